// Reductions. Builders resolve axes (sorted, non-negative, de-duplicated) before making nodes.
//   sum, mean, max, min, prod, logsumexp, norm_l1, norm_l2: axes (ints), keepdims (bool)
//   variance: axes, keepdims, correction (int)
//   argmax, argmin: axis (int), keepdims (bool); output i64
//   cumsum: axis (int), exclusive (bool), reverse (bool)
// Dtypes: sum/prod/cumsum keep the input dtype (bool becomes i64 in the builder); mean, variance,
// logsumexp and the norms need a float dtype; max/min/argmax/argmin take any dtype. Max, min,
// argmax and argmin have no identity, so an empty reduction is an error; sum of nothing is 0,
// prod of nothing 1.
#include "kiln/ops/reduce.h"

#include "kiln/ops/elementwise.h"
#include "kiln/ops/transform.h"
#include "ops/common.h"

namespace kiln {

using namespace ops;

namespace {
// Checks attribute axes against the input rank (attrs may come from a package, not a builder).
void check_axes(const InferContext& ctx, const std::vector<int64_t>& axes) {
  const Shape& s = ctx.inputs[0].shape;
  for (int64_t a : axes)
    if (a < 0 || a >= static_cast<int64_t>(s.size()))
      fail<ValueError>("[{}] axis {} is out of range for shape {}", ctx.name(), a, str(s));
}

Shape reduced_shape(const Shape& in, const std::vector<int64_t>& axes, bool keepdims) {
  Shape out;
  size_t k = 0;
  for (size_t d = 0; d < in.size(); ++d) {
    const bool reduced = k < axes.size() && axes[k] == static_cast<int64_t>(d);
    if (reduced) ++k;
    if (!reduced) out.push_back(in[d]);
    else if (keepdims) out.push_back(1);
  }
  return out;
}

// Max, min, argmax and argmin have no identity: reducing nothing into a non-empty output fails.
void require_nonempty(const InferContext& ctx, const std::vector<int64_t>& axes,
                      const Shape& out) {
  const Shape& in = ctx.inputs[0].shape;
  if (!is_static(in) || numel(out) == 0) return;
  for (int64_t a : axes)
    if (in[a] == 0)
      fail<ValueError>("[{}] cannot reduce over empty axis {} of shape {}: {} has no identity",
                       ctx.name(), a, str(in), ctx.name());
}

std::vector<TensorInfo> infer_reduce(const InferContext& ctx, DTypeSet ok, const char* what) {
  require_dtype(ctx, 0, ok, what);
  const auto& axes = ctx.attrs.ints("axes");
  check_axes(ctx, axes);
  return {{reduced_shape(ctx.inputs[0].shape, axes, ctx.attrs.b("keepdims")),
           ctx.inputs[0].dtype}};
}
std::vector<TensorInfo> infer_reduce_numeric(const InferContext& ctx) {
  return infer_reduce(ctx, kNumericTypes, "a numeric dtype");
}
std::vector<TensorInfo> infer_reduce_float(const InferContext& ctx) {
  return infer_reduce(ctx, kFloatTypes, "a float dtype");
}
std::vector<TensorInfo> infer_reduce_extreme(const InferContext& ctx) {
  auto out = infer_reduce(ctx, kAllTypes, "any dtype");
  require_nonempty(ctx, ctx.attrs.ints("axes"), out[0].shape);
  return out;
}
std::vector<TensorInfo> infer_variance(const InferContext& ctx) {
  if (ctx.attrs.i("correction") < 0)
    fail<ValueError>("[variance] correction must be >= 0, got {} (shape {})",
                     ctx.attrs.i("correction"), str(ctx.inputs[0].shape));
  return infer_reduce_float(ctx);
}
std::vector<TensorInfo> infer_arg(const InferContext& ctx) {
  const std::vector<int64_t> axes{ctx.attrs.i("axis")};
  check_axes(ctx, axes);
  Shape out = reduced_shape(ctx.inputs[0].shape, axes, ctx.attrs.b("keepdims"));
  require_nonempty(ctx, axes, out);
  return {{out, i64}};
}
std::vector<TensorInfo> infer_cumsum(const InferContext& ctx) {
  require_dtype(ctx, 0, kNumericTypes, "a numeric dtype");
  check_axes(ctx, {ctx.attrs.i("axis")});
  return {ctx.inputs[0]};
}

// Sum-like ops of bool count in i64, as numpy does.
Tensor widen_bool(const Tensor& x) { return x.dtype() == boolean ? cast(x, i64) : x; }

// ---- gradient rules ----

using Grads = std::vector<std::optional<Tensor>>;

// The cotangent of a reduction reshaped to keepdims form and broadcast back to the input.
Tensor expand_back(const VjpContext& c, const Tensor& g) {
  const Shape in = c.inputs[0].shape();
  Shape kept = reduced_shape(in, c.attrs.ints("axes"), /*keepdims=*/true);
  Tensor k = g.shape() == kept ? g : reshape(g, kept);
  return broadcast_to(k, in);
}
Grads vjp_sum(const VjpContext& c) { return {expand_back(c, *c.cotangents[0])}; }

Tensor reduce(OpId op, const Tensor& x, const Axes& axes, bool keepdims) {
  auto resolved = resolve_axes(op_name(op), axes, x.shape());
  return make_node1(op, {x}, {{"axes", resolved}, {"keepdims", keepdims}});
}
Tensor arg_reduce(OpId op, const Tensor& x, int64_t axis, bool keepdims) {
  int64_t a = resolve_axis(op_name(op), axis, x.shape());
  return make_node1(op, {x}, {{"axis", a}, {"keepdims", keepdims}});
}
}  // namespace

void register_reduce_ops() {
  define_op(OpId::Sum).set_infer(infer_reduce_numeric).grad(vjp_sum);
  define_op(OpId::Prod).set_infer(infer_reduce_numeric);
  define_op(OpId::Mean).set_infer(infer_reduce_float);
  define_op(OpId::Logsumexp).set_infer(infer_reduce_float);
  define_op(OpId::NormL1).set_infer(infer_reduce_float);
  define_op(OpId::NormL2).set_infer(infer_reduce_float);
  define_op(OpId::Max).set_infer(infer_reduce_extreme);
  define_op(OpId::Min).set_infer(infer_reduce_extreme);
  define_op(OpId::Variance).set_infer(infer_variance);
  define_op(OpId::Argmax).set_infer(infer_arg);
  define_op(OpId::Argmin).set_infer(infer_arg);
  define_op(OpId::Cumsum).set_infer(infer_cumsum);
}

Tensor sum(const Tensor& x, const Axes& axes, bool keepdims) {
  return reduce(OpId::Sum, widen_bool(x), axes, keepdims);
}
Tensor prod(const Tensor& x, const Axes& axes, bool keepdims) {
  return reduce(OpId::Prod, widen_bool(x), axes, keepdims);
}
Tensor mean(const Tensor& x, const Axes& axes, bool keepdims) {
  return reduce(OpId::Mean, x, axes, keepdims);
}
Tensor max(const Tensor& x, const Axes& axes, bool keepdims) {
  return reduce(OpId::Max, x, axes, keepdims);
}
Tensor min(const Tensor& x, const Axes& axes, bool keepdims) {
  return reduce(OpId::Min, x, axes, keepdims);
}
Tensor logsumexp(const Tensor& x, const Axes& axes, bool keepdims) {
  return reduce(OpId::Logsumexp, x, axes, keepdims);
}
Tensor norm_l1(const Tensor& x, const Axes& axes, bool keepdims) {
  return reduce(OpId::NormL1, x, axes, keepdims);
}
Tensor norm_l2(const Tensor& x, const Axes& axes, bool keepdims) {
  return reduce(OpId::NormL2, x, axes, keepdims);
}
Tensor variance(const Tensor& x, const Axes& axes, bool keepdims, int64_t correction) {
  auto resolved = resolve_axes("variance", axes, x.shape());
  return make_node1(OpId::Variance, {x},
                    {{"axes", resolved}, {"keepdims", keepdims}, {"correction", correction}});
}
Tensor argmax(const Tensor& x, int64_t axis, bool keepdims) {
  return arg_reduce(OpId::Argmax, x, axis, keepdims);
}
Tensor argmin(const Tensor& x, int64_t axis, bool keepdims) {
  return arg_reduce(OpId::Argmin, x, axis, keepdims);
}
Tensor cumsum(const Tensor& x, int64_t axis, bool exclusive, bool reverse) {
  Tensor w = widen_bool(x);
  int64_t a = resolve_axis("cumsum", axis, w.shape());
  return make_node1(OpId::Cumsum, {w},
                    {{"axis", a}, {"exclusive", exclusive}, {"reverse", reverse}});
}

}  // namespace kiln
