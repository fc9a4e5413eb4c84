// Convolutions over 1-3 spatial dims; the rank comes from the weight. The builders resolve
// padding modes into explicit pads and default options, so nodes are strict.
//   conv: stride (nd), pads (2*nd, begins then ends), dilation (nd), groups, has_bias.
//         Inputs x (N, C, spatial...), w (O, C/groups, kernel...)[, bias (O)].
//   conv_transpose: the same plus output_padding (nd).
//         Inputs x (N, C, spatial...), w (C, O/groups, kernel...)[, bias (O)].
#include "kiln/ops/nn.h"
#include "ops/common.h"

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

// ONNX auto_pad SAME_*: out = ceil(in / stride); the total pad does not depend on `in` when
// stride is 1, so dynamic sizes work there.
std::vector<int64_t> same_pads(const Shape& x, const Shape& w, const std::vector<int64_t>& stride,
                               const std::vector<int64_t>& dilation, bool upper) {
  const int nd = static_cast<int>(stride.size());
  std::vector<int64_t> pads(2 * nd);
  for (int i = 0; i < nd; ++i) {
    const int64_t in = x[2 + i], k = w[2 + i], s = stride[i];
    if (k < 0 || (s > 1 && in < 0))
      fail<UnsupportedError>("[conv] same padding needs static sizes, got input {} and weight {}",
                             str(x), str(w));
    const int64_t eff = (k - 1) * dilation[i] + 1;
    const int64_t total =
        s == 1 ? eff - 1 : std::max<int64_t>(0, ((in + s - 1) / s - 1) * s + eff - in);
    const int64_t small = total / 2, big = total - small;
    pads[i] = upper ? small : big;
    pads[nd + i] = upper ? big : small;
  }
  return pads;
}

Tensor conv_nd(int nd, const char* fn, const Tensor& x, const Tensor& w,
               const std::optional<Tensor>& bias, const ConvOptions& o) {
  check_rank(kConv, fn, "input", x, nd);
  check_rank(kConv, fn, "weight", w, nd);
  const auto stride = per_dim(kConv, "stride", o.stride, nd, 1, 1);
  const auto dilation = per_dim(kConv, "dilation", o.dilation, nd, 1, 1);
  if (o.groups < 1) fail<ValueError>("[conv] groups must be >= 1, got {}", o.groups);
  if (o.pad_mode != PadMode::explicit_ && !o.padding.empty())
    fail<ValueError>("[conv] padding ({}) is given with a pad mode other than explicit",
                     fmt::join(o.padding, ", "));
  std::vector<int64_t> pads;
  switch (o.pad_mode) {
    case PadMode::explicit_:
      pads = explicit_pads(kConv, o.padding, nd);
      break;
    case PadMode::valid:
      pads.assign(2 * nd, 0);
      break;
    case PadMode::same_upper:
    case PadMode::same_lower:
      pads = same_pads(x.shape(), w.shape(), stride, dilation, o.pad_mode == PadMode::same_upper);
  }
  DType t = promote(x.dtype(), w.dtype());
  if (bias) t = promote(t, bias->dtype());
  std::vector<Tensor> inputs{cast_to(x, t), cast_to(w, t)};
  Attrs attrs{{"stride", stride}, {"pads", pads}, {"dilation", dilation}, {"groups", o.groups}};
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
  // nodes may come from packages: check what the builders guarantee
  auto check = [&](const char* key, int n, int64_t min) {
    const auto& v = ctx.attrs.ints(key);
    bool ok = static_cast<int>(v.size()) == n;
    for (int64_t e : v) ok = ok && e >= min;
    if (!ok)
      fail<ValueError>("[{}] attribute {} ({}) needs {} values >= {} for input with shape {}",
                       ctx.name(), key, fmt::join(v, ", "), n, min, str(x));
  };
  check("stride", nd, 1);
  check("dilation", nd, 1);
  check("pads", 2 * nd, 0);
  if (ctx.op == OpId::ConvTranspose) check("output_padding", nd, 0);
  if (ctx.attrs.i("groups") < 1)
    fail<ValueError>("[{}] groups must be >= 1, got {}", ctx.name(), ctx.attrs.i("groups"));
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
  for (int i = 0; i < nd; ++i) {
    const int64_t in = x[2 + i], k = w[2 + i];
    if (in < 0 || k < 0) {
      out.push_back(-1);
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

std::vector<TensorInfo> infer_conv_transpose(const InferContext& ctx) {
  const Shape& x = ctx.inputs[0].shape;
  const Shape& w = ctx.inputs[1].shape;
  const int64_t groups = ctx.attrs.i("groups");
  const int64_t out_channels = w[1] < 0 ? -1 : w[1] * groups;
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
    if (in < 0 || k < 0) {
      out.push_back(-1);
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
}  // namespace

void register_conv_ops() {
  define_op(OpId::Conv).set_infer(infer_conv);
  define_op(OpId::ConvTranspose).set_infer(infer_conv_transpose);
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
