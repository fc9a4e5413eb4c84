// Graph::compile: extract, specialize shapes, autocast, optimize, place, plan memory.
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <string>
#include <unordered_map>

#include "core/device_backend.h"
#include "core/errors.h"
#include "core/op_registry.h"
#include "ops/control_ops.h"
#include "ops/fused_elementwise.h"
#include "runtime/control.h"
#include "runtime/custom_op.h"
#include "runtime/env.h"
#include "runtime/executable_impl.h"
#include "runtime/profiler.h"
#include "runtime/run_kernel.h"
#include "runtime/shape_cache.h"

namespace kiln {

using detail::Node;
using detail::ValueRef;

namespace {
void run_pass(Program& p, const char* name, const std::function<Program(const Program&)>& pass) {
  prof::HostScope span(SpanKind::compile, name);
  p = pass(p);
#ifndef NDEBUG
  verify_program(p, name);
#else
  (void)name;
#endif
}
// " in layout L" for the kernel lookups of nodes in another layout than plain.
std::string in_layout(Layout layout) {
  return layout == Layout::plain ? "" : fmt::format(" in layout {}", layout_name(layout));
}
}  // namespace

// Placement: each executed node runs on the device's backend when it has a kernel for the
// node's dtype, else on the CPU with copies around it (marked with the reason), unless the
// options forbid fallbacks.
void place(const Program& p, Device device, bool strict, detail::ExecutableImpl& impl) {
  const Backend target = backend_for(device);
  for (size_t i = 0; i < p.graph.nodes.size(); ++i) {
    const Node& n = p.graph.nodes[i];
    const auto id = static_cast<int32_t>(i);
    if (n.op == OpId::Placeholder) {
      impl.placeholders.push_back(id);
      continue;
    }
    if (n.op == OpId::Constant || n.op == OpId::Variable) continue;
    std::vector<TensorInfo> in;
    for (auto v : n.inputs) in.push_back(p.graph.info(v));
    std::string reason;
    const Layout layout = layout_of(n.op, n.attrs);
    if (target != Backend::cpu) {
      const KernelEntry* k = find_kernel(n.op, target, layout);
      // custom ops: whether the node's own op has a kernel here (runtime/custom_op.h)
      const bool custom_ok = detail::node_has_kernel(n, target);
      if (k && k->handles(kernel_dtype(*k, n, in)) && custom_ok) {
        impl.steps.push_back({id, k, target, {}});
        impl.reports_errors = impl.reports_errors || k->reports_errors;
        continue;
      }
      if (!custom_ok)
        reason = fmt::format("custom op '{}' has no {} kernel",
                             n.attrs.str(detail::kCustomOpKey, ""), backend_name(target));
      else
        reason = k ? fmt::format("no {} kernel for dtype {}", backend_name(target),
                                 name(kernel_dtype(*k, n, in)))
                   : fmt::format("no {} kernel{}", backend_name(target), in_layout(layout));
      if (strict)
        fail<UnsupportedError>("[compile] op {} (node %{}) cannot run on {}: {}, and "
                               "strict_placement forbids the cpu fallback",
                               op_name(n.op), i, device.str(), reason);
      // the fallback writes the variable through host copies only for inputs, so assignments
      // must run on the device
      if (op_def(n.op).writes_variable)
        fail<UnsupportedError>("[compile] {} (node %{}) cannot run on {}: {}", op_name(n.op), i,
                               device.str(), reason);
    }
    const KernelEntry* k = find_kernel(n.op, Backend::cpu, layout);
    if (!k || !detail::node_has_kernel(n, Backend::cpu))
      fail<UnsupportedError>(
          "[compile] op {}{} (node %{}) has no cpu kernel{}", op_name(n.op),
          detail::is_custom(n.op) ? " " + n.attrs.str(detail::kCustomOpKey, "") : "", i,
          in_layout(layout));
    const DType t = kernel_dtype(*k, n, in);
    if (!k->handles(t))
      fail<UnsupportedError>("[{}] no cpu kernel for dtype {} (node %{})", op_name(n.op), name(t), i);
    impl.steps.push_back({id, k, Backend::cpu, reason});
  }
}

void attach_program(detail::ExecutableImpl& impl, Program p) {
  // constants live on the device; variables move to the device of the executable that runs
  impl.variables.clear();
  for (size_t i = 0; i < p.graph.nodes.size(); ++i) {
    Node& n = p.graph.nodes[i];
    if (n.op == OpId::Constant) n.value = n.value.to(impl.device);
    else if (n.op == OpId::Variable) impl.variables.push_back(static_cast<int32_t>(i));
    // decoded here, after every pass, once for all the runs of the executable
    const OpDef& def = op_def(n.op);
    n.params = def.decode ? def.decode(n.op, n.attrs) : nullptr;
    if (num_bodies(n.op) > 0) n.params = detail::compile_bodies(p, n, impl);
  }
  impl.program = std::move(p);
  if (impl.options.num_threads > 0) {
    impl.own_pool = std::make_unique<ThreadPool>(impl.options.num_threads);
    impl.pool = impl.own_pool.get();
  } else {
    impl.pool = &ThreadPool::global();
  }
}

namespace {
// The fused elementwise kernels of `impl`'s steps, compiled side by side on the CPU's threads
// (each its own NVRTC program: BERT-base's first compile spent 1.4 s in them one after another).
// Nodes alike (the same program on the same inputs: every layer of a transformer) share a
// kernel, so the first of each kind go first and the threads take them as they come; the others
// then find their kernel compiled.
void compile_generated_kernels(const Program& p, const detail::ExecutableImpl& impl,
                               Device device) {
  std::vector<std::pair<fused::PrepareFn, const Node*>> kernels, alike;
  // a node's kind: its attributes and its inputs' shapes and dtypes (by hash, then compared)
  std::unordered_multimap<size_t, const Node*> kinds;
  auto same_kind = [&p](const Node& a, const Node& b) {
    if (a.inputs.size() != b.inputs.size() || !(a.attrs == b.attrs)) return false;
    for (size_t k = 0; k < a.inputs.size(); ++k) {
      const TensorInfo &x = p.graph.info(a.inputs[k]), &y = p.graph.info(b.inputs[k]);
      if (x.shape != y.shape || x.dtype != y.dtype) return false;
    }
    return true;
  };
  for (const Step& st : impl.steps) {
    const Node& n = p.graph.nodes[st.node];
    if (n.op != OpId::FusedElementwise) continue;
    const fused::PrepareFn prep = fused::prepare(st.backend);
    if (!prep) continue;
    size_t h = n.attrs.hash();
    for (auto v : n.inputs) {
      const TensorInfo& t = p.graph.info(v);
      for (int64_t d : t.shape) h = h * 1000003u ^ static_cast<size_t>(d);
      h = h * 1000003u ^ static_cast<size_t>(t.dtype);
    }
    const auto [first, last] = kinds.equal_range(h);
    const bool seen =
        std::any_of(first, last, [&](const auto& e) { return same_kind(*e.second, n); });
    if (!seen) kinds.emplace(h, &n);
    (seen ? alike : kernels).emplace_back(prep, &n);
  }
  kernels.insert(kernels.end(), alike.begin(), alike.end());
  std::atomic<size_t> next{0};
  ThreadPool& pool = ThreadPool::global();
  pool.parallel_for(std::min<int64_t>(pool.size(), static_cast<int64_t>(kernels.size())), 1,
                    [&](int64_t, int64_t) {
                      for (size_t k; (k = next++) < kernels.size();) {
                        const Node& n = *kernels[k].second;
                        std::vector<TensorInfo> in;
                        for (auto v : n.inputs) in.push_back(p.graph.info(v));
                        kernels[k].first(n.attrs, in, n.outputs[0], device.index, impl.many_shapes);
                      }
                    });
}
}  // namespace

void optimize_for_any_shape(Program& p, const CompileOptions& o, const NodeEvaluator& fold) {
  // int8 products first: before autocast would cast their float inputs, and before folding
  // would turn dequantized constant weights into f32 constants
  if (o.optimize && o.fuse_quant) run_pass(p, "fuse_quant", fuse_quant);
  // before folding, so the casts of constant weights fold; batch norms fold into their
  // convolutions first (autocast's casts would stand between them)
  if (const auto low = o.autocast) {
    if (o.optimize) {
      run_pass(p, "constant_folding", [&](const Program& q) { return fold_constants(q, fold); });
      run_pass(p, "fold_batch_norms", fold_batch_norms);
      run_pass(p, "fuse_attention", fuse_attention);  // (so that the attention runs low too)
      run_pass(p, "recognize_gelu", recognize_gelu);
    }
    run_pass(p, "autocast", [low](const Program& q) { return autocast(q, *low); });
  }
  if (o.optimize) {
    run_pass(p, "constant_folding", [&](const Program& q) { return fold_constants(q, fold); });
    run_pass(p, "fold_batch_norms", fold_batch_norms);
    run_pass(p, "fuse_attention", fuse_attention);
    run_pass(p, "recognize_gelu", recognize_gelu);
    run_pass(p, "hoist_casts", hoist_casts);
    run_pass(p, "cse", eliminate_common_subexpressions);
    run_pass(p, "dce", eliminate_dead_code);
  }
  if (o.allow_tf32) run_pass(p, "allow_tf32", allow_tf32);
}

namespace {
bool any_node(const Program& p, std::initializer_list<OpId> ops) {
  for (const Node& n : p.graph.nodes)
    if (std::find(ops.begin(), ops.end(), n.op) != ops.end()) return true;
  return false;
}
bool fuses(const CompileOptions& o) {
  return o.optimize && o.fuse_elementwise && env::fusion_enabled();
}
}  // namespace

bool fuse_for_any_shape(Program& p, const CompileOptions& o, Device device) {
  const Backend target = backend_for(device);
  // the passes that must see the program before fusion: channels_last (its choice depends on
  // the sizes), order_assignments, schedule_collectives, and on the CPU the convolutions' and
  // products' epilogues
  if (!fuses(o) ||
      any_node(p,
               {OpId::Assign, OpId::AssignSlice, OpId::AllReduce, OpId::Conv, OpId::ConvTranspose,
                OpId::ConvGradWeight, OpId::QuantizedConv, OpId::FusedConv}) ||
      (target == Backend::cpu && any_node(p, {OpId::Matmul, OpId::Linear, OpId::FusedMatmul})))
    return false;
  if (has_identity_broadcasts(p)) run_pass(p, "drop_identity_broadcasts", drop_identity_broadcasts);
  run_pass(p, "fuse_elementwise_chains",
           [target](const Program& q) { return fuse_elementwise(q, target, FusePhases::chains); });
  return true;
}

std::shared_ptr<detail::ExecutableImpl> compile_optimized(
    Program p, Device device, const CompileOptions& o,
    const std::function<void(Program&)>& before_attach, bool many_shapes, bool chains_fused) {
  DeviceBackend* backend = backend_of(device);  // throws when the device is not there
  auto impl = std::make_shared<detail::ExecutableImpl>();
  impl->device = device;
  impl->options = o;
  impl->many_shapes = many_shapes;
  // int8 convolutions run on NHWC (without reorders on the CPU, with contiguous im2col rows on
  // CUDA), and so do f16/bf16 inference convolutions on CUDA (cuDNN's tensor-core layout)
  // (each pass copies the program: passes that would change nothing are not run, which a new
  // shape of a dynamic executable feels)
  if (o.optimize && o.kernels.channels_last && channels_last_applies(p, backend_for(device))) {
    run_pass(p, "channels_last",
             [&device](const Program& q) { return channels_last(q, backend_for(device)); });
    // the weights it permuted at compile time replace the originals: neither device memory nor
    // a package keeps both
    run_pass(p, "dce", eliminate_dead_code);
  }
  auto any = [&p](OpId op) { return any_node(p, {op}); };
  if (o.optimize && has_identity_broadcasts(p))
    run_pass(p, "drop_identity_broadcasts", drop_identity_broadcasts);
  if (any(OpId::AllReduce)) run_pass(p, "schedule_collectives", schedule_collectives);
  if (any(OpId::Assign) || any(OpId::AssignSlice))
    run_pass(p, "order_assignments", order_assignments);
  // (before fuse_elementwise, which would take a conv's add and relu into a chain of their own)
  const bool fuse = fuses(o);
  const bool cpu = backend_for(device) == Backend::cpu;
  if (o.optimize && cpu && (any(OpId::Conv) || any(OpId::FusedConv)))
    run_pass(p, "prepare_cpu_convs",
             [fuse](const Program& q) { return prepare_cpu_convs(q, fuse); });
  if (o.optimize && cpu && any(OpId::MaxPool))
    run_pass(p, "drop_unread_pool_indices", drop_unread_pool_indices);
  const bool products = any(OpId::Matmul) || any(OpId::Linear);
  // (before fuse_elementwise, which would take a product's bias add and activation)
  if (fuse && cpu && products) run_pass(p, "fuse_cpu_matmul_epilogues", fuse_cpu_matmul_epilogues);
  if (o.optimize && cpu && (products || any(OpId::FusedMatmul)))
    run_pass(p, "mark_cpu_const_weights", mark_cpu_const_weights);
  if (fuse)
    run_pass(p, chains_fused ? "group_small_values" : "fuse_elementwise",
             [&device, chains_fused](const Program& q) {
               return fuse_elementwise(q, backend_for(device),
                                       chains_fused ? FusePhases::small_groups : FusePhases::all);
             });
  {
    prof::HostScope phase(SpanKind::compile, "placement");
    place(p, device, o.strict_placement, *impl);
  }
  // generated kernels compile now, so no run waits for them
  {
    prof::HostScope phase(SpanKind::compile, "generated kernels (NVRTC)");
    compile_generated_kernels(p, *impl, device);
  }
  {
    prof::HostScope phase(SpanKind::compile, "plan_memory");
    impl->plan = plan_memory(p, {o.plan_memory, o.in_place, cpu});
  }
  impl->backend = backend;
  {
    prof::HostScope phase(SpanKind::compile, "constants to the device");
    if (before_attach) before_attach(p);
    attach_program(*impl, std::move(p));
  }
  return impl;
}

std::shared_ptr<detail::ExecutableImpl> compile_program(
    Program p, Device device, const CompileOptions& o,
    const std::vector<std::pair<int32_t, Shape>>& shapes,
    const std::function<void(Program&)>& before_attach, NodeEvaluator fold) {
  if (!fold) fold = evaluate_node_cpu;
  backend_of(device);  // throws when the device is not there
  {
    prof::HostScope phase(SpanKind::compile, "specialize_shapes");
    specialize_shapes(p, shapes, /*allow_dynamic=*/false, &fold);
  }
  optimize_for_any_shape(p, o, fold);
  return compile_optimized(std::move(p), device, o, before_attach);
}

Executable Graph::compile(Device device, const FeedShapes& feeds,
                          const std::vector<Tensor>& targets, const CompileOptions& options) const {
  return compile(device, feeds, targets, Updates{}, options);
}

Executable Graph::compile(Device device, const FeedShapes& feeds,
                          const std::vector<Tensor>& targets, const Updates& update_ops,
                          const CompileOptions& options) const {
  const std::vector<Tensor>& updates = update_ops.ops;
  if (targets.empty() && updates.empty()) fail<ValueError>("[compile] no targets given");
  if (options.autocast && *options.autocast != f16 && *options.autocast != bf16)
    fail<ValueError>("[compile] autocast takes f16 or bf16, got {}", name(*options.autocast));
  backend_of(device);  // throws when the device is not there
  std::vector<ValueRef> outs;
  for (const auto* list : {&targets, &updates})
    for (size_t i = 0; i < list->size(); ++i) {
      const Tensor& t = (*list)[i];
      if (t.graph_impl() != impl_.get())
        fail<ValueError>("[compile] {} {} belongs to another graph",
                         list == &targets ? "target" : "update", i);
      outs.push_back({t.node_id(), t.output_index()});
    }
  std::vector<std::pair<int32_t, Shape>> shapes;
  for (auto& [t, s] : feeds) {
    if (t.graph_impl() != impl_.get())
      fail<ValueError>("[compile] feed shape given for a tensor of another graph");
    if (impl_->nodes[t.node_id()].op != OpId::Placeholder)
      fail<ValueError>("[compile] feed shape given for '{}', which is a {} and not a placeholder",
                       t.name(), t.op_name());
    shapes.emplace_back(t.node_id(), s);
  }

  prof::HostScope span(SpanKind::compile, "compile", prof::on() ? "for " + device.str() : "");
  CompileOptions o = options;
  o.deterministic = options.deterministic || env::deterministic();
  env::override_kernel_choices(o.kernels);
  Program p = extract_program(*impl_, outs);
  p.num_returned = targets.size();
  // a named dim fixed by one feed shape is fixed in every placeholder that shares it
  shapes = detail::InputDims(p).complete(shapes);
  const NodeEvaluator eval = evaluate_node_cpu;
  if (!specialize_shapes(p, shapes, /*allow_dynamic=*/true, &eval))
    return Executable(detail::make_dynamic(std::move(p), device, o, impl_.get()));
  auto impl = compile_program(std::move(p), device, o, {});
  impl->source = impl_.get();
  return Executable(std::move(impl));
}

}  // namespace kiln
