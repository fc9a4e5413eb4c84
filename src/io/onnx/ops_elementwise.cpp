// ONNX elementwise ops: arithmetic, comparisons, logic, activations, casts.
#include <algorithm>
#include <cmath>

#include "io/onnx/map_util.h"

namespace kiln::onnx::detail {

namespace {

template <Tensor (*F)(const Tensor&, const Tensor&)>
Outs binary(NodeContext& c) {
  return {F(c.input(0), c.input(1))};
}
template <Tensor (*F)(const Tensor&)>
Outs unary(NodeContext& c) {
  return {F(c.input(0))};
}

Tensor bool_to(const Tensor& b, DType t) { return cast(b, t); }

// ONNX integer division truncates toward zero; kiln's floors.
Outs div_op(NodeContext& c) {
  Tensor a = c.input(0), b = c.input(1);
  Tensor q = div(a, b);
  if (!is_integer(q.dtype())) return {q};
  Tensor r = mod(a, b);
  Tensor zero = scalar_of(r, 0);
  Tensor fix = logical_and(not_equal(r, zero),
                           logical_xor(less(a, scalar_of(a, 0)), less(b, scalar_of(b, 0))));
  return {add(q, bool_to(fix, q.dtype()))};
}

Outs mod_op(NodeContext& c) {
  Tensor a = c.input(0), b = c.input(1);
  Tensor r = mod(a, b);
  const bool fmod = c.attr_int("fmod", 0) != 0;
  if (!fmod) return {r};  // the remainder takes the divisor's sign (numpy's mod; floats too)
  // C fmod: the remainder takes the dividend's sign
  Tensor zero = scalar_of(r, 0);
  Tensor wrong = logical_and(not_equal(r, zero),
                             not_equal(less(r, zero), less(a, scalar_of(a, 0))));
  return {where(wrong, sub(r, b), r)};
}

Outs pow_op(NodeContext& c) {
  Tensor x = c.input(0);
  Tensor y = pow(x, c.input(1));
  return {y.dtype() == x.dtype() ? y : cast(y, x.dtype())};
}

template <Tensor (*F)(const Tensor&, const Tensor&)>
Outs variadic(NodeContext& c) {
  Tensor r = c.input(0);
  for (int i = 1; i < c.num_inputs(); ++i) r = F(r, c.input(i));
  return {r};
}

Outs mean_op(NodeContext& c) {
  Tensor r = c.input(0);
  for (int i = 1; i < c.num_inputs(); ++i) r = add(r, c.input(i));
  return {div(r, scalar_of(r, c.num_inputs()))};
}

Outs identity(NodeContext& c) {
  if (c.is_sequence(0)) {  // (a sequence passes on as it is, and an optional without a value)
    c.set_sequence(0, c.sequence(0));
    return {};
  }
  if (c.is_absent(0)) {
    c.set_absent(0);
    return {};
  }
  return {c.input(0)};
}

// saturate (opset 19: 8-bit float targets) and round_mode (opset 24: float8e8m0 targets)
narrow::Rules cast_rules(NodeContext& c) {
  narrow::Rules r;
  r.saturate = c.attr_int("saturate", 1) != 0;
  const std::string mode = c.attr_string("round_mode", "up");
  if (mode == "down") r.round = narrow::Round::down;
  else if (mode == "nearest") r.round = narrow::Round::nearest;
  else if (mode != "up")
    c.fail(fmt::format("round_mode must be \"up\", \"down\" or \"nearest\", got \"{}\"", mode));
  return r;
}

Outs cast_op(NodeContext& c) {
  const int64_t to = c.required_int("to");
  const auto t = from_onnx_dtype(static_cast<int32_t>(to));
  if (!t) c.unsupported(fmt::format("casting to {} (kiln has no such element type)",
                                    onnx_dtype_name(static_cast<int32_t>(to))));
  return {cast(c.input(0), *t, cast_rules(c))};
}

// BitCast (opset 26): the same bits as another type of the same width (bitcast checks widths)
Outs bitcast_op(NodeContext& c) {
  const int32_t to = static_cast<int32_t>(c.required_int("to"));
  const auto t = from_onnx_dtype(to);
  if (!t)
    c.unsupported(
        fmt::format("bit casting to {} (kiln has no such element type)", onnx_dtype_name(to)));
  // (ONNX packs the 4- and 2-bit types: a bit cast keeps their widths, where kiln's one byte an
  // element would let i4 become i8)
  const Tensor x = c.input(0);
  if (onnx_bits(x.dtype()) != onnx_bits(*t) && std::min(onnx_bits(x.dtype()), onnx_bits(*t)) < 8)
    c.fail(fmt::format("cannot bit cast {} ({} bits) to {} ({} bits)", name(x.dtype()),
                       onnx_bits(x.dtype()), name(*t), onnx_bits(*t)));
  return {bitcast(x, *t)};
}

Outs cast_like(NodeContext& c) { return {cast(c.input(0), c.input(1).dtype(), cast_rules(c))}; }

Outs clip_op(NodeContext& c) {
  Tensor x = c.input(0);
  if (c.version() < 11) {
    return {clip(x, c.attr_float("min", -INFINITY), c.attr_float("max", INFINITY))};
  }
  // bounds are optional inputs, known or not
  if ((!c.has_input(1) || c.constant(1)) && (!c.has_input(2) || c.constant(2)) &&
      is_floating(x.dtype())) {
    const double lo = c.has_input(1) ? c.doubles(1).at(0) : -INFINITY;
    const double hi = c.has_input(2) ? c.doubles(2).at(0) : INFINITY;
    if (lo > hi) return {full(c.graph(), x.shape(), hi, x.dtype())};  // ONNX: all max when min > max
    return {clip(x, lo, hi)};
  }
  if (c.has_input(1)) x = maximum(x, cast(c.input(1), x.dtype()));
  if (c.has_input(2)) x = minimum(x, cast(c.input(2), x.dtype()));
  return {x};
}

Outs leaky_relu_op(NodeContext& c) { return {leaky_relu(c.input(0), c.attr_float("alpha", 0.01f))}; }
Outs elu_op(NodeContext& c) { return {elu(c.input(0), c.attr_float("alpha", 1.0f))}; }
Outs selu_op(NodeContext& c) {
  Tensor x = c.input(0);
  const double alpha = c.attr_float("alpha", 1.67326319217681884765625f);
  const double gamma = c.attr_float("gamma", 1.05070102214813232421875f);
  Tensor neg = mul(scalar_of(x, alpha), sub(exp(x), scalar_of(x, 1)));
  return {mul(scalar_of(x, gamma), where(greater(x, scalar_of(x, 0)), x, neg))};
}
Outs celu_op(NodeContext& c) {
  Tensor x = c.input(0);
  const double alpha = c.attr_float("alpha", 1.0f);
  Tensor e = mul(scalar_of(x, alpha), sub(exp(div(x, scalar_of(x, alpha))), scalar_of(x, 1)));
  return {add(maximum(x, scalar_of(x, 0)), minimum(e, scalar_of(x, 0)))};
}
Outs hard_sigmoid_op(NodeContext& c) {
  return {hardsigmoid(c.input(0), c.attr_float("alpha", 0.2f), c.attr_float("beta", 0.5f))};
}
Outs thresholded_relu(NodeContext& c) {
  Tensor x = c.input(0);
  return {where(greater(x, scalar_of(x, c.attr_float("alpha", 1.0f))), x, scalar_of(x, 0))};
}
Outs softplus_op(NodeContext& c) {
  Tensor x = c.input(0);  // log(1 + exp(x)) = max(x, 0) + log1p(exp(-|x|)), stable for large |x|
  return {add(maximum(x, scalar_of(x, 0)), log1p(exp(neg(abs(x)))))};
}
Outs softsign(NodeContext& c) {
  Tensor x = c.input(0);
  return {div(x, add(abs(x), scalar_of(x, 1)))};
}
Outs mish(NodeContext& c) {
  Tensor x = c.input(0);
  Tensor sp = add(maximum(x, scalar_of(x, 0)), log1p(exp(neg(abs(x)))));
  return {mul(x, tanh(sp))};
}
Outs gelu_op(NodeContext& c) {
  const std::string a = c.attr_string("approximate", "none");
  if (a != "none" && a != "tanh") c.fail(fmt::format("approximate='{}' is not none or tanh", a));
  return {gelu(c.input(0), a == "tanh" ? GeluApprox::tanh : GeluApprox::none)};
}
Outs shrink_op(NodeContext& c) {
  Tensor x = c.input(0);
  const double l = c.attr_float("lambd", 0.5f), b = c.attr_float("bias", 0.0f);
  // bias == lambd is softshrink: one op (fusable, and placed as one)
  if (b == l && l >= 0 && is_floating(x.dtype())) return {softshrink(x, l)};
  Tensor lo = less(x, scalar_of(x, -l)), hi = greater(x, scalar_of(x, l));
  return {where(lo, add(x, scalar_of(x, b)), where(hi, sub(x, scalar_of(x, b)), scalar_of(x, 0)))};
}
Outs prelu_op(NodeContext& c) {
  Tensor x = c.input(0), slope = c.input(1);
  return {where(less(x, scalar_of(x, 0)), mul(x, slope), x)};
}
Outs hardswish_op(NodeContext& c) { return {hardswish(c.input(0))}; }
// Swish (opset 24): x · sigmoid(alpha · x); alpha 1 is silu.
Tensor swish(const Tensor& x, double alpha) {
  return alpha == 1.0 ? silu(x) : x * sigmoid(x * alpha);
}

// SwiGLU (opset 28): Swish_alpha(A) · B = A · sigmoid(alpha · A) · B, A and B of one shape.
Outs swiglu_op(NodeContext& c) {
  const Tensor a = c.input(0), b = c.input(1);
  if (a.shape() != b.shape())
    c.fail(fmt::format("A {} and B {} differ in shape", str(a.shape()), str(b.shape())));
  return {swish(a, c.attr_float("alpha", 1.0f)) * b};
}

Outs swish_op(NodeContext& c) { return {swish(c.input(0), c.attr_float("alpha", 1.0f))}; }

Outs isinf_op(NodeContext& c) {
  Tensor x = c.input(0);
  const bool pos = c.attr_int("detect_positive", 1) != 0, negv = c.attr_int("detect_negative", 1) != 0;
  Tensor inf = isinf(x);
  if (pos && negv) return {inf};
  if (!pos && !negv) return {logical_and(inf, logical_not(inf))};
  Tensor side = pos ? greater(x, scalar_of(x, 0)) : less(x, scalar_of(x, 0));
  return {logical_and(inf, side)};
}

Outs where_op(NodeContext& c) { return {where(c.input(0), c.input(1), c.input(2))}; }

Outs sum_op(NodeContext& c) { return variadic<add>(c); }

Tensor relu_any(const Tensor& x) { return relu(x); }

Outs bit_shift_op(NodeContext& c) {
  const std::string dir = c.attr_string("direction", "");
  if (dir != "LEFT" && dir != "RIGHT") c.fail(fmt::format("direction '{}' is not LEFT or RIGHT", dir));
  return {bit_shift(c.input(0), c.input(1), dir == "LEFT")};
}

}  // namespace

void add_elementwise_ops(std::vector<OpEntry>& t) {
  t.insert(t.end(), {
                        {"Add", 7, binary<add>},
                        {"Sub", 7, binary<sub>},
                        {"Mul", 7, binary<mul>},
                        {"Div", 7, div_op},
                        {"Pow", 7, pow_op},
                        {"Mod", 10, mod_op},
                        {"Max", 8, variadic<maximum>},
                        {"Min", 8, variadic<minimum>},
                        {"Sum", 8, sum_op},
                        {"Mean", 8, mean_op},
                        {"Equal", 7, binary<equal>},
                        {"Less", 7, binary<less>},
                        {"Greater", 7, binary<greater>},
                        {"LessOrEqual", 12, binary<less_equal>},
                        {"GreaterOrEqual", 12, binary<greater_equal>},
                        {"And", 7, binary<logical_and>},
                        {"Or", 7, binary<logical_or>},
                        {"Xor", 7, binary<logical_xor>},
                        {"Not", 1, unary<logical_not>},
                        {"Where", 9, where_op},
                        {"Abs", 6, unary<abs>},
                        {"Neg", 6, unary<neg>},
                        {"Sign", 9, unary<sign>},
                        {"Exp", 6, unary<exp>},
                        {"Log", 6, unary<log>},
                        {"Sqrt", 6, unary<sqrt>},
                        {"Reciprocal", 6, unary<reciprocal>},
                        {"Sin", 7, unary<sin>},
                        {"Cos", 7, unary<cos>},
                        {"Tanh", 6, unary<tanh>},
                        {"Sigmoid", 6, unary<sigmoid>},
                        {"Relu", 6, unary<relu_any>},
                        {"Floor", 6, unary<floor>},
                        {"Ceil", 6, unary<ceil>},
                        {"Round", 11, unary<round>},
                        {"Erf", 9, unary<erf>},
                        {"IsNaN", 9, unary<isnan>},
                        {"IsInf", 10, isinf_op},
                        {"Identity", 1, identity},
                        {"Cast", 6, cast_op},
                        {"CastLike", 15, cast_like},
                        // opset 24 adds round_mode, for float8e8m0 targets: the same mapping
                        {"Cast", 24, cast_op},
                        {"CastLike", 24, cast_like},
                        {"BitCast", 26, bitcast_op},
                        {"Clip", 6, clip_op},
                        {"LeakyRelu", 6, leaky_relu_op},
                        {"Elu", 6, elu_op},
                        {"Selu", 6, selu_op},
                        {"Celu", 12, celu_op},
                        {"HardSigmoid", 6, hard_sigmoid_op},
                        {"HardSwish", 14, hardswish_op},
                        {"Swish", 24, swish_op},
                        {"SwiGLU", 28, swiglu_op},
                        {"ThresholdedRelu", 10, thresholded_relu},
                        {"Softplus", 1, softplus_op},
                        {"Softsign", 1, softsign},
                        {"Mish", 18, mish},
                        {"Gelu", 20, gelu_op},
                        {"Shrink", 9, shrink_op},
                        {"PRelu", 7, prelu_op},
                        {"Tan", 7, unary<tan>},
                        {"Asin", 7, unary<asin>},
                        {"Acos", 7, unary<acos>},
                        {"Atan", 7, unary<atan>},
                        {"Sinh", 9, unary<sinh>},
                        {"Cosh", 9, unary<cosh>},
                        {"Asinh", 9, unary<asinh>},
                        {"Acosh", 9, unary<acosh>},
                        {"Atanh", 9, unary<atanh>},
                        {"BitwiseAnd", 18, binary<bitwise_and>},
                        {"BitwiseOr", 18, binary<bitwise_or>},
                        {"BitwiseXor", 18, binary<bitwise_xor>},
                        {"BitwiseNot", 18, unary<bitwise_not>},
                        {"BitShift", 11, bit_shift_op},
                    });
}

}  // namespace kiln::onnx::detail
