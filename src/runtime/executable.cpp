// Executable: running it (on the CPU or device executor, or submitted to a queue), feeds bound
// to placeholders, and what it reports about itself.
#include "kiln/executable.h"

#include <sstream>

#include "core/device_backend.h"
#include "core/errors.h"
#include "core/op_registry.h"
#include "runtime/executor.h"
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
