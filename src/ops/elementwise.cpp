// Elementwise ops. Binary ops promote dtypes in the builder, so the node's inputs already have
// the result dtype; inference broadcasts. Comparisons, isnan and isinf give bool.
// Attributes (validated by inference, which also runs at build time):
//   leaky_relu: alpha   elu: alpha   gelu: approximate ("none" | "tanh")
//   softplus: beta (> 0), threshold   softshrink/hardshrink: lambda (>= 0)
//   hardsigmoid: alpha, beta   clip: min, max (min <= max)   cast: dtype
// Integer semantics: div is floor division and x / 0 = 0; mod takes the divisor's sign and
// x mod 0 = 0; pow to a negative exponent truncates (1 and -1 keep their value, others give 0);
// overflow wraps.
#include "kiln/ops/elementwise.h"

#include <cmath>

#include "kiln/autodiff.h"
#include "kiln/ops/core.h"
#include "ops/common.h"

namespace kiln {

using namespace ops;

namespace {
inline constexpr DTypeSet kBool{boolean};

void require_same_dtypes(const InferContext& ctx, int first, int count) {
  for (int i = first + 1; i < first + count; ++i)
    if (ctx.inputs[i].dtype != ctx.inputs[first].dtype)
      fail<DTypeError>("[{}] inputs have dtypes {} and {} (shapes {} and {})", ctx.name(),
                       name(ctx.inputs[first].dtype), name(ctx.inputs[i].dtype),
                       str(ctx.inputs[first].shape), str(ctx.inputs[i].shape));
}

std::vector<TensorInfo> infer_binary(const InferContext& ctx) {
  require_same_dtypes(ctx, 0, 2);
  require_dtype(ctx, 0, kNumericTypes, "a numeric dtype");
  return {{broadcast_infer(ctx), ctx.inputs[0].dtype}};
}
std::vector<TensorInfo> infer_compare(const InferContext& ctx) {
  require_same_dtypes(ctx, 0, 2);
  return {{broadcast_infer(ctx), boolean}};
}
std::vector<TensorInfo> infer_logical(const InferContext& ctx) {
  for (int i = 0; i < static_cast<int>(ctx.inputs.size()); ++i)
    require_dtype(ctx, i, kBool, "bool");
  return {{broadcast_infer(ctx), boolean}};
}
std::vector<TensorInfo> infer_where(const InferContext& ctx) {
  require_dtype(ctx, 0, kBool, "a bool condition");
  require_same_dtypes(ctx, 1, 2);
  return {{broadcast_infer(ctx), ctx.inputs[1].dtype}};
}
std::vector<TensorInfo> infer_unary_float(const InferContext& ctx) {
  require_dtype(ctx, 0, kFloatTypes, "a float dtype");
  return {ctx.inputs[0]};
}
std::vector<TensorInfo> infer_unary_signed(const InferContext& ctx) {
  require_dtype(ctx, 0, kSignedTypes, "a signed numeric dtype");
  return {ctx.inputs[0]};
}
std::vector<TensorInfo> infer_unary_numeric(const InferContext& ctx) {
  require_dtype(ctx, 0, kNumericTypes, "a numeric dtype");
  return {ctx.inputs[0]};
}
std::vector<TensorInfo> infer_classify(const InferContext& ctx) {
  require_dtype(ctx, 0, kNumericTypes, "a numeric dtype");
  return {{ctx.inputs[0].shape, boolean}};
}
std::vector<TensorInfo> infer_cast(const InferContext& ctx) {
  return {{ctx.inputs[0].shape, ctx.attrs.dtype("dtype")}};
}

// Attribute checks name the op, the attribute and the input shape.
void require_attr(const InferContext& ctx, const char* key, bool ok, const char* what) {
  if (!ok)
    fail<ValueError>("[{}] {} must be {}, got {} (input shape {})", ctx.name(), key, what,
                     ctx.attrs.f(key), str(ctx.inputs[0].shape));
}
void require_finite(const InferContext& ctx, const char* key) {
  require_attr(ctx, key, std::isfinite(ctx.attrs.f(key)), "finite");
}

std::vector<TensorInfo> infer_alpha(const InferContext& ctx) {
  require_finite(ctx, "alpha");
  return infer_unary_float(ctx);
}
std::vector<TensorInfo> infer_gelu(const InferContext& ctx) {
  const std::string& a = ctx.attrs.str("approximate");
  if (a != "none" && a != "tanh")
    fail<ValueError>("[gelu] approximate must be \"none\" or \"tanh\", got \"{}\"", a);
  return infer_unary_float(ctx);
}
std::vector<TensorInfo> infer_softplus(const InferContext& ctx) {
  const double beta = ctx.attrs.f("beta");
  require_attr(ctx, "beta", std::isfinite(beta) && beta > 0, "finite and positive");
  require_attr(ctx, "threshold", !std::isnan(ctx.attrs.f("threshold")), "a number");
  return infer_unary_float(ctx);
}
std::vector<TensorInfo> infer_shrink(const InferContext& ctx) {
  const double l = ctx.attrs.f("lambda");
  require_attr(ctx, "lambda", std::isfinite(l) && l >= 0, "finite and non-negative");
  return infer_unary_float(ctx);
}
std::vector<TensorInfo> infer_hardsigmoid(const InferContext& ctx) {
  require_finite(ctx, "alpha");
  require_finite(ctx, "beta");
  return infer_unary_float(ctx);
}
std::vector<TensorInfo> infer_clip(const InferContext& ctx) {
  const double lo = ctx.attrs.f("min"), hi = ctx.attrs.f("max");
  if (std::isnan(lo) || std::isnan(hi) || lo > hi)
    fail<ValueError>("[clip] needs min <= max, got min {} and max {} (input shape {})", lo, hi,
                     str(ctx.inputs[0].shape));
  return infer_unary_numeric(ctx);
}

Tensor binary(OpId op, const Tensor& a, const Tensor& b) {
  DType t = promote(a.dtype(), b.dtype());
  return make_node1(op, {cast_to(a, t), cast_to(b, t)});
}

// ---- gradient rules (written with kiln ops; broadcasting's gradient is sum_to_shape) ----

using Grads = std::vector<std::optional<Tensor>>;

Grads vjp_add(const VjpContext& c) {
  const Tensor& g = *c.cotangents[0];
  return {sum_to_shape(g, c.inputs[0].shape()), sum_to_shape(g, c.inputs[1].shape())};
}
Grads vjp_sub(const VjpContext& c) {
  const Tensor& g = *c.cotangents[0];
  return {sum_to_shape(g, c.inputs[0].shape()), sum_to_shape(-g, c.inputs[1].shape())};
}
Grads vjp_mul(const VjpContext& c) {
  const Tensor& g = *c.cotangents[0];
  return {sum_to_shape(g * c.inputs[1], c.inputs[0].shape()),
          sum_to_shape(g * c.inputs[0], c.inputs[1].shape())};
}
Grads vjp_neg(const VjpContext& c) { return {-*c.cotangents[0]}; }
Grads vjp_exp(const VjpContext& c) { return {*c.cotangents[0] * c.outputs[0]}; }
// float <-> float casts pass the gradient back; from integers there is none to pass
Grads vjp_cast(const VjpContext& c) {
  if (!is_floating(c.inputs[0].dtype())) return {std::nullopt};
  return {cast(*c.cotangents[0], c.inputs[0].dtype())};
}
}  // namespace

void register_elementwise_ops() {
  for (OpId op : {OpId::Add, OpId::Sub, OpId::Mul, OpId::Div, OpId::Pow, OpId::Maximum,
                  OpId::Minimum, OpId::Mod})
    define_op(op).set_infer(infer_binary).inplace(0);
  for (OpId op : {OpId::Equal, OpId::NotEqual, OpId::Less, OpId::LessEqual, OpId::Greater,
                  OpId::GreaterEqual})
    define_op(op).set_infer(infer_compare);
  for (OpId op : {OpId::LogicalAnd, OpId::LogicalOr, OpId::LogicalXor, OpId::LogicalNot})
    define_op(op).set_infer(infer_logical).inplace(0);
  for (OpId op : {OpId::Neg, OpId::Relu})
    define_op(op).set_infer(infer_unary_signed).inplace(0);
  for (OpId op : {OpId::Abs, OpId::Sign, OpId::Floor, OpId::Ceil, OpId::Round})
    define_op(op).set_infer(infer_unary_numeric).inplace(0);
  for (OpId op : {OpId::Exp, OpId::Log, OpId::Log1p, OpId::Expm1, OpId::Sqrt, OpId::Rsqrt,
                  OpId::Reciprocal, OpId::Sin, OpId::Cos, OpId::Tanh, OpId::Sigmoid, OpId::Selu,
                  OpId::Silu, OpId::Hardswish, OpId::Erf})
    define_op(op).set_infer(infer_unary_float).inplace(0);
  define_op(OpId::LeakyRelu).set_infer(infer_alpha).inplace(0);
  define_op(OpId::Elu).set_infer(infer_alpha).inplace(0);
  define_op(OpId::Gelu).set_infer(infer_gelu).inplace(0);
  define_op(OpId::Softplus).set_infer(infer_softplus).inplace(0);
  define_op(OpId::Softshrink).set_infer(infer_shrink).inplace(0);
  define_op(OpId::Hardshrink).set_infer(infer_shrink).inplace(0);
  define_op(OpId::Hardsigmoid).set_infer(infer_hardsigmoid).inplace(0);
  define_op(OpId::Clip).set_infer(infer_clip).inplace(0);
  define_op(OpId::Where).set_infer(infer_where);
  define_op(OpId::Cast).set_infer(infer_cast);
  define_op(OpId::IsNan).set_infer(infer_classify);
  define_op(OpId::IsInf).set_infer(infer_classify);

  define_op(OpId::Add).grad(vjp_add);
  define_op(OpId::Sub).grad(vjp_sub);
  define_op(OpId::Mul).grad(vjp_mul);
  define_op(OpId::Neg).grad(vjp_neg);
  define_op(OpId::Exp).grad(vjp_exp);
  define_op(OpId::Cast).grad(vjp_cast);
}

Tensor add(const Tensor& a, const Tensor& b) { return binary(OpId::Add, a, b); }
Tensor sub(const Tensor& a, const Tensor& b) { return binary(OpId::Sub, a, b); }
Tensor mul(const Tensor& a, const Tensor& b) { return binary(OpId::Mul, a, b); }
Tensor div(const Tensor& a, const Tensor& b) { return binary(OpId::Div, a, b); }
Tensor pow(const Tensor& a, const Tensor& b) { return binary(OpId::Pow, a, b); }
Tensor maximum(const Tensor& a, const Tensor& b) { return binary(OpId::Maximum, a, b); }
Tensor minimum(const Tensor& a, const Tensor& b) { return binary(OpId::Minimum, a, b); }
Tensor mod(const Tensor& a, const Tensor& b) { return binary(OpId::Mod, a, b); }

Tensor neg(const Tensor& x) { return make_node1(OpId::Neg, {x}); }
Tensor abs(const Tensor& x) { return make_node1(OpId::Abs, {x}); }
Tensor sign(const Tensor& x) { return make_node1(OpId::Sign, {x}); }
Tensor exp(const Tensor& x) { return make_node1(OpId::Exp, {x}); }
Tensor log(const Tensor& x) { return make_node1(OpId::Log, {x}); }
Tensor log1p(const Tensor& x) { return make_node1(OpId::Log1p, {x}); }
Tensor expm1(const Tensor& x) { return make_node1(OpId::Expm1, {x}); }
Tensor sqrt(const Tensor& x) { return make_node1(OpId::Sqrt, {x}); }
Tensor rsqrt(const Tensor& x) { return make_node1(OpId::Rsqrt, {x}); }
Tensor reciprocal(const Tensor& x) { return make_node1(OpId::Reciprocal, {x}); }
Tensor sin(const Tensor& x) { return make_node1(OpId::Sin, {x}); }
Tensor cos(const Tensor& x) { return make_node1(OpId::Cos, {x}); }
Tensor tanh(const Tensor& x) { return make_node1(OpId::Tanh, {x}); }
Tensor sigmoid(const Tensor& x) { return make_node1(OpId::Sigmoid, {x}); }
Tensor relu(const Tensor& x) { return make_node1(OpId::Relu, {x}); }
Tensor leaky_relu(const Tensor& x, double alpha) {
  return make_node1(OpId::LeakyRelu, {x}, {{"alpha", alpha}});
}
Tensor elu(const Tensor& x, double alpha) { return make_node1(OpId::Elu, {x}, {{"alpha", alpha}}); }
Tensor selu(const Tensor& x) { return make_node1(OpId::Selu, {x}); }
Tensor gelu(const Tensor& x, GeluApprox approximate) {
  const char* a = approximate == GeluApprox::tanh ? "tanh" : "none";
  return make_node1(OpId::Gelu, {x}, {{"approximate", std::string(a)}});
}
Tensor silu(const Tensor& x) { return make_node1(OpId::Silu, {x}); }
Tensor softplus(const Tensor& x, double beta, double threshold) {
  return make_node1(OpId::Softplus, {x}, {{"beta", beta}, {"threshold", threshold}});
}
Tensor softshrink(const Tensor& x, double lambda) {
  return make_node1(OpId::Softshrink, {x}, {{"lambda", lambda}});
}
Tensor hardshrink(const Tensor& x, double lambda) {
  return make_node1(OpId::Hardshrink, {x}, {{"lambda", lambda}});
}
Tensor hardswish(const Tensor& x) { return make_node1(OpId::Hardswish, {x}); }
Tensor hardsigmoid(const Tensor& x, double alpha, double beta) {
  return make_node1(OpId::Hardsigmoid, {x}, {{"alpha", alpha}, {"beta", beta}});
}
Tensor erf(const Tensor& x) { return make_node1(OpId::Erf, {x}); }
Tensor floor(const Tensor& x) { return make_node1(OpId::Floor, {x}); }
Tensor ceil(const Tensor& x) { return make_node1(OpId::Ceil, {x}); }
Tensor round(const Tensor& x) { return make_node1(OpId::Round, {x}); }
Tensor clip(const Tensor& x, double lo, double hi) {
  return make_node1(OpId::Clip, {x}, {{"min", lo}, {"max", hi}});
}

Tensor equal(const Tensor& a, const Tensor& b) { return binary(OpId::Equal, a, b); }
Tensor not_equal(const Tensor& a, const Tensor& b) { return binary(OpId::NotEqual, a, b); }
Tensor less(const Tensor& a, const Tensor& b) { return binary(OpId::Less, a, b); }
Tensor less_equal(const Tensor& a, const Tensor& b) { return binary(OpId::LessEqual, a, b); }
Tensor greater(const Tensor& a, const Tensor& b) { return binary(OpId::Greater, a, b); }
Tensor greater_equal(const Tensor& a, const Tensor& b) {
  return binary(OpId::GreaterEqual, a, b);
}
Tensor logical_and(const Tensor& a, const Tensor& b) {
  return make_node1(OpId::LogicalAnd, {a, b});
}
Tensor logical_or(const Tensor& a, const Tensor& b) { return make_node1(OpId::LogicalOr, {a, b}); }
Tensor logical_xor(const Tensor& a, const Tensor& b) {
  return make_node1(OpId::LogicalXor, {a, b});
}
Tensor logical_not(const Tensor& x) { return make_node1(OpId::LogicalNot, {x}); }
Tensor where(const Tensor& cond, const Tensor& x, const Tensor& y) {
  DType t = promote(x.dtype(), y.dtype());
  return make_node1(OpId::Where, {cond, cast_to(x, t), cast_to(y, t)});
}
Tensor cast(const Tensor& x, DType dtype) {
  return make_node1(OpId::Cast, {x}, {{"dtype", dtype}});
}
Tensor isnan(const Tensor& x) { return make_node1(OpId::IsNan, {x}); }
Tensor isinf(const Tensor& x) { return make_node1(OpId::IsInf, {x}); }

Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator-(const Tensor& x) { return neg(x); }
Tensor operator+(const Tensor& a, double b) { return add(a, scalar_like(a, b)); }
Tensor operator-(const Tensor& a, double b) { return sub(a, scalar_like(a, b)); }
Tensor operator*(const Tensor& a, double b) { return mul(a, scalar_like(a, b)); }
Tensor operator/(const Tensor& a, double b) { return div(a, scalar_like(a, b)); }
Tensor operator+(double a, const Tensor& b) { return add(scalar_like(b, a), b); }
Tensor operator-(double a, const Tensor& b) { return sub(scalar_like(b, a), b); }
Tensor operator*(double a, const Tensor& b) { return mul(scalar_like(b, a), b); }
Tensor operator/(double a, const Tensor& b) { return div(scalar_like(b, a), b); }

}  // namespace kiln
