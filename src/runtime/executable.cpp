// Executable: running it (on the CPU or device executor, or submitted to a queue), feeds bound
// to placeholders, and what it reports about itself.
#include "kiln/executable.h"

#include <fmt/format.h>

#include <exception>
#include <sstream>

#include "core/device_backend.h"
#include "core/errors.h"
#include "core/op_registry.h"
#include "runtime/executor.h"
#include "runtime/queue_impl.h"
#include "runtime/step_loop.h"

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

std::vector<Array> run_impl(ExecutableImpl& x, const std::vector<const Array*>& feed_by_node) {
  return x.backend ? run_device(x, feed_by_node) : run_cpu(x, feed_by_node);
}
}  // namespace

namespace detail {
ExecutableImpl::~ExecutableImpl() {
  print_step_times(*this);
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
      std::vector<Array> outputs = run_cpu(x, job->feed_pointers());
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
