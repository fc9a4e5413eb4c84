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
// None is differentiable yet.
#include <algorithm>

#include "kiln/ops/transform.h"
#include "ops/common.h"
#include "ops/transform_util.h"

namespace kiln {

using namespace ops;

namespace {
const char* reduction_name(ScatterReduction r) {
  switch (r) {
    case ScatterReduction::none: return "none";
    case ScatterReduction::add: return "add";
    case ScatterReduction::mul: return "mul";
    case ScatterReduction::max: return "max";
    case ScatterReduction::min: return "min";
  }
  return "none";
}

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
  if (upd.shape != idx.shape)
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
  const int64_t depth = ctx.attrs.i("depth");
  if (depth < 0) fail<ValueError>("[one_hot] depth must be non-negative, got {}", depth);
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
}  // namespace

void register_transform_index_ops() {
  define_op(OpId::Gather).set_infer(infer_gather);
  define_op(OpId::GatherElements).set_infer(infer_gather_elements);
  define_op(OpId::ScatterElements).set_infer(infer_scatter_elements);
  define_op(OpId::OneHot).set_infer(infer_one_hot);
  define_op(OpId::Topk).set_infer(infer_topk);
  define_op(OpId::Sort).set_infer(infer_sort);
  define_op(OpId::Argsort).set_infer(infer_argsort);
  define_op(OpId::CoordinateAlongAxis).set_infer(infer_coordinate_along_axis);
  define_op(OpId::HammingDistance).set_infer(infer_hamming_distance);
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
