// Ops of the transform family that index, sort or count (layout ops live in transform.cpp).
// Index inputs take any integer dtype. Attrs:
//   gather, gather_elements:  axis. An out-of-range index is a ValueError at run time.
//   scatter_elements:         axis, reduction ("none" | "add" | "mul" | "max" | "min"); inputs
//                             x, indices, updates (updates already cast to x's dtype)
//   one_hot:                  depth, axis (of the result), dtype, on_value, off_value; an index
//                             outside [0, depth) gives a row of off_value
//   topk:                     k, axis, largest; outputs values and i64 indices
//   sort, argsort:            axis, descending (stable; NaN sorts above every number)
//   coordinate_along_axis:    axis, dtype
//   hamming_distance:         dtype
// Gradients scatter-add g back to the positions the values came from; argsort, one_hot and
// hamming_distance have integer outputs or inputs and are not differentiable.
#include <algorithm>

#include "kiln/autodiff.h"
#include "kiln/ops/core.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/transform.h"
#include "ops/common.h"
#include "ops/shape_values.h"
#include "ops/transform_params.h"
#include "ops/transform_util.h"

namespace kiln {

using namespace ops;

namespace {
int axis_attr(const InferContext& ctx, const Shape& shape) {
  return resolve_axis(ctx.name(), ctx.attrs.i("axis"), shape);
}

void require_indices(const InferContext& ctx, int input) {
  require_dtype(ctx, input, kIntTypes, "an integer dtype for indices");
}

// indices must have x's rank and fit inside x on every dim but `axis` (ONNX GatherElements).
void check_elementwise_indices(const InferContext& ctx, int axis) {
  const Shape &x = ctx.inputs[0].shape, &idx = ctx.inputs[1].shape;
  bool ok = x.size() == idx.size();
  for (size_t d = 0; ok && d < x.size(); ++d)
    ok = static_cast<int>(d) == axis || x[d] < 0 || idx[d] < 0 || idx[d] <= x[d];
  if (!ok)
    fail<ShapeError>("[{}] indices shape {} must have the rank of x shape {} and fit inside it on "
                     "every axis but {}",
                     ctx.name(), str(idx), str(x), axis);
}

std::vector<TensorInfo> infer_gather(const InferContext& ctx) {
  require_indices(ctx, 1);
  const Shape& x = ctx.inputs[0].shape;
  const int axis = axis_attr(ctx, x);
  Shape out(x.begin(), x.begin() + axis);
  out.insert(out.end(), ctx.inputs[1].shape.begin(), ctx.inputs[1].shape.end());
  out.insert(out.end(), x.begin() + axis + 1, x.end());
  return {{out, ctx.inputs[0].dtype}};
}

std::vector<TensorInfo> infer_gather_elements(const InferContext& ctx) {
  require_indices(ctx, 1);
  check_elementwise_indices(ctx, axis_attr(ctx, ctx.inputs[0].shape));
  return {{ctx.inputs[1].shape, ctx.inputs[0].dtype}};
}

std::vector<TensorInfo> infer_scatter_elements(const InferContext& ctx) {
  require_indices(ctx, 1);
  check_elementwise_indices(ctx, axis_attr(ctx, ctx.inputs[0].shape));
  const TensorInfo &x = ctx.inputs[0], &idx = ctx.inputs[1], &upd = ctx.inputs[2];
  if (!shapes_match(upd.shape, idx.shape))
    fail<ShapeError>("[scatter_elements] updates shape {} must equal indices shape {}",
                     str(upd.shape), str(idx.shape));
  if (upd.dtype != x.dtype)
    fail<DTypeError>("[scatter_elements] updates dtype {} differs from x dtype {}",
                     name(upd.dtype), name(x.dtype));
  const std::string& r = ctx.attrs.str("reduction");
  if (r != "none" && r != "add" && r != "mul" && r != "max" && r != "min")
    fail<ValueError>("[scatter_elements] unknown reduction '{}'", r);
  return {x};
}

std::vector<TensorInfo> infer_one_hot(const InferContext& ctx) {
  require_indices(ctx, 0);
  if (from_values(ctx)) require_scalar_value(ctx, 1, "depth");
  // depth from a value: dynamic until the value is written in
  const int64_t depth = from_values(ctx) ? kDynamic : ctx.attrs.i("depth");
  if (depth < 0 && !from_values(ctx))
    fail<ValueError>("[one_hot] depth must be non-negative, got {}", depth);
  Shape out = ctx.inputs[0].shape;
  out.push_back(depth);  // a placeholder dim, so the axis resolves against the result's rank
  const int axis = axis_attr(ctx, out);
  out.pop_back();
  out.insert(out.begin() + axis, depth);
  return {{out, ctx.attrs.dtype("dtype")}};
}

std::vector<TensorInfo> infer_topk(const InferContext& ctx) {
  const Shape& x = ctx.inputs[0].shape;
  const int axis = axis_attr(ctx, x);
  if (from_values(ctx)) {  // k from a value: the axis is dynamic until it is written in
    require_scalar_value(ctx, 1, "k");
    Shape out = x;
    out[axis] = kDynamic;
    return {{out, ctx.inputs[0].dtype}, {out, i64}};
  }
  const int64_t k = ctx.attrs.i("k");
  if (k < 0 || (x[axis] >= 0 && k > x[axis]))
    fail<ShapeError>("[topk] k = {} does not fit axis {} of shape {}", k, axis, str(x));
  Shape out = x;
  out[axis] = k;
  return {{out, ctx.inputs[0].dtype}, {out, i64}};
}

std::vector<TensorInfo> infer_sort(const InferContext& ctx) {
  axis_attr(ctx, ctx.inputs[0].shape);
  return {ctx.inputs[0]};
}

std::vector<TensorInfo> infer_argsort(const InferContext& ctx) {
  axis_attr(ctx, ctx.inputs[0].shape);
  return {{ctx.inputs[0].shape, i64}};
}

std::vector<TensorInfo> infer_coordinate_along_axis(const InferContext& ctx) {
  axis_attr(ctx, ctx.inputs[0].shape);
  const DType t = ctx.attrs.dtype("dtype");
  if (!kNumericTypes.has(t))
    fail<DTypeError>("[coordinate_along_axis] dtype {} is not numeric (shape {})", name(t),
                     str(ctx.inputs[0].shape));
  return {{ctx.inputs[0].shape, t}};
}

std::vector<TensorInfo> infer_hamming_distance(const InferContext& ctx) {
  const TensorInfo &a = ctx.inputs[0], &b = ctx.inputs[1];
  require_dtype(ctx, 0, kIntTypes, "an integer dtype (bit-packed)");
  require_dtype(ctx, 1, kIntTypes, "an integer dtype (bit-packed)");
  if (a.dtype != b.dtype)
    fail<DTypeError>("[hamming_distance] inputs have dtypes {} and {}", name(a.dtype),
                     name(b.dtype));
  const DType t = ctx.attrs.dtype("dtype");
  if (!(kIntTypes | DTypeSet{f32, f64}).has(t))
    fail<DTypeError>("[hamming_distance] result dtype {} must be an integer type, f32 or f64",
                     name(t));
  Shape out;
  const bool ranked = !a.shape.empty() && !b.shape.empty();
  const int64_t na = ranked ? a.shape.back() : 0, nb = ranked ? b.shape.back() : 0;
  if (!ranked || (na >= 0 && nb >= 0 && na != nb) ||
      !broadcast_shapes(Shape(a.shape.begin(), a.shape.end() - 1),
                        Shape(b.shape.begin(), b.shape.end() - 1), out))
    fail<ShapeError>("[hamming_distance] shapes {} and {} need equal last dims and broadcastable "
                     "leading dims",
                     str(a.shape), str(b.shape));
  return {{out, t}};
}

// ---- gradient rules (written with kiln ops, so they are differentiable themselves)

using Grads = std::vector<std::optional<Tensor>>;
using transform::full_on;

// take's gradient: x seen as (pre, n, post) and the indices broadcast over pre and post make it
// one scatter-add along axis 1 (repeated indices add up, negative ones count from the end).
Grads vjp_gather(const VjpContext& c) {
  const int axis = static_cast<int>(c.attrs.i("axis"));
  if (!is_static(c.inputs[0].shape()) || !is_static(c.inputs[1].shape()))
    return {transform::gather_grad(c.inputs[0], c.inputs[1], *c.cotangents[0], axis), std::nullopt};
  const Shape x = c.inputs[0].shape(), idx = c.inputs[1].shape();
  const int64_t pre = numel(Shape(x.begin(), x.begin() + axis));
  const int64_t post = numel(Shape(x.begin() + axis + 1, x.end())), taken = numel(idx);
  const Tensor g = reshape(*c.cotangents[0], {pre, taken, post});
  const Tensor at = broadcast_to(reshape(c.inputs[1], {1, taken, 1}), {pre, taken, post});
  const Tensor dx = scatter_elements(full_on(g, {pre, x[axis], post}, 0, g.dtype()), at, g, 1,
                                     ScatterReduction::add);
  return {reshape(dx, x), std::nullopt};
}

Grads vjp_gather_elements(const VjpContext& c) {
  return {scatter_elements(zeros_like(c.inputs[0]), c.inputs[1], *c.cotangents[0],
                           c.attrs.i("axis"), ScatterReduction::add),
          std::nullopt};
}

// reduction none: written-over entries of x get no gradient, and of updates with the same target
// only the one that was written last (in index order) does; it is found by scattering flat ids.
Grads vjp_scatter_none(const VjpContext& c, const Tensor& g, int64_t axis) {
  const Tensor &x = c.inputs[0], &idx = c.inputs[1], &u = c.inputs[2];
  const Tensor dx = scatter_elements(g, idx, zeros_like(u), axis);
  const Tensor ids = transform::element_ids(u);
  const Tensor last = scatter_elements(transform::full_shaped_like(x, 0, i64), idx, ids, axis);
  const Tensor won = equal(gather_elements(last, idx, axis), ids);
  return {dx, std::nullopt, where(won, gather_elements(g, idx, axis), zeros_like(u))};
}

// max/min: the gradient goes to whichever of x and the updates gave the result, split evenly
// between ties (as PyTorch's scatter_reduce amax/amin).
Grads vjp_scatter_extremum(const VjpContext& c, const Tensor& g, int64_t axis) {
  const Tensor &x = c.inputs[0], &idx = c.inputs[1], &u = c.inputs[2], &out = c.outputs[0];
  const Tensor from_x = cast(equal(x, out), x.dtype());
  const Tensor from_u = cast(equal(u, gather_elements(out, idx, axis)), x.dtype());
  const Tensor share = g / scatter_elements(from_x, idx, from_u, axis, ScatterReduction::add);
  return {share * from_x, std::nullopt, gather_elements(share, idx, axis) * from_u};
}

// mul: d out / d x is the product of the updates, scattered exactly; an update's own gradient
// divides it out again, so it is undefined (inf/nan) where that update is 0.
Grads vjp_scatter_mul(const VjpContext& c, const Tensor& g, int64_t axis) {
  const Tensor &idx = c.inputs[1], &u = c.inputs[2];
  return {scatter_elements(g, idx, u, axis, ScatterReduction::mul), std::nullopt,
          gather_elements(g * c.outputs[0], idx, axis) / u};
}

Grads vjp_scatter_elements(const VjpContext& c) {
  const Tensor& g = *c.cotangents[0];
  const int64_t axis = c.attrs.i("axis");
  const std::string& r = c.attrs.str("reduction");
  if (r == "none") return vjp_scatter_none(c, g, axis);
  if (r == "add") return {g, std::nullopt, gather_elements(g, c.inputs[1], axis)};
  if (r == "mul") return vjp_scatter_mul(c, g, axis);
  return vjp_scatter_extremum(c, g, axis);
}

// The values came from x at the indices output; the indices themselves carry no gradient.
Grads vjp_topk(const VjpContext& c) {
  return {scatter_elements(zeros_like(c.inputs[0]), c.outputs[1], *c.cotangents[0],
                           c.attrs.i("axis"), ScatterReduction::add)};
}

// sort does not output its permutation: argsort (stable, like sort) recomputes it.
Grads vjp_sort(const VjpContext& c) {
  const int64_t axis = c.attrs.i("axis");
  const Tensor perm = argsort(c.inputs[0], axis, c.attrs.b("descending"));
  return {scatter_elements(zeros_like(c.inputs[0]), perm, *c.cotangents[0], axis)};
}

// The coordinates depend on x's shape only, never on its values.
Grads vjp_coordinate_along_axis(const VjpContext&) { return {std::nullopt}; }
}  // namespace

void register_transform_index_ops() {
  define_op(OpId::Gather).set_infer(infer_gather).grad(vjp_gather).inputs(2).params<AxisParams>();
  define_op(OpId::GatherElements)
      .set_infer(infer_gather_elements)
      .grad(vjp_gather_elements)
      .inputs(2)
      .params<AxisParams>();
  define_op(OpId::ScatterElements)
      .set_infer(infer_scatter_elements)
      .grad(vjp_scatter_elements)
      .inputs(3)
      .params<ScatterParams>();
  define_op(OpId::OneHot)
      .set_infer(infer_one_hot)
      .not_differentiable()
      .inputs(1)
      .from_values({"depth"})
      .params<OneHotParams>();
  define_op(OpId::Topk)
      .set_infer(infer_topk)
      .grad(vjp_topk)
      .inputs(1)
      .from_values({"k"})
      .params<SortParams>();
  define_op(OpId::Sort).set_infer(infer_sort).grad(vjp_sort).inputs(1).params<SortParams>();
  define_op(OpId::Argsort)
      .set_infer(infer_argsort)
      .not_differentiable()
      .inputs(1)
      .params<SortParams>();
  define_op(OpId::CoordinateAlongAxis)
      .set_infer(infer_coordinate_along_axis)
      .grad(vjp_coordinate_along_axis)
      .inputs(1)
      .params<AxisParams>();
  define_op(OpId::HammingDistance).set_infer(infer_hamming_distance).not_differentiable().inputs(2);
}

Tensor gather(const Tensor& x, const Tensor& indices, int64_t axis) {
  const int a = resolve_axis("gather", axis, x.shape());
  return make_node1(OpId::Gather, {x, indices}, {{"axis", int64_t{a}}});
}

Tensor gather_elements(const Tensor& x, const Tensor& indices, int64_t axis) {
  const int a = resolve_axis("gather_elements", axis, x.shape());
  return make_node1(OpId::GatherElements, {x, indices}, {{"axis", int64_t{a}}});
}

Tensor scatter_elements(const Tensor& x, const Tensor& indices, const Tensor& updates,
                        int64_t axis, ScatterReduction reduction) {
  const int a = resolve_axis("scatter_elements", axis, x.shape());
  return make_node1(OpId::ScatterElements, {x, indices, cast_to(updates, x.dtype())},
                    {{"axis", int64_t{a}}, {"reduction", std::string(reduction_name(reduction))}});
}

Tensor one_hot(const Tensor& indices, int64_t depth, int64_t axis, DType dtype, double on_value,
               double off_value) {
  Shape out = indices.shape();
  out.push_back(depth);
  const int a = resolve_axis("one_hot", axis, out);
  return make_node1(OpId::OneHot, {indices},
                    {{"depth", depth},
                     {"axis", int64_t{a}},
                     {"dtype", dtype},
                     {"on_value", on_value},
                     {"off_value", off_value}});
}

std::pair<Tensor, Tensor> topk(const Tensor& x, int64_t k, int64_t axis, bool largest) {
  const int a = resolve_axis("topk", axis, x.shape());
  auto outs = make_node(OpId::Topk, {x}, {{"k", k}, {"axis", int64_t{a}}, {"largest", largest}});
  return {outs[0], outs[1]};
}

Tensor one_hot(const Tensor& indices, const Tensor& depth, int64_t axis, DType dtype,
               double on_value, double off_value) {
  const Tensor d = ops::count_value("one_hot", "depth", depth);
  if (const Array* v = ops::constant_value(d))
    return one_hot(indices, v->astype(i64).to_vector<int64_t>().at(0), axis, dtype, on_value,
                   off_value);
  Shape out = indices.shape();
  out.push_back(kDynamic);
  const int a = resolve_axis("one_hot", axis, out);
  return ops::node_from_values(OpId::OneHot, {indices},
                               {{"depth", int64_t{0}},
                                {"axis", int64_t{a}},
                                {"dtype", dtype},
                                {"on_value", on_value},
                                {"off_value", off_value}},
                               {d});
}

std::pair<Tensor, Tensor> topk(const Tensor& x, const Tensor& k, int64_t axis, bool largest) {
  const Tensor kv = ops::count_value("topk", "k", k);
  if (const Array* v = ops::constant_value(kv))
    return topk(x, v->astype(i64).to_vector<int64_t>().at(0), axis, largest);
  const int a = resolve_axis("topk", axis, x.shape());
  auto outs = ops::node_from_values(
      OpId::Topk, {x}, {{"k", int64_t{0}}, {"axis", int64_t{a}}, {"largest", largest}}, {kv});
  // (node_from_values gives the first output; the indices are the node's second)
  return {outs, Tensor(outs.graph_impl(), outs.node_id(), 1)};
}

Tensor sort(const Tensor& x, int64_t axis, bool descending) {
  const int a = resolve_axis("sort", axis, x.shape());
  return make_node1(OpId::Sort, {x}, {{"axis", int64_t{a}}, {"descending", descending}});
}

Tensor argsort(const Tensor& x, int64_t axis, bool descending) {
  const int a = resolve_axis("argsort", axis, x.shape());
  return make_node1(OpId::Argsort, {x}, {{"axis", int64_t{a}}, {"descending", descending}});
}

Tensor coordinate_along_axis(const Tensor& x, int64_t axis, DType dtype) {
  const int a = resolve_axis("coordinate_along_axis", axis, x.shape());
  return make_node1(OpId::CoordinateAlongAxis, {x}, {{"axis", int64_t{a}}, {"dtype", dtype}});
}

Tensor hamming_distance(const Tensor& a, const Tensor& b, DType dtype) {
  return make_node1(OpId::HammingDistance, {a, b}, {{"dtype", dtype}});
}

}  // namespace kiln
