// quantize, dequantize, fake_quantize (family quant; include/kiln/ops/quant.h). Inputs
// (x, scale, zero_point) with zero_point always present (builders make zeros for symmetric
// quantization) and of scale's shape. Attrs: axis (resolved, >= 0), block_size (>= 0).
//   quantize:      x float -> zero_point's dtype (i8, u8, i16, u16); no gradient (integer output).
//   dequantize:    q (i8, u8, i16, u16, i32) -> scale's dtype; gradient for scale only.
//   fake_quantize: x float -> x's dtype; straight-through gradient masked to the range.
// quantized_matmul: inputs a, a_scale, a_zp, w, w_scale, w_zp, y_scale, y_zp[, bias][, residual];
//   attrs transpose_w, relu, has_bias, has_residual, gelu ("erf" or "tanh": gelu after the
//   additions; absent: none; not with relu), zero_w_zp (set by fuse_quant where w_zp is a
//   constant of zeros, default false: kernels may skip the row sums of a). Inference only.
// quantized_conv: inputs x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp[, bias][, residual
//   [, residual_scale, residual_zp]]; attrs conv's stride, pads, dilation, groups, plus relu,
//   has_bias, has_residual, quantized_residual (the residual i8/u8 with a 0-d f32 scale and zero
//   point, dequantized as dequantize does: fuse_quant folds a residual's dequantize in), gelu (as
//   quantized_matmul's). Inference
//   only. The bias is (O), (O, 1, 1) or (1, O, 1, 1): the pass keeps what the graph added; an
//   i32 bias (ONNX QLinearConv's) adds to the integer sum before scaling. Layout channels_last
//   (attr channels_last, set by the channels_last pass): x, residual and output are NHWC. Attr
//   zero_w_zp (set by the same pass where w_zp is a constant of zeros, default false): kernels
//   may skip the window sums of x that a weight zero point needs. Attr weights_ohwi (set by the
//   same pass for CUDA's constant weights, groups 1): w is (O, kh, kw, C). Attr quantize_x (set
//   by the same pass on CUDA where a quantize of a float image, at most 4 channels, feeds the
//   conv alone, default false): x is f32 NCHW in either layout, and the conv reads
//   quantize(x, x_scale, x_zp) (exactly quantize's values; the data's dtype is x_zp's).
// quantized_weight_linear: inputs x (f32), w (N, K) i8/u8, w_scale, w_zp[, bias]; attr has_bias.
//   Inference only.
// dequantize_adaptive_avg_pool: inputs q (N, C, H, W) i8/u8, scale (0-d f32), zero point (0-d);
//   attr output_size (2 entries). Layout channels_last (attr channels_last, set by the
//   channels_last pass on CUDA): q and the output are NHWC. Inference only.
// The kernels read the attributes decoded (ops/quant_params.h).
#include "kiln/ops/quant.h"

#include "kiln/ops/core.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/reduce.h"
#include "kiln/ops/transform.h"
#include "ops/common.h"
#include "ops/conv_attrs.h"
#include "ops/quant_params.h"

namespace kiln {

using namespace ops;

namespace {
constexpr DTypeSet kQuantTypes{i8, u8, i16, u16};

// A tensor of scale's shape filled with v, of dtype t.
Tensor full_like_scale(const Tensor& scale, double v, DType t) {
  const Tensor c = cast_to(scalar_like(scale, v), t);
  return scale.rank() == 0 ? c : broadcast_to(c, scale.shape());
}
Tensor zeros_of(const Tensor& scale, DType t) { return full_like_scale(scale, 0, t); }

// Checks scale and zero point (inputs 1, 2) against x's shape (input 0) for the op's layout.
void check_params(const InferContext& ctx) {
  const TensorInfo &x = ctx.inputs[0], &s = ctx.inputs[1], &zp = ctx.inputs[2];
  const int64_t axis = ctx.attrs.i("axis"), block = ctx.attrs.i("block_size");
  if (!is_floating(s.dtype))
    fail<DTypeError>("[{}] scale must be a float tensor, got {}", ctx.name(), name(s.dtype));
  if (!shapes_match(s.shape, zp.shape))
    fail<ShapeError>("[{}] scale {} and zero_point {} must have one shape", ctx.name(),
                     str(s.shape), str(zp.shape));
  const int64_t rank = static_cast<int64_t>(x.shape.size());
  if (s.shape.empty()) return;  // per tensor
  if (axis < 0 || axis >= rank)
    fail<ShapeError>("[{}] axis {} is out of range for x of shape {}", ctx.name(), axis,
                     str(x.shape));
  const int64_t d = x.shape[static_cast<size_t>(axis)];
  if (block < 0) fail<ValueError>("[{}] block_size must be >= 0, got {}", ctx.name(), block);
  if (block == 0) {
    if (s.shape.size() != 1 || !(dims_match(s.shape[0], d) || s.shape[0] == 1))
      fail<ShapeError>(
          "[{}] a per-channel scale must be 0-d or 1-D with x.shape[{}] = {} values; "
          "got scale {} for x {}",
          ctx.name(), axis, d, str(s.shape), str(x.shape));
    return;
  }
  Shape want = x.shape;
  if (d >= 0) want[static_cast<size_t>(axis)] = (d + block - 1) / block;
  if (!shapes_match(s.shape, want))
    fail<ShapeError>(
        "[{}] a per-group scale for x {} with block_size {} along axis {} must have "
        "shape {}, got {}",
        ctx.name(), str(x.shape), block, axis, str(want), str(s.shape));
}

std::vector<TensorInfo> infer_quantize(const InferContext& ctx) {
  require_dtype(ctx, 0, kFloatTypes, "a float type");
  require_dtype(ctx, 2, kQuantTypes, "i8, u8, i16 or u16 (the zero point sets the output type)");
  check_params(ctx);
  const DType out = ctx.op == OpId::FakeQuantize ? ctx.inputs[0].dtype : ctx.inputs[2].dtype;
  return {{ctx.inputs[0].shape, out}};
}

std::vector<TensorInfo> infer_dequantize(const InferContext& ctx) {
  require_dtype(ctx, 0, kQuantTypes | DTypeSet{i32}, "i8, u8, i16, u16 or i32");
  if (ctx.inputs[2].dtype != ctx.inputs[0].dtype)
    fail<DTypeError>("[dequantize] zero_point has dtype {} but q has dtype {}",
                     name(ctx.inputs[2].dtype), name(ctx.inputs[0].dtype));
  check_params(ctx);
  return {{ctx.inputs[0].shape, ctx.inputs[1].dtype}};
}

// The dtypes of an int8 product (quantized_matmul, quantized_conv): the data (input 0, called
// `data` in messages) and weights (3) i8 or u8 with zero points (2, 5) of their dtype, f32 scales
// (1, 4, 6), and the output's zero point (7) i8 or u8.
void check_int8_dtypes(const InferContext& ctx, const char* data) {
  const auto& in = ctx.inputs;
  const DTypeSet q8{i8, u8};
  require_dtype(ctx, 0, q8, "i8 or u8");
  require_dtype(ctx, 3, q8, "i8 or u8");
  require_dtype(ctx, 7, q8, "i8 or u8 (the output zero point sets the output type)");
  for (int i : {1, 4, 6}) require_dtype(ctx, i, DTypeSet{f32}, "f32 (a scale)");
  if (in[2].dtype != in[0].dtype || in[5].dtype != in[3].dtype)
    fail<DTypeError>("[{}] zero points must have their data's dtype: {} {} with {}, w {} with {}",
                     ctx.name(), data, name(in[0].dtype), name(in[2].dtype), name(in[3].dtype),
                     name(in[5].dtype));
}

// Attr gelu ("erf" or "tanh"), and not with relu.
void check_activation(const InferContext& ctx) {
  if (!ctx.attrs.has("gelu")) return;
  const std::string& g = ctx.attrs.str("gelu");
  if (g != "erf" && g != "tanh")
    fail<ValueError>("[{}] gelu must be 'erf' or 'tanh', got '{}'", ctx.name(), g);
  if (ctx.attrs.b("relu", false))
    fail<ValueError>("[{}] takes one activation: relu or gelu, not both", ctx.name());
}

std::vector<TensorInfo> infer_quantized_matmul(const InferContext& ctx) {
  const auto& in = ctx.inputs;
  const char* op = ctx.name();
  check_int8_dtypes(ctx, "a");
  const Shape &a = in[0].shape, &w = in[3].shape;
  const bool tw = ctx.attrs.b("transpose_w");
  if (a.empty() || w.size() != 2)
    fail<ShapeError>("[{}] a {} must have rank >= 1 and w {} rank 2", op, str(a), str(w));
  const int64_t k = tw ? w[1] : w[0], n = tw ? w[0] : w[1];
  if (!dims_match(a.back(), k))
    fail<ShapeError>("[{}] a {} and w {} (transpose_w {}) disagree in K", op, str(a), str(w), tw);
  check_activation(ctx);
  for (int i : {1, 2, 6, 7})
    if (!in[i].shape.empty())
      fail<ShapeError>("[{}] input {} (a scale or zero point of a or y) must be 0-d, got {}", op, i,
                       str(in[i].shape));
  const Shape& ws = in[4].shape;
  if (!(ws.empty() || (ws.size() == 1 && dims_match(ws[0], n))) || !shapes_match(in[5].shape, ws))
    fail<ShapeError>("[{}] w's scale {} and zero point {} must be 0-d or ({},)", op, str(ws),
                     str(in[5].shape), n);
  Shape out(a.begin(), a.end() - 1);
  out.push_back(n);
  size_t next = 8;
  if (ctx.attrs.b("has_bias", false)) {
    require_dtype(ctx, static_cast<int>(next), DTypeSet{f32}, "f32 (bias)");
    if (!shapes_match(in[next].shape, Shape{n}))
      fail<ShapeError>("[{}] bias {} must be ({})", op, str(in[next].shape), n);
    ++next;
  }
  if (ctx.attrs.b("has_residual", false)) {
    require_dtype(ctx, static_cast<int>(next), DTypeSet{f32}, "f32 (residual)");
    if (!shapes_match(in[next].shape, out))
      fail<ShapeError>("[{}] residual {} must have the output's shape {}", op, str(in[next].shape),
                       str(out));
  }
  return {{out, in[7].dtype}};
}

std::vector<TensorInfo> infer_quantized_weight_linear(const InferContext& ctx) {
  const auto& in = ctx.inputs;
  const char* op = ctx.name();
  require_dtype(ctx, 0, DTypeSet{f32}, "f32");
  require_dtype(ctx, 1, DTypeSet{i8, u8}, "i8 or u8");
  require_dtype(ctx, 2, DTypeSet{f32}, "f32 (a scale)");
  if (in[3].dtype != in[1].dtype)
    fail<DTypeError>("[{}] w's zero point has dtype {} but w has {}", op, name(in[3].dtype),
                     name(in[1].dtype));
  const Shape &x = in[0].shape, &w = in[1].shape, &ws = in[2].shape;
  if (x.empty() || w.size() != 2)
    fail<ShapeError>("[{}] x {} must have rank >= 1 and w {} rank 2 (N, K)", op, str(x), str(w));
  if (!dims_match(x.back(), w[1]))
    fail<ShapeError>("[{}] x {} and w {} (N, K) disagree in K", op, str(x), str(w));
  if (!(ws.empty() || (ws.size() == 1 && dims_match(ws[0], w[0]))) ||
      !shapes_match(in[3].shape, ws))
    fail<ShapeError>("[{}] w's scale {} and zero point {} must be 0-d or ({},)", op, str(ws),
                     str(in[3].shape), w[0]);
  if (ctx.attrs.b("has_bias", false)) {
    require_dtype(ctx, 4, DTypeSet{f32}, "f32 (bias)");
    if (!shapes_match(in[4].shape, Shape{w[0]}))
      fail<ShapeError>("[{}] bias {} must be ({})", op, str(in[4].shape), w[0]);
  }
  Shape out(x.begin(), x.end() - 1);
  out.push_back(w[0]);
  return {{out, f32}};
}

std::vector<TensorInfo> infer_dequantize_adaptive_avg_pool(const InferContext& ctx) {
  const auto& in = ctx.inputs;
  const char* op = ctx.name();
  require_dtype(ctx, 0, DTypeSet{i8, u8}, "i8 or u8");
  require_dtype(ctx, 1, DTypeSet{f32}, "f32 (a scale)");
  if (in[2].dtype != in[0].dtype)
    fail<DTypeError>("[{}] the zero point has dtype {} but q has {}", op, name(in[2].dtype),
                     name(in[0].dtype));
  if (!in[1].shape.empty() || !in[2].shape.empty())
    fail<ShapeError>("[{}] the scale {} and zero point {} must be 0-d", op, str(in[1].shape),
                     str(in[2].shape));
  if (in[0].shape.size() != 4 || ctx.attrs.ints("output_size").size() != 2)
    fail<ShapeError>("[{}] q {} must be (N, C, H, W) and output_size {} have 2 entries", op,
                     str(in[0].shape), str(ctx.attrs.ints("output_size")));
  // the float pool's shape rules, on the dequantized tensor
  const Attrs pool{{"output_size", ctx.attrs.ints("output_size")}};
  const std::vector<TensorInfo> f{{in[0].shape, f32}};
  return op_def(OpId::AdaptiveAvgPool).infer(InferContext{OpId::AdaptiveAvgPool, pool, f});
}

std::vector<TensorInfo> infer_quantized_conv(const InferContext& ctx) {
  const char* op = ctx.name();
  // quantize_x: x is f32 NCHW, read as quantize(x, x_scale, x_zp) of x_zp's dtype
  const bool quantize_x = ctx.attrs.b("quantize_x", false);
  if (quantize_x) {
    require_dtype(ctx, 0, DTypeSet{f32}, "f32 (quantize_x: quantized by the conv)");
    require_dtype(ctx, 2, DTypeSet{i8, u8}, "i8 or u8 (quantize_x: the data's dtype)");
    std::vector<TensorInfo> as_int8 = ctx.inputs;
    as_int8[0].dtype = as_int8[2].dtype;
    Attrs plain = ctx.attrs;
    plain.set("quantize_x", false);
    return infer_quantized_conv(InferContext{ctx.op, plain, as_int8});
  }
  const auto& in = ctx.inputs;
  check_int8_dtypes(ctx, "x");
  check_activation(ctx);
  const Shape& x = in[0].shape;
  if (x.size() != 4 || in[3].shape.size() != 4)
    fail<ShapeError>("[{}] x {} and w {} must have rank 4 (N, C, H, W) and (O, C/groups, kh, kw)",
                     op, str(x), str(in[3].shape));
  // weights_ohwi: w given as (O, kh, kw, C), groups 1
  const bool ohwi = ctx.attrs.b("weights_ohwi", false);
  if (ohwi && ctx.attrs.i("groups") != 1)
    fail<ValueError>("[{}] weights_ohwi takes groups 1, got {}", op, ctx.attrs.i("groups"));
  const Shape& wg = in[3].shape;
  const Shape w = ohwi ? Shape{wg[0], wg[3], wg[1], wg[2]} : wg;
  for (int i : {1, 2, 6, 7})
    if (!in[i].shape.empty())
      fail<ShapeError>("[{}] input {} (a scale or zero point of x or y) must be 0-d, got {}", op, i,
                       str(in[i].shape));
  const int64_t o = w[0];
  const Shape& ws = in[4].shape;
  if (!(ws.empty() || (ws.size() == 1 && dims_match(ws[0], o))) || !shapes_match(in[5].shape, ws))
    fail<ShapeError>("[{}] w's scale {} and zero point {} must be 0-d or ({},)", op, str(ws),
                     str(in[5].shape), o);
  // the geometry as the float conv infers it
  Attrs geom{{"stride", ctx.attrs.ints("stride")},
             {"pads", ctx.attrs.ints("pads")},
             {"dilation", ctx.attrs.ints("dilation")},
             {"groups", ctx.attrs.i("groups")},
             {"has_bias", false}};
  const std::vector<TensorInfo> conv_in{{x, f32}, {w, f32}};
  const Shape out = op_def(OpId::Conv).infer(InferContext{OpId::Conv, geom, conv_in})[0].shape;
  size_t next = 8;
  if (ctx.attrs.b("has_bias", false)) {
    require_dtype(ctx, static_cast<int>(next), DTypeSet{f32, i32},
                  "f32 (bias) or i32 (bias in the integer sum's units)");
    const Shape& b = in[next].shape;
    const bool ok = shapes_match(b, Shape{o}) || shapes_match(b, Shape{o, 1, 1}) ||
                    shapes_match(b, Shape{1, o, 1, 1});
    if (!ok)
      fail<ShapeError>("[{}] bias {} must be ({}), ({}, 1, 1) or (1, {}, 1, 1)", op, str(b), o, o,
                       o);
    ++next;
  }
  if (ctx.attrs.b("has_residual", false)) {
    const bool quantized = ctx.attrs.b("quantized_residual", false);
    require_dtype(ctx, static_cast<int>(next), quantized ? DTypeSet{i8, u8} : DTypeSet{f32},
                  quantized ? "i8 or u8 (quantized residual)" : "f32 (residual)");
    if (!shapes_match(in[next].shape, out))
      fail<ShapeError>("[{}] residual {} must have the output's shape {}", op, str(in[next].shape),
                       str(out));
    if (quantized) {
      if (in.size() < next + 3)
        fail<ValueError>("[{}] a quantized residual needs its scale and zero point after it", op);
      require_dtype(ctx, static_cast<int>(next + 1), DTypeSet{f32}, "f32 (residual scale)");
      if (!in[next + 1].shape.empty() || !in[next + 2].shape.empty() ||
          in[next + 2].dtype != in[next].dtype)
        fail<ShapeError>("[{}] the residual's scale and zero point must be 0-d, the zero point "
                         "of the residual's dtype {}",
                         op, name(in[next].dtype));
    }
  }
  return {{out, in[7].dtype}};
}

QuantizeOptions options_of(const Attrs& a) { return {a.i("axis"), a.i("block_size")}; }

// t (x's shape) summed onto the scale's layout.
Tensor sum_to_scale(const Tensor& t, const Tensor& scale, const QuantizeOptions& o) {
  if (scale.rank() == 0) return sum(t);
  const Shape xs = t.shape();
  const int64_t axis = o.axis;
  if (o.block_size == 0) {
    Axes others;
    for (int64_t i = 0; i < t.rank(); ++i)
      if (i != axis) others.push_back(i);
    const Tensor r = sum(t, others);
    return scale.shape() == r.shape() ? r : reshape(sum(r), scale.shape());  // one value for all
  }
  // zeros after a short last block, then one sum per block
  const int64_t d = xs[static_cast<size_t>(axis)];
  const int64_t blocks = (d + o.block_size - 1) / o.block_size, extra = blocks * o.block_size - d;
  Tensor full = t;
  if (extra > 0) {
    std::vector<int64_t> pads(2 * xs.size(), 0);
    pads[2 * static_cast<size_t>(axis) + 1] = extra;
    full = pad(t, pads);
  }
  Shape split = xs;
  split[static_cast<size_t>(axis)] = blocks;
  split.insert(split.begin() + axis + 1, o.block_size);
  return sum(reshape(full, split), Axes{axis + 1});
}

using Grads = std::vector<std::optional<Tensor>>;

// d/dscale of (q - zp) * scale: the cotangent times (q - zp), summed onto the scale's layout.
Grads vjp_dequantize(const VjpContext& c) {
  const QuantizeOptions o = options_of(c.attrs);
  const Tensor& scale = c.inputs[1];
  const Tensor unit =
      dequantize(c.inputs[0], full_like_scale(scale, 1, scale.dtype()), c.inputs[2], o);
  return {std::nullopt, sum_to_scale(*c.cotangents[0] * unit, scale, o), std::nullopt};
}

// Straight-through: the cotangent where x lies in [(qmin - zp) * s, (qmax - zp) * s].
Grads vjp_fake_quantize(const VjpContext& c) {
  const QuantizeOptions o = options_of(c.attrs);
  const Tensor &x = c.inputs[0], &scale = c.inputs[1], &zp = c.inputs[2];
  const DType qt = zp.dtype();  // sets the range
  const double qmin = qt == u8 ? 0 : qt == i8 ? -128 : -32768;
  const double qmax = qt == u8 ? 255 : qt == i8 ? 127 : 32767;
  const Shape xs = x.shape();
  auto bound = [&](double q) {
    return cast_to(dequantize(broadcast_to(scalar_like(zp, q), xs), scale, zp, o), x.dtype());
  };
  const Tensor inside = logical_and(greater_equal(x, bound(qmin)), less_equal(x, bound(qmax)));
  const Tensor& g = *c.cotangents[0];
  return {where(inside, g, scalar_like(g, 0)), std::nullopt, std::nullopt};
}

// The NHWC inputs of a channels_last quantized_conv: x (unless quantize_x: an NCHW image) and a
// residual (after the bias; a quantized residual's 0-d scale and zero point follow it).
bool nhwc_quantized_conv(const Attrs& a, int k, int) {
  if (k == 0) return !a.b("quantize_x", false);
  return a.b("has_residual", false) && k == 8 + (a.b("has_bias", false) ? 1 : 0);
}
bool nhwc_x(const Attrs&, int k, int) { return k == 0; }

// A quantized residual brings its scale and zero point.
int quantized_residual_inputs(const Attrs& a) {
  return a.b("has_residual", false) && a.b("quantized_residual", false) ? 2 : 0;
}

// A stored node's geometry: 2-D, one value per spatial dim, within bounds.
std::string check_stored_quantized_conv(const InferContext& ctx) {
  const Attrs& a = ctx.attrs;
  if (ctx.inputs[0].shape.size() != 4 || ctx.inputs[3].shape.size() != 4)
    return "quantized_conv inputs of rank other than 4";
  std::string why;
  for (const char* k : {"stride", "dilation"})
    if (!(why = stored::check_ints(a, k, 2, 1, stored::kMaxGeometry)).empty()) return why;
  if (!(why = stored::check_ints(a, "pads", 4, 0, stored::kMaxGeometry)).empty()) return why;
  if (a.i("groups") < 1 || a.i("groups") > stored::kMaxGeometry) return "groups out of range";
  return {};
}
}  // namespace

void register_quant_ops() {
  // x, scale, zero_point
  define_op(OpId::Quantize)
      .set_infer(infer_quantize)
      .not_differentiable()
      .inputs(3)
      .params<QuantizeParams>();
  define_op(OpId::Dequantize)
      .set_infer(infer_dequantize)
      .grad(vjp_dequantize)
      .inputs(3)
      .params<QuantizeParams>();
  define_op(OpId::FakeQuantize)
      .set_infer(infer_quantize)
      .grad(vjp_fake_quantize)
      .inputs(3)
      .params<QuantizeParams>();
  define_op(OpId::QuantizedMatmul)
      .set_infer(infer_quantized_matmul)
      .not_differentiable()
      .inputs(8)
      .optional_inputs({"has_bias", "has_residual"})
      .params<QuantizedMatmulParams>();
  define_op(OpId::QuantizedConv)
      .set_infer(infer_quantized_conv)
      .not_differentiable()
      .inputs(8)
      .optional_inputs({"has_bias", "has_residual"})
      .more_inputs(quantized_residual_inputs)
      .check_stored(check_stored_quantized_conv)
      .params<QuantizedConvParams>()
      .channels_last(nhwc_quantized_conv);
  define_op(OpId::QuantizedWeightLinear)
      .set_infer(infer_quantized_weight_linear)
      .not_differentiable()
      .inputs(4)
      .optional_inputs({"has_bias"})
      .params<QuantizedWeightLinearParams>();
  define_op(OpId::DequantizeAdaptiveAvgPool)
      .set_infer(infer_dequantize_adaptive_avg_pool)
      .not_differentiable()
      .inputs(3)
      .channels_last(nhwc_x);
}

namespace {
const char* check_builder(OpId op, const Tensor& x, const Tensor& scale, QuantizeOptions& o) {
  const char* name = op_name(op);
  if (scale.rank() > 0)
    o.axis = resolve_axis(name, o.axis, x.shape());
  else
    o.axis = 0;
  if (o.block_size < 0)
    fail<ValueError>("[{}] block_size must be >= 0, got {}", name, o.block_size);
  return name;
}

Tensor build(OpId op, const Tensor& x, const Tensor& scale, const Tensor& zp, QuantizeOptions o) {
  check_builder(op, x, scale, o);
  const Tensor s = op == OpId::Dequantize ? scale : cast_to(scale, x.dtype());
  return make_node1(op, {x, s, zp}, {{"axis", o.axis}, {"block_size", o.block_size}});
}
}  // namespace

Tensor quantize(const Tensor& x, const Tensor& scale, const Tensor& zero_point,
                const QuantizeOptions& options) {
  return build(OpId::Quantize, x, scale, zero_point, options);
}
Tensor quantize(const Tensor& x, const Tensor& scale, DType dtype, const QuantizeOptions& options) {
  return build(OpId::Quantize, x, scale, zeros_of(scale, dtype), options);
}
Tensor dequantize(const Tensor& q, const Tensor& scale, const Tensor& zero_point,
                  const QuantizeOptions& options) {
  return build(OpId::Dequantize, q, scale, zero_point, options);
}
Tensor dequantize(const Tensor& q, const Tensor& scale, const QuantizeOptions& options) {
  return build(OpId::Dequantize, q, scale, zeros_of(scale, q.dtype()), options);
}
Tensor fake_quantize(const Tensor& x, const Tensor& scale, const Tensor& zero_point,
                     const QuantizeOptions& options) {
  return build(OpId::FakeQuantize, x, scale, zero_point, options);
}
Tensor fake_quantize(const Tensor& x, const Tensor& scale, DType dtype,
                     const QuantizeOptions& options) {
  return build(OpId::FakeQuantize, x, scale, zeros_of(scale, dtype), options);
}

Tensor quantized_matmul(const QTensor& a, const QTensor& w, const Tensor& y_scale,
                        const Tensor& y_zero_point, const QuantizedMatmulOptions& o) {
  std::vector<Tensor> in{a.q,     a.scale,      a.zero_point, w.q,
                         w.scale, w.zero_point, y_scale,      y_zero_point};
  Attrs attrs{{"transpose_w", o.transpose_w}, {"relu", o.relu}};
  if (o.gelu) attrs.set("gelu", std::string(*o.gelu == GeluApprox::tanh ? "tanh" : "erf"));
  add_optional(in, attrs, "bias", o.bias);
  add_optional(in, attrs, "residual", o.residual);
  return make_node1(OpId::QuantizedMatmul, in, attrs);
}

Tensor quantized_conv(const QTensor& x, const QTensor& w, const Tensor& y_scale,
                      const Tensor& y_zero_point, const QuantizedConvOptions& o) {
  const char* op = op_name(OpId::QuantizedConv);
  if (x.q.rank() != 4 || w.q.rank() != 4)
    fail<ShapeError>("[{}] x {} and w {} must have rank 4 (N, C, H, W) and (O, C/groups, kh, kw)",
                     op, str(x.q.shape()), str(w.q.shape()));
  std::vector<Tensor> in{x.q,     x.scale,      x.zero_point, w.q,
                         w.scale, w.zero_point, y_scale,      y_zero_point};
  Attrs attrs = conv_attrs(op, x.q.shape(), w.q.shape(), o.conv);
  if (same_pads_pending(attrs))
    fail<UnsupportedError>(
        "[{}] same padding needs static spatial dims, got input {} and weight {}", op,
        str(x.q.shape()), str(w.q.shape()));
  attrs.set("relu", o.relu);
  if (o.gelu) attrs.set("gelu", std::string(*o.gelu == GeluApprox::tanh ? "tanh" : "erf"));
  add_optional(in, attrs, "bias", o.bias);
  add_optional(in, attrs, "residual", o.residual);
  return make_node1(OpId::QuantizedConv, in, attrs);
}

Tensor quantized_weight_linear(const Tensor& x, const QTensor& w,
                               const std::optional<Tensor>& bias) {
  std::vector<Tensor> in{x, w.q, w.scale, w.zero_point};
  Attrs attrs;
  add_optional(in, attrs, "bias", bias);
  return make_node1(OpId::QuantizedWeightLinear, in, attrs);
}

Tensor dequantize_adaptive_avg_pool(const QTensor& q, const std::vector<int64_t>& output_size) {
  return make_node1(OpId::DequantizeAdaptiveAvgPool, {q.q, q.scale, q.zero_point},
                    {{"output_size", output_size}});
}

}  // namespace kiln
