// Convolutions over 1-3 spatial dims; the rank comes from the weight. The builders resolve
// padding modes into explicit pads and default options, so nodes are strict.
//   conv: stride (nd), pads (2*nd, begins then ends), dilation (nd), groups, has_bias.
//         Inputs x (N, C, spatial...), w (O, C/groups, kernel...)[, bias (O)]. Attr
//         channels_last (2-D only, set by the channels_last pass for GPU f16/bf16/TF32 convs):
//         x (N, H, W, C), w (O, kh, kw, C/groups), output (N, OH, OW, O); with attr nchw_x
//         (the CPU's f32 conv of an image, at most 4 channels) x stays (N, C, H, W).
//   fused_conv (internal: the channels_last pass and the CPU's prepare_cpu_convs fuse a conv's
//         epilogue into it): conv's attributes and inputs, then, with has_residual, a residual of
//         the output's shape and dtype added to the output, then relu with attr relu, or (the
//         CPU's) attr activation "clip" (act_min, act_max), "hardswish", "sigmoid" or "silu". In
//         layout channels_last the residual is NHWC too. Passes build it after autodiff: it has
//         no gradient rule.
//   conv_transpose: the same plus output_padding (nd).
//         Inputs x (N, C, spatial...), w (C, O/groups, kernel...)[, bias (O)].
//   conv_grad_weight: conv's stride, pads, dilation, groups plus weight_shape; inputs x and the
//         conv output's gradient dy (N, O, out...); out dW of weight_shape.
//   conv_transpose and conv_grad_weight with channels_last (2-D, set by the channels_last pass in
//         CUDA training programs): x, dy and conv_transpose's output NHWC, the weights (and dW)
//         (O, kh, kw, C/groups) as conv's; weight_shape stays the NCHW (O, C/groups, kh, kw).
#include "core/sym_dim.h"
#include "kiln/ops/core.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/nn.h"
#include "kiln/ops/reduce.h"
#include "kiln/ops/transform.h"
#include "ops/common.h"
#include "ops/conv_attrs.h"
#include "ops/conv_params.h"
#include "ops/shape_values.h"

namespace kiln {

using namespace ops;

namespace {
const char* const kConv = "conv";
const char* const kConvT = "conv_transpose";

// An option with one value per spatial dim (empty: `dflt` everywhere), each >= `min`.
std::vector<int64_t> per_dim(const char* op, const char* what, const std::vector<int64_t>& v,
                             int nd, int64_t dflt, int64_t min) {
  if (v.empty()) return std::vector<int64_t>(nd, dflt);
  if (static_cast<int>(v.size()) != nd)
    fail<ValueError>("[{}] {} has {} entries ({}); expected {} (one per spatial dim)", op, what,
                     v.size(), fmt::join(v, ", "), nd);
  for (int64_t e : v)
    if (e < min) fail<ValueError>("[{}] {} ({}) must be >= {}", op, what, fmt::join(v, ", "), min);
  return v;
}

// Padding as nd symmetric values or 2*nd begins-then-ends; returns 2*nd.
std::vector<int64_t> explicit_pads(const char* op, const std::vector<int64_t>& p, int nd) {
  if (p.empty()) return std::vector<int64_t>(2 * nd, 0);
  for (int64_t e : p)
    if (e < 0) fail<ValueError>("[{}] padding ({}) must be >= 0", op, fmt::join(p, ", "));
  if (static_cast<int>(p.size()) == 2 * nd) return p;
  if (static_cast<int>(p.size()) != nd)
    fail<ValueError>("[{}] padding has {} entries ({}); expected {} or {}", op, p.size(),
                     fmt::join(p, ", "), nd, 2 * nd);
  std::vector<int64_t> r(p);
  r.insert(r.end(), p.begin(), p.end());
  return r;
}

void check_rank(const char* op, const char* fn, const char* what, const Tensor& t, int nd) {
  const Shape s = t.shape();
  if (static_cast<int>(s.size()) != nd + 2)
    fail<ShapeError>("[{}] {} expects {} of rank {}, got shape {}", op, fn, what, nd + 2, str(s));
}

// Whether ONNX auto_pad SAME_* can be resolved now: the total pad does not depend on `in` when
// stride is 1, so only the kernel's size must be known there.
bool same_pads_known(const Shape& x, const Shape& w, const std::vector<int64_t>& stride) {
  for (size_t i = 0; i < stride.size(); ++i)
    if (w[2 + i] < 0 || (stride[i] > 1 && x[2 + i] < 0)) return false;
  return true;
}

// ONNX auto_pad SAME_*: out = ceil(in / stride).
std::vector<int64_t> same_pads(const Shape& x, const Shape& w, const std::vector<int64_t>& stride,
                               const std::vector<int64_t>& dilation, bool upper) {
  const int nd = static_cast<int>(stride.size());
  std::vector<int64_t> pads(2 * nd);
  for (int i = 0; i < nd; ++i) {
    const int64_t in = x[2 + i], k = w[2 + i], s = stride[i];
    const int64_t eff = (k - 1) * dilation[i] + 1;
    const int64_t total =
        s == 1 ? eff - 1 : std::max<int64_t>(0, ((in + s - 1) / s - 1) * s + eff - in);
    const int64_t small = total / 2, big = total - small;
    pads[i] = upper ? small : big;
    pads[nd + i] = upper ? big : small;
  }
  return pads;
}

}  // namespace

Attrs ops::conv_attrs(const char* op, const Shape& x, const Shape& w, const ConvOptions& o) {
  const int nd = static_cast<int>(x.size()) - 2;
  const auto stride = per_dim(op, "stride", o.stride, nd, 1, 1);
  const auto dilation = per_dim(op, "dilation", o.dilation, nd, 1, 1);
  if (o.groups < 1) fail<ValueError>("[{}] groups must be >= 1, got {}", op, o.groups);
  if (o.pad_mode != PadMode::explicit_ && !o.padding.empty())
    fail<ValueError>("[{}] padding ({}) is given with a pad mode other than explicit", op,
                     fmt::join(o.padding, ", "));
  std::vector<int64_t> pads;
  switch (o.pad_mode) {
    case PadMode::explicit_:
      pads = explicit_pads(op, o.padding, nd);
      break;
    case PadMode::valid:
      pads.assign(2 * nd, 0);
      break;
    case PadMode::same_upper:
    case PadMode::same_lower: {
      const bool upper = o.pad_mode == PadMode::same_upper;
      if (!same_pads_known(x, w, stride))  // (resolved when shapes are specialized)
        return {{"stride", stride},
                {"pads", std::vector<int64_t>(2 * nd, 0)},
                {"dilation", dilation},
                {"groups", o.groups},
                {"auto_pad", std::string(upper ? "same_upper" : "same_lower")}};
      pads = same_pads(x, w, stride, dilation, upper);
    }
  }
  return {{"stride", stride}, {"pads", pads}, {"dilation", dilation}, {"groups", o.groups}};
}

void ops::resolve_same_pads(Attrs& a, const Shape& x, const Shape& w) {
  if (!same_pads_pending(a)) return;
  const auto& stride = a.ints("stride");
  if (!same_pads_known(x, w, stride))
    fail<ShapeError>(
        "[conv] same padding needs the input's spatial dims, got input {} and "
        "weight {}",
        str(x), str(w));
  a.set("pads", same_pads(x, w, stride, a.ints("dilation"), a.str("auto_pad") == "same_upper"));
  a.set("auto_pad", std::string());
}

namespace {
Tensor conv_nd(int nd, const char* fn, const Tensor& x, const Tensor& w,
               const std::optional<Tensor>& bias, const ConvOptions& o) {
  check_rank(kConv, fn, "input", x, nd);
  check_rank(kConv, fn, "weight", w, nd);
  Attrs attrs = conv_attrs(kConv, x.shape(), w.shape(), o);
  DType t = promote(x.dtype(), w.dtype());
  if (bias) t = promote(t, bias->dtype());
  std::vector<Tensor> inputs{cast_to(x, t), cast_to(w, t)};
  add_optional(inputs, attrs, "bias", bias ? std::optional<Tensor>(cast_to(*bias, t)) : bias);
  return make_node1(OpId::Conv, inputs, attrs);
}

Tensor conv_transpose_nd(int nd, const char* fn, const Tensor& x, const Tensor& w,
                         const std::optional<Tensor>& bias, const ConvTransposeOptions& o) {
  check_rank(kConvT, fn, "input", x, nd);
  check_rank(kConvT, fn, "weight", w, nd);
  if (o.groups < 1) fail<ValueError>("[conv_transpose] groups must be >= 1, got {}", o.groups);
  DType t = promote(x.dtype(), w.dtype());
  if (bias) t = promote(t, bias->dtype());
  std::vector<Tensor> inputs{cast_to(x, t), cast_to(w, t)};
  Attrs attrs{{"stride", per_dim(kConvT, "stride", o.stride, nd, 1, 1)},
              {"pads", explicit_pads(kConvT, o.padding, nd)},
              {"dilation", per_dim(kConvT, "dilation", o.dilation, nd, 1, 1)},
              {"output_padding", per_dim(kConvT, "output_padding", o.output_padding, nd, 0, 0)},
              {"groups", o.groups}};
  add_optional(inputs, attrs, "bias", bias ? std::optional<Tensor>(cast_to(*bias, t)) : bias);
  return make_node1(OpId::ConvTranspose, inputs, attrs);
}

// Nodes may come from packages: check what the builders guarantee.
void check_attr(const InferContext& ctx, const char* key, int n, int64_t min) {
  const auto& v = ctx.attrs.ints(key);
  bool ok = static_cast<int>(v.size()) == n;
  for (int64_t e : v) ok = ok && e >= min;
  if (!ok)
    fail<ValueError>("[{}] attribute {} ({}) needs {} values >= {} for input with shape {}",
                     ctx.name(), key, fmt::join(v, ", "), n, min, str(ctx.inputs[0].shape));
}

void check_geometry_attrs(const InferContext& ctx, int nd) {
  check_attr(ctx, "stride", nd, 1);
  check_attr(ctx, "dilation", nd, 1);
  check_attr(ctx, "pads", 2 * nd, 0);
  if (ctx.op == OpId::ConvTranspose) check_attr(ctx, "output_padding", nd, 0);
  if (ctx.attrs.i("groups") < 1)
    fail<ValueError>("[{}] groups must be >= 1, got {}", ctx.name(), ctx.attrs.i("groups"));
}

// What both inferences check: dtypes, ranks, attribute lengths and the bias.
int check_common(const InferContext& ctx, int64_t out_channels) {
  require_rank(ctx, 0, 3, 5);
  const Shape& x = ctx.inputs[0].shape;
  const Shape& w = ctx.inputs[1].shape;
  if (w.size() != x.size())
    fail<ShapeError>("[{}] weight with shape {} must have the rank of input with shape {}",
                     ctx.name(), str(w), str(x));
  require_dtype(ctx, 0, kFloatTypes, "a float dtype");
  for (size_t i = 1; i < ctx.inputs.size(); ++i)
    if (ctx.inputs[i].dtype != ctx.inputs[0].dtype)
      fail<DTypeError>("[{}] input 0 has dtype {} but input {} has dtype {}", ctx.name(),
                       name(ctx.inputs[0].dtype), i, name(ctx.inputs[i].dtype));
  const int nd = static_cast<int>(x.size()) - 2;
  check_geometry_attrs(ctx, nd);
  if (ctx.attrs.b("has_bias")) {
    const Shape& b = ctx.inputs[2].shape;
    if (b.size() != 1 || (b[0] >= 0 && out_channels >= 0 && b[0] != out_channels))
      fail<ShapeError>("[{}] bias with shape {} must have shape ({},) for weight with shape {}",
                       ctx.name(), str(b), out_channels, str(w));
  }
  return nd;
}

void check_groups(const InferContext& ctx, int64_t groups, int64_t channels, const char* what) {
  const Shape& x = ctx.inputs[0].shape;
  const Shape& w = ctx.inputs[1].shape;
  if (channels >= 0 && channels % groups != 0)
    fail<ShapeError>("[{}] groups={} does not divide the {} {} channels (input {}, weight {})",
                     ctx.name(), groups, channels, what, str(x), str(w));
}

std::vector<TensorInfo> infer_conv(const InferContext& ctx) {
  if (ctx.attrs.b("relu", false) || ctx.attrs.b("has_residual", false))
    fail<ValueError>("[conv] has no fused relu or residual (op fused_conv has them)");
  const Shape& x = ctx.inputs[0].shape;
  const Shape& w = ctx.inputs[1].shape;
  const int nd = check_common(ctx, w[0]);
  const int64_t groups = ctx.attrs.i("groups");
  check_groups(ctx, groups, x[1], "input");
  check_groups(ctx, groups, w[0], "output");
  if (x[1] >= 0 && w[1] >= 0 && x[1] != w[1] * groups)
    fail<ShapeError>(
        "[conv] input with shape {} has {} channels but weight with shape {} and groups={} "
        "expects {}",
        str(x), x[1], str(w), groups, w[1] * groups);
  const auto &s = ctx.attrs.ints("stride"), &d = ctx.attrs.ints("dilation"),
             &p = ctx.attrs.ints("pads");
  Shape out{x[0], w[0]};
  if (same_pads_pending(ctx.attrs)) {  // "same": ceil(in / stride), whatever the pads will be
    for (int i = 0; i < nd; ++i) out.push_back(sym::ceildiv(x[2 + i], s[i]));
    return {{out, ctx.inputs[0].dtype}};
  }
  for (int i = 0; i < nd; ++i) {
    const int64_t in = x[2 + i], k = w[2 + i];
    if (in < 0 || k < 0) {  // (in symbolic: the same arithmetic on the expression)
      const int64_t span =
          sym::sub(sym::add(in, p[i] + p[nd + i]), sym::add(sym::mul(sym::sub(k, 1), d[i]), 1));
      out.push_back(sym::add(sym::floordiv(span, s[i]), 1));
      continue;
    }
    const int64_t span = in + p[i] + p[nd + i] - (k - 1) * d[i] - 1;
    if (span < 0)
      fail<ShapeError>(
          "[conv] kernel of weight with shape {} (dilation {}) is larger than the "
          "padded input with shape {} (pads {})",
          str(w), fmt::join(d, ", "), str(x), fmt::join(p, ", "));
    out.push_back(span / s[i] + 1);
  }
  return {{out, ctx.inputs[0].dtype}};
}

// fused_conv: conv's inference without the residual, which must match the output.
std::vector<TensorInfo> infer_fused_conv(const InferContext& ctx) {
  const bool residual = ctx.attrs.b("has_residual", false);
  std::vector<TensorInfo> in = ctx.inputs;
  if (residual) in.pop_back();
  Attrs attrs = ctx.attrs;
  attrs.set("relu", false);
  attrs.set("has_residual", false);
  std::vector<TensorInfo> out = infer_conv(InferContext{OpId::Conv, attrs, in});
  if (residual) {
    const TensorInfo& r = ctx.inputs.back();
    if (!shapes_match(r.shape, out[0].shape) || r.dtype != out[0].dtype)
      fail<ShapeError>("[fused_conv] residual {} {} must have the output's shape {} and dtype {}",
                       name(r.dtype), str(r.shape), str(out[0].shape), name(out[0].dtype));
  }
  return out;
}

std::vector<TensorInfo> infer_conv_transpose(const InferContext& ctx) {
  const Shape& x = ctx.inputs[0].shape;
  const Shape& w = ctx.inputs[1].shape;
  const int64_t groups = ctx.attrs.i("groups");
  const int64_t out_channels = sym::mul(w[1], groups);
  const int nd = check_common(ctx, out_channels);
  check_groups(ctx, groups, x[1], "input");
  if (x[1] >= 0 && w[0] >= 0 && x[1] != w[0])
    fail<ShapeError>(
        "[conv_transpose] input with shape {} has {} channels but weight with "
        "shape {} expects {}",
        str(x), x[1], str(w), w[0]);
  const auto &s = ctx.attrs.ints("stride"), &d = ctx.attrs.ints("dilation"),
             &p = ctx.attrs.ints("pads"), &op = ctx.attrs.ints("output_padding");
  Shape out{x[0], out_channels};
  for (int i = 0; i < nd; ++i) {
    if (op[i] >= s[i] && op[i] >= d[i])
      fail<ValueError>(
          "[conv_transpose] output_padding ({}) must be smaller than stride ({}) or "
          "dilation ({})",
          fmt::join(op, ", "), fmt::join(s, ", "), fmt::join(d, ", "));
    const int64_t in = x[2 + i], k = w[2 + i];
    if (in < 0 || k < 0) {  // (in symbolic: in * stride + what the kernel and pads add)
      const int64_t c = op[i] + 1 - s[i] - p[i] - p[nd + i];
      const int64_t grown = sym::add(sym::mul(in, s[i]), sym::mul(sym::sub(k, 1), d[i]));
      out.push_back(c >= 0 ? sym::add(grown, c) : sym::sub(grown, -c));
      continue;
    }
    const int64_t size = (in - 1) * s[i] - p[i] - p[nd + i] + (k - 1) * d[i] + op[i] + 1;
    if (size < 0)
      fail<ShapeError>(
          "[conv_transpose] pads ({}) leave a negative output size for input with "
          "shape {} and weight with shape {}",
          fmt::join(p, ", "), str(x), str(w));
    out.push_back(size);
  }
  return {{out, ctx.inputs[0].dtype}};
}
std::vector<TensorInfo> infer_conv_grad_weight(const InferContext& ctx) {
  require_rank(ctx, 0, 3, 5);
  require_dtype(ctx, 0, kFloatTypes, "a float dtype");
  if (ctx.inputs[1].dtype != ctx.inputs[0].dtype)
    fail<DTypeError>("[conv_grad_weight] input has dtype {} but output gradient has dtype {}",
                     name(ctx.inputs[0].dtype), name(ctx.inputs[1].dtype));
  const Shape& x = ctx.inputs[0].shape;
  const Shape& dy = ctx.inputs[1].shape;
  const Shape& w = ctx.attrs.ints("weight_shape");
  const int64_t groups = ctx.attrs.i("groups");
  if (dy.size() != x.size() || w.size() != x.size())
    fail<ShapeError>(
        "[conv_grad_weight] input with shape {}, output gradient with shape {} and weight "
        "shape {} must have one rank",
        str(x), str(dy), str(w));
  check_geometry_attrs(ctx, static_cast<int>(x.size()) - 2);
  bool ok = w[0] % groups == 0 && dims_match(x[1], w[1] * groups) && dims_match(dy[1], w[0]) &&
            dims_match(x[0], dy[0]);
  for (int64_t e : w) ok = ok && e >= 0;
  if (!ok)
    fail<ShapeError>(
        "[conv_grad_weight] input with shape {} and output gradient with shape {} do not fit "
        "weight shape {} with groups={}",
        str(x), str(dy), str(w), groups);
  return {{w, ctx.inputs[0].dtype}};
}

// ---- gradients: each conv's adjoint is the other conv with the same geometry ----
using Grads = std::vector<std::optional<Tensor>>;

int spatial_dims(const Tensor& t) { return static_cast<int>(t.shape().size()) - 2; }

ConvOptions options_of(const Attrs& a) {
  ConvOptions o;
  o.stride = a.ints("stride");
  o.padding = a.ints("pads");
  o.dilation = a.ints("dilation");
  o.groups = a.i("groups");
  return o;
}

// y with each spatial dim cut at the end to the size that dim has in `like` at run time (the
// sizes are read when shapes are specialized: the path for spatial dims dynamic when built).
Tensor crop_spatial_like(const Tensor& y, const Tensor& like) {
  const int nd = spatial_dims(y);
  std::vector<int64_t> axes;
  for (int i = 0; i < nd; ++i) axes.push_back(2 + i);
  const Tensor zeros =
      constant_on(*y.graph_impl(), Array::from_vector(std::vector<int64_t>(nd, 0), {nd}));
  return slice(y, zeros, slice(shape_of(like), {2}, {2 + nd}), {}, axes);
}

// conv(x, w) cropped to the spatial size of `out`: a conv_transpose whose output_padding reached
// the dilation (not the stride) has inputs past the end that no output position reads.
Tensor conv_to(const Tensor& x, const Tensor& w, const Attrs& a, const Tensor& out) {
  const int nd = spatial_dims(x);
  Tensor y = conv_nd(nd, kConv, x, w, std::nullopt, options_of(a));
  if (dynamic_spatial(out.shape()) || dynamic_spatial(y.shape())) {
    // the conv gives back out's size unless an output_padding reached the stride
    const auto& s = a.ints("stride");
    const std::vector<int64_t> op =
        a.has("output_padding") ? a.ints("output_padding") : std::vector<int64_t>(nd, 0);
    bool crop = false;
    for (int i = 0; i < nd; ++i) crop = crop || op[i] >= s[i];
    return crop ? crop_spatial_like(y, out) : y;
  }
  std::vector<int64_t> starts(nd, 0), stops, axes;
  bool crop = false;
  for (int i = 0; i < nd; ++i) {
    stops.push_back(out.shape()[2 + i]);
    axes.push_back(2 + i);
    crop = crop || y.shape()[2 + i] != out.shape()[2 + i];
  }
  return crop ? slice(y, starts, stops, {}, axes) : y;
}

// The adjoint of conv(., w): conv_transpose of dy with the output_padding that gives back the
// spatial size of x (positions that the stride skipped at the end get no gradient). Where the
// spatial sizes are known only at run time, the output_padding is stride - 1 (the most any size
// needs) and the result is cropped to x's size: the positions before the end do not depend on
// the output_padding.
Tensor conv_transpose_to(const Tensor& dy, const Tensor& w, const Attrs& a, const Tensor& x) {
  const int nd = spatial_dims(dy);
  const auto &s = a.ints("stride"), &d = a.ints("dilation"), &p = a.ints("pads");
  const Shape &xs = x.shape(), &ys = dy.shape(), &ws = w.shape();
  ConvTransposeOptions o{s, p, {}, d, a.i("groups")};
  if (dynamic_spatial(ws))
    fail<UnsupportedError>(
        "[gradients] the input gradient of a convolution needs a weight of static shape, got "
        "input {}, weight {} and output gradient {}",
        str(xs), str(ws), str(ys));
  if (dynamic_spatial(xs) || dynamic_spatial(ys)) {
    bool crop = false;
    for (int i = 0; i < nd; ++i) {
      o.output_padding.push_back(s[i] - 1);
      crop = crop || s[i] > 1;
    }
    const Tensor dx = conv_transpose_nd(nd, kConvT, dy, w, std::nullopt, o);
    return crop ? crop_spatial_like(dx, x) : dx;
  }
  for (int i = 0; i < nd; ++i) {
    const int64_t size = (ys[2 + i] - 1) * s[i] - p[i] - p[nd + i] + (ws[2 + i] - 1) * d[i] + 1;
    o.output_padding.push_back(xs[2 + i] - size);
  }
  return conv_transpose_nd(nd, kConvT, dy, w, std::nullopt, o);
}

// The bias adds to every (n, spatial) position.
Tensor bias_grad(const Tensor& g) {
  std::vector<int64_t> axes{0};
  for (int i = 2; i < static_cast<int>(g.shape().size()); ++i) axes.push_back(i);
  return sum(g, axes);
}

// "Same" padding of spatial dims known only when run, as values: kiln's pads (begin, end per
// dim, zero for N and C) and the begins of the spatial dims, from x's run-time shape as
// same_pads computes them.
struct RunTimePads {
  Tensor pads, begins;
};
RunTimePads same_pads_of(const Tensor& x, const Shape& w, const Attrs& a) {
  const auto &stride = a.ints("stride"), &dilation = a.ints("dilation");
  const bool upper = a.str("auto_pad") == "same_upper";
  const int nd = static_cast<int>(stride.size());
  auto& g = *x.graph_impl();
  auto value = [&](int64_t v) {
    return constant_on(g, Array::from_vector(std::vector<int64_t>{v}, {1}));
  };
  const Tensor sizes = shape_of(x);
  std::vector<Tensor> pads{value(0), value(0), value(0), value(0)}, begins;
  for (int i = 0; i < nd; ++i) {
    const int64_t s = stride[i], eff = (w[2 + i] - 1) * dilation[i] + 1;
    const Tensor in = slice(sizes, {2 + i}, {3 + i});
    // total = max(0, (ceil(in / s) - 1) * s + eff - in)
    const Tensor total =
        maximum(((in + value(s - 1)) / value(s) - value(1)) * value(s) + value(eff) - in, value(0));
    const Tensor small = total / value(2), big = total - small;
    begins.push_back(upper ? small : big);
    pads.push_back(begins.back());
    pads.push_back(upper ? big : small);
  }
  return {concat(pads, 0), concat(begins, 0)};
}

// conv with "same" padding of run-time size is conv(pad(x), valid): the gradient of that, with
// the padded border of dx cut away.
Grads vjp_conv_same_run_time(const VjpContext& c) {
  const Tensor& g = *c.cotangents[0];
  const Tensor &x = c.inputs[0], &w = c.inputs[1];
  const int nd = spatial_dims(x);
  const RunTimePads p = same_pads_of(x, w.shape(), c.attrs);
  Attrs valid;
  for (const auto& [key, v] : c.attrs.items())
    if (key != "auto_pad") valid.set(key, v);
  const Tensor xp = pad(x, p.pads);
  const Tensor dxp = conv_transpose_to(g, w, valid, xp);
  std::vector<int64_t> axes;
  for (int i = 0; i < nd; ++i) axes.push_back(2 + i);
  const Tensor dx = slice(dxp, p.begins, p.begins + slice(shape_of(x), {2}, {2 + nd}), {}, axes);
  Grads r{dx, conv_grad_weight(xp, g, w.shape(), options_of(valid))};
  if (c.attrs.b("has_bias")) r.push_back(bias_grad(g));
  return r;
}

Grads vjp_conv(const VjpContext& c) {
  if (same_pads_pending(c.attrs)) return vjp_conv_same_run_time(c);
  const Tensor& g = *c.cotangents[0];
  const Tensor &x = c.inputs[0], &w = c.inputs[1];
  Grads r{conv_transpose_to(g, w, c.attrs, x),
          conv_grad_weight(x, g, w.shape(), options_of(c.attrs))};
  if (c.attrs.b("has_bias")) r.push_back(bias_grad(g));
  return r;
}

// y = conv_transpose(x, w) is the adjoint of x -> conv(., w), so dx = conv(dy, w); per group,
// dw[c, o, k] = sum x[n, c, i] dy[n, o, i*s - pad + k*d] is conv's weight gradient with the
// conv input dy and output gradient x.
Grads vjp_conv_transpose(const VjpContext& c) {
  const Tensor& g = *c.cotangents[0];
  const Tensor &x = c.inputs[0], &w = c.inputs[1];
  Grads r{conv_to(g, w, c.attrs, x), conv_grad_weight(g, x, w.shape(), options_of(c.attrs))};
  if (c.attrs.b("has_bias")) r.push_back(bias_grad(g));
  return r;
}

// dW(x, dy) is linear in each input: <G, dW> = <x, conv_transpose(dy, G)> = <dy, conv(x, G)>.
Grads vjp_conv_grad_weight(const VjpContext& c) {
  const Tensor& g = *c.cotangents[0];
  const Tensor &x = c.inputs[0], &dy = c.inputs[1];
  return {conv_transpose_to(dy, g, c.attrs, x), conv_to(x, g, c.attrs, dy)};
}

// The NHWC inputs of a channels_last node: x (and dy), a residual; a weight is (O, kh, kw, C/G).
// (nchw_x: the CPU's conv of an NCHW image, x stays NCHW)
bool nhwc_x_and_residual(const Attrs& a, int k, int n) {
  return (k == 0 && !a.b("nchw_x", false)) || (a.b("has_residual", false) && k == n - 1);
}
bool nhwc_x(const Attrs& a, int k, int) { return k == 0 && !a.b("nchw_x", false); }
bool nhwc_x_and_dy(const Attrs&, int k, int) { return k <= 1; }

// A stored node's geometry: one value per spatial dim, within bounds.
std::string check_stored_conv(const InferContext& c) {
  const auto& in = c.inputs;
  const size_t rank = in[0].shape.size();
  if (rank < 3 || rank > 5 || (c.op != OpId::ConvGradWeight && in[1].shape.size() != rank))
    return "convolution inputs of ranks other than 3 to 5, or of two ranks";
  const size_t nd = rank - 2;
  std::string why;
  for (const char* k : {"stride", "dilation", "output_padding"})
    if (!(why = stored::check_ints(c.attrs, k, nd, 0, stored::kMaxGeometry)).empty()) return why;
  if (!(why = stored::check_ints(c.attrs, "pads", 2 * nd, 0, stored::kMaxGeometry)).empty())
    return why;
  if (c.attrs.i("groups") < 1 || c.attrs.i("groups") > stored::kMaxGeometry)
    return "groups out of range";
  return {};
}
}  // namespace

namespace {
void resolve_conv_pads(Attrs& a, const std::vector<TensorInfo>& in) {
  resolve_same_pads(a, in[0].shape, in[1].shape);
}
void resolve_conv_grad_weight_pads(Attrs& a, const std::vector<TensorInfo>& in) {
  resolve_same_pads(a, in[0].shape, a.ints("weight_shape"));
}
}  // namespace

void register_conv_ops() {
  define_op(OpId::Conv)
      .set_infer(infer_conv)
      .when_static(resolve_conv_pads)
      .grad(vjp_conv)
      .inputs(2)
      .optional_inputs({"has_bias"})
      .check_stored(check_stored_conv)
      .params<ConvParams>()
      .channels_last(nhwc_x, 1)
      .on_tensor_cores()
      .low_precision();
  define_op(OpId::FusedConv)
      .set_infer(infer_fused_conv)
      .when_static(resolve_conv_pads)
      .not_differentiable()
      .inputs(2)
      .optional_inputs({"has_bias", "has_residual"})
      .check_stored(check_stored_conv)
      .params<ConvParams>()
      .channels_last(nhwc_x_and_residual, 1)
      .on_tensor_cores()
      .low_precision();
  define_op(OpId::ConvTranspose)
      .set_infer(infer_conv_transpose)
      .grad(vjp_conv_transpose)
      .inputs(2)
      .optional_inputs({"has_bias"})
      .check_stored(check_stored_conv)
      .params<ConvParams>()
      .channels_last(nhwc_x, 1)
      .on_tensor_cores()
      .low_precision();
  define_op(OpId::ConvGradWeight)
      .set_infer(infer_conv_grad_weight)
      .when_static(resolve_conv_grad_weight_pads)
      .grad(vjp_conv_grad_weight)
      .inputs(2)
      .check_stored(check_stored_conv)
      .params<ConvParams>()
      .channels_last(nhwc_x_and_dy)
      .on_tensor_cores()
      .low_precision();
}

Tensor conv_grad_weight(const Tensor& x, const Tensor& dy, const Shape& weight_shape,
                        const ConvOptions& opts) {
  const int nd = static_cast<int>(x.shape().size()) - 2;
  if (nd < 1 || nd > 3 || weight_shape.size() != x.shape().size())
    fail<ShapeError>(
        "[conv_grad_weight] expects an input of rank 3 to 5 and a weight shape of its rank, got "
        "input with shape {} and weight shape {}",
        str(x.shape()), str(weight_shape));
  Attrs attrs = conv_attrs("conv_grad_weight", x.shape(), weight_shape, opts);
  attrs.set("weight_shape", weight_shape);
  const DType t = promote(x.dtype(), dy.dtype());
  return make_node1(OpId::ConvGradWeight, {cast_to(x, t), cast_to(dy, t)}, attrs);
}

Tensor conv1d(const Tensor& x, const Tensor& w, const std::optional<Tensor>& bias,
              const ConvOptions& opts) {
  return conv_nd(1, "conv1d", x, w, bias, opts);
}
Tensor conv2d(const Tensor& x, const Tensor& w, const std::optional<Tensor>& bias,
              const ConvOptions& opts) {
  return conv_nd(2, "conv2d", x, w, bias, opts);
}
Tensor conv3d(const Tensor& x, const Tensor& w, const std::optional<Tensor>& bias,
              const ConvOptions& opts) {
  return conv_nd(3, "conv3d", x, w, bias, opts);
}
Tensor conv_transpose1d(const Tensor& x, const Tensor& w, const std::optional<Tensor>& bias,
                        const ConvTransposeOptions& opts) {
  return conv_transpose_nd(1, "conv_transpose1d", x, w, bias, opts);
}
Tensor conv_transpose2d(const Tensor& x, const Tensor& w, const std::optional<Tensor>& bias,
                        const ConvTransposeOptions& opts) {
  return conv_transpose_nd(2, "conv_transpose2d", x, w, bias, opts);
}
Tensor conv_transpose3d(const Tensor& x, const Tensor& w, const std::optional<Tensor>& bias,
                        const ConvTransposeOptions& opts) {
  return conv_transpose_nd(3, "conv_transpose3d", x, w, bias, opts);
}

}  // namespace kiln
