// The N-d indexing ops of the transform family (ONNX GatherND, ScatterND). Attrs:
//   gather_nd:   batch_dims; inputs x, indices (..., m)
//   scatter_nd:  reduction ("none" | "add" | "mul" | "max" | "min"); inputs x, indices (..., m),
//                updates (already cast to x's dtype)
//   assign_scatter_nd: scatter_nd's attrs and inputs, x a variable written in place
// An index tuple addresses a slice of x: component k indexes dim batch_dims + k (negative values
// count from the end). An out-of-range component is a ValueError at run time.
#include <algorithm>

#include "kiln/autodiff.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/transform.h"
#include "ops/common.h"
#include "ops/transform_params.h"
#include "ops/transform_util.h"

namespace kiln {

using namespace ops;

namespace {
// The tuple length m = indices.shape[-1], checked against x's rank past `batch`.
int64_t tuple_length(const InferContext& ctx, int64_t batch) {
  require_dtype(ctx, 1, kIntTypes, "an integer dtype for indices");
  const Shape &x = ctx.inputs[0].shape, &idx = ctx.inputs[1].shape;
  const int64_t r = static_cast<int64_t>(x.size()), q = static_cast<int64_t>(idx.size());
  if (q < 1 || batch < 0 || batch >= std::min(q, r))
    fail<ShapeError>("[{}] batch_dims {} must be below the ranks of x shape {} and indices shape "
                     "{} (indices need rank >= 1)",
                     ctx.name(), batch, str(x), str(idx));
  const int64_t m = idx.back();
  if (m < 1 || m > r - batch)
    fail<ShapeError>("[{}] the last dim of indices shape {} must be static and in [1, {}] for x "
                     "shape {} and batch_dims {}",
                     ctx.name(), str(idx), r - batch, str(x), batch);
  for (int64_t d = 0; d < batch; ++d)
    if (!dims_match(x[d], idx[d]))
      fail<ShapeError>("[{}] batch dim {} differs: x shape {}, indices shape {}", ctx.name(), d,
                       str(x), str(idx));
  return m;
}

// indices.shape[:-1] + x.shape[batch + m:]
Shape gathered_shape(const Shape& x, const Shape& idx, int64_t batch, int64_t m) {
  Shape out(idx.begin(), idx.end() - 1);
  out.insert(out.end(), x.begin() + batch + m, x.end());
  return out;
}

std::vector<TensorInfo> infer_gather_nd(const InferContext& ctx) {
  const int64_t b = ctx.attrs.i("batch_dims"), m = tuple_length(ctx, b);
  return {{gathered_shape(ctx.inputs[0].shape, ctx.inputs[1].shape, b, m), ctx.inputs[0].dtype}};
}

std::vector<TensorInfo> infer_scatter_nd(const InferContext& ctx) {
  const int64_t m = tuple_length(ctx, 0);
  const TensorInfo &x = ctx.inputs[0], &upd = ctx.inputs[2];
  const Shape want = gathered_shape(x.shape, ctx.inputs[1].shape, 0, m);
  if (!shapes_match(upd.shape, want))
    fail<ShapeError>(
        "[{}] updates shape {} must be indices.shape[:-1] + x.shape[{}:] = "
        "{} (x shape {}, indices shape {})",
        ctx.name(), str(upd.shape), m, str(want), str(x.shape), str(ctx.inputs[1].shape));
  if (upd.dtype != x.dtype)
    fail<DTypeError>("[{}] updates dtype {} differs from x dtype {}", ctx.name(), name(upd.dtype),
                     name(x.dtype));
  const std::string& r = ctx.attrs.str("reduction");
  if (r != "none" && r != "add" && r != "mul" && r != "max" && r != "min")
    fail<ValueError>("[{}] unknown reduction '{}'", ctx.name(), r);
  return {x};
}

// ---- gradient rules (written with kiln ops, so they are differentiable themselves)

using Grads = std::vector<std::optional<Tensor>>;
using transform::full_on;

// gather_nd with batch dims, as indices without them: each tuple gets its batch coordinates
// prepended (i64), so scatter_nd (which has no batch dims) can send the gradient back.
Tensor with_batch_coordinates(const VjpContext& c, int64_t batch) {
  const Tensor idx = cast_to(c.inputs[1], i64);
  if (batch == 0) return idx;
  Shape s = idx.shape();
  s.back() = 1;
  // idx's shape with a last dim of 1 (its first column where the shape is dynamic: only the
  // coordinates of its positions are read)
  const Tensor base =
      is_static(s) ? full_on(idx, s, 0, i64) : slice(idx, {0}, {1}, {}, {idx.rank() - 1});
  std::vector<Tensor> parts;
  for (int64_t d = 0; d < batch; ++d) parts.push_back(coordinate_along_axis(base, d, i64));
  parts.push_back(idx);
  return concat(parts, -1);
}

Grads vjp_gather_nd(const VjpContext& c) {
  const Tensor idx = with_batch_coordinates(c, c.attrs.i("batch_dims"));
  return {scatter_nd(zeros_like(c.inputs[0]), idx, *c.cotangents[0], ScatterReduction::add),
          std::nullopt};
}

// As scatter_elements' rules: for none, written-over entries of x get no gradient, and of updates
// with one target only the last (in index order) does, found by scattering element ids.
Grads vjp_scatter_nd_none(const VjpContext& c, const Tensor& g) {
  const Tensor &x = c.inputs[0], &idx = c.inputs[1], &u = c.inputs[2];
  const Tensor dx = scatter_nd(g, idx, zeros_like(u));
  const Tensor ids = transform::element_ids(u);
  const Tensor last = scatter_nd(transform::full_shaped_like(x, 0, i64), idx, ids);
  const Tensor won = equal(gather_nd(last, idx), ids);
  return {dx, std::nullopt, where(won, gather_nd(g, idx), zeros_like(u))};
}

Grads vjp_scatter_nd_extremum(const VjpContext& c, const Tensor& g) {
  const Tensor &x = c.inputs[0], &idx = c.inputs[1], &u = c.inputs[2], &out = c.outputs[0];
  const Tensor from_x = cast(equal(x, out), x.dtype());
  const Tensor from_u = cast(equal(u, gather_nd(out, idx)), x.dtype());
  const Tensor share = g / scatter_nd(from_x, idx, from_u, ScatterReduction::add);
  return {share * from_x, std::nullopt, gather_nd(share, idx) * from_u};
}

Grads vjp_scatter_nd(const VjpContext& c) {
  const Tensor& g = *c.cotangents[0];
  const Tensor &idx = c.inputs[1], &u = c.inputs[2];
  const std::string& r = c.attrs.str("reduction");
  if (r == "none") return vjp_scatter_nd_none(c, g);
  if (r == "add") return {g, std::nullopt, gather_nd(g, idx)};
  // mul: an update's own gradient divides it out again (undefined where it is 0)
  if (r == "mul")
    return {scatter_nd(g, idx, u, ScatterReduction::mul), std::nullopt,
            gather_nd(g * c.outputs[0], idx) / u};
  return vjp_scatter_nd_extremum(c, g);
}
}  // namespace

void register_transform_nd_ops() {
  define_op(OpId::GatherNd)
      .set_infer(infer_gather_nd)
      .grad(vjp_gather_nd)
      .inputs(2)
      .params<GatherNdParams>();
  define_op(OpId::ScatterNd)
      .set_infer(infer_scatter_nd)
      .grad(vjp_scatter_nd)
      .inputs(3)
      .params<ScatterParams>();
  define_op(OpId::AssignScatterNd)
      .set_infer(infer_scatter_nd)
      .writes_input0()
      .not_differentiable()
      .inputs(3)
      .params<ScatterParams>();
}

Tensor gather_nd(const Tensor& x, const Tensor& indices, int64_t batch_dims) {
  return make_node1(OpId::GatherNd, {x, indices}, {{"batch_dims", batch_dims}});
}

Tensor scatter_nd(const Tensor& x, const Tensor& indices, const Tensor& updates,
                  ScatterReduction reduction) {
  return make_node1(OpId::ScatterNd, {x, indices, cast_to(updates, x.dtype())},
                    {{"reduction", std::string(reduction_name(reduction))}});
}

Tensor assign_scatter_nd(const Tensor& variable, const Tensor& indices, const Tensor& updates,
                         ScatterReduction reduction) {
  if (!variable.valid() || variable.graph_impl()->nodes[variable.node_id()].op != OpId::Variable)
    fail<ValueError>(
        "[assign_scatter_nd] the first input must be a variable made by Graph::variable");
  return make_node1(OpId::AssignScatterNd, {variable, indices, cast_to(updates, variable.dtype())},
                    {{"reduction", std::string(reduction_name(reduction))}});
}

}  // namespace kiln
