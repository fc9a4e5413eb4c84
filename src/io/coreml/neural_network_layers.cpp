// The NeuralNetwork layers of the rank-5 era (src/io/coreml/neural_network.h): convolution,
// pooling, activations, inner product, normalizations, elementwise and data layout layers. "C",
// "H" and "W" are axes -3, -2 and -1.
#include <cmath>

#include "io/coreml/neural_network.h"
#include "kiln/ops/core.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/nn.h"
#include "kiln/ops/norm.h"
#include "kiln/ops/rearrange.h"
#include "kiln/ops/reduce.h"
#include "kiln/ops/transform.h"

namespace kiln::coreml::detail::nn {

namespace {

using L = spec::NeuralNetworkLayer;

int64_t dim_or(const google::protobuf::RepeatedField<uint64_t>& v, int k, int64_t fallback) {
  return v.size() > k ? static_cast<int64_t>(v.Get(k)) : fallback;
}

// x of rank >= 4 as (N, C, H, W) with every leading dim in N, and back.
Tensor to_nchw(LayerContext& c, const Tensor& x) {
  if (x.rank() < 4) c.fail("takes a blob of rank 4 or more, got shape {}", str(x.shape()));
  if (x.rank() == 4) return x;
  return reshape(x, {-1, x.dim(-3), x.dim(-2), x.dim(-1)});
}
Tensor from_nchw(const Tensor& y, const Tensor& x) {
  if (x.rank() == 4) return y;
  Shape s = x.shape();
  s.resize(s.size() - 3);
  for (int d = 1; d < 4; ++d) s.push_back(y.dim(d));
  return reshape(y, s);
}

// The valid padding's amounts as (top, left, bottom, right).
std::vector<int64_t> valid_pads(const spec::ValidPadding& v) {
  const auto& b = v.paddingamounts().borderamounts();
  std::vector<int64_t> p(4, 0);
  for (int k = 0; k < b.size() && k < 2; ++k) {
    p[k] = static_cast<int64_t>(b.Get(k).startedgesize());
    p[k + 2] = static_cast<int64_t>(b.Get(k).endedgesize());
  }
  return p;
}

// SamePadding's amounts (top, left, bottom, right) for sizes (h, w).
std::vector<int64_t> same_pads(const spec::SamePadding& s, const int64_t in[2],
                               const int64_t kernel[2], const int64_t stride[2]) {
  std::vector<int64_t> p(4, 0);
  for (int k = 0; k < 2; ++k) {
    const int64_t out = (in[k] + stride[k] - 1) / stride[k];
    const int64_t total = std::max<int64_t>((out - 1) * stride[k] + kernel[k] - in[k], 0);
    const int64_t small = total / 2;
    const bool top_heavy = s.asymmetrymode() == spec::SamePadding_SamePaddingMode_TOP_LEFT_HEAVY;
    p[k] = top_heavy ? total - small : small;
    p[k + 2] = total - p[k];
  }
  return p;
}

void convolution(LayerContext& c) {
  const auto& p = c.layer.convolution();
  const Tensor x0 = c.in();
  const Tensor x = to_nchw(c, x0);
  const int64_t cin = x.dim(1);
  const int64_t cout = static_cast<int64_t>(p.outputchannels());
  const int64_t kc = static_cast<int64_t>(p.kernelchannels());
  const int64_t groups = p.ngroups() ? static_cast<int64_t>(p.ngroups()) : 1;
  const int64_t kernel[2] = {dim_or(p.kernelsize(), 0, 3), dim_or(p.kernelsize(), 1, 3)};
  const int64_t stride[2] = {dim_or(p.stride(), 0, 1), dim_or(p.stride(), 1, 1)};
  const int64_t dil[2] = {dim_or(p.dilationfactor(), 0, 1), dim_or(p.dilationfactor(), 1, 1)};
  const int64_t in[2] = {x.dim(2), x.dim(3)};
  std::optional<Tensor> bias;
  if (p.hasbias()) bias = c.weight(p.bias(), {cout}, "bias");
  if (!p.isdeconvolution()) {
    if (kc * groups != cin)
      c.fail("kernelChannels {} with {} groups does not fit {} input channels", kc, groups, cin);
    const Tensor w = c.weight(p.weights(), {cout, kc, kernel[0], kernel[1]}, "weights");
    ConvOptions o;
    o.stride = {stride[0], stride[1]};
    o.dilation = {dil[0], dil[1]};
    o.groups = groups;
    if (p.has_same()) {
      const int64_t eff[2] = {(kernel[0] - 1) * dil[0] + 1, (kernel[1] - 1) * dil[1] + 1};
      o.padding = same_pads(p.same(), in, eff, stride);
    } else if (p.has_valid()) {
      o.padding = valid_pads(p.valid());
    }
    c.set(0, from_nchw(conv2d(x, w, bias, o), x0));
    return;
  }
  // deconvolution: weights (C_in, C_out / groups, kh, kw); dilation is ignored (the spec's rule)
  if (kc != cin) c.fail("kernelChannels {} is not the {} input channels", kc, cin);
  if (cout % groups) c.fail("{} output channels in {} groups", cout, groups);
  const Tensor w = c.weight(p.weights(), {kc, cout / groups, kernel[0], kernel[1]}, "weights", 1);
  ConvTransposeOptions o;
  o.stride = {stride[0], stride[1]};
  o.groups = groups;
  std::vector<int64_t> pads(4, 0), extra(2, 0);
  int64_t out[2];
  for (int k = 0; k < 2; ++k) {
    const int64_t full = (in[k] - 1) * stride[k] + kernel[k];
    if (p.has_same()) {
      out[k] = in[k] * stride[k];
      const int64_t total = full - out[k];
      if (total < 0) {
        extra[k] = -total;
      } else {
        const bool top_heavy =
            p.same().asymmetrymode() == spec::SamePadding_SamePaddingMode_TOP_LEFT_HEAVY;
        pads[k] = top_heavy ? total - total / 2 : total / 2;
        pads[k + 2] = total - pads[k];
      }
    } else {
      if (p.has_valid()) {
        const auto v = valid_pads(p.valid());
        pads[k] = v[k];
        pads[k + 2] = v[k + 2];
      }
      out[k] = full - pads[k] - pads[k + 2];
    }
  }
  // an outputShape up to stride - 1 past the padding's size adds rows and columns at the end
  // (as the converters mean it: PyTorch's output_padding); other sizes are not mapped
  if (p.outputshape_size()) {
    if (p.outputshape_size() != 2) c.fail("outputShape has {} entries (2)", p.outputshape_size());
    for (int k = 0; k < 2; ++k) {
      const int64_t more = static_cast<int64_t>(p.outputshape(k)) - out[k];
      if (more < 0 || more >= stride[k])
        c.unsupported("outputShape {}x{} for the padding's output size {}x{} is not mapped",
                      p.outputshape(0), p.outputshape(1), out[0], out[1]);
      extra[k] += more;
    }
  }
  o.padding = pads;
  o.output_padding = extra;
  c.set(0, from_nchw(conv_transpose2d(x, w, bias, o), x0));
}

void pooling(LayerContext& c) {
  const auto& p = c.layer.pooling();
  const Tensor x0 = c.in();
  const Tensor x = to_nchw(c, x0);
  const bool is_max = p.type() == spec::PoolingLayerParams_PoolingType_MAX;
  if (p.type() == spec::PoolingLayerParams_PoolingType_L2)
    c.unsupported("L2 pooling is not mapped");
  if (p.globalpooling()) {
    c.set(0, from_nchw(is_max ? max(x, {2, 3}, true) : mean(x, {2, 3}, true), x0));
    return;
  }
  const int64_t kernel[2] = {dim_or(p.kernelsize(), 0, 3), dim_or(p.kernelsize(), 1, 3)};
  const int64_t stride[2] = {dim_or(p.stride(), 0, 1), dim_or(p.stride(), 1, 1)};
  const int64_t in[2] = {x.dim(2), x.dim(3)};
  PoolOptions o;
  o.kernel = {kernel[0], kernel[1]};
  o.stride = {stride[0], stride[1]};
  o.count_include_pad = !p.avgpoolexcludepadding();
  if (p.has_same()) {
    o.padding = same_pads(p.same(), in, kernel, stride);
  } else if (p.has_valid()) {
    o.padding = valid_pads(p.valid());
  } else if (p.has_includelastpixel()) {
    const auto& a = p.includelastpixel().paddingamounts();
    const int64_t pad[2] = {dim_or(a, 0, 0), dim_or(a, 1, 0)};
    o.padding = {pad[0], pad[1]};
    o.ceil_mode = true;
    // the spec drops a window that starts past the input only when there is padding
    for (int k = 0; k < 2; ++k) {
      const int64_t out = (in[k] + 2 * pad[k] - kernel[k] + stride[k] - 1) / stride[k] + 1;
      const bool drop = (out - 1) * stride[k] >= in[k] + pad[k];
      if (drop && pad[0] == 0 && pad[1] == 0)
        c.unsupported("includeLastPixel without padding and a kernel smaller than its stride");
    }
  }
  c.set(0, from_nchw(is_max ? max_pool(x, o) : avg_pool(x, o), x0));
}

// A per-channel parameter (length 1 or C) shaped to broadcast along axis -3.
Tensor per_channel(LayerContext& c, const spec::WeightParams& w, int64_t channels,
                   const std::string& what) {
  int64_t n = w.floatvalue_size();
  if (!n && !w.float16value().empty()) n = static_cast<int64_t>(w.float16value().size() / 2);
  if (!n) n = channels;
  if (n != 1 && n != channels) c.fail("{} has {} values for {} channels", what, n, channels);
  return c.weight(w, {n, 1, 1}, what);
}

void activation(LayerContext& c) {
  const auto& a = c.layer.activation();
  const Tensor x = c.in();
  using A = spec::ActivationParams;
  switch (a.NonlinearityType_case()) {
    case A::kReLU:
      return c.set(0, relu(x));
    case A::kLeakyReLU:
      return c.set(0, leaky_relu(x, a.leakyrelu().alpha()));
    case A::kTanh:
      return c.set(0, tanh(x));
    case A::kScaledTanh:
      return c.set(0, tanh(x * a.scaledtanh().beta()) * a.scaledtanh().alpha());
    case A::kSigmoid:
      return c.set(0, sigmoid(x));
    case A::kSigmoidHard:
      return c.set(0, clip(x * a.sigmoidhard().alpha() + a.sigmoidhard().beta(), 0.0, 1.0));
    case A::kLinear:
      return c.set(0, x * a.linear().alpha() + a.linear().beta());
    case A::kELU:
      return c.set(0, elu(x, a.elu().alpha()));
    case A::kSoftsign:
      return c.set(0, x / (abs(x) + 1.0));
    case A::kSoftplus:
      return c.set(0, softplus(x));
    case A::kThresholdedReLU: {
      const Tensor zero = scalar_like(x, 0);
      return c.set(0,
                   where(greater_equal(x, scalar_like(x, a.thresholdedrelu().alpha())), x, zero));
    }
    case A::kPReLU: {
      if (x.rank() < 3) c.fail("PReLU takes a blob of rank 3 or more, got {}", str(x.shape()));
      const Tensor alpha = per_channel(c, a.prelu().alpha(), x.dim(-3), "alpha");
      return c.set(0, where(greater_equal(x, scalar_like(x, 0)), x, x * alpha));
    }
    case A::kParametricSoftplus: {
      if (x.rank() < 3) c.fail("takes a blob of rank 3 or more, got {}", str(x.shape()));
      const auto& s = a.parametricsoftplus();
      const Tensor alpha = per_channel(c, s.alpha(), x.dim(-3), "alpha");
      const Tensor beta = per_channel(c, s.beta(), x.dim(-3), "beta");
      return c.set(0, softplus(x * beta) * alpha);
    }
    default:
      c.unsupported("activation kind {} is not mapped",
                    static_cast<int>(a.NonlinearityType_case()));
  }
}

void inner_product(LayerContext& c) {
  const auto& p = c.layer.innerproduct();
  const int64_t cin = static_cast<int64_t>(p.inputchannels());
  const int64_t cout = static_cast<int64_t>(p.outputchannels());
  const Tensor x = c.in();
  const Shape s = x.shape();
  // the input as a (rows, C_in) matrix (the spec's reshape for each rank)
  Shape out;
  Tensor m;
  switch (x.rank()) {
    case 1:
    case 2:
    case 3:
      m = x;
      out = s;
      out.back() = cout;
      break;
    case 4:
      m = reshape(x, {s[0], s[1] * s[2] * s[3]});
      out = {s[0], cout, 1, 1};
      break;
    case 5:
      m = reshape(x, {s[0] * s[1], s[2] * s[3] * s[4]});
      out = {s[0], s[1], cout, 1, 1};
      break;
    default:
      c.fail("takes a blob of rank 1 to 5, got {}", str(s));
  }
  if (m.dim(-1) != cin)
    c.fail("takes {} input channels, the input {} gives {}", cin, str(s), m.dim(-1));
  std::optional<Tensor> bias;
  if (p.hasbias()) bias = c.weight(p.bias(), {cout}, "bias");
  c.set(0, reshape(linear(m, c.weight(p.weights(), {cout, cin}, "weights"), bias), out));
}

void embedding_layer(LayerContext& c) {
  const auto& p = c.layer.embedding();
  const int64_t dim = static_cast<int64_t>(p.inputdim());
  const int64_t cout = static_cast<int64_t>(p.outputchannels());
  const Tensor x = c.in();
  const Shape s = x.shape();
  if (x.rank() < 4 || s[s.size() - 1] != 1 || s[s.size() - 2] != 1 || s[s.size() - 3] != 1)
    c.fail("takes indices of shape (..., 1, 1, 1), got {}", str(s));
  const Tensor table = transpose(c.weight(p.weights(), {cout, dim}, "weights"));
  Tensor y = embedding(table, cast(x, i64));  // (..., 1, 1, 1, C_out)
  if (p.hasbias()) y = y + c.weight(p.bias(), {cout}, "bias");
  Shape out(s.begin(), s.end() - 3);
  out.insert(out.end(), {cout, 1, 1});
  c.set(0, reshape(y, out));
}

void batchnorm(LayerContext& c) {
  const auto& p = c.layer.batchnorm();
  const Tensor x = c.in();
  if (x.rank() < 3) c.fail("takes a blob of rank 3 or more, got {}", str(x.shape()));
  const int64_t ch = static_cast<int64_t>(p.channels());
  if (x.dim(-3) != ch) c.fail("has {} channels, the input {}", ch, str(x.shape()));
  const double eps = p.epsilon() ? p.epsilon() : 1e-5;
  const Array gamma = c.weights(p.gamma(), {ch}, "gamma");
  const Array beta = c.weights(p.beta(), {ch}, "beta");
  if (p.computemeanvar()) {
    Axes axes = {x.rank() - 2, x.rank() - 1};
    if (!p.instancenormalization())
      for (int d = 0; d < x.rank() - 3; ++d) axes.push_back(d);
    const Tensor mu = mean(x, axes, true);
    const Tensor var = variance(x, axes, true);
    const Tensor g = constant(c.graph(), gamma.reshape({ch, 1, 1}));
    const Tensor b = constant(c.graph(), beta.reshape({ch, 1, 1}));
    c.set(0, (x - mu) / sqrt(var + eps) * g + b);
    return;
  }
  const Array mu = c.weights(p.mean(), {ch}, "mean");
  const Array var = c.weights(p.variance(), {ch}, "variance");
  // y = x * scale + shift, folded now in f64
  std::vector<double> scale(ch), shift(ch);
  for (int64_t i = 0; i < ch; ++i) {
    const double g = gamma.data<float>()[i], v = var.data<float>()[i];
    scale[i] = g / std::sqrt(v + eps);
    shift[i] = beta.data<float>()[i] - mu.data<float>()[i] * scale[i];
  }
  c.set(0, x * c.constant_of(scale, {ch, 1, 1}) + c.constant_of(shift, {ch, 1, 1}));
}

// A scale or bias layer's parameter of shape [1], [C], [1, H, W] or [C, H, W], shaped to
// broadcast over (..., C, H, W).
Tensor chw_param(LayerContext& c, const google::protobuf::RepeatedField<uint64_t>& shape,
                 const spec::WeightParams& w, const std::string& what) {
  Shape s(shape.begin(), shape.end());
  if (s.empty()) s = {1};
  if (s.size() == 1) s = {s[0], 1, 1};
  if (s.size() != 3)
    c.fail("{} has shape {} (one of [1], [C], [1, H, W], [C, H, W])", what, str(s));
  return c.weight(w, s, what);
}

void padding(LayerContext& c) {
  const auto& p = c.layer.padding();
  const Tensor x = c.in();
  if (x.rank() < 2) c.fail("takes a blob of rank 2 or more, got {}", str(x.shape()));
  std::vector<int64_t> pads(2 * x.rank(), 0);
  const auto& b = p.paddingamounts().borderamounts();
  for (int k = 0; k < b.size() && k < 2; ++k) {
    const size_t d = x.rank() - 2 + k;
    pads[2 * d] = static_cast<int64_t>(b.Get(k).startedgesize());
    pads[2 * d + 1] = static_cast<int64_t>(b.Get(k).endedgesize());
  }
  if (p.has_reflection()) c.set(0, pad(x, pads, PadKind::reflect));
  else if (p.has_replication()) c.set(0, pad(x, pads, PadKind::edge));
  else c.set(0, pad(x, pads, PadKind::constant, p.constant().value()));
}

void upsample(LayerContext& c) {
  const auto& p = c.layer.upsample();
  if (p.fractionalscalingfactor_size()) c.unsupported("a fractional scaling factor is not mapped");
  const Tensor x = c.in();
  if (x.rank() < 3) c.fail("takes a blob of rank 3 or more, got {}", str(x.shape()));
  Shape sizes = x.shape();
  sizes[sizes.size() - 2] *= dim_or(p.scalingfactor(), 0, 1);
  sizes[sizes.size() - 1] *= dim_or(p.scalingfactor(), 1, 1);
  ResizeOptions o;
  if (p.mode() == spec::UpsampleLayerParams_InterpolationMode_NN) {
    o.mode = ResizeMode::nearest;
    o.coordinate_transformation_mode = ResizeCoordinates::asymmetric;
    o.nearest_mode = NearestMode::floor;
  } else {
    o.mode = ResizeMode::linear;
    switch (p.linearupsamplemode()) {
      case spec::UpsampleLayerParams_LinearUpsampleMode_ALIGN_CORNERS_TRUE:
        o.coordinate_transformation_mode = ResizeCoordinates::align_corners;
        break;
      case spec::UpsampleLayerParams_LinearUpsampleMode_ALIGN_CORNERS_FALSE:
        o.coordinate_transformation_mode = ResizeCoordinates::pytorch_half_pixel;
        break;
      default:  // the spec's UPSAMPLE_MODE grid: output i samples input i / scale
        o.coordinate_transformation_mode = ResizeCoordinates::asymmetric;
    }
  }
  c.set(0, resize(x, sizes, o));
}

void unary_layer(LayerContext& c) {
  const auto& p = c.layer.unary();
  const double scale = p.scale() ? p.scale() : 1.0;
  const double eps = p.epsilon() ? p.epsilon() : 1e-6;
  Tensor x = c.in();
  if (scale != 1.0) x = x * scale;
  if (p.shift() != 0) x = x + static_cast<double>(p.shift());
  using U = spec::UnaryFunctionLayerParams;
  switch (p.type()) {
    case U::SQRT:
      return c.set(0, sqrt(x));
    case U::RSQRT:
      return c.set(0, rsqrt(x + eps));
    case U::INVERSE:
      return c.set(0, reciprocal(x + eps));
    case U::POWER:
      return c.set(0, pow(x, scalar_like(x, p.alpha())));
    case U::EXP:
      return c.set(0, exp(x));
    case U::LOG:
      return c.set(0, log(x));
    case U::ABS:
      return c.set(0, abs(x));
    case U::THRESHOLD:
      return c.set(0, maximum(x, scalar_like(x, p.alpha())));
    default:
      c.unsupported("unary function {} is not mapped", static_cast<int>(p.type()));
  }
}

// add, multiply, max, min: two or more inputs folded, or one input with alpha (add, multiply).
void fold(LayerContext& c, Tensor (*f)(const Tensor&, const Tensor&), std::optional<float> alpha) {
  std::vector<Tensor> xs = c.ins();
  if (xs.empty()) c.fail("has no inputs");
  if (xs.size() == 1) {
    if (!alpha) c.fail("takes 2 or more inputs, got 1");
    c.set(0, f(xs[0], scalar_like(xs[0], *alpha)));
    return;
  }
  Tensor y = xs[0];
  for (size_t k = 1; k < xs.size(); ++k) y = f(y, xs[k]);
  c.set(0, y);
}

// The legacy reshape's and flatten's CHANNEL_LAST order: (..., C, H, W) read as (..., H, W, C).
Tensor channels_last(const Tensor& x) {
  const int r = x.rank();
  std::vector<int64_t> perm;
  for (int d = 0; d < r - 3; ++d) perm.push_back(d);
  perm.insert(perm.end(), {r - 2, r - 1, r - 3});
  return transpose(x, perm);
}

void reshape_layer(LayerContext& c) {
  const auto& p = c.layer.reshape();
  const Tensor x = c.in();
  Shape t(p.targetshape().begin(), p.targetshape().end());
  const Shape xs = x.shape();
  if (xs.size() < 3) c.fail("takes a blob of rank 3 or more, got {}", str(xs));
  Shape lead(xs.begin(), xs.end() - 3);
  if (t.size() == 4) {
    if (!c.exact) {
      if (t[0] != 1) c.unsupported("a sequence length other than 1 (target shape {})", str(t));
      t.erase(t.begin());
    } else if (x.rank() == 5) {
      lead = {t[0], x.dim(1)};
      t.erase(t.begin());
    } else {
      c.fail("a 4-dim target shape for an input of shape {}", str(x.shape()));
    }
  }
  if (t.size() != 3) c.fail("target shape {} has length {} (3 or 4)", str(t), t.size());
  Shape out = lead;
  out.insert(out.end(), t.begin(), t.end());
  if (p.mode() == spec::ReshapeLayerParams_ReshapeOrder_CHANNEL_FIRST) {
    c.set(0, reshape(x, out));
    return;
  }
  Shape hwc = lead;
  hwc.insert(hwc.end(), {t[1], t[2], t[0]});
  const int r = static_cast<int>(hwc.size());
  std::vector<int64_t> perm;
  for (int d = 0; d < r - 3; ++d) perm.push_back(d);
  perm.insert(perm.end(), {r - 1, r - 3, r - 2});
  c.set(0, transpose(reshape(channels_last(x), hwc), perm));
}

void flatten(LayerContext& c) {
  Tensor x = c.in();
  if (x.rank() < 3) c.fail("takes a blob of rank 3 or more, got {}", str(x.shape()));
  const Shape xs = x.shape();
  Shape out(xs.begin(), xs.end() - 3);
  out.insert(out.end(), {x.dim(-3) * x.dim(-2) * x.dim(-1), 1, 1});
  if (c.layer.flatten().mode() == spec::FlattenLayerParams_FlattenOrder_CHANNEL_LAST)
    x = channels_last(x);
  c.set(0, reshape(x, out));
}

void permute(LayerContext& c) {
  const auto& a = c.layer.permute().axis();
  const Tensor x = c.in();
  std::vector<int64_t> axis = {0, 1, 2, 3};
  if (a.size()) axis.assign(a.begin(), a.end());
  if (axis.size() != 4) c.fail("axis has {} entries (4)", axis.size());
  // axis permutes (Seq, C, H, W); the batch axis stays
  if (x.rank() == 5) {
    const int64_t to5[4] = {0, 2, 3, 4};
    c.set(0, transpose(x, {to5[axis[0]], 1, to5[axis[1]], to5[axis[2]], to5[axis[3]]}));
  } else if (x.rank() == 4 && !c.exact) {
    if (axis[0] != 0) c.unsupported("moving the sequence axis (axis {})", str(axis));
    c.set(0, transpose(x, {0, axis[1], axis[2], axis[3]}));
  } else {
    c.fail("takes a rank-5 blob, got {}", str(x.shape()));
  }
}

void reduce_layer(LayerContext& c) {
  const auto& p = c.layer.reduce();
  const Tensor x = c.in();
  const int r = x.rank();
  using R = spec::ReduceLayerParams;
  Axes axes;
  switch (p.axis()) {
    case R::CHW:
      axes = {r - 3, r - 2, r - 1};
      break;
    case R::HW:
      axes = {r - 2, r - 1};
      break;
    case R::C:
      axes = {r - 3};
      break;
    case R::H:
      axes = {r - 2};
      break;
    default:
      axes = {r - 1};
  }
  for (int64_t a : axes)
    if (a < 0) c.fail("reduces axes the input of shape {} does not have", str(x.shape()));
  const double eps = p.epsilon() ? p.epsilon() : 1e-6;
  switch (p.mode()) {
    case R::SUM:
      return c.set(0, sum(x, axes, true));
    case R::AVG:
      return c.set(0, mean(x, axes, true));
    case R::PROD:
      return c.set(0, prod(x, axes, true));
    case R::LOGSUM:
      return c.set(0, sum(log(x + eps), axes, true));
    case R::SUMSQUARE:
      return c.set(0, sum(x * x, axes, true));
    case R::L1:
      return c.set(0, norm_l1(x, axes, true));
    case R::L2:
      return c.set(0, norm_l2(x, axes, true));
    case R::MAX:
      return c.set(0, max(x, axes, true));
    case R::MIN:
      return c.set(0, min(x, axes, true));
    case R::ARGMAX:
      if (axes.size() != 1) c.unsupported("ARGMAX over more than one axis");
      return c.set(0, cast(argmax(x, axes[0], true), f32));
    default:
      c.unsupported("reduce mode {} is not mapped", static_cast<int>(p.mode()));
  }
}

void slice_layer(LayerContext& c) {
  const auto& p = c.layer.slice();
  const Tensor x = c.in();
  const int64_t a = p.axis() == spec::SliceLayerParams_SliceAxis_CHANNEL_AXIS  ? -3
                    : p.axis() == spec::SliceLayerParams_SliceAxis_HEIGHT_AXIS ? -2
                                                                               : -1;
  const int64_t ax = c.axis(a, x.rank());
  const int64_t n = x.dim(static_cast<int>(ax));
  int64_t b = p.startindex(), e = p.endindex();
  if (b < 0) b += n;
  if (e < 0) e += n;
  const int64_t step = p.stride() ? static_cast<int64_t>(p.stride()) : 1;
  c.set(0, slice(x, {std::clamp<int64_t>(b, 0, n)}, {std::clamp<int64_t>(e, 0, n)}, {step}, {ax}));
}

void slice_static(LayerContext& c) {
  const auto& p = c.layer.slicestatic();
  const Tensor x = c.in();
  const int r = x.rank();
  if (p.beginids_size() != r || p.endids_size() != r)
    c.fail("beginIds/endIds have {}/{} entries for rank {}", p.beginids_size(), p.endids_size(), r);
  std::vector<int64_t> b(r), e(r), s(r), axes(r);
  std::vector<int64_t> squeeze_axes;
  for (int d = 0; d < r; ++d) {
    const int64_t n = x.dim(d);
    s[d] = p.strides_size() > d ? p.strides(d) : 1;
    if (s[d] <= 0) c.unsupported("a stride of {} is not mapped", s[d]);
    b[d] = p.beginmasks_size() > d && p.beginmasks(d) ? 0 : p.beginids(d);
    e[d] = p.endmasks_size() > d && p.endmasks(d) ? n : p.endids(d);
    if (b[d] < 0) b[d] += n;
    if (e[d] < 0) e[d] += n;
    b[d] = std::clamp<int64_t>(b[d], 0, n);
    e[d] = std::clamp<int64_t>(e[d], 0, n);
    axes[d] = d;
    if (p.squeezemasks_size() > d && p.squeezemasks(d)) {
      e[d] = b[d] + 1;
      squeeze_axes.push_back(d);
    }
  }
  Tensor y = slice(x, b, e, s, axes);
  if (!squeeze_axes.empty()) y = squeeze(y, squeeze_axes);
  c.set(0, y);
}

void lrn(LayerContext& c) {
  const auto& p = c.layer.lrn();
  const Tensor x = c.in();
  if (x.rank() < 3) c.fail("takes a blob of rank 3 or more, got {}", str(x.shape()));
  const int64_t n = static_cast<int64_t>(p.localsize());
  if (n < 1) c.fail("localSize is {}", n);
  const double k = p.k() ? p.k() : 1.0;
  const int64_t ch = x.dim(-3), h = x.dim(-2), w = x.dim(-1);
  // the mean of squares over the window of n channels around c (zeros past the ends), as an
  // average pool over (C, H * W)
  const Tensor sq = reshape(x * x, {-1, 1, ch, h * w});
  PoolOptions o;
  o.kernel = {n, 1};
  o.stride = {1, 1};
  o.padding = {(n - 1) / 2, 0, n - 1 - (n - 1) / 2, 0};
  o.count_include_pad = true;
  const Tensor avg = reshape(avg_pool(sq, o), x.shape());
  c.set(0, x / pow(avg * static_cast<double>(p.alpha()) + k, scalar_like(x, p.beta())));
}

void mvn(LayerContext& c) {
  const auto& p = c.layer.mvn();
  const Tensor x = c.in();
  const int r = x.rank();
  if (r < 3) c.fail("takes a blob of rank 3 or more, got {}", str(x.shape()));
  const Axes axes = p.acrosschannels() ? Axes{r - 3, r - 2, r - 1} : Axes{r - 2, r - 1};
  const double eps = p.epsilon() ? p.epsilon() : 1e-6;
  Tensor y = x - mean(x, axes, true);
  if (p.normalizevariance()) y = y / sqrt(variance(x, axes, true) + eps);
  c.set(0, y);
}

}  // namespace

void add_layers(LayerTable& t) {
  t[L::kConvolution] = convolution;
  t[L::kPooling] = pooling;
  t[L::kActivation] = activation;
  t[L::kInnerProduct] = inner_product;
  t[L::kEmbedding] = embedding_layer;
  t[L::kBatchnorm] = batchnorm;
  t[L::kPadding] = padding;
  t[L::kUpsample] = upsample;
  t[L::kUnary] = unary_layer;
  t[L::kReshape] = reshape_layer;
  t[L::kFlatten] = flatten;
  t[L::kPermute] = permute;
  t[L::kReduce] = reduce_layer;
  t[L::kSlice] = slice_layer;
  t[L::kSliceStatic] = slice_static;
  t[L::kLrn] = lrn;
  t[L::kMvn] = mvn;
  t[L::kAdd] = [](LayerContext& c) { fold(c, add, c.layer.add().alpha()); };
  t[L::kMultiply] = [](LayerContext& c) { fold(c, mul, c.layer.multiply().alpha()); };
  t[L::kMax] = [](LayerContext& c) { fold(c, maximum, std::nullopt); };
  t[L::kMin] = [](LayerContext& c) { fold(c, minimum, std::nullopt); };
  t[L::kAverage] = [](LayerContext& c) {
    const std::vector<Tensor> xs = c.ins();
    if (xs.size() < 2) c.fail("takes 2 or more inputs, got {}", xs.size());
    Tensor y = xs[0];
    for (size_t k = 1; k < xs.size(); ++k) y = y + xs[k];
    c.set(0, y / static_cast<double>(xs.size()));
  };
  t[L::kScale] = [](LayerContext& c) {
    const auto& p = c.layer.scale();
    Tensor y = c.in() * chw_param(c, p.shapescale(), p.scale(), "scale");
    if (p.hasbias()) y = y + chw_param(c, p.shapebias(), p.bias(), "bias");
    c.set(0, y);
  };
  t[L::kBias] = [](LayerContext& c) {
    const auto& p = c.layer.bias();
    c.set(0, c.in() + chw_param(c, p.shape(), p.bias(), "bias"));
  };
  t[L::kSoftmax] = [](LayerContext& c) {
    const Tensor x = c.in();
    c.set(0, softmax(x, c.axis(-3, x.rank())));
  };
  t[L::kL2Normalize] = [](LayerContext& c) {
    const Tensor x = c.in();
    const int r = x.rank();
    if (r < 3) c.fail("takes a blob of rank 3 or more, got {}", str(x.shape()));
    const double eps = c.layer.l2normalize().epsilon() ? c.layer.l2normalize().epsilon() : 1e-6;
    c.set(0, x / sqrt(sum(x * x, {r - 3, r - 2, r - 1}, true) + eps));
  };
  t[L::kConcat] = [](LayerContext& c) {
    const std::vector<Tensor> xs = c.ins();
    if (c.layer.concat().sequenceconcat() && !c.exact)
      c.unsupported("sequenceConcat (the sequence axis is not kept under the rank-5 mapping)");
    const int64_t a = c.layer.concat().sequenceconcat() ? -5 : -3;
    c.set(0, concat(xs, c.axis(a, xs.at(0).rank())));
  };
  t[L::kSplit] = [](LayerContext& c) {
    const Tensor x = c.in();
    const int64_t n =
        c.layer.split().noutputs() ? c.layer.split().noutputs() : c.layer.output_size();
    c.set(split(x, n, c.axis(-3, x.rank())));
  };
  t[L::kLoadConstant] = [](LayerContext& c) {
    const auto& p = c.layer.loadconstant();
    if (p.shape_size() != 3) c.fail("shape has {} entries (3: C, H, W)", p.shape_size());
    Shape s = {1, static_cast<int64_t>(p.shape(0)), static_cast<int64_t>(p.shape(1)),
               static_cast<int64_t>(p.shape(2))};
    if (c.exact) s.insert(s.begin(), 1);
    c.set(0, c.weight(p.data(), s, "data"));
  };
  t[L::kCrop] = [](LayerContext& c) {
    const auto& p = c.layer.crop();
    const Tensor x = c.in();
    const int r = x.rank();
    if (r < 3) c.fail("takes a blob of rank 3 or more, got {}", str(x.shape()));
    int64_t b[2] = {0, 0}, e[2] = {x.dim(-2), x.dim(-1)};
    if (c.num_inputs() == 2) {
      const Tensor ref = c.in(1);
      for (int k = 0; k < 2; ++k) {
        b[k] = dim_or(p.offset(), k, 0);
        e[k] = b[k] + ref.dim(r - 2 + k);
      }
    } else {
      const auto& a = p.cropamounts().borderamounts();
      for (int k = 0; k < a.size() && k < 2; ++k) {
        b[k] = static_cast<int64_t>(a.Get(k).startedgesize());
        e[k] -= static_cast<int64_t>(a.Get(k).endedgesize());
      }
    }
    c.set(0, slice(x, {b[0], b[1]}, {e[0], e[1]}, {}, {r - 2, r - 1}));
  };
}

}  // namespace kiln::coreml::detail::nn
