// Elementwise ops. Binary ops promote dtypes in the builder, so the node's inputs already have
// the result dtype; inference broadcasts. Comparisons, isnan and isinf give bool.
// Attributes (validated by inference, which also runs at build time):
//   leaky_relu: alpha   elu: alpha   gelu: approximate ("none" | "tanh")
//   softplus: beta (> 0), threshold   softshrink/hardshrink: lambda (>= 0)
//   hardsigmoid: alpha, beta   clip: min, max (min <= max)   cast: dtype
//   bit_shift: left (bool; false shifts right)   bitcast: dtype (of the input's element size)
// Integer semantics: div is floor division and x / 0 = 0; mod takes the divisor's sign and
// x mod 0 = 0; pow to a negative exponent truncates (1 and -1 keep their value, others give 0);
// overflow wraps. Bitwise ops take integers of one dtype (no promotion); shifts by amounts outside
// [0, bits) give 0, or -1 for a right shift of a negative value (numpy).
// Gradients: maximum/minimum split ties evenly; pow passes none to the exponent where the base is
// <= 0; sign, floor, ceil and round give zeros; bool-valued and bitwise ops and bitcast are not
// differentiable.
#include "kiln/ops/elementwise.h"

#include <cmath>

#include "kiln/autodiff.h"
#include "kiln/ops/core.h"
#include "ops/common.h"
#include "ops/elementwise_params.h"
#include "ops/elementwise_records.h"

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
std::vector<TensorInfo> infer_bitwise(const InferContext& ctx) {
  require_same_dtypes(ctx, 0, 2);
  require_dtype(ctx, 0, kIntTypes, "an integer dtype");
  return {{broadcast_infer(ctx), ctx.inputs[0].dtype}};
}
std::vector<TensorInfo> infer_unary_int(const InferContext& ctx) {
  require_dtype(ctx, 0, kIntTypes, "an integer dtype");
  return {ctx.inputs[0]};
}
std::vector<TensorInfo> infer_bit_shift(const InferContext& ctx) {
  (void)ctx.attrs.b("left");  // present and a bool
  return infer_bitwise(ctx);
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
  const std::string round = ctx.attrs.str("round", "up");
  if (round != "up" && round != "down" && round != "nearest")
    fail<ValueError>("[cast] round must be \"up\", \"down\" or \"nearest\", got \"{}\"", round);
  return {{ctx.inputs[0].shape, ctx.attrs.dtype("dtype")}};
}
// The same bytes read as another dtype: its elements must be as wide as the input's.
std::vector<TensorInfo> infer_bitcast(const InferContext& ctx) {
  const DType from = ctx.inputs[0].dtype, to = ctx.attrs.dtype("dtype");
  if (size_of(from) != size_of(to))
    fail<DTypeError>(
        "[bitcast] cannot reinterpret {} ({} bytes an element) as {} ({} bytes an element): the "
        "element sizes must match (input shape {})",
        name(from), size_of(from), name(to), size_of(to), str(ctx.inputs[0].shape));
  return {{ctx.inputs[0].shape, to}};
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
  if (!(lo <= hi))  // (and neither NaN; ClipParams::decode checks the same for the kernels)
    fail<ValueError>("[clip] needs min <= max, got min {} and max {} (input shape {})", lo, hi,
                     str(ctx.inputs[0].shape));
  return infer_unary_numeric(ctx);
}

Tensor binary(OpId op, const Tensor& a, const Tensor& b) {
  DType t = promote(a.dtype(), b.dtype());
  return make_node1(op, {cast_to(a, t), cast_to(b, t)});
}
// binary_<dtypes column of the record>: promoting, or taking one dtype as given
Tensor binary_numeric(OpId op, const Tensor& a, const Tensor& b) { return binary(op, a, b); }
Tensor binary_all(OpId op, const Tensor& a, const Tensor& b) { return binary(op, a, b); }
Tensor binary_int(OpId op, const Tensor& a, const Tensor& b) { return make_node1(op, {a, b}); }
Tensor binary_bool(OpId op, const Tensor& a, const Tensor& b) { return make_node1(op, {a, b}); }

// ---- gradient rules (written with kiln ops; broadcasting's gradient is sum_to_shape) ----

using Grads = std::vector<std::optional<Tensor>>;

Grads vjp_add(const VjpContext& c) {
  const Tensor& g = *c.cotangents[0];
  return {sum_to_shape_of(g, c.inputs[0]), sum_to_shape_of(g, c.inputs[1])};
}
Grads vjp_sub(const VjpContext& c) {
  const Tensor& g = *c.cotangents[0];
  return {sum_to_shape_of(g, c.inputs[0]), sum_to_shape_of(-g, c.inputs[1])};
}
Grads vjp_mul(const VjpContext& c) {
  const Tensor& g = *c.cotangents[0];
  return {sum_to_shape_of(g * c.inputs[1], c.inputs[0]),
          sum_to_shape_of(g * c.inputs[0], c.inputs[1])};
}
Grads vjp_neg(const VjpContext& c) { return {-*c.cotangents[0]}; }
Grads vjp_exp(const VjpContext& c) { return {*c.cotangents[0] * c.outputs[0]}; }
// float <-> float casts pass the gradient back; from integers there is none to pass
Grads vjp_cast(const VjpContext& c) {
  if (!is_floating(c.inputs[0].dtype())) return {std::nullopt};
  return {cast(*c.cotangents[0], c.inputs[0].dtype())};
}

// Shorthands for the rules below: comparisons against a constant, masking with zeros.
Tensor gt(const Tensor& x, double v) { return greater(x, scalar_like(x, v)); }
Tensor lt(const Tensor& x, double v) { return less(x, scalar_like(x, v)); }
Tensor masked(const Tensor& keep, const Tensor& g) { return where(keep, g, scalar_like(g, 0)); }
// Gradients of both inputs of a binary op, each summed back to its input's shape.
Grads binary_grads(const VjpContext& c, const Tensor& ga, const Tensor& gb) {
  return {sum_to_shape_of(ga, c.inputs[0]), sum_to_shape_of(gb, c.inputs[1])};
}

Grads vjp_div(const VjpContext& c) {
  const Tensor &g = *c.cotangents[0], &b = c.inputs[1];
  return binary_grads(c, g / b, -(g * c.outputs[0]) / b);
}
// The base's gradient is 0 where the exponent is 0 (0^0 has no 0 * inf), and the exponent's is
// 0 where the base is <= 0 (log undefined there; PyTorch gives 0 at 0 and NaN below).
Grads vjp_pow(const VjpContext& c) {
  const Tensor &g = *c.cotangents[0], &a = c.inputs[0], &b = c.inputs[1];
  const Tensor da = masked(not_equal(b, scalar_like(b, 0)), b * pow(a, b - 1.0));
  const Tensor pos = gt(a, 0);
  const Tensor db = c.outputs[0] * masked(pos, log(where(pos, a, scalar_like(a, 1))));
  return binary_grads(c, g * da, g * db);
}
// The gradient goes to the selected input; ties split it evenly (as PyTorch).
Grads minmax_grads(const VjpContext& c, const Tensor& a_wins) {
  const Tensor &g = *c.cotangents[0], &a = c.inputs[0];
  const Tensor tie = equal(a, c.inputs[1]);
  const Tensor w =
      where(a_wins, scalar_like(a, 1), where(tie, scalar_like(a, 0.5), scalar_like(a, 0)));
  const Tensor ga = g * w;
  return binary_grads(c, ga, g - ga);
}
Grads vjp_maximum(const VjpContext& c) {
  return minmax_grads(c, greater(c.inputs[0], c.inputs[1]));
}
Grads vjp_minimum(const VjpContext& c) { return minmax_grads(c, less(c.inputs[0], c.inputs[1])); }
// a mod b = a - b * floor(a / b)
Grads vjp_mod(const VjpContext& c) {
  const Tensor &g = *c.cotangents[0], &a = c.inputs[0], &b = c.inputs[1];
  return binary_grads(c, g, -(g * floor(a / b)));
}

Grads vjp_abs(const VjpContext& c) { return {*c.cotangents[0] * sign(c.inputs[0])}; }
// floor, ceil, round, sign: piecewise constant, so zeros (as PyTorch)
Grads vjp_zero(const VjpContext& c) { return {zeros_like(c.inputs[0])}; }
Grads vjp_log(const VjpContext& c) { return {*c.cotangents[0] / c.inputs[0]}; }
Grads vjp_log1p(const VjpContext& c) { return {*c.cotangents[0] / (c.inputs[0] + 1.0)}; }
Grads vjp_expm1(const VjpContext& c) { return {*c.cotangents[0] * (c.outputs[0] + 1.0)}; }
Grads vjp_sqrt(const VjpContext& c) { return {*c.cotangents[0] / (c.outputs[0] * 2.0)}; }
// d/dx x^-1/2 = -1/2 x^-3/2 = -1/2 * out / x
Grads vjp_rsqrt(const VjpContext& c) {
  return {*c.cotangents[0] * c.outputs[0] / c.inputs[0] * -0.5};
}
Grads vjp_reciprocal(const VjpContext& c) {
  return {-(*c.cotangents[0] * c.outputs[0] * c.outputs[0])};
}
Grads vjp_sin(const VjpContext& c) { return {*c.cotangents[0] * cos(c.inputs[0])}; }
Grads vjp_cos(const VjpContext& c) { return {-(*c.cotangents[0] * sin(c.inputs[0]))}; }
Grads vjp_tanh(const VjpContext& c) {
  const Tensor& y = c.outputs[0];
  return {*c.cotangents[0] * (1.0 - y * y)};
}
Grads vjp_sigmoid(const VjpContext& c) {
  const Tensor& y = c.outputs[0];
  return {*c.cotangents[0] * y * (1.0 - y)};
}
// tan' = 1 + tan^2; sinh' = cosh; cosh' = sinh
Grads vjp_tan(const VjpContext& c) {
  const Tensor& y = c.outputs[0];
  return {*c.cotangents[0] * (y * y + 1.0)};
}
Grads vjp_sinh(const VjpContext& c) { return {*c.cotangents[0] * cosh(c.inputs[0])}; }
Grads vjp_cosh(const VjpContext& c) { return {*c.cotangents[0] * sinh(c.inputs[0])}; }
// asin' = 1/sqrt(1 - x^2) = -acos'; atan' = 1/(1 + x^2)
Grads vjp_asin(const VjpContext& c) {
  const Tensor& x = c.inputs[0];
  return {*c.cotangents[0] * rsqrt(1.0 - x * x)};
}
Grads vjp_acos(const VjpContext& c) {
  const Tensor& x = c.inputs[0];
  return {-(*c.cotangents[0] * rsqrt(1.0 - x * x))};
}
Grads vjp_atan(const VjpContext& c) {
  const Tensor& x = c.inputs[0];
  return {*c.cotangents[0] / (x * x + 1.0)};
}
// asinh' = 1/sqrt(x^2 + 1); acosh' = 1/sqrt((x - 1)(x + 1)); atanh' = 1/(1 - x^2)
Grads vjp_asinh(const VjpContext& c) {
  const Tensor& x = c.inputs[0];
  return {*c.cotangents[0] * rsqrt(x * x + 1.0)};
}
Grads vjp_acosh(const VjpContext& c) {
  const Tensor& x = c.inputs[0];
  return {*c.cotangents[0] * rsqrt((x - 1.0) * (x + 1.0))};
}
Grads vjp_atanh(const VjpContext& c) {
  const Tensor& x = c.inputs[0];
  return {*c.cotangents[0] / (1.0 - x * x)};
}
// d/dx erf(x) = 2/sqrt(pi) exp(-x^2)
Grads vjp_erf(const VjpContext& c) {
  const Tensor& x = c.inputs[0];
  return {*c.cotangents[0] * exp(-(x * x)) * 1.1283791670955126};
}

// At kinks (relu at 0, shrink at +-lambda, clip at its bounds) the rules take the side PyTorch
// takes.
Grads vjp_relu(const VjpContext& c) { return {masked(gt(c.inputs[0], 0), *c.cotangents[0])}; }
Grads vjp_leaky_relu(const VjpContext& c) {
  const Tensor& g = *c.cotangents[0];
  return {where(gt(c.inputs[0], 0), g, g * c.attrs.f("alpha"))};
}
// Below 0, elu = alpha (e^x - 1), whose derivative alpha e^x is out + alpha.
Grads vjp_elu(const VjpContext& c) {
  const Tensor& g = *c.cotangents[0];
  return {where(gt(c.inputs[0], 0), g, g * (c.outputs[0] + c.attrs.f("alpha")))};
}
constexpr double kSeluAlpha = 1.6732632423543772848170429916717;
constexpr double kSeluScale = 1.0507009873554804934193349852946;
Grads vjp_selu(const VjpContext& c) {
  const Tensor& g = *c.cotangents[0];
  return {where(gt(c.inputs[0], 0), g * kSeluScale, g * (c.outputs[0] + kSeluScale * kSeluAlpha))};
}
// gelu(x) = x Phi(x): derivative Phi(x) + x phi(x)
Tensor gelu_erf_slope(const Tensor& x) {
  const Tensor cdf = (erf(x * 0.7071067811865476) + 1.0) * 0.5;
  const Tensor pdf = exp(x * x * -0.5) * 0.3989422804014327;  // 1 / sqrt(2 pi)
  return cdf + x * pdf;
}
// gelu(x) = x/2 (1 + tanh(u)), u = k (x + 0.044715 x^3)
Tensor gelu_tanh_slope(const Tensor& x) {
  constexpr double k = 0.7978845608028654;  // sqrt(2 / pi)
  const Tensor x2 = x * x;
  const Tensor t = tanh((x + x * x2 * 0.044715) * k);
  const Tensor du = (x2 * (3 * 0.044715) + 1.0) * k;
  return (t + 1.0) * 0.5 + x * 0.5 * (1.0 - t * t) * du;
}
Grads vjp_gelu(const VjpContext& c) {
  const Tensor& x = c.inputs[0];
  const bool tanh_form = c.attrs.str("approximate") == "tanh";
  return {*c.cotangents[0] * (tanh_form ? gelu_tanh_slope(x) : gelu_erf_slope(x))};
}
// silu = x s with s = sigmoid(x): derivative s + x s (1 - s) = s + out (1 - s)
Grads vjp_silu(const VjpContext& c) {
  const Tensor s = sigmoid(c.inputs[0]);
  return {*c.cotangents[0] * (s + c.outputs[0] * (1.0 - s))};
}
// mish = x t with t = tanh(softplus(x)): derivative t + x sigmoid(x) (1 - t^2)
Grads vjp_mish(const VjpContext& c) {
  const Tensor& x = c.inputs[0];
  const Tensor t = tanh(softplus(x));
  return {*c.cotangents[0] * (t + x * sigmoid(x) * (1.0 - t * t))};
}
// Below the threshold the derivative is sigmoid(beta x); above it softplus is x.
Grads vjp_softplus(const VjpContext& c) {
  const Tensor& g = *c.cotangents[0];
  const Tensor bx = c.inputs[0] * c.attrs.f("beta");
  return {where(gt(bx, c.attrs.f("threshold")), g, g * sigmoid(bx))};
}
// Both shrinks pass the gradient where |x| > lambda and block it inside.
Grads vjp_shrink(const VjpContext& c) {
  return {masked(gt(abs(c.inputs[0]), c.attrs.f("lambda")), *c.cotangents[0])};
}
// hardswish = x relu6(x + 3) / 6: 0 below -3, 1 above 3, x/3 + 1/2 between
Grads vjp_hardswish(const VjpContext& c) {
  const Tensor& x = c.inputs[0];
  const Tensor slope =
      where(lt(x, -3), scalar_like(x, 0), where(gt(x, 3), scalar_like(x, 1), x / 3.0 + 0.5));
  return {*c.cotangents[0] * slope};
}
// alpha where the output is strictly inside (0, 1), 0 where it is clamped
Grads vjp_hardsigmoid(const VjpContext& c) {
  const Tensor& y = c.outputs[0];
  const Tensor inside = logical_and(gt(y, 0), lt(y, 1));
  return {masked(inside, *c.cotangents[0] * c.attrs.f("alpha"))};
}
// The gradient passes where min <= x <= max (bounds included, as PyTorch).
Grads vjp_clip(const VjpContext& c) {
  const Tensor& x = c.inputs[0];
  const Tensor inside = logical_and(greater_equal(x, scalar_like(x, c.attrs.f("min"))),
                                    less_equal(x, scalar_like(x, c.attrs.f("max"))));
  return {masked(inside, *c.cotangents[0])};
}
// None for the condition; x gets the gradient where it was chosen, y elsewhere.
Grads vjp_where(const VjpContext& c) {
  const Tensor &g = *c.cotangents[0], &cond = c.inputs[0];
  const Tensor zero = scalar_like(g, 0);
  return {std::nullopt, sum_to_shape_of(where(cond, g, zero), c.inputs[1]),
          sum_to_shape_of(where(cond, zero, g), c.inputs[2])};
}

// Inference of a record: its dtypes, then broadcasting or the input's shape.
InferFn record_infer(const math::Record& r) {
  using math::Result;
  using math::Types;
  if (r.types == Types::boolean) return infer_logical;
  if (r.arity == 2) {
    if (r.result == Result::boolean) return infer_compare;
    return r.types == Types::integer ? infer_bitwise : infer_binary;
  }
  if (r.result == Result::boolean) return infer_classify;
  switch (r.types) {
    case Types::signed_numeric: return infer_unary_signed;
    case Types::floating: return infer_unary_float;
    case Types::integer: return infer_unary_int;
    default: return infer_unary_numeric;
  }
}
}  // namespace

void register_elementwise_ops() {
  for (const math::Record& r : math::kRecords) {
    OpDef& d = define_op(r.op).set_infer(record_infer(r)).inputs(r.arity);
    // the output may take its input's buffer where it keeps the input's dtype
    if (r.result == math::Result::same || r.types == math::Types::boolean) d.inplace(0);
    if (r.num_attrs() > 0) d.params<math::RecordParams>();
  }
  // records with attributes check them in their own inference; the other ops are not records
  define_op(OpId::BitShift)
      .set_infer(infer_bit_shift)
      .inplace(0)
      .inputs(2)
      .params<BitShiftParams>();
  define_op(OpId::LeakyRelu).set_infer(infer_alpha);
  define_op(OpId::Elu).set_infer(infer_alpha);
  define_op(OpId::Gelu).set_infer(infer_gelu).inplace(0).inputs(1).params<GeluParams>();
  define_op(OpId::Softplus).set_infer(infer_softplus);
  define_op(OpId::Softshrink).set_infer(infer_shrink);
  define_op(OpId::Hardshrink).set_infer(infer_shrink);
  define_op(OpId::Hardsigmoid).set_infer(infer_hardsigmoid);
  define_op(OpId::Clip).set_infer(infer_clip).inplace(0).inputs(1).params<math::ClipParams>();
  define_op(OpId::Where).set_infer(infer_where).inputs(3);
  define_op(OpId::Cast).set_infer(infer_cast).inputs(1).params<CastParams>();
  // the output is a view of the input's bytes (no copy where the memory planner allows)
  define_op(OpId::Bitcast).set_infer(infer_bitcast).alias().inputs(1);

  define_op(OpId::Add).grad(vjp_add);
  define_op(OpId::Sub).grad(vjp_sub);
  define_op(OpId::Mul).grad(vjp_mul);
  define_op(OpId::Neg).grad(vjp_neg);
  define_op(OpId::Exp).grad(vjp_exp);
  define_op(OpId::Cast).grad(vjp_cast);
  define_op(OpId::Div).grad(vjp_div);
  define_op(OpId::Pow).grad(vjp_pow);
  define_op(OpId::Maximum).grad(vjp_maximum);
  define_op(OpId::Minimum).grad(vjp_minimum);
  define_op(OpId::Mod).grad(vjp_mod);
  define_op(OpId::Abs).grad(vjp_abs);
  for (OpId op : {OpId::Sign, OpId::Floor, OpId::Ceil, OpId::Round}) define_op(op).grad(vjp_zero);
  define_op(OpId::Log).grad(vjp_log);
  define_op(OpId::Log1p).grad(vjp_log1p);
  define_op(OpId::Expm1).grad(vjp_expm1);
  define_op(OpId::Sqrt).grad(vjp_sqrt);
  define_op(OpId::Rsqrt).grad(vjp_rsqrt);
  define_op(OpId::Reciprocal).grad(vjp_reciprocal);
  define_op(OpId::Sin).grad(vjp_sin);
  define_op(OpId::Cos).grad(vjp_cos);
  define_op(OpId::Tanh).grad(vjp_tanh);
  define_op(OpId::Sigmoid).grad(vjp_sigmoid);
  define_op(OpId::Erf).grad(vjp_erf);
  define_op(OpId::Tan).grad(vjp_tan);
  define_op(OpId::Asin).grad(vjp_asin);
  define_op(OpId::Acos).grad(vjp_acos);
  define_op(OpId::Atan).grad(vjp_atan);
  define_op(OpId::Sinh).grad(vjp_sinh);
  define_op(OpId::Cosh).grad(vjp_cosh);
  define_op(OpId::Asinh).grad(vjp_asinh);
  define_op(OpId::Acosh).grad(vjp_acosh);
  define_op(OpId::Atanh).grad(vjp_atanh);
  define_op(OpId::Relu).grad(vjp_relu);
  define_op(OpId::LeakyRelu).grad(vjp_leaky_relu);
  define_op(OpId::Elu).grad(vjp_elu);
  define_op(OpId::Selu).grad(vjp_selu);
  define_op(OpId::Gelu).grad(vjp_gelu);
  define_op(OpId::Silu).grad(vjp_silu);
  define_op(OpId::Mish).grad(vjp_mish);
  define_op(OpId::Softplus).grad(vjp_softplus);
  define_op(OpId::Softshrink).grad(vjp_shrink);
  define_op(OpId::Hardshrink).grad(vjp_shrink);
  define_op(OpId::Hardswish).grad(vjp_hardswish);
  define_op(OpId::Hardsigmoid).grad(vjp_hardsigmoid);
  define_op(OpId::Clip).grad(vjp_clip);
  define_op(OpId::Where).grad(vjp_where);
  // bool or integer outputs
  for (OpId op : {OpId::Equal, OpId::NotEqual, OpId::Less, OpId::LessEqual, OpId::Greater,
                  OpId::GreaterEqual, OpId::LogicalAnd, OpId::LogicalOr, OpId::LogicalXor,
                  OpId::LogicalNot, OpId::IsNan, OpId::IsInf, OpId::BitwiseAnd, OpId::BitwiseOr,
                  OpId::BitwiseXor, OpId::BitwiseNot, OpId::BitShift})
    define_op(op).not_differentiable();
  // the bits of one dtype read as another: no derivative relates the two
  define_op(OpId::Bitcast).not_differentiable();
}

// The builders of the records without attributes; binary ops promote their inputs' dtypes,
// except logic and bitwise ops, which take one dtype.
#define KILN_OP(P, s, id, family)
#define KILN_EW(P, s, id, arity, result, types, k0, k1) \
  KILN_EW_IF_NO_ATTRS(k0, KILN_EW_BUILDER_##arity(P, s, types))
#define KILN_EW_BUILDER_1(P, s, types) \
  Tensor s(const Tensor& x) { return make_node1(OpId::P, {x}); }
#define KILN_EW_BUILDER_2(P, s, types) \
  Tensor s(const Tensor& a, const Tensor& b) { return binary_##types(OpId::P, a, b); }
#include "ops/op_list.inc"
#undef KILN_OP
#undef KILN_EW
#undef KILN_EW_BUILDER_1
#undef KILN_EW_BUILDER_2

Tensor leaky_relu(const Tensor& x, double alpha) {
  return make_node1(OpId::LeakyRelu, {x}, {{"alpha", alpha}});
}
Tensor elu(const Tensor& x, double alpha) { return make_node1(OpId::Elu, {x}, {{"alpha", alpha}}); }
Tensor gelu(const Tensor& x, GeluApprox approximate) {
  const char* a = approximate == GeluApprox::tanh ? "tanh" : "none";
  return make_node1(OpId::Gelu, {x}, {{"approximate", std::string(a)}});
}
Tensor softplus(const Tensor& x, double beta, double threshold) {
  return make_node1(OpId::Softplus, {x}, {{"beta", beta}, {"threshold", threshold}});
}
Tensor softshrink(const Tensor& x, double lambda) {
  return make_node1(OpId::Softshrink, {x}, {{"lambda", lambda}});
}
Tensor hardshrink(const Tensor& x, double lambda) {
  return make_node1(OpId::Hardshrink, {x}, {{"lambda", lambda}});
}
Tensor hardsigmoid(const Tensor& x, double alpha, double beta) {
  return make_node1(OpId::Hardsigmoid, {x}, {{"alpha", alpha}, {"beta", beta}});
}
Tensor clip(const Tensor& x, double lo, double hi) {
  return make_node1(OpId::Clip, {x}, {{"min", lo}, {"max", hi}});
}
Tensor where(const Tensor& cond, const Tensor& x, const Tensor& y) {
  DType t = promote(x.dtype(), y.dtype());
  return make_node1(OpId::Where, {cond, cast_to(x, t), cast_to(y, t)});
}
Tensor cast(const Tensor& x, DType dtype) {
  return make_node1(OpId::Cast, {x}, {{"dtype", dtype}});
}
Tensor cast(const Tensor& x, DType dtype, bool saturate) {
  return cast(x, dtype, narrow::Rules{saturate, narrow::Round::up});
}
Tensor cast(const Tensor& x, DType dtype, const narrow::Rules& rules) {
  Attrs a{{"dtype", dtype}};  // (the defaults take no attribute, as before)
  if (!rules.saturate) a.set("saturate", false);
  if (rules.round != narrow::Round::up)
    a.set("round", std::string(rules.round == narrow::Round::down ? "down" : "nearest"));
  return make_node1(OpId::Cast, {x}, a);
}
Tensor bitcast(const Tensor& x, DType dtype) {
  return make_node1(OpId::Bitcast, {x}, {{"dtype", dtype}});
}
Tensor bit_shift(const Tensor& x, const Tensor& y, bool left) {
  return make_node1(OpId::BitShift, {x, y}, {{"left", left}});
}

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
