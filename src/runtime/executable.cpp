#include "kiln/executable.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>
#include <cstring>
#include <sstream>
#include <type_traits>

#include "core/errors.h"
#include "core/op_registry.h"
#include "core/device_backend.h"
#include "runtime/env.h"
#include "runtime/executable_impl.h"
#include "runtime/profiler_run.h"
#include "runtime/queue_impl.h"
#include "runtime/run_kernel.h"

namespace kiln {

using detail::ExecutableImpl;
using detail::Node;
using detail::ValueRef;
using Where = ValueSlot::Where;

Executable::Executable() = default;
Executable::~Executable() = default;
Executable::Executable(Executable&&) noexcept = default;
Executable& Executable::operator=(Executable&&) noexcept = default;
Executable::Executable(std::shared_ptr<ExecutableImpl> impl) : impl_(std::move(impl)) {}

namespace {
void check_feed(const Node& ph, const Array& a, Device device) {
  const TensorInfo& want = ph.outputs[0];
  if (a.shape() != want.shape)
    fail<ShapeError>("[run] placeholder '{}' was compiled for shape {} but the feed has shape {}",
                     ph.name, str(want.shape), str(a.shape()));
  if (a.dtype() != want.dtype)
    fail<DTypeError>("[run] placeholder '{}' has dtype {} but the feed has dtype {}", ph.name,
                     name(want.dtype), name(a.dtype()));
  if (a.device().kind != Device::Kind::cpu && a.device() != device)
    fail<UnsupportedError>("[run] feed '{}' lives on {}; this executable runs on {} (host feeds "
                           "are copied there)", ph.name, a.device().str(), device.str());
}

// The first element where `got` (from the GPU) and `want` (from the CPU) differ beyond the
// tolerance of their dtype, or -1.
int64_t first_mismatch(const Array& got, const Array& want, double* g, double* w) {
  const auto a = got.to_vector<double>(), b = want.to_vector<double>();
  double tol = 0;
  switch (got.dtype()) {
    case f64: tol = 1e-9; break;
    case f32: tol = 1e-4; break;
    case f16: tol = 1e-2; break;
    case bf16: tol = 5e-2; break;
    default: break;
  }
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) && std::isnan(b[i])) continue;
    if (a[i] == b[i]) continue;
    if (std::abs(a[i] - b[i]) <= tol * (1 + std::abs(b[i]))) continue;
    *g = a[i];
    *w = b[i];
    return static_cast<int64_t>(i);
  }
  return -1;
}

// What is left of a GPU run once its work is on a stream: called after the stream has passed it,
// it checks the error slots, fills the returned aliases, gives the slot back and returns the
// outputs (or throws the run's error).
using Finish = std::function<std::vector<Array>()>;

std::vector<Array> run_device(ExecutableImpl& x, const std::vector<const Array*>& feed_by_node,
                              void* on_stream = nullptr, Finish* deferred = nullptr);

// The returned values no step wrote: feeds (`feed(placeholder)`), constants (copied) and values
// returned more than once.
template <typename Feed>
void fill_aliases(const ExecutableImpl& x, std::vector<Array>& outputs, Feed&& feed) {
  for (size_t k = 0; k < x.program.num_returned; ++k) {
    if (outputs[k].valid() && outputs[k].storage()) continue;
    ValueRef v = x.program.outputs[k];
    const ValueSlot& s = x.plan.slots[v.node][v.index];
    if (s.where == Where::output) outputs[k] = outputs[s.index];
    else if (s.where == Where::feed) outputs[k] = feed(s.index);
    else if (s.where == Where::constant) outputs[k] = x.program.graph.nodes[s.index].value.copy();
  }
}

std::vector<Array> run_impl(ExecutableImpl& x, const std::vector<const Array*>& feed_by_node) {
  if (x.backend) return run_device(x, feed_by_node);
  const auto& nodes = x.program.graph.nodes;
  for (int32_t v : x.variables)
    if (auto& st = nodes[v].value.storage()) move_storage(*st, x.device);
  for (int32_t ph : x.placeholders)
    if (!feed_by_node[ph]) fail<ValueError>("[run] placeholder '{}' has no feed", nodes[ph].name);

  std::vector<Array> outputs(x.program.num_returned);
  for (size_t k = 0; k < x.program.num_returned; ++k) {
    ValueRef v = x.program.outputs[k];
    const ValueSlot& s = x.plan.slots[v.node][v.index];
    if (s.where == Where::output && s.index == static_cast<int>(k)) {
      const TensorInfo& t = nodes[v.node].outputs[v.index];
      outputs[k] = Array::empty(t.shape, t.dtype);
    }
  }
  std::shared_ptr<Storage> arena;
  {
    std::lock_guard<std::mutex> l(x.arena_mu);
    if (!x.free_arenas.empty()) {
      arena = std::move(x.free_arenas.back());
      x.free_arenas.pop_back();
    }
  }
  if (!arena && x.plan.arena_bytes) arena = Array::empty({static_cast<int64_t>(x.plan.arena_bytes)}, u8).storage();
  char* base = arena ? static_cast<char*>(arena->data) : nullptr;

  auto view = [&](ValueRef v) -> TensorView {
    const ValueSlot& s = x.plan.slots[v.node][v.index];
    const TensorInfo& t = nodes[v.node].outputs[v.index];
    void* p = nullptr;
    switch (s.where) {
      case Where::feed: p = const_cast<void*>(feed_by_node[s.index]->data()); break;
      case Where::constant: p = const_cast<void*>(nodes[s.index].value.data()); break;
      case Where::arena: p = base + s.offset; break;
      case Where::output: p = outputs[s.index].data(); break;
      case Where::none: KILN_ASSERT(false);
    }
    return {p, t.shape, t.dtype};
  };

  auto run_step = [&](const Step& st) {
    const Node& n = nodes[st.node];
    std::vector<TensorView> in, out;
    in.reserve(n.inputs.size());
    for (auto v : n.inputs) in.push_back(view(v));
    for (size_t o = 0; o < n.outputs.size(); ++o)
      out.push_back(view({st.node, static_cast<int32_t>(o)}));
    run_kernel(*st.kernel, n, in, out, x.pool);
  };
  // the profiler off: one test per run, and the loop has none
  if (const auto prof = kiln::prof::RunProfile::begin(x.device, nullptr, nullptr)) {
    for (size_t k = 0; k < x.steps.size(); ++k) {
      const Step& st = x.steps[k];
      prof->step_begin(static_cast<int32_t>(k), st.node, op_name(nodes[st.node].op), nullptr);
      run_step(st);
      prof->step_end();
    }
    prof->finish();
  } else if (env::step_times()) {
    for (const Step& st : x.steps) {
      const auto t0 = std::chrono::steady_clock::now();
      run_step(st);
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      std::lock_guard<std::mutex> l(x.times_mu);
      auto& [total, calls] = x.step_ms[op_name(nodes[st.node].op)];
      total += ms;
      ++calls;
    }
  } else {
    for (const Step& st : x.steps) run_step(st);
  }
  // outputs that are feeds, constants or repeated targets
  fill_aliases(x, outputs, [&](int32_t ph) { return *feed_by_node[ph]; });
  if (arena) {
    std::lock_guard<std::mutex> l(x.arena_mu);
    x.free_arenas.push_back(std::move(arena));
  }
  return outputs;
}
// Inputs the CPU would have rejected (indices out of range), reported by GPU kernels: a
// ValueError like the CPU kernel's for the first bad position of the first step that reported.
void check_error_slots(const ExecutableImpl& x, const ExecutableImpl::DeviceSlot& slot) {
  for (size_t k = 0; k < x.steps.size(); ++k) {
    const auto packed = static_cast<uint64_t>(slot.errors_host[2 * k]);
    if (packed == ~uint64_t{0}) continue;
    const int64_t pos = static_cast<int64_t>(packed >> 32);
    const auto low = static_cast<uint32_t>(packed);
    const int64_t value =
        low == 0x80000000u ? slot.errors_host[2 * k + 1] : static_cast<int32_t>(low);
    const int64_t* info = slot.error_info.data() + 3 * k;
    const Node& n = x.program.graph.nodes[x.steps[k].node];
    std::string shapes;
    for (auto v : n.inputs) shapes += (shapes.empty() ? "" : ", ") + str(x.program.graph.info(v).shape);
    const std::string where = fmt::format("(position {} of node %{} with inputs {}; found on {})",
                                          pos, x.steps[k].node, shapes, x.device.str());
    switch (static_cast<ErrorKind>(info[0])) {
      case ErrorKind::label:
        fail<ValueError>("[{}] label {} at position {} is out of range for {} classes {}",
                         op_name(n.op), value, pos, info[2], where);
      case ErrorKind::plane_index:
        fail<ValueError>("[{}] index {} out of range for an input plane of {} elements {}",
                         op_name(n.op), value, info[2], where);
      case ErrorKind::index_tuple: {
        const int64_t axis = info[1] + pos % std::max<int64_t>(info[2], 1);
        const Shape& xs = x.program.graph.info(n.inputs[0]).shape;
        fail<ValueError>("[{}] index {} out of range for axis {} of size {} {}", op_name(n.op),
                         value, axis, axis < static_cast<int64_t>(xs.size()) ? xs[axis] : -1,
                         where);
      }
      case ErrorKind::sequence_length:
        fail<ValueError>("[{}] seq_lens[{}] = {} is outside [0, {}] {}", op_name(n.op), pos, value,
                         info[2], where);
      case ErrorKind::index_on_axis:
        break;
    }
    fail<ValueError>("[{}] index {} out of range for axis {} of size {} {}", op_name(n.op), value,
                     info[1], info[2], where);
  }
}

// Why the runs of `x` are not recorded as CUDA graphs; empty when they are.
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
  }
  return {};
}

Array device_array(DeviceBackend& b, Device device, const Shape& shape, DType t, void* stream) {
  auto st = std::make_shared<Storage>();
  st->bytes = static_cast<size_t>(numel(shape)) * size_of(t);
  const int dev = device.index;
  st->data = b.allocate(dev, st->bytes, stream);
  st->device = device;
  st->deleter = [&b, dev](void* p) { b.release(dev, p); };
  return Array::adopt(std::move(st), shape, t);
}

// The input and output views of step `k`, and its error slot in `kenv`.
template <typename View>
void step_io(const ExecutableImpl& x, ExecutableImpl::DeviceSlot& slot, size_t k, View&& view,
             KernelEnv& kenv, std::vector<TensorView>& in, std::vector<TensorView>& out) {
  const Step& st = x.steps[k];
  const Node& n = x.program.graph.nodes[st.node];
  if (x.reports_errors && st.kernel->reports_errors) {
    kenv.errors = static_cast<int64_t*>(slot.errors->data) + 2 * k;
    kenv.error_info = slot.error_info.data() + 3 * k;
  } else {
    kenv.errors = kenv.error_info = nullptr;
  }
  in.clear();
  out.clear();
  for (auto v : n.inputs) in.push_back(view(v));
  for (size_t o = 0; o < n.outputs.size(); ++o)
    out.push_back(view({st.node, static_cast<int32_t>(o)}));
}

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
  void* p = r.backend->allocate(device, bytes, stream);
  r.scratch.emplace_back(bytes, p);
  return p;
}

void recording_release(void* user, int, void* p) {
  auto& r = *static_cast<ExecutableImpl::Recording*>(user);
  for (size_t i = 0; i < r.scratch.size(); ++i)
    if (r.scratch[i].second == p) r.free_scratch.push_back(i);
}

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
  rec->signature = std::move(signature);
  rec->feeds.resize(nodes.size());
  for (int32_t ph : x.placeholders)
    rec->feeds[ph] = device_array(b, x.device, nodes[ph].outputs[0].shape,
                                  nodes[ph].outputs[0].dtype, stream);
  rec->outputs.resize(x.program.num_returned);
  for (size_t k = 0; k < x.program.num_returned; ++k) {
    ValueRef v = x.program.outputs[k];
    const ValueSlot& s = x.plan.slots[v.node][v.index];
    if (s.where == Where::output && s.index == static_cast<int>(k)) {
      const TensorInfo& t = nodes[v.node].outputs[v.index];
      rec->outputs[k] = device_array(b, x.device, t.shape, t.dtype, stream);
    }
  }
  char* base = slot.arena ? static_cast<char*>(slot.arena->data) : nullptr;
  auto view = [&](ValueRef v) -> TensorView {
    const ValueSlot& s = x.plan.slots[v.node][v.index];
    const TensorInfo& t = nodes[v.node].outputs[v.index];
    void* p = nullptr;
    switch (s.where) {
      case Where::feed: p = rec->feeds[s.index].data(); break;
      case Where::constant: p = const_cast<void*>(nodes[s.index].value.data()); break;
      case Where::arena: p = base + s.offset; break;
      case Where::output: p = rec->outputs[s.index].data(); break;
      case Where::none: KILN_ASSERT(false);
    }
    return {p, t.shape, t.dtype};
  };
  KernelEnv kenv = b.kernel_env(dev, stream);
  kenv.deterministic = x.options.deterministic || env::deterministic();
  kenv.allocate = recording_allocate;
  kenv.release = recording_release;
  kenv.user = rec.get();
  std::vector<TensorView> in, out;
  b.begin_capture(dev, stream);
  try {
    for (size_t k = 0; k < x.steps.size(); ++k) {
      step_io(x, slot, k, view, kenv, in, out);
      run_device_kernel(*x.steps[k].kernel, x.steps[k].backend, nodes[x.steps[k].node], in, out,
                        x.pool, kenv);
    }
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

// Whether a replay is worth its copies: device feeds copied into the recording's buffers and
// outputs copied out cost about 0.5 us per MiB on a GPU; a launch saved about 2-4 us per step.
// (A 2-step max-pool pass over 250 MB of feeds and outputs runs faster launched step by step.)
bool recording_pays(const ExecutableImpl& x, const std::vector<const Array*>& feed_by_node) {
  constexpr size_t kBytesPerStep = size_t{4} << 20;
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

// A slot taken from the executable's pool for one run, given back when the run has ended: after
// waiting for the run's stream when it failed (work may still be in flight).
struct SlotLease {
  ExecutableImpl& x;
  ExecutableImpl::DeviceSlot slot;
  void* stream = nullptr;  // the run's
  bool ok = false;
  explicit SlotLease(ExecutableImpl& e) : x(e) {}
  SlotLease(const SlotLease&) = delete;
  SlotLease& operator=(const SlotLease&) = delete;
  ~SlotLease() {
    if (!slot.stream) return;
    if (ok) {
      ++slot.runs;
    } else if (stream) {
      try {
        x.backend->synchronize(x.device.index, stream);
      } catch (...) {
      }
    }
    std::lock_guard<std::mutex> l(x.arena_mu);
    x.free_slots.push_back(std::move(slot));
  }
};

// The end of a run whose work is on `stream`: the error slots come back to the host, then (once
// the stream has passed the run) they are checked, the returned aliases filled (`alias` gives a
// placeholder's value) and the slot given back. Without `deferred` this waits for the stream and
// returns the outputs; with it, it returns nothing and leaves that to *deferred.
template <typename Alias>
std::vector<Array> end_run(std::shared_ptr<SlotLease> lease, std::vector<Array> outputs,
                           Alias alias, Finish* deferred) {
  ExecutableImpl& x = lease->x;
  auto& slot = lease->slot;
  DeviceBackend& b = *x.backend;
  const int dev = x.device.index;
  const size_t error_bytes = 2 * sizeof(int64_t) * x.steps.size();
  if (x.reports_errors)
    b.copy_to_pinned_async(dev, slot.errors_host, slot.errors->data, error_bytes, lease->stream);
  Finish finish = [lease, outputs = std::move(outputs), alias = std::move(alias)]() mutable {
    if (lease->x.reports_errors) check_error_slots(lease->x, lease->slot);
    lease->ok = true;
    fill_aliases(lease->x, outputs, alias);
    return std::move(outputs);
  };
  if (deferred) {
    *deferred = std::move(finish);
    return {};
  }
  b.synchronize(dev, lease->stream);
  return finish();
}

// A run replayed from the slot's recording (made now when there is none, or when a variable has
// moved since). Returns false, with x.capture_off set, when the run cannot be recorded.
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
  for (int32_t v : x.variables) signature.push_back(nodes[v].value.storage() ? nodes[v].value.storage()->data : nullptr);
  if (!slot.recording || slot.recording->signature != signature) {
    slot.recording.reset();
    std::string why;
    slot.recording = record_run(x, slot, stream, std::move(signature), &why);
    if (!slot.recording) {
      if (const char* level = env::log_level(); level && std::string(level) != "error")
        fmt::print(stderr, "[run] runs on {} go on without CUDA graphs: {}\n", x.device.str(), why);
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
  b.launch_graph(dev, rec.graph, stream);
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
  result = end_run(std::move(lease), std::move(outputs),
                   [feed_by_node](int32_t ph) { return *feed_by_node[ph]; }, deferred);
  return true;
}

std::vector<Array> run_device(ExecutableImpl& x, const std::vector<const Array*>& feed_by_node,
                              void* on_stream, Finish* deferred) {
  const auto& nodes = x.program.graph.nodes;
  for (int32_t ph : x.placeholders)
    if (!feed_by_node[ph]) fail<ValueError>("[run] placeholder '{}' has no feed", nodes[ph].name);
  DeviceBackend& b = *x.backend;
  const int dev = x.device.index;

  // a (stream, arena) pair of its own; back to the pool however the run ends
  auto lease = std::make_shared<SlotLease>(x);
  auto& slot = lease->slot;
  bool may_record = false;
  {
    std::lock_guard<std::mutex> l(x.arena_mu);
    if (!x.capture_off) x.capture_off = capture_blocker(x);
    may_record = x.capture_off->empty();
    if (!x.free_slots.empty()) {
      slot = std::move(x.free_slots.back());
      x.free_slots.pop_back();
    }
  }
  if (!slot.stream) slot.stream = b.create_stream(dev);
  // the run's work goes on the caller's queue, or on the slot's own stream
  void* stream = lease->stream = on_stream ? on_stream : slot.stream;
  auto device_array = [&](const Shape& shape, DType t) {
    return kiln::device_array(b, x.device, shape, t, stream);
  };
  if (!slot.arena && x.plan.arena_bytes)
    slot.arena = device_array({static_cast<int64_t>(x.plan.arena_bytes)}, u8).storage();
  char* base = slot.arena ? static_cast<char*>(slot.arena->data) : nullptr;
  const size_t error_bytes = 2 * sizeof(int64_t) * x.steps.size();
  if (x.reports_errors) {
    if (!slot.errors) {
      slot.errors = device_array({static_cast<int64_t>(2 * x.steps.size())}, i64).storage();
      slot.errors_host = static_cast<int64_t*>(b.allocate_mapped(error_bytes));
      slot.error_info.assign(3 * x.steps.size(), 0);
    }
  }
  // variables follow the executables that use them
  for (int32_t v : x.variables)
    if (auto& st = nodes[v].value.storage()) move_storage(*st, x.device);
  // debugging modes wait for steps on the host: they finish the run now
  const bool validate = env::validate_on_cpu();
  const bool on_device = env::step_times_device();
  const bool timed = env::step_times() && !on_device;
  if (validate || env::step_times()) deferred = nullptr;
  // null when the profiler is off; a profiled run is not replayed, so that every op is timed
  const auto prof = kiln::prof::RunProfile::begin(x.device, &b, stream);
  // from the second run on a slot: one launch of the slot's recording, unless copying this run's
  // device feeds in and its outputs out would cost more than the launches it saves
  if (may_record && !prof && slot.runs > 0 && recording_pays(x, feed_by_node)) {
    std::vector<Array> outputs;
    if (run_recorded(lease, feed_by_node, outputs, deferred)) return outputs;
  }
  if (x.reports_errors)  // all ones: no report
    b.memset_async(dev, slot.errors->data, 0xff, error_bytes, stream);

  // feeds from the host go up on the run's stream
  std::vector<Array> feeds(nodes.size());
  for (int32_t ph : x.placeholders) {
    const Array& a = *feed_by_node[ph];
    if (a.device() == x.device) {
      feeds[ph] = a;
      continue;
    }
    feeds[ph] = device_array(a.shape(), a.dtype());
    const int mark = prof ? prof->mark() : -1;
    b.copy_async(dev, feeds[ph].data(), false, a.data(), true, a.nbytes(), stream);
    if (prof) prof->copy(mark, "H2D", a.nbytes());
  }

  std::vector<Array> outputs(x.program.num_returned);
  for (size_t k = 0; k < x.program.num_returned; ++k) {
    ValueRef v = x.program.outputs[k];
    const ValueSlot& s = x.plan.slots[v.node][v.index];
    if (s.where == Where::output && s.index == static_cast<int>(k)) {
      const TensorInfo& t = nodes[v.node].outputs[v.index];
      outputs[k] = device_array(t.shape, t.dtype);
    }
  }
  auto view = [&](ValueRef v) -> TensorView {
    const ValueSlot& s = x.plan.slots[v.node][v.index];
    const TensorInfo& t = nodes[v.node].outputs[v.index];
    void* p = nullptr;
    switch (s.where) {
      case Where::feed: p = feeds[s.index].data(); break;
      case Where::constant: p = const_cast<void*>(nodes[s.index].value.data()); break;
      case Where::arena: p = base + s.offset; break;
      case Where::output: p = outputs[s.index].data(); break;
      case Where::none: KILN_ASSERT(false);
    }
    return {p, t.shape, t.dtype};
  };

  KernelEnv kenv = b.kernel_env(dev, stream);
  kenv.deterministic = x.options.deterministic || env::deterministic();
  // KILN_STEP_TIMES=device: an event before every step and one after the last
  std::vector<void*> events;
  struct DropEvents {
    DeviceBackend& b;
    int dev;
    std::vector<void*>& events;
    ~DropEvents() {
      for (void* e : events) b.destroy_event(dev, e);
    }
  } drop_events{b, dev, events};
  if (on_device && slot.runs > 0) {
    for (size_t k = 0; k <= x.steps.size(); ++k) events.push_back(b.create_timing_event(dev));
  }
  auto t_step = std::chrono::steady_clock::now();
  auto record = [&](const Node& n) {
    b.synchronize(dev, stream);
    const auto now = std::chrono::steady_clock::now();
    std::lock_guard<std::mutex> l(x.times_mu);
    auto& [ms, calls] = x.step_ms[op_name(n.op)];
    ms += std::chrono::duration<double, std::milli>(now - t_step).count();
    ++calls;
    t_step = now;
  };
  if (timed) b.synchronize(dev, stream), t_step = std::chrono::steady_clock::now();
  // the step loop, instantiated with and without the profiler: off, it holds no profiler code
  // (a run tests once whether it is profiled)
  auto encode_steps = [&](auto p) {
    constexpr bool profiled = !std::is_null_pointer_v<decltype(p)>;
    std::vector<TensorView> in, out;
    for (size_t k = 0; k < x.steps.size(); ++k) {
      const Step& st = x.steps[k];
      const Node& n = nodes[st.node];
      step_io(x, slot, k, view, kenv, in, out);
      if (!events.empty()) b.record_event(dev, events[k], stream);
      if constexpr (profiled)
        p->step_begin(static_cast<int32_t>(k), st.node, op_name(n.op),
                      st.backend == Backend::cpu ? &st.fallback_reason : nullptr);
      if (st.backend == Backend::cpu) {
        run_on_host(*st.kernel, n, in, out, b, dev, stream, x.pool, nullptr, p);
        if (timed) record(n);
        if constexpr (profiled) p->step_end();
        continue;
      }
      // collectives talk to other ranks: they are not run twice
      if (!validate || n.op == OpId::AllReduce || n.op == OpId::CollectiveWait) {
        run_device_kernel(*st.kernel, st.backend, n, in, out, x.pool, kenv);
        if (timed) record(n);
        if constexpr (profiled) p->step_end();
        continue;
      }
      // KILN_VALIDATE=cpu: the same node on the CPU, from the same inputs (read before the GPU
      // kernel, which may write over them)
      std::vector<Array> want;
      const KernelEntry* cpu = find_kernel(n.op, Backend::cpu);
      if (cpu) run_on_host(*cpu, n, in, out, b, dev, stream, x.pool, &want);
      run_device_kernel(*st.kernel, st.backend, n, in, out, x.pool, kenv);
      for (size_t o = 0; cpu && o < out.size(); ++o) {
        Array got = Array::empty(out[o].shape, out[o].dtype);
        b.copy_async(dev, got.data(), true, out[o].data, false, got.nbytes(), stream);
        double g = 0, w = 0;
        const int64_t i = first_mismatch(got, want[o], &g, &w);
        if (i >= 0)
          fail<DeviceError>("[validate] node %{} ({}) output {} {} {} disagrees with the cpu at "
                            "element {}: {} on {}, {} on the cpu",
                            st.node, op_name(n.op), o, name(out[o].dtype), str(out[o].shape), i, g,
                            x.device.str(), w);
      }
      if constexpr (profiled) p->step_end();
    }
  };
  if (prof)
    encode_steps(prof.get());
  else
    encode_steps(nullptr);
  if (!events.empty()) {
    b.record_event(dev, events.back(), stream);
    b.synchronize(dev, stream);
    std::lock_guard<std::mutex> l(x.times_mu);
    for (size_t k = 0; k < x.steps.size(); ++k) {
      auto& [ms, calls] = x.step_ms[op_name(nodes[x.steps[k].node].op)];
      ms += b.elapsed_ms(dev, events[k], events[k + 1]);
      ++calls;
    }
  }
  if (prof) prof->encoded();
  auto result = end_run(std::move(lease), std::move(outputs),
                        [feeds = std::move(feeds)](int32_t ph) { return feeds[ph]; }, deferred);
  // a profile's device spans are read once the stream has passed the run
  if (prof && deferred)
    *deferred = [prof, finish = std::move(*deferred)]() mutable {
      prof->finish();
      return finish();
    };
  else if (prof)
    prof->finish();
  return result;
}
}  // namespace

namespace detail {
ExecutableImpl::Recording::~Recording() {
  if (graph) backend->destroy_graph(device, graph);
  for (auto& [bytes, p] : scratch) backend->release(device, p);
}

ExecutableImpl::~ExecutableImpl() {
  if (!step_ms.empty()) {
    std::vector<std::pair<double, std::string>> rows;
    double total = 0;
    for (auto& [op, t] : step_ms) {
      rows.emplace_back(t.first, fmt::format("{:>10.3f} ms {:>8} calls  {}", t.first, t.second, op));
      total += t.first;
    }
    std::sort(rows.rbegin(), rows.rend());
    fmt::print(stderr, "[kiln] KILN_STEP_TIMES on {}{}: {:.3f} ms in all\n", device.str(),
               env::step_times_device() ? " (device time, runs after the first)" : "", total);
    for (auto& r : rows) fmt::print(stderr, "  {}\n", r.second);
  }
  for (auto& s : free_slots) {
    s.arena.reset();
    if (backend && s.stream) backend->destroy_stream(device.index, s.stream);
    s.recording.reset();
    s.errors.reset();
    if (backend && s.errors_host) backend->release_mapped(s.errors_host);
  }
}
}  // namespace detail

namespace {
// The feed of every placeholder of the program, by program node id (nullptr: not fed).
std::vector<const Array*> bind_feeds(const ExecutableImpl& x, const Feeds& feeds) {
  std::vector<const Array*> by_node(x.program.graph.nodes.size(), nullptr);
  if (!x.source && !feeds.empty())
    fail<ValueError>("[run] this executable was loaded from a package and has no graph: feed its "
                     "placeholders by name");
  for (auto& [t, a] : feeds) {
    if (t.graph_impl() != x.source)
      fail<ValueError>("[run] feed for a tensor of another graph");
    bool used = false;
    for (int32_t ph : x.placeholders) {
      const Node& n = x.program.graph.nodes[ph];
      if (n.origin != t.node_id()) continue;
      check_feed(n, a, x.device);
      by_node[ph] = &a;
      used = true;
    }
    if (!used && x.source->nodes[t.node_id()].op != OpId::Placeholder)
      fail<ValueError>("[run] '{}' is a {}, not a placeholder; it cannot be fed", t.name(),
                       t.op_name());
  }
  return by_node;
}

std::vector<const Array*> bind_feeds(const ExecutableImpl& x,
                                     const std::map<std::string, Array>& feeds) {
  std::vector<const Array*> by_node(x.program.graph.nodes.size(), nullptr);
  for (auto& [name, a] : feeds) {
    bool found = false;
    for (int32_t ph : x.placeholders) {
      const Node& n = x.program.graph.nodes[ph];
      if (n.name != name) continue;
      check_feed(n, a, x.device);
      by_node[ph] = &a;
      found = true;
    }
    if (!found) {
      bool declared = false;
      // a placeholder of the source graph that the targets do not need may be fed too
      if (x.source)
        for (auto& n : x.source->nodes) declared = declared || (n.op == OpId::Placeholder && n.name == name);
      if (!declared) fail<ValueError>("[run] no placeholder named '{}'", name);
    }
  }
  return by_node;
}

// A run submitted to a queue, from submission until its handlers have been called.
struct AsyncRun {
  std::shared_ptr<ExecutableImpl> x;
  std::vector<Array> feeds;  // by program node id (invalid: not fed)
  ExecutionDescriptor desc;
  std::promise<std::vector<Array>> promise;
  bool scheduled = false;

  std::vector<const Array*> feed_pointers() const {
    std::vector<const Array*> p(feeds.size(), nullptr);
    for (size_t i = 0; i < feeds.size(); ++i)
      if (feeds[i].valid()) p[i] = &feeds[i];
    return p;
  }
  static void call(const char* which, const std::function<void()>& fn) {
    try {
      fn();
    } catch (const std::exception& e) {
      fmt::print(stderr, "[run_async] the {} handler threw: {}\n", which, e.what());
    } catch (...) {
      fmt::print(stderr, "[run_async] the {} handler threw\n", which);
    }
  }
  void mark_scheduled() {
    scheduled = true;
    for (auto& s : desc.signal_events)
      if (s.stage == Stage::scheduled) s.event.signal(s.value);
    if (desc.scheduled_handler) call("scheduled", [&] { desc.scheduled_handler(nullptr); });
  }
  void complete(std::vector<Array> outputs) {
    for (auto& s : desc.signal_events)
      if (s.stage == Stage::completed) s.event.signal(s.value);
    if (desc.completed_handler) call("completed", [&] { desc.completed_handler(outputs, nullptr); });
    promise.set_value(std::move(outputs));
  }
  // the run failed: every stage it had not reached fails with `error`
  void fail_with(std::exception_ptr error) {
    for (auto& s : desc.signal_events)
      if (s.stage == Stage::completed || !scheduled) s.event.state()->advance(s.value, error);
    if (!scheduled && desc.scheduled_handler)
      call("scheduled", [&] { desc.scheduled_handler(error); });
    if (desc.completed_handler) call("completed", [&] { desc.completed_handler({}, error); });
    promise.set_exception(error);
  }
  // on a GPU queue the waits were chained on the device: a run that failed to signal one of them
  // fails this run too
  void check_waits() const {
    for (auto& w : desc.wait_events) w.event.state()->host_wait(w.value);
  }
};

// On the queue's submission thread: waits, then the run (encoded on a GPU queue's stream, whose
// completion finishes it; executed on a CPU queue).
void start_async(const std::shared_ptr<AsyncRun>& job, Queue::Impl& q) {
  try {
    for (auto& w : job->desc.wait_events) q.wait_event(w.event, w.value);
    ExecutableImpl& x = *job->x;
    if (!x.backend) {
      job->mark_scheduled();
      std::vector<Array> outputs = run_impl(x, job->feed_pointers());
      job->complete(std::move(outputs));
      return;
    }
    Finish finish;
    std::vector<Array> outputs = run_device(x, job->feed_pointers(), q.stream, &finish);
    for (auto& s : job->desc.signal_events)
      if (s.stage == Stage::completed) s.event.state()->add_pending(s.value, *x.backend, x.device.index, q.stream);
    job->mark_scheduled();
    q.after_device([job, finish = std::move(finish), outputs = std::move(outputs)]() mutable {
      try {
        if (finish) outputs = finish();
        job->check_waits();
      } catch (...) {
        job->fail_with(std::current_exception());
        return;
      }
      job->complete(std::move(outputs));
    });
  } catch (...) {
    job->fail_with(std::current_exception());
  }
}

std::future<std::vector<Array>> submit_async(const std::shared_ptr<ExecutableImpl>& impl,
                                             Queue& queue,
                                             const std::vector<const Array*>& by_node,
                                             ExecutionDescriptor desc) {
  const ExecutableImpl& x = *impl;
  if (queue.device() != x.device)
    fail<ValueError>("[run_async] the executable runs on {} but the queue is of {}", x.device.str(),
                     queue.device().str());
  for (int32_t ph : x.placeholders)
    if (!by_node[ph])
      fail<ValueError>("[run] placeholder '{}' has no feed", x.program.graph.nodes[ph].name);
  auto job = std::make_shared<AsyncRun>();
  job->x = impl;
  job->feeds.resize(by_node.size());
  for (size_t i = 0; i < by_node.size(); ++i)
    if (by_node[i]) job->feeds[i] = *by_node[i];
  job->desc = std::move(desc);
  auto future = job->promise.get_future();
  Queue::Impl& q = queue.impl();
  q.enqueue([job, &q] { start_async(job, q); });
  return future;
}
}  // namespace

std::vector<Array> Executable::run(const Feeds& feeds) const {
  if (!impl_) fail<ValueError>("[run] empty Executable");
  return run_impl(*impl_, bind_feeds(*impl_, feeds));
}

std::vector<Array> Executable::run(const std::map<std::string, Array>& feeds) const {
  if (!impl_) fail<ValueError>("[run] empty Executable");
  return run_impl(*impl_, bind_feeds(*impl_, feeds));
}

std::future<std::vector<Array>> Executable::run_async(Queue& queue, const Feeds& feeds,
                                                      ExecutionDescriptor descriptor) const {
  if (!impl_) fail<ValueError>("[run_async] empty Executable");
  return submit_async(impl_, queue, bind_feeds(*impl_, feeds), std::move(descriptor));
}

std::future<std::vector<Array>> Executable::run_async(Queue& queue,
                                                      const std::map<std::string, Array>& feeds,
                                                      ExecutionDescriptor descriptor) const {
  if (!impl_) fail<ValueError>("[run_async] empty Executable");
  return submit_async(impl_, queue, bind_feeds(*impl_, feeds), std::move(descriptor));
}

Device Executable::device() const { return impl_->device; }
size_t Executable::peak_intermediate_bytes() const { return impl_->plan.arena_bytes; }
size_t Executable::num_steps() const { return impl_->steps.size(); }
int64_t Executable::replayed_runs() const { return impl_->replays.load(); }
std::string Executable::capture_status() const {
  auto& x = *impl_;
  if (!x.backend) return "cpu executable: runs are not recorded";
  std::lock_guard<std::mutex> l(x.arena_mu);
  if (!x.capture_off) return "not run yet";
  if (x.capture_off->empty()) return "recorded once, replayed from the second run";
  return "off: " + *x.capture_off;
}

std::vector<Executable::IoInfo> Executable::inputs() const {
  std::vector<IoInfo> r;
  for (int32_t ph : impl_->placeholders) {
    const Node& n = impl_->program.graph.nodes[ph];
    r.push_back({n.name, n.outputs[0].shape, n.outputs[0].dtype});
  }
  return r;
}

std::vector<Executable::IoInfo> Executable::outputs() const {
  std::vector<IoInfo> r;
  for (size_t k = 0; k < impl_->program.num_returned; ++k) {
    const ValueRef v = impl_->program.outputs[k];
    const Node& n = impl_->program.graph.nodes[v.node];
    const std::string& name = k < impl_->output_names.size() ? impl_->output_names[k] : n.name;
    r.push_back({name, n.outputs[v.index].shape, n.outputs[v.index].dtype});
  }
  return r;
}

std::vector<Executable::StepInfo> Executable::placement() const {
  std::vector<StepInfo> r;
  for (const Step& st : impl_->steps)
    r.push_back({st.node, op_name(impl_->program.graph.nodes[st.node].op), backend_name(st.backend),
                 st.fallback_reason});
  return r;
}

std::string Executable::report() const {
  const auto steps = placement();
  size_t fallbacks = 0;
  for (auto& s : steps) fallbacks += !s.fallback_reason.empty();
  std::ostringstream os;
  os << "device " << impl_->device.str() << ": " << steps.size() << " kernels, "
     << steps.size() - fallbacks << " on " << (impl_->backend ? "cuda" : "cpu");
  if (impl_->backend) os << ", " << fallbacks << " cpu fallbacks";
  os << "; arena " << impl_->plan.arena_bytes << " bytes\n";
  if (impl_->backend) os << "  runs as a CUDA graph: " << capture_status() << "\n";
  if (const auto& pk = impl_->package)
    os << "  loaded from " << pk->path << " (compiled for " << pk->compiled_for
       << (pk->replanned ? "; placed and planned again" : "") << ")\n";
  for (auto& s : steps)
    if (!s.fallback_reason.empty())
      os << "  cpu fallback: %" << s.node << " " << s.op << " (" << s.fallback_reason
         << "; inputs copied to the host, outputs back)\n";
  return os.str();
}

std::string Executable::dump() const {
  std::ostringstream os;
  const auto& nodes = impl_->program.graph.nodes;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    os << "%" << i << " = " << op_name(n.op) << "(";
    for (size_t j = 0; j < n.inputs.size(); ++j) os << (j ? ", " : "") << "%" << n.inputs[j].node;
    os << ")";
    for (const Step& st : impl_->steps)
      if (st.node == static_cast<int32_t>(i) && st.backend != Backend::cpu) os << " [" << backend_name(st.backend) << "]";
      else if (st.node == static_cast<int32_t>(i) && impl_->backend) os << " [cpu fallback: " << st.fallback_reason << "]";
    for (size_t o = 0; o < n.outputs.size(); ++o) {
      const ValueSlot& s = impl_->plan.slots[i][o];
      os << " -> " << name(n.outputs[o].dtype) << to_string(n.outputs[o].shape);
      if (s.where == Where::arena) os << " @arena+" << s.offset;
      else if (s.where == Where::output) os << " @output" << s.index;
    }
    os << "\n";
  }
  os << "arena: " << impl_->plan.arena_bytes << " bytes in " << impl_->plan.num_buffers
     << " buffers\n";
  return os.str();
}

}  // namespace kiln
