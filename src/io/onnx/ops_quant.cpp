// ONNX quantization ops (QuantizeLinear, DequantizeLinear, integer matmul and conv), lowered onto
// kiln ops.
//
// QuantizeLinear and DequantizeLinear become kiln's quantize / dequantize (per tensor, per axis,
// blocked) where those compute exactly what the reference does; the rarer forms (half-precision
// or integer x, a `precision` attribute, i32 data with half scales) keep the composition below.
//
// Integer results follow ONNX's reference exactly: integer products accumulate in f32 chunks
// short enough to hold every sum exactly (MatMulInteger) or in f64 (conv, exact for these sizes),
// requantization scales multiply in f64 and round half to even before saturating to the output
// type's range. QLinearConv over 2 spatial dims becomes one quantized_conv node that computes the
// same; ConvInteger (i32 out) keeps the composition.
#include <algorithm>
#include <cmath>

#include "io/onnx/map_util.h"
#include "kiln/ops/quant.h"

namespace kiln::onnx::detail {

namespace {

std::pair<double, double> int_range(NodeContext& c, DType t) {
  switch (t) {
    case DType::u8: return {0, 255};
    case DType::i8: return {-128, 127};
    case DType::i16: return {-32768, 32767};
    case DType::u16:
      return {0, 65535};
    case DType::i32: return {-2147483648.0, 2147483647.0};
    case DType::i4:
      return {-8, 7};
    case DType::u4:
      return {0, 15};
    case DType::i2:
      return {-2, 1};
    case DType::u2:
      return {0, 3};
    default: c.unsupported(fmt::format("quantized type {}", name(t)));
  }
}

// The 4- and 2-bit integers quantize and dequantize as the 8-bit one of their signedness, then
// cast (which saturates); f4e2m1fn as the 8-bit floats do.
bool sub_byte_int(DType t) { return t == i4 || t == u4 || t == i2 || t == u2; }
DType byte_type_of(DType t) { return t == i4 || t == i2 ? i8 : u8; }
bool float_codes(DType t) { return is_float8(t) || t == f4e2m1fn; }

// A scale or zero point shaped to broadcast against a rank-`rank` tensor: a scalar (or one
// value) per tensor, a 1-D tensor along `axis`.
Tensor per_axis(NodeContext& c, const Tensor& v, int rank, int64_t axis, const char* what) {
  if (v.rank() == 0) return v;
  if (v.rank() != 1)
    c.unsupported(fmt::format("{} of shape {} (blocked quantization)", what, str(v.shape())));
  if (v.dim(0) == 1) return reshape(v, {});
  const int64_t a = axis_of(c, axis, rank);
  Shape s(static_cast<size_t>(rank), 1);
  s[static_cast<size_t>(a)] = v.dim(0);
  return reshape(v, s);
}

// round half to even, then add the zero point and saturate to `t`'s range, in f64; NaN gives
// the range's low end.
Tensor requantize(NodeContext& c, const Tensor& scaled, const std::optional<Tensor>& zp, DType t) {
  const auto [lo, hi] = int_range(c, t);
  Tensor r = cast(round(scaled), f64);
  if (zp) r = add(r, cast(*zp, f64));
  r = where(isnan(r), scalar_of(r, lo), clip(r, lo, hi));
  return cast(r, t);
}

// A scale or zero point for kiln's quantize / dequantize: one value per tensor as 0-d.
Tensor param_of(NodeContext& c, const Tensor& v, int64_t block, const char* what) {
  if (block > 0 || v.rank() == 0) return v;
  if (v.rank() == 1) return v.dim(0) == 1 ? reshape(v, {}) : v;
  c.fail(fmt::format("{} must be a scalar or 1-D without block_size, got shape {}", what,
                     str(v.shape())));
}

QuantizeOptions quant_options(NodeContext& c, const Tensor& scale, int64_t axis, int64_t block,
                              int rank) {
  if (block < 0) c.fail(fmt::format("block_size must be >= 0, got {}", block));
  return {scale.rank() == 0 ? 0 : axis_of(c, axis, rank), block};
}

// A float type's zero point (input 2), where given, must be 0 (ONNX's QuantizeLinear and
// DequantizeLinear); one known at import is checked.
void check_zero_point_is_zero(NodeContext& c, const char* what) {
  if (!c.has_input(2) || !c.constant(2)) return;
  for (double v : c.doubles(2))
    if (v != 0)
      c.fail(fmt::format("{} must be 0 for a float type ({}), got {}", what,
                         name(c.input(2).dtype()), v));
}

// QuantizeLinear to an 8-bit float or f4e2m1fn: x / y_scale rounded to it (saturating unless the
// node's `saturate` is 0), in x's and the scale's promoted float type as the reference divides.
Tensor quantize_float(NodeContext& c, const Tensor& x, const Tensor& scale, int64_t axis,
                      int64_t block, DType out) {
  check_zero_point_is_zero(c, "y_zero_point");
  if (block > 0)
    c.unsupported(fmt::format("blocked quantization to {} (block_size > 0)", name(out)));
  Tensor q = div(x, per_axis(c, scale, x.rank(), axis, "y_scale"));
  if (c.has_attr("precision") && c.attr_int("precision", 0) != 0)
    c.unsupported(fmt::format("precision with a {} output", name(out)));
  return cast(q, out, c.attr_int("saturate", 1) != 0);
}

Outs quantize_linear(NodeContext& c) {
  Tensor x = c.input(0), scale = c.input(1);
  const int64_t block = c.version() >= 21 ? c.attr_int("block_size", 0) : 0;
  const int64_t axis = c.version() >= 13 ? c.attr_int("axis", 1) : 1;
  if (c.version() < 13 && scale.rank() > 0 && !(scale.rank() == 1 && scale.dim(0) == 1))
    c.fail(fmt::format("y_scale must be a scalar before opset 13, got {}", str(scale.shape())));
  std::optional<Tensor> zp;
  DType out = u8;
  if (c.has_input(2)) {
    zp = c.input(2);
    out = zp->dtype();
  } else if (c.has_attr("output_dtype") && c.attr_int("output_dtype", 0) != 0) {
    const int32_t od = static_cast<int32_t>(c.attr_int("output_dtype", 0));
    const auto t = from_onnx_dtype(od);
    if (!t) c.unsupported(fmt::format("output_dtype {}", onnx_dtype_name(od)));
    out = *t;
  }
  if (float_codes(out)) return {quantize_float(c, x, scale, axis, block, out)};
  const DType narrow_out = out;
  if (sub_byte_int(out)) {
    out = byte_type_of(out);
    if (zp) zp = cast(*zp, out);
  } else if (out != u8 && out != i8 && out != i16 && out != u16) {
    c.unsupported(fmt::format("quantizing to {}", name(out)));
  }
  const auto narrowed = [&](const Tensor& q) {
    return q.dtype() == narrow_out ? q : cast(q, narrow_out);
  };
  const bool precision = c.has_attr("precision") && c.attr_int("precision", 0) != 0;
  if ((x.dtype() == f32 || x.dtype() == f64) && scale.dtype() == x.dtype() && !precision) {
    const Tensor s = param_of(c, scale, block, "y_scale");
    const QuantizeOptions o = quant_options(c, s, axis, block, x.rank());
    if (!zp) return {narrowed(quantize(x, s, out, o))};
    return {narrowed(quantize(x, s, param_of(c, *zp, block, "y_zero_point"), o))};
  }
  if (block > 0) c.unsupported("blocked quantization (block_size > 0) of this x and scale type");
  scale = per_axis(c, scale, x.rank(), axis, "y_scale");
  if (zp) zp = per_axis(c, *zp, x.rank(), axis, "y_zero_point");
  // x / scale in x's float type (numpy's promotion: integers divide in f64), or in `precision`
  if (c.has_attr("precision") && c.attr_int("precision", 0) != 0) {
    const int32_t p = static_cast<int32_t>(c.attr_int("precision", 0));
    const auto t = from_onnx_dtype(p);
    if (!t || !is_floating(*t)) c.unsupported(fmt::format("precision {}", onnx_dtype_name(p)));
    x = cast(x, *t);
    scale = cast(scale, *t);
  } else if (!is_floating(x.dtype())) {
    x = cast(x, f64);
    scale = cast(scale, f64);
  }
  return {requantize(c, div(x, scale), zp, narrow_out)};
}

Outs dequantize_linear(NodeContext& c) {
  Tensor x = c.input(0), scale = c.input(1);
  const int64_t block = c.version() >= 21 ? c.attr_int("block_size", 0) : 0;
  const int64_t axis = c.version() >= 13 ? c.attr_int("axis", 1) : 1;
  if (!is_integer(x.dtype()) && !is_narrow(x.dtype()))
    c.fail(
        fmt::format("x must be an integer, 8-bit or 4-bit float tensor, got {}", name(x.dtype())));
  std::optional<Tensor> zp;
  if (c.has_input(2)) {
    zp = c.input(2);
    if (zp->dtype() != x.dtype())
      c.fail(fmt::format("x_zero_point is {}, x is {}", name(zp->dtype()), name(x.dtype())));
  }
  if (sub_byte_int(x.dtype())) {  // (exactly: every value fits the byte type)
    x = cast(x, byte_type_of(x.dtype()));
    if (zp) zp = cast(*zp, x.dtype());
  }
  DType out = scale.dtype();
  if (c.has_attr("output_dtype") && c.attr_int("output_dtype", 0) != 0) {
    const int32_t od = static_cast<int32_t>(c.attr_int("output_dtype", 0));
    const auto t = from_onnx_dtype(od);
    if (!t || !is_floating(*t)) c.unsupported(fmt::format("output_dtype {}", onnx_dtype_name(od)));
    out = *t;
  }
  const DType qt = x.dtype();
  if (float_codes(qt)) {  // x as f32 times the scale (a zero point must be 0)
    check_zero_point_is_zero(c, "x_zero_point");
    if (block > 0)
      c.unsupported(fmt::format("blocked dequantization of {} (block_size > 0)", name(qt)));
    const Tensor y = mul(cast(x, f32), per_axis(c, scale, x.rank(), axis, "x_scale"));
    return {y.dtype() == out ? y : cast(y, out)};
  }
  if ((qt == i8 || qt == u8 || qt == i16 || qt == u16 ||
       (qt == i32 && (scale.dtype() == f32 || scale.dtype() == f64))) &&
      is_floating(scale.dtype())) {
    const Tensor s = param_of(c, scale, block, "x_scale");
    const QuantizeOptions o = quant_options(c, s, axis, block, x.rank());
    Tensor y;
    if (zp) {
      y = dequantize(x, s, param_of(c, *zp, block, "x_zero_point"), o);
    } else {
      y = dequantize(x, s, o);
    }
    return {y.dtype() == out ? y : cast(y, out)};
  }
  if (block > 0) c.unsupported("blocked quantization (block_size > 0) of this x and scale type");
  scale = per_axis(c, scale, x.rank(), axis, "x_scale");
  // (x as f32 - zero point) * scale, as the reference computes it (f64 for i32 zero points)
  Tensor d = cast(x, f32);
  if (zp) {
    const Tensor z = per_axis(c, *zp, x.rank(), axis, "x_zero_point");
    if (z.dtype() == i32 || z.dtype() == i64) d = cast(d, f64);
    d = sub(d, cast(z, d.dtype()));
  }
  Tensor y = mul(d, scale);
  return {y.dtype() == out ? y : cast(y, out)};
}

Outs dynamic_quantize_linear(NodeContext& c) {
  Tensor x = c.input(0);
  if (x.dtype() != f32) c.fail(fmt::format("x must be FLOAT, got {}", name(x.dtype())));
  Tensor zero = scalar_of(x, 0);
  Tensor mx = maximum(max(x), zero), mn = minimum(min(x), zero);
  Tensor range = where(equal(mx, mn), scalar_of(x, 1), sub(mx, mn));
  Tensor scale = div(range, scalar_of(x, 255));
  Tensor zp = cast(round(clip(sub(zero, div(mn, scale)), 0, 255)), u8);
  // saturate(round_half_even(x / scale) + zp): kiln's quantize, one vectorized pass
  return {quantize(x, scale, zp), scale, zp};
}

// A scale or zero point for an operand of rank `rank`: a scalar or one value applies to the whole
// operand, a 1-D tensor runs along `axis` (negative counts from the end: rows of A are -2,
// columns of B -1, output channels of W 0), an N-D one broadcasts as it is.
Tensor along(NodeContext& c, const Tensor& v, int rank, int axis) {
  if (v.rank() == 0) return v;
  if (v.rank() == 1 && v.dim(0) == 1) return reshape(v, {});
  if (v.rank() != 1) return v;
  const int a = axis < 0 ? rank + axis : axis;
  if (a < 0 || a >= rank)
    c.fail(fmt::format("a 1-D scale or zero point of {} values needs an operand of rank > {}, got {}",
                       v.dim(0), a, rank));
  Shape s(static_cast<size_t>(rank), 1);
  s[static_cast<size_t>(a)] = v.dim(0);
  return reshape(v, s);
}

// An operand minus its zero point (input `zp_input`, optional), in dtype `t`.
Tensor minus_zero_point(NodeContext& c, const Tensor& v, int zp_input, int axis, DType t) {
  Tensor r = cast(v, t);
  if (!c.has_input(zp_input)) return r;
  Tensor zp = c.input(zp_input);
  if (zp.dtype() != v.dtype())
    c.fail(fmt::format("zero point is {}, its operand {}", name(zp.dtype()), name(v.dtype())));
  return sub(r, cast(along(c, zp, std::max(v.rank(), 1), axis), t));
}

// A per-tensor scale or zero point (one value).
Tensor one_value(NodeContext& c, int input) {
  Tensor v = c.input(input);
  if (v.rank() == 0) return v;
  if (v.rank() == 1 && v.dim(0) == 1) return reshape(v, {});
  c.fail(fmt::format("input {} must be a scalar, got shape {}", input, str(v.shape())));
}

void check_int8(NodeContext& c, const Tensor& t, const char* what) {
  if (t.dtype() != u8 && t.dtype() != i8)
    c.fail(fmt::format("{} must be UINT8 or INT8, got {}", what, name(t.dtype())));
}

// MatMulInteger: the exact i32 product of A - a_zero_point (per tensor or per row of A) and
// B - b_zero_point (per tensor or per column of B). Each operand minus its zero point lies in
// [-255, 255], so a product is at most 255² and a sum of 256 of them stays below 2^24, where f32
// holds every integer: chunks of 256 along K run as f32 products (oneDNN's or cuBLAS's tuned
// kernels; exact in any order of summation, and on TF32, bf16 or f16 inputs too, which hold
// these integers exactly), each rounded back to i32 and summed in i32. (An integer product in
// loops took about 45 µs for 32 x 64 x 64.) A K known only at run time takes the i32 product.
Outs matmul_integer(NodeContext& c) {
  Tensor a = c.input(0), b = c.input(1);
  check_int8(c, a, "A");
  check_int8(c, b, "B");
  const int64_t k = b.rank() >= 2 ? b.dim(b.rank() - 2) : b.dim(0);
  const int a_axis = a.rank() >= 2 ? -2 : 0;
  if (k < 0)
    return {matmul(minus_zero_point(c, a, 2, a_axis, i32), minus_zero_point(c, b, 3, -1, i32))};
  Tensor af = minus_zero_point(c, a, 2, a_axis, f32);
  Tensor bf = minus_zero_point(c, b, 3, -1, f32);
  constexpr int64_t kChunk = 256;
  if (k <= kChunk) return {cast(matmul(af, bf), i32)};
  std::vector<int64_t> sizes;
  for (int64_t k0 = 0; k0 < k; k0 += kChunk) sizes.push_back(std::min(kChunk, k - k0));
  const std::vector<Tensor> as = split(af, sizes, -1);
  const std::vector<Tensor> bs = split(bf, sizes, b.rank() >= 2 ? b.rank() - 2 : 0);
  Tensor y = cast(matmul(as[0], bs[0]), i32);
  for (size_t i = 1; i < as.size(); ++i) y = add(y, cast(matmul(as[i], bs[i]), i32));
  return {y};
}

ConvOptions conv_options(NodeContext& c, int nd) {
  ConvOptions o;
  o.stride = c.attr_ints("strides", std::vector<int64_t>(static_cast<size_t>(nd), 1));
  o.dilation = c.attr_ints("dilations", std::vector<int64_t>(static_cast<size_t>(nd), 1));
  o.padding = c.attr_ints("pads", std::vector<int64_t>(2 * static_cast<size_t>(nd), 0));
  o.groups = c.attr_int("group", 1);
  const std::string ap = c.attr_string("auto_pad", "NOTSET");
  if (ap == "SAME_UPPER") {
    o.pad_mode = PadMode::same_upper;
  } else if (ap == "SAME_LOWER") {
    o.pad_mode = PadMode::same_lower;
  } else if (ap == "VALID") {
    o.pad_mode = PadMode::valid;
  } else if (ap != "NOTSET") {
    c.fail(fmt::format("unknown auto_pad '{}'", ap));
  }
  if (o.pad_mode != PadMode::explicit_) o.padding.clear();
  return o;
}

// Exact integer convolution of (x - x_zp) and (w - w_zp) (+ bias), computed in f64.
Tensor integer_conv(NodeContext& c, int x_in, int xzp_in, int w_in, int wzp_in,
                    const std::optional<Tensor>& bias) {
  Tensor x = c.input(x_in), w = c.input(w_in);
  check_int8(c, x, "x");
  check_int8(c, w, "w");
  if (w.rank() < 3 || w.rank() > 5) c.unsupported(fmt::format("{}-D weights", w.rank()));
  if (x.rank() != w.rank())
    c.fail(fmt::format("x {} and w {} differ in rank", str(x.shape()), str(w.shape())));
  Tensor xf = minus_zero_point(c, x, xzp_in, 1, f64);
  Tensor wf = minus_zero_point(c, w, wzp_in, 0, f64);
  std::optional<Tensor> bf;
  if (bias) bf = cast(*bias, f64);
  const ConvOptions o = conv_options(c, w.rank() - 2);
  switch (w.rank()) {
    case 3: return conv1d(xf, wf, bf, o);
    case 4: return conv2d(xf, wf, bf, o);
    default: return conv3d(xf, wf, bf, o);
  }
}

Outs conv_integer(NodeContext& c) {
  return {cast(integer_conv(c, 0, 2, 1, 3, std::nullopt), i32)};
}

// The requantization multiplier a_scale * b_scale / y_scale in the scales' type, as f64.
Tensor multiplier(const Tensor& sa, const Tensor& sb, const Tensor& sy) {
  return cast(div(mul(sa, sb), sy), f64);
}

Outs qlinear_matmul(NodeContext& c) {
  Tensor a = c.input(0), b = c.input(3);
  check_int8(c, a, "a");
  check_int8(c, b, "b");
  const int ra = std::max(a.rank(), 2), rb = std::max(b.rank(), 2);
  // a's scale and zero point per row, b's per column, y's per row
  Tensor a32 = minus_zero_point(c, a, 2, a.rank() >= 2 ? -2 : 0, i32);
  Tensor b32 = minus_zero_point(c, b, 5, -1, i32);
  Tensor acc = cast(matmul(a32, b32), f64);
  Tensor sa = along(c, c.input(1), ra, -2), sb = along(c, c.input(4), rb, -1),
         sy = along(c, c.input(6), ra, -2);
  std::optional<Tensor> yzp;
  DType out = a.dtype();
  if (c.has_input(7)) {
    yzp = along(c, c.input(7), ra, -2);
    out = yzp->dtype();
  }
  return {requantize(c, mul(acc, multiplier(sa, sb, sy)), yzp, out)};
}

// QLinearConv over 2 spatial dims as one quantized_conv: the reference's multiplier
// x_scale * w_scale / y_scale (in f32) becomes the weight scale, with unit x and y scales, and
// the i32 bias adds to the integer sum, so results match the composition below bit for bit.
// Other forms (1-D / 3-D, other scale types or shapes) return nothing.
std::optional<Tensor> qlinear_conv_fused(NodeContext& c) {
  const Tensor x = c.input(0), w = c.input(3);
  if (x.rank() != 4 || w.rank() != 4 || (x.dtype() != u8 && x.dtype() != i8) ||
      (w.dtype() != u8 && w.dtype() != i8))
    return std::nullopt;
  const int64_t o = w.dim(0);
  auto vec = [&](Tensor v) -> std::optional<Tensor> {  // 0-d or (O)
    if (v.rank() == 1 && v.dim(0) == 1) return reshape(v, {});
    if (v.rank() == 0 || (v.rank() == 1 && v.dim(0) == o)) return v;
    return std::nullopt;
  };
  const Tensor sx = one_value(c, 1), sy = one_value(c, 6);
  const auto sw = vec(c.input(4));
  if (!sw || sx.dtype() != f32 || sw->dtype() != f32 || sy.dtype() != f32) return std::nullopt;
  std::optional<Tensor> bias;
  if (c.has_input(8)) {
    bias = c.input(8);
    if (bias->dtype() != i32 || bias->rank() != 1 || bias->dim(0) != o) return std::nullopt;
  }
  const Tensor xzp = c.has_input(2) ? one_value(c, 2) : scalar_of(x, 0);
  const auto wzp_in = c.has_input(5) ? vec(c.input(5)) : std::optional<Tensor>(scalar_of(w, 0));
  if (!wzp_in || xzp.dtype() != x.dtype() || wzp_in->dtype() != w.dtype()) return std::nullopt;
  const Tensor yzp = c.has_input(7) ? one_value(c, 7) : scalar_of(x, 0);
  if (yzp.dtype() != u8 && yzp.dtype() != i8) return std::nullopt;
  Tensor m = div(mul(sx, *sw), sy), wzp = *wzp_in;
  if (m.rank() != wzp.rank()) {  // one per channel: both (O)
    if (m.rank() == 0) m = broadcast_to(m, {o});
    if (wzp.rank() == 0) wzp = broadcast_to(wzp, {o});
  }
  const Tensor one = scalar_of(sx, 1);
  QuantizedConvOptions opts;
  opts.conv = conv_options(c, 2);
  opts.bias = bias;
  return quantized_conv({x, one, xzp}, {w, m, wzp}, one, yzp, opts);
}

Outs qlinear_conv(NodeContext& c) {
  if (auto fused = qlinear_conv_fused(c)) return {*fused};
  Tensor x = c.input(0), w = c.input(3);
  std::optional<Tensor> bias;
  if (c.has_input(8)) bias = c.input(8);
  Tensor acc = integer_conv(c, 0, 2, 3, 5, bias);  // f64, exact
  // w_scale per output channel: channel axis 1 of the result
  Tensor sx = one_value(c, 1), sy = one_value(c, 6), sw = along(c, c.input(4), w.rank(), 1);
  std::optional<Tensor> yzp;
  DType out = x.dtype();
  if (c.has_input(7)) {
    yzp = one_value(c, 7);
    out = yzp->dtype();
  }
  return {requantize(c, mul(acc, multiplier(sx, sw, sy)), yzp, out)};
}

}  // namespace

void add_quant_ops(std::vector<OpEntry>& t) {
  t.insert(t.end(), {
                        {"QuantizeLinear", 10, quantize_linear},
                        {"QuantizeLinear", 13, quantize_linear},
                        {"QuantizeLinear", 19, quantize_linear},
                        {"QuantizeLinear", 21, quantize_linear},
                        {"QuantizeLinear", 23, quantize_linear},
                        {"DequantizeLinear", 10, dequantize_linear},
                        {"DequantizeLinear", 13, dequantize_linear},
                        {"DequantizeLinear", 19, dequantize_linear},
                        {"DequantizeLinear", 21, dequantize_linear},
                        {"DequantizeLinear", 23, dequantize_linear},
                        {"DynamicQuantizeLinear", 11, dynamic_quantize_linear},
                        {"MatMulInteger", 10, matmul_integer},
                        {"ConvInteger", 10, conv_integer},
                        {"QLinearMatMul", 10, qlinear_matmul},
                        {"QLinearMatMul", 21, qlinear_matmul},
                        {"QLinearConv", 10, qlinear_conv},
                    });
}

}  // namespace kiln::onnx::detail
