// Reverse-mode autodiff over the graph, using each op's gradient rule (OpDef::vjp).
#include <algorithm>
#include <map>

#include "core/errors.h"
#include "core/op_registry.h"
#include "kiln/autodiff.h"
#include "kiln/ops/core.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/reduce.h"
#include "kiln/ops/transform.h"
#include "ops/common.h"

namespace kiln {

using detail::GraphImpl;
using detail::Node;
using detail::ValueRef;

Tensor VjpContext::cotangent_or_zeros(int i) const {
  return cotangents[i] ? *cotangents[i] : zeros_like(outputs[i]);
}

namespace {
// A dynamic shape makes a full node that reads x's shape (made static when shapes are
// specialized), not its data.
Tensor full_like(const Tensor& x, double v) {
  const Shape s = x.shape();
  if (!is_static(s))
    return detail::make_node1(
        OpId::Full, {x}, {{"shape", s}, {"value", v}, {"dtype", x.dtype()}, {"shape_like", true}});
  auto* g = x.graph_impl();
  return detail::make_source_node(*g, OpId::Full, {{"shape", s}, {"value", v}, {"dtype", x.dtype()}})[0];
}
}  // namespace

Tensor zeros_like(const Tensor& x) { return full_like(x, 0.0); }
Tensor ones_like(const Tensor& x) { return full_like(x, 1.0); }

namespace {
// g summed over the dims along which `shape` broadcast (keeping them as 1s) and without the
// leading dims `shape` lacks.
Tensor summed_to_rank(const Tensor& g, const Shape& shape) {
  const Shape gs = g.shape();
  if (gs.size() < shape.size())
    fail<ShapeError>("[gradients] cannot sum shape {} down to {}", str(gs), str(shape));
  const size_t lead = gs.size() - shape.size();
  std::vector<int64_t> axes;
  for (size_t i = 0; i < gs.size(); ++i)
    if (i < lead || (shape[i - lead] == 1 && gs[i] != 1)) axes.push_back(static_cast<int64_t>(i));
  Tensor r = axes.empty() ? g : sum(g, axes, /*keepdims=*/true);
  if (lead > 0) {  // (squeezed, not reshaped: dynamic dims stay as they are)
    std::vector<int64_t> leading(lead);
    for (size_t i = 0; i < lead; ++i) leading[i] = static_cast<int64_t>(i);
    r = squeeze(r, leading);
  }
  return r;
}
}  // namespace

Tensor sum_to_shape(const Tensor& g, const Shape& shape) {
  if (g.shape() == shape) return g;
  const Tensor r = summed_to_rank(g, shape);
  if (r.shape() == shape) return r;
  if (std::count(shape.begin(), shape.end(), int64_t{-1}) > 1)
    fail<ShapeError>(
        "[gradients] cannot sum a gradient of shape {} down to {}: with several dynamic dims, "
        "sum to the shape of a tensor (sum_to_shape_of)",
        str(r.shape()), str(shape));
  return reshape(r, shape);
}

Tensor sum_to_shape_of(const Tensor& g, const Tensor& like) {
  const Shape shape = like.shape();
  if (is_static(shape)) return sum_to_shape(g, shape);
  // like's shape is read when shapes are specialized: a dynamic dim that broadcast (1 at run time
  // against a larger one, which this sum does not reduce) then fails to reshape, rather than
  // giving a gradient of the wrong shape
  return ops::reshape_like(summed_to_rank(g, shape), like);
}

std::vector<Tensor> gradients(const Tensor& y, const std::vector<Tensor>& xs) {
  if (!y.valid()) fail<ValueError>("[gradients] y is an empty Tensor");
  return gradients(y, xs, ones_like(y));
}

std::vector<Tensor> gradients(const Tensor& y, const std::vector<Tensor>& xs, const Tensor& grad_y) {
  GraphImpl* g = y.graph_impl();
  if (!g) fail<ValueError>("[gradients] y is an empty Tensor");
  for (auto& x : xs)
    if (x.graph_impl() != g) fail<ValueError>("[gradients] x '{}' belongs to another graph", x.name());
  if (grad_y.graph_impl() != g || grad_y.shape() != y.shape())
    fail<ShapeError>("[gradients] grad_y of shape {} must match y of shape {} on y's graph",
                     str(grad_y.shape()), str(y.shape()));
  const int32_t count = y.node_id() + 1;  // nodes appended below are not revisited

  // nodes on a path from some x to y
  std::vector<char> from_x(count, 0), to_y(count, 0);
  for (auto& x : xs)
    if (x.node_id() < count) from_x[x.node_id()] = 1;
  for (int32_t i = 0; i < count; ++i)
    for (auto v : g->nodes[i].inputs) from_x[i] = from_x[i] || from_x[v.node];
  to_y[y.node_id()] = 1;
  for (int32_t i = count - 1; i >= 0; --i)
    if (to_y[i])
      for (auto v : g->nodes[i].inputs) to_y[v.node] = 1;

  std::map<ValueRef, Tensor> cot;
  cot[{y.node_id(), y.output_index()}] = grad_y;
  for (int32_t i = count - 1; i >= 0; --i) {
    if (!(from_x[i] && to_y[i])) continue;
    const Node node = g->nodes[i];  // a copy: rules append nodes and may move the vector
    std::vector<std::optional<Tensor>> cts(node.outputs.size());
    bool any = false;
    for (size_t o = 0; o < node.outputs.size(); ++o) {
      auto it = cot.find({i, static_cast<int32_t>(o)});
      if (it != cot.end() && is_floating(node.outputs[o].dtype)) {
        cts[o] = it->second;
        any = true;
      }
    }
    if (!any || node.inputs.empty()) continue;
    const OpDef& def = op_def(node.op);
    if (def.grad_kind != GradKind::rule)
      fail<UnsupportedError>("[gradients] op {} (node %{}{}) is not differentiable, but y depends "
                             "on x through it",
                             op_name(node.op), i, node.name.empty() ? "" : " '" + node.name + "'");
    if (layout_of(node.op, node.attrs) != Layout::plain)
      fail<UnsupportedError>(
          "[gradients] node %{} ({}) runs in layout {}, which has no gradient "
          "(the channels_last pass runs after autodiff)",
          i, op_name(node.op), layout_name(layout_of(node.op, node.attrs)));
    VjpContext ctx{node.op, node.attrs, {}, {}, std::move(cts), node.bodies};
    for (auto v : node.inputs) ctx.inputs.emplace_back(g, v.node, v.index);
    for (size_t o = 0; o < node.outputs.size(); ++o) ctx.outputs.emplace_back(g, i, static_cast<int32_t>(o));
    std::vector<std::optional<Tensor>> grads = def.vjp(ctx);
    // values an attribute is taken from (OpDef::value_attrs) are sizes: a rule may leave them out
    if (node.attrs.b("from_values", false) &&
        grads.size() + def.value_attrs.size() == node.inputs.size())
      grads.resize(node.inputs.size());
    KILN_ASSERT(grads.size() == node.inputs.size());
    for (size_t k = 0; k < grads.size(); ++k) {
      const ValueRef in = node.inputs[k];
      if (!grads[k] || !from_x[in.node] || !is_floating(g->info(in).dtype)) continue;
      Tensor gk = *grads[k];
      if (gk.shape() != g->info(in).shape)
        fail<Error>("[gradients] rule of {} gave shape {} for input {} of shape {}",
                    op_name(node.op), str(gk.shape()), k, str(g->info(in).shape));
      if (gk.dtype() != g->info(in).dtype) gk = cast(gk, g->info(in).dtype);
      auto it = cot.find(in);
      cot.insert_or_assign(in, it == cot.end() ? gk : add(it->second, gk));
    }
  }
  std::vector<Tensor> out;
  for (auto& x : xs) {
    auto it = cot.find({x.node_id(), x.output_index()});
    if (it == cot.end() && x.node_id() < count && to_y[x.node_id()]) {
      // y depends on x, but only through values that carry no gradient (indices, masks)
      for (int32_t i = x.node_id() + 1; i < count; ++i) {
        const Node& n = g->nodes[i];
        if (!(from_x[i] && to_y[i]) || n.outputs.empty() || is_floating(n.outputs[0].dtype)) continue;
        fail<UnsupportedError>("[gradients] y depends on '{}' only through {} (node %{}), whose {} "
                               "output has no gradient",
                               x.name(), op_name(n.op), i, name(n.outputs[0].dtype));
      }
    }
    out.push_back(it != cot.end() ? it->second : zeros_like(x));
  }
  return out;
}

}  // namespace kiln
