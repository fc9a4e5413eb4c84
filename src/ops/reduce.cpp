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

#include <algorithm>
#include <optional>

#include "kiln/autodiff.h"
#include "kiln/ops/core.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/transform.h"
#include "ops/common.h"
#include "ops/reduce_params.h"

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

// A reduction's output (or any tensor of its shape) in keepdims form, to broadcast against x.
Tensor kept(const VjpContext& c, const Tensor& t) {
  const auto& axes = c.attrs.ints("axes");
  Shape k = reduced_shape(c.inputs[0].shape(), axes, /*keepdims=*/true);
  if (t.shape() == k) return t;
  // the reduced form: size-1 axes back in place (dynamic dims stay as they are)
  if (t.rank() + static_cast<int>(axes.size()) == static_cast<int>(k.size()))
    return expand_dims(t, axes);
  return reshape(t, k);
}
// The cotangent of a reduction reshaped to keepdims form and broadcast back to the input.
Tensor expand_back(const VjpContext& c, const Tensor& g) {
  return broadcast_to_like(kept(c, g), c.inputs[0]);
}
Grads vjp_sum(const VjpContext& c) { return {expand_back(c, *c.cotangents[0])}; }

// Number of elements reduced into each output, when the reduced dims are static.
std::optional<int64_t> static_count(const VjpContext& c) {
  const Shape in = c.inputs[0].shape();
  int64_t n = 1;
  for (int64_t a : c.attrs.ints("axes")) {
    if (in[a] < 0) return std::nullopt;
    n *= in[a];
  }
  return n;
}
// The same as a tensor of `dtype`: a scalar, or with a dynamic reduced dim, the sum of ones over
// the reduced axes (in keepdims form), which folds to a constant once shapes are specialized.
Tensor reduced_count_of(const VjpContext& c, const Tensor& like, DType dtype) {
  if (const auto n = static_count(c))
    return cast_to(scalar_like(like, static_cast<double>(*n)), dtype);
  return sum(ones_like(cast_to(c.inputs[0], dtype)), c.attrs.ints("axes"), /*keepdims=*/true);
}

Grads vjp_mean(const VjpContext& c) {
  const Tensor& g = *c.cotangents[0];
  const Tensor n = reduced_count_of(c, g, g.dtype());
  return {expand_back(c, n.rank() == 0 ? g / n : kept(c, g) / n)};
}

// Max and min: the gradient goes to the inputs equal to the result, split evenly among ties
// (as TensorFlow and PyTorch's amax do), so it sums to the incoming gradient.
Grads vjp_extreme(const VjpContext& c) {
  const Tensor& x = c.inputs[0];
  const Tensor hit = equal(x, kept(c, c.outputs[0]));
  const Tensor ties = sum(cast(hit, x.dtype()), c.attrs.ints("axes"), /*keepdims=*/true);
  return {where(hit, kept(c, *c.cotangents[0]) / ties, scalar_like(x, 0))};
}

// Prod: d/dx_i is the product of the others. Written as prod/x_i only where x has no zero in
// the reduced group; with one zero, only that position gets the product of the nonzero
// elements; with two or more, the gradient is zero everywhere. Exact for any input.
Grads vjp_prod(const VjpContext& c) {
  const Tensor& x = c.inputs[0];
  const auto& axes = c.attrs.ints("axes");
  const Tensor zero = scalar_like(x, 0), one = scalar_like(x, 1);
  const Tensor is_zero = equal(x, zero);
  const Tensor zeros = sum(cast(is_zero, x.dtype()), axes, /*keepdims=*/true);
  const Tensor nonzero = where(is_zero, one, x);
  const Tensor others = prod(nonzero, axes, /*keepdims=*/true);  // of the nonzero elements
  const Tensor at_zero = where(equal(zeros, one), others, zero);
  const Tensor elsewhere = where(equal(zeros, zero), others / nonzero, zero);
  return {kept(c, *c.cotangents[0]) * where(is_zero, at_zero, elsewhere)};
}

// d logsumexp / dx = exp(x - logsumexp): the softmax over the reduced axes.
Grads vjp_logsumexp(const VjpContext& c) {
  return {kept(c, *c.cotangents[0]) * exp(c.inputs[0] - kept(c, c.outputs[0]))};
}

// 2 (x - mean) / (n - correction); with n <= correction the forward gives inf or NaN and so
// does this.
Grads vjp_variance(const VjpContext& c) {
  const Tensor& x = c.inputs[0];
  const Tensor& g = *c.cotangents[0];
  const int64_t correction = c.attrs.i("correction");
  // 2 / dof: in f64 when the count is static, else in f32 from the run-time count
  Tensor scale = scalar_like(x, 0);
  if (const auto n = static_count(c)) {
    scale = scalar_like(x, 2.0 / static_cast<double>(std::max<int64_t>(*n - correction, 0)));
  } else {
    const Tensor count = reduced_count_of(c, x, f32);
    scale = cast_to(2.0 / maximum(count - static_cast<double>(correction), scalar_like(count, 0)),
                    x.dtype());
  }
  const Tensor centered = x - mean(x, c.attrs.ints("axes"), /*keepdims=*/true);
  return {kept(c, g) * centered * scale};
}

// sign(x), so the subgradient at 0 is 0 (as PyTorch).
Grads vjp_norm_l1(const VjpContext& c) {
  return {kept(c, *c.cotangents[0]) * sign(c.inputs[0])};
}

// x / norm; a zero norm (x all zeros) gives 0, as PyTorch's subgradient.
Grads vjp_norm_l2(const VjpContext& c) {
  const Tensor& x = c.inputs[0];
  const Tensor norm = kept(c, c.outputs[0]);
  const Tensor safe = where(equal(norm, scalar_like(x, 0)), scalar_like(x, 1), norm);
  return {kept(c, *c.cotangents[0]) * (x / safe)};
}

// Each input reaches the outputs after it (before it when reversed), so its gradient is the
// cumsum of the cotangent the other way, with the same exclusiveness.
Grads vjp_cumsum(const VjpContext& c) {
  return {cumsum(*c.cotangents[0], c.attrs.i("axis"), c.attrs.b("exclusive"),
                 !c.attrs.b("reverse"))};
}

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
  define_op(OpId::Sum)
      .set_infer(infer_reduce_numeric)
      .grad(vjp_sum)
      .inputs(1)
      .params<ReduceParams>();
  define_op(OpId::Prod)
      .set_infer(infer_reduce_numeric)
      .grad(vjp_prod)
      .inputs(1)
      .params<ReduceParams>();
  define_op(OpId::Mean)
      .set_infer(infer_reduce_float)
      .grad(vjp_mean)
      .inputs(1)
      .params<ReduceParams>();
  define_op(OpId::Logsumexp)
      .set_infer(infer_reduce_float)
      .grad(vjp_logsumexp)
      .inputs(1)
      .params<ReduceParams>();
  define_op(OpId::NormL1)
      .set_infer(infer_reduce_float)
      .grad(vjp_norm_l1)
      .inputs(1)
      .params<ReduceParams>();
  define_op(OpId::NormL2)
      .set_infer(infer_reduce_float)
      .grad(vjp_norm_l2)
      .inputs(1)
      .params<ReduceParams>();
  define_op(OpId::Max)
      .set_infer(infer_reduce_extreme)
      .grad(vjp_extreme)
      .inputs(1)
      .params<ReduceParams>();
  define_op(OpId::Min)
      .set_infer(infer_reduce_extreme)
      .grad(vjp_extreme)
      .inputs(1)
      .params<ReduceParams>();
  define_op(OpId::Variance)
      .set_infer(infer_variance)
      .grad(vjp_variance)
      .inputs(1)
      .params<ReduceParams>();
  define_op(OpId::Argmax)
      .set_infer(infer_arg)
      .not_differentiable()
      .inputs(1)
      .params<ReduceAxisParams>();
  define_op(OpId::Argmin)
      .set_infer(infer_arg)
      .not_differentiable()
      .inputs(1)
      .params<ReduceAxisParams>();
  define_op(OpId::Cumsum)
      .set_infer(infer_cumsum)
      .grad(vjp_cumsum)
      .inputs(1)
      .params<ReduceAxisParams>();
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
