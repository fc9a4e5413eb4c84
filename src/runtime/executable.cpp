// Executable: running it (on the CPU or device executor, or submitted to a queue), feeds bound
// to placeholders, and what it reports about itself.
#include "kiln/executable.h"

#include <sstream>

#include "core/device_backend.h"
#include "core/dim_specs.h"
#include "core/errors.h"
#include "core/op_registry.h"
#include "runtime/executor.h"
#include "runtime/shape_cache.h"
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
  bool fits = a.shape().size() == want.shape.size();
  for (size_t d = 0; fits && d < want.shape.size(); ++d)
    fits = want.shape[d] < 0 || want.shape[d] == a.shape()[d];
  if (!fits)
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

}  // namespace

namespace {
// A dynamic executable runs the specialization for the feeds' shapes (compiled on a miss).
std::vector<Array> run_bound(const std::shared_ptr<ExecutableImpl>& x,
                             const std::vector<const Array*>& feed_by_node) {
  if (!x->dynamic) return run_impl(*x, feed_by_node);
  const auto b = x->dynamic->bind(*x, feed_by_node);
  return b.cut(run_impl(*b.impl, b.feed_by_node));
}
std::future<std::vector<Array>> submit_bound(const std::shared_ptr<ExecutableImpl>& x, Queue& queue,
                                             const std::vector<const Array*>& feed_by_node,
                                             ExecutionDescriptor descriptor) {
  if (!x->dynamic) return submit_async(x, queue, feed_by_node, std::move(descriptor));
  auto b = std::make_shared<detail::ShapeCache::Bound>(x->dynamic->bind(*x, feed_by_node));
  auto run = submit_async(b->impl, queue, b->feed_by_node, std::move(descriptor));
  if (b->cuts.empty() && b->padded.empty()) return run;
  // (the padded feeds live until the run's outputs are taken)
  return std::async(std::launch::deferred,
                    [b, run = std::move(run)]() mutable { return b->cut(run.get()); });
}
}  // namespace

std::vector<Array> Executable::run(const Feeds& feeds) const {
  if (!impl_) fail<ValueError>("[run] empty Executable");
  return run_bound(impl_, bind_feeds(*impl_, feeds));
}

std::vector<Array> Executable::run(const std::map<std::string, Array>& feeds) const {
  if (!impl_) fail<ValueError>("[run] empty Executable");
  return run_bound(impl_, bind_feeds(*impl_, feeds));
}

std::future<std::vector<Array>> Executable::run_async(Queue& queue, const Feeds& feeds,
                                                      ExecutionDescriptor descriptor) const {
  if (!impl_) fail<ValueError>("[run_async] empty Executable");
  return submit_bound(impl_, queue, bind_feeds(*impl_, feeds), std::move(descriptor));
}

std::future<std::vector<Array>> Executable::run_async(Queue& queue,
                                                      const std::map<std::string, Array>& feeds,
                                                      ExecutionDescriptor descriptor) const {
  if (!impl_) fail<ValueError>("[run_async] empty Executable");
  return submit_bound(impl_, queue, bind_feeds(*impl_, feeds), std::move(descriptor));
}

namespace {
// What the plan accessors describe: the executable, or a dynamic one's specialization run last
// (the front, with no steps, before the first run). Held so that an eviction cannot free it.
std::shared_ptr<const ExecutableImpl> shown(const std::shared_ptr<ExecutableImpl>& x) {
  if (x->dynamic)
    if (auto last = x->dynamic->last()) return last;
  return x;
}
}  // namespace

Device Executable::device() const { return impl_->device; }
size_t Executable::peak_intermediate_bytes() const { return shown(impl_)->plan.arena_bytes; }
size_t Executable::num_steps() const { return shown(impl_)->steps.size(); }
int64_t Executable::replayed_runs() const { return shown(impl_)->replays.load(); }
std::string Executable::capture_status() const {
  const auto keep = shown(impl_);
  auto& x = const_cast<ExecutableImpl&>(*keep);
  if (!x.backend) return "cpu executable: runs are not recorded";
  std::lock_guard<std::mutex> l(x.arena_mu);
  if (!x.capture_off) return "not run yet";
  if (x.capture_off->empty()) return "recorded once, replayed from the second run";
  return "off: " + *x.capture_off;
}
bool Executable::is_dynamic() const { return impl_ && impl_->dynamic; }
Executable::ShapeCacheStats Executable::shape_cache() const {
  return impl_ && impl_->dynamic ? impl_->dynamic->stats() : ShapeCacheStats{};
}

std::vector<Executable::IoInfo> Executable::inputs() const {
  std::vector<IoInfo> r;
  for (int32_t ph : impl_->placeholders) {
    const Node& n = impl_->program.graph.nodes[ph];
    r.push_back({n.name, n.outputs[0].shape, n.outputs[0].dtype,
                 detail::dim_specs(n.attrs, n.outputs[0].shape.size())});
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
  const auto x = shown(impl_);
  std::vector<StepInfo> r;
  for (const Step& st : x->steps)
    r.push_back({st.node, op_name(x->program.graph.nodes[st.node].op), backend_name(st.backend),
                 st.fallback_reason});
  return r;
}

std::string Executable::report() const {
  const auto steps = placement();
  size_t fallbacks = 0;
  for (auto& s : steps) fallbacks += !s.fallback_reason.empty();
  std::ostringstream os;
  if (impl_->dynamic) {
    const ShapeCacheStats c = shape_cache();
    os << "dynamic inputs:";
    for (const IoInfo& in : inputs()) os << " " << in.name << to_string(in.shape);
    os << "\n  specializations: " << c.entries << " held (" << c.bytes << " bytes; bounds "
       << c.max_entries << " and " << c.max_bytes << " bytes, 0 = none; peak " << c.peak_bytes
       << "), " << c.hits << " hits, " << c.misses << " misses, " << c.evictions << " evictions\n"
       << "  passes: "
       << (c.symbolic ? "once, on the symbolic program (" + std::to_string(c.symbolic_misses) +
                            " misses specialized from it)\n"
                      : "again for each shape (" + c.not_symbolic + ")\n");
    if (!c.entries) return os.str();
    os << "  the one run last: ";
  }
  os << "device " << impl_->device.str() << ": " << steps.size() << " kernels, "
     << steps.size() - fallbacks << " on " << (impl_->backend ? "cuda" : "cpu");
  if (impl_->backend) os << ", " << fallbacks << " cpu fallbacks";
  os << "; arena " << peak_intermediate_bytes() << " bytes\n";
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
  const auto keep = shown(impl_);
  const ExecutableImpl& x = *keep;
  if (x.steps.empty() && impl_->dynamic) os << "(dynamic; no specialization run yet)\n";
  const auto& nodes = x.program.graph.nodes;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    os << "%" << i << " = " << op_name(n.op) << "(";
    for (size_t j = 0; j < n.inputs.size(); ++j) os << (j ? ", " : "") << "%" << n.inputs[j].node;
    os << ")";
    for (const Step& st : x.steps)
      if (st.node == static_cast<int32_t>(i) && st.backend != Backend::cpu) os << " [" << backend_name(st.backend) << "]";
      else if (st.node == static_cast<int32_t>(i) && x.backend)
        os << " [cpu fallback: " << st.fallback_reason << "]";
    for (size_t o = 0; o < n.outputs.size(); ++o) {
      os << " -> " << name(n.outputs[o].dtype) << to_string(n.outputs[o].shape);
      if (i >= x.plan.slots.size()) continue;  // a dynamic executable before its first run
      const ValueSlot& s = x.plan.slots[i][o];
      if (s.where == Where::arena) os << " @arena+" << s.offset;
      else if (s.where == Where::output) os << " @output" << s.index;
    }
    os << "\n";
  }
  os << "arena: " << x.plan.arena_bytes << " bytes in " << x.plan.num_buffers << " buffers\n";
  return os.str();
}

}  // namespace kiln
