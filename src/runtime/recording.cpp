// Recorded runs (CompileOptions::capture): a device run recorded once on a slot's stream as a
// graph of the backend (a CUDA graph) with buffers of its own, then replayed with one launch.
#include <fmt/format.h>

#include "core/op_registry.h"
#include "runtime/control.h"
#include "runtime/device_run.h"
#include "runtime/env.h"
#include "runtime/log.h"
#include "runtime/run_kernel.h"
#include "runtime/step_loop.h"

namespace kiln {

using detail::ExecutableImpl;
using detail::Node;
using detail::ValueRef;
using Where = ValueSlot::Where;

namespace detail {
ExecutableImpl::Recording::~Recording() {
  if (graph) backend->destroy_graph(device, graph);
  for (auto& [bytes, p] : scratch) backend->release(device, p);
  for (auto& body : body_errors)
    if (body.second.errors_host) backend->release_mapped(body.second.errors_host);
}
}  // namespace detail

std::string capture_blocker(const ExecutableImpl& x) {
  const int forced = env::capture();
  if (forced == 0) return "KILN_CAPTURE=0";
  if (forced < 0 && !x.options.capture) return "CompileOptions::capture is off";
  if (!x.backend->can_capture()) return "the backend cannot record runs";
  if (env::validate_on_cpu()) return "KILN_VALIDATE=cpu";
  if (env::step_times()) return "KILN_STEP_TIMES";
  for (const Step& st : x.steps) {
    const OpId op = x.program.graph.nodes[st.node].op;
    if (st.backend == Backend::cpu)
      return fmt::format("%{} {} falls back to the cpu", st.node, op_name(op));
    if (op == OpId::AllReduce || op == OpId::CollectiveWait)
      return fmt::format("%{} {} talks to other ranks", st.node, op_name(op));
    const Node& n = x.program.graph.nodes[st.node];
    if (n.bodies.empty()) continue;
    if (!x.backend->can_record_conditionals())
      return fmt::format("%{} {} runs its bodies from the host", st.node, op_name(op));
    if (!env::conditional_nodes())
      return fmt::format("%{} {}: KILN_CONDITIONAL_NODES=0", st.node, op_name(op));
    if (std::string why = detail::bodies_capture_blocker(n); !why.empty())
      return fmt::format("%{} {}: {}", st.node, op_name(op), why);
  }
  return {};
}

namespace {
// The recording the calling thread is making (control ops record their bodies into it).
thread_local ExecutableImpl::Recording* recording_now = nullptr;

// Scratch memory of kernels while a run is recorded: blocks are reused only within the recording
// (its kernels run in order on one stream) and kept for as long as it can be replayed. `user` is
// the recording (KernelEnv::user).
void* recording_allocate(void* user, int device, size_t bytes, void* stream) {
  auto& r = *static_cast<ExecutableImpl::Recording*>(user);
  size_t best = r.free_scratch.size();
  for (size_t i = 0; i < r.free_scratch.size(); ++i) {
    const size_t have = r.scratch[r.free_scratch[i]].first;
    if (have >= bytes && (best == r.free_scratch.size() ||
                          have < r.scratch[r.free_scratch[best]].first))
      best = i;
  }
  if (best < r.free_scratch.size()) {
    void* p = r.scratch[r.free_scratch[best]].second;
    r.free_scratch.erase(r.free_scratch.begin() + static_cast<std::ptrdiff_t>(best));
    return p;
  }
  // (on the recorded stream: a body's kernels are recorded from a stream of their own)
  void* p = r.backend->allocate(device, bytes, r.stream);
  r.scratch.emplace_back(bytes, p);
  return p;
}

void recording_release(void* user, int, void* p) {
  auto& r = *static_cast<ExecutableImpl::Recording*>(user);
  for (size_t i = 0; i < r.scratch.size(); ++i)
    if (r.scratch[i].second == p) r.free_scratch.push_back(i);
}

struct RecordingScope {
  ExecutableImpl::Recording* before = recording_now;
  explicit RecordingScope(ExecutableImpl::Recording* r) { recording_now = r; }
  ~RecordingScope() { recording_now = before; }
};

// Records every step of `x` on `stream` into a new recording with buffers of its own for
// feeds and outputs. Returns nullptr, with the reason in `why`, when some call cannot be
// recorded; nothing has run then.
std::shared_ptr<ExecutableImpl::Recording> record_run(ExecutableImpl& x,
                                                      ExecutableImpl::DeviceSlot& slot,
                                                      void* stream, std::vector<void*> signature,
                                                      std::string* why) {
  const auto& nodes = x.program.graph.nodes;
  DeviceBackend& b = *x.backend;
  const int dev = x.device.index;
  auto rec = std::make_shared<ExecutableImpl::Recording>(&b, dev);
  rec->stream = stream;
  rec->signature = std::move(signature);
  rec->feeds.resize(nodes.size());
  for (int32_t ph : x.placeholders)
    rec->feeds[ph] = device_array(b, x.device, nodes[ph].outputs[0].shape,
                                  nodes[ph].outputs[0].dtype, stream);
  rec->outputs = allocate_outputs(
      x, [&](const Shape& s, DType t) { return device_array(b, x.device, s, t, stream); });
  char* base = slot.arena ? static_cast<char*>(slot.arena->data) : nullptr;
  auto feed_data = [&](int32_t ph) { return rec->feeds[ph].data(); };
  auto data = [&](ValueRef v) { return value_data(x, v, feed_data, base, rec->outputs); };
  KernelEnv kenv = step_kernel_env(x, b, dev, stream);
  kenv.allocate = recording_allocate;
  kenv.release = recording_release;
  kenv.user = rec.get();
  // every step is a device step (capture_blocker); no observer watches a recording
  auto run = [&](size_t k, const Step& st, const Node& n, std::vector<TensorView>& in,
                 std::vector<TensorView>& out) {
    set_error_slot(x, slot, k, kenv);
    run_device_kernel(*st.kernel, st.backend, n, in, out, x.pool, kenv);
  };
  b.begin_capture(dev, stream);
  try {
    RecordingScope now(rec.get());
    run_steps(x, data, run, StepObservers{});
  } catch (const std::exception& e) {
    std::string ignored;
    if (void* g = b.end_capture(dev, stream, &ignored)) b.destroy_graph(dev, g);
    *why = fmt::format("recording the run failed: {}", e.what());
    return nullptr;
  }
  rec->graph = b.end_capture(dev, stream, why);
  if (!rec->graph) return nullptr;
  return rec;
}
}  // namespace

ExecutableImpl::Recording* recording_in_progress() { return recording_now; }

std::vector<TensorView> record_body(const std::shared_ptr<ExecutableImpl>& body,
                                    ExecutableImpl::Recording& rec, void* stream,
                                    const std::vector<const void*>& feeds) {
  ExecutableImpl& x = *body;
  DeviceBackend& b = *x.backend;
  const int dev = x.device.index;
  auto make = [&](const Shape& s, DType t) {
    rec.buffers.push_back(device_array(b, x.device, s, t, rec.stream));
    return rec.buffers.back();
  };
  char* base = x.plan.arena_bytes
                   ? static_cast<char*>(make({static_cast<int64_t>(x.plan.arena_bytes)}, u8).data())
                   : nullptr;
  const std::vector<Array> outputs = allocate_outputs(x, make);
  ExecutableImpl::DeviceSlot slot;
  if (x.reports_errors) {
    const size_t words = 2 * x.steps.size();
    slot.errors = make({static_cast<int64_t>(words)}, i64).storage();
    slot.errors_host = static_cast<int64_t*>(b.allocate_mapped(words * sizeof(int64_t)));
    slot.error_info.assign(3 * x.steps.size(), 0);
  }
  auto feed_data = [&](int32_t ph) { return feeds[ph]; };
  auto data = [&](ValueRef v) { return value_data(x, v, feed_data, base, outputs); };
  KernelEnv kenv = step_kernel_env(x, b, dev, stream);
  kenv.allocate = recording_allocate;
  kenv.release = recording_release;
  kenv.user = &rec;
  // (error_info is filled while encoding: the slot joins the recording before its steps)
  if (x.reports_errors) rec.body_errors.emplace_back(body, std::move(slot));
  ExecutableImpl::DeviceSlot& kept = x.reports_errors ? rec.body_errors.back().second : slot;
  auto run = [&](size_t k, const Step& st, const Node& n, std::vector<TensorView>& in,
                 std::vector<TensorView>& out) {
    set_error_slot(x, kept, k, kenv);
    run_device_kernel(*st.kernel, st.backend, n, in, out, x.pool, kenv);
  };
  run_steps(x, data, run, StepObservers{});
  std::vector<TensorView> results;
  for (size_t k = 0; k < x.program.num_returned; ++k)
    results.push_back(value_view(x, x.program.outputs[k], feed_data, base, outputs));
  return results;
}

// A replay is worth its copies when device feeds copied into the recording's buffers and outputs
// copied out (about 0.5 us per MiB on a GPU) cost less than the launches saved (about 2-4 us per
// step). (A 2-step max-pool pass over 250 MB of feeds and outputs runs faster step by step.)
// A control op pays always: a loop on the device saves a wait for the stream per iteration.
bool recording_pays(const ExecutableImpl& x, const std::vector<const Array*>& feed_by_node) {
  constexpr size_t kBytesPerStep = size_t{4} << 20;
  for (const Step& st : x.steps)
    if (!x.program.graph.nodes[st.node].bodies.empty()) return true;
  size_t bytes = 0;
  for (int32_t ph : x.placeholders)
    if (feed_by_node[ph]->device().kind != Device::Kind::cpu) bytes += feed_by_node[ph]->nbytes();
  const auto& nodes = x.program.graph.nodes;
  for (size_t k = 0; k < x.program.num_returned; ++k) {
    const ValueRef v = x.program.outputs[k];
    const TensorInfo& t = nodes[v.node].outputs[v.index];
    bytes += static_cast<size_t>(numel(t.shape)) * size_of(t.dtype);
  }
  return bytes <= kBytesPerStep * x.steps.size();
}

bool run_recorded(std::shared_ptr<SlotLease> lease, const std::vector<const Array*>& feed_by_node,
                  std::vector<Array>& result, Finish* deferred) {
  ExecutableImpl& x = lease->x;
  auto& slot = lease->slot;
  const auto& nodes = x.program.graph.nodes;
  DeviceBackend& b = *x.backend;
  const int dev = x.device.index;
  void* stream = lease->stream;
  std::vector<void*> signature;
  signature.reserve(x.variables.size());
  for (int32_t v : x.variables)
    signature.push_back(nodes[v].value.storage() ? nodes[v].value.storage()->data : nullptr);
  if (!slot.recording || slot.recording->signature != signature) {
    slot.recording.reset();
    std::string why;
    slot.recording = record_run(x, slot, stream, std::move(signature), &why);
    if (!slot.recording) {
      log::warn("[run] runs on {} go on without CUDA graphs: {}", x.device.str(), why);
      std::lock_guard<std::mutex> l(x.arena_mu);
      x.capture_off = why;
      return false;
    }
  }
  auto& rec = *slot.recording;
  for (int32_t ph : x.placeholders) {
    const Array& a = *feed_by_node[ph];
    b.copy_async(dev, rec.feeds[ph].data(), false, a.data(), a.device().kind == Device::Kind::cpu,
                 a.nbytes(), stream);
  }
  const size_t error_bytes = 2 * sizeof(int64_t) * x.steps.size();
  if (x.reports_errors) b.memset_async(dev, slot.errors->data, 0xff, error_bytes, stream);
  for (auto& [body, s] : rec.body_errors)
    b.memset_async(dev, s.errors->data, 0xff, s.errors->bytes, stream);
  b.launch_graph(dev, rec.graph, stream);
  for (auto& [body, s] : rec.body_errors)
    b.copy_to_pinned_async(dev, s.errors_host, s.errors->data, s.errors->bytes, stream);
  std::vector<Array> outputs(x.program.num_returned);
  for (size_t k = 0; k < x.program.num_returned; ++k) {
    ValueRef v = x.program.outputs[k];
    const ValueSlot& s = x.plan.slots[v.node][v.index];
    const Array* from = nullptr;
    if (s.where == Where::output && s.index == static_cast<int>(k)) from = &rec.outputs[k];
    else if (s.where == Where::feed && feed_by_node[s.index]->device() != x.device)
      from = &rec.feeds[s.index];
    if (!from) continue;
    outputs[k] = device_array(b, x.device, from->shape(), from->dtype(), stream);
    b.copy_async(dev, outputs[k].data(), false, from->data(), false, from->nbytes(), stream);
  }
  ++x.replays;
  const ExecutableImpl::Recording* replayed = slot.recording.get();
  result = end_run(
      std::move(lease), std::move(outputs),
      [feed_by_node](int32_t ph) { return *feed_by_node[ph]; }, deferred, replayed);
  return true;
}

}  // namespace kiln
