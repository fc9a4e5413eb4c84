// ONNX neural-network ops: matmul, convolution, pooling, normalization, softmax, losses.
#include <cmath>

#include "io/onnx/map_util.h"

namespace kiln::onnx::detail {

namespace {

Shape static_shape(NodeContext& c, const Tensor& x) {
  Shape s = x.shape();
  if (!is_static(s))
    c.unsupported(fmt::format("needs the static shape of its input, which is {}; give the "
                              "model's inputs static shapes",
                              str(s)));
  return s;
}

// x's shape, whose spatial dims (2 on) must be static; the batch and channels may be dynamic.
Shape static_spatial(NodeContext& c, const Tensor& x) {
  Shape s = x.shape();
  for (size_t d = 2; d < s.size(); ++d)
    if (s[d] < 0)
      c.unsupported(
          fmt::format("needs the static spatial dims of its input, which is {}; give the "
                      "model's inputs static image sizes",
                      str(s)));
  return s;
}

// Ones of x's shape, also where it is known only when run.
Tensor ones_shaped_like(NodeContext& c, const Tensor& x, DType dtype) {
  if (is_static(x.shape())) return full(c.graph(), x.shape(), 1.0, dtype);
  return full(shape_of(x), 1.0, dtype);
}

Outs matmul_op(NodeContext& c) { return {matmul(c.input(0), c.input(1))}; }

Outs gemm_op(NodeContext& c) {
  Tensor a = c.input(0), b = c.input(1);
  const double alpha = c.attr_float("alpha", 1.0f), beta = c.attr_float("beta", 1.0f);
  const bool ta = c.attr_int("transA", 0) != 0, tb = c.attr_int("transB", 0) != 0;
  if (a.rank() != 2 || b.rank() != 2) c.fail("A and B must be 2-D");
  if (ta) a = transpose(a);
  // the common Linear layer: x · wᵀ + bias, one fused kernel
  if (tb && alpha == 1.0 && beta == 1.0 && c.has_input(2) && c.input(2).rank() == 1 &&
      c.input(2).dim(0) == b.dim(0))
    return {linear(a, b, c.input(2))};
  if (tb && alpha == 1.0 && !c.has_input(2)) return {linear(a, b)};
  Tensor y = matmul(a, tb ? transpose(b) : b);
  if (alpha != 1.0) y = mul(y, scalar_of(y, alpha));
  if (c.has_input(2)) {
    Tensor bias = c.input(2);
    if (beta != 1.0) bias = mul(bias, scalar_of(bias, beta));
    y = add(y, bias);
  }
  return {y};
}

struct Window {
  std::vector<int64_t> kernel, stride, dilation, pads;  // pads: begins then ends
};

// kernel/strides/dilations/pads with auto_pad resolved against x's spatial dims.
Window window(NodeContext& c, const Tensor& x, std::vector<int64_t> kernel) {
  const size_t nd = kernel.size();
  Window w;
  w.kernel = kernel;
  w.stride = c.attr_ints("strides", std::vector<int64_t>(nd, 1));
  w.dilation = c.attr_ints("dilations", std::vector<int64_t>(nd, 1));
  w.pads = c.attr_ints("pads", std::vector<int64_t>(2 * nd, 0));
  if (w.stride.size() != nd || w.dilation.size() != nd || w.pads.size() != 2 * nd)
    c.fail(fmt::format("strides, dilations and pads must have {} and {} values", nd, 2 * nd));
  const std::string ap = c.attr_string("auto_pad", "NOTSET");
  if (ap == "VALID") {
    std::fill(w.pads.begin(), w.pads.end(), 0);
  } else if (ap == "SAME_UPPER" || ap == "SAME_LOWER") {
    const Shape s = static_spatial(c, x);
    for (size_t i = 0; i < nd; ++i) {
      const int64_t in = s[2 + i], out = (in + w.stride[i] - 1) / w.stride[i];
      const int64_t total =
          std::max<int64_t>(0, (out - 1) * w.stride[i] + (kernel[i] - 1) * w.dilation[i] + 1 - in);
      const int64_t small = total / 2, big = total - small;
      w.pads[i] = ap == "SAME_UPPER" ? small : big;
      w.pads[i + nd] = ap == "SAME_UPPER" ? big : small;
    }
  } else if (ap != "NOTSET") {
    c.fail(fmt::format("unknown auto_pad '{}'", ap));
  }
  return w;
}

Outs conv_op(NodeContext& c) {
  Tensor x = c.input(0), w = c.input(1);
  if (w.rank() < 3 || w.rank() > 5) c.unsupported(fmt::format("{}-D weights", w.rank()));
  const Shape ws = w.shape();
  ConvOptions o;
  const std::string ap = c.attr_string("auto_pad", "NOTSET");
  if ((ap == "SAME_UPPER" || ap == "SAME_LOWER") && !is_static(x.shape())) {
    // pads that depend on dynamic spatial dims: resolved for each shape (conv's pad modes)
    const size_t nd = ws.size() - 2;
    o.stride = c.attr_ints("strides", std::vector<int64_t>(nd, 1));
    o.dilation = c.attr_ints("dilations", std::vector<int64_t>(nd, 1));
    o.pad_mode = ap == "SAME_UPPER" ? PadMode::same_upper : PadMode::same_lower;
  } else {
    Window win = window(c, x, Shape(ws.begin() + 2, ws.end()));
    o.stride = win.stride;
    o.dilation = win.dilation;
    o.padding = win.pads;
  }
  o.groups = c.attr_int("group", 1);
  std::optional<Tensor> bias;
  if (c.has_input(2)) bias = c.input(2);
  switch (w.rank()) {
    case 3: return {conv1d(x, w, bias, o)};
    case 4: return {conv2d(x, w, bias, o)};
    default: return {conv3d(x, w, bias, o)};
  }
}

Outs conv_transpose_op(NodeContext& c) {
  Tensor x = c.input(0), w = c.input(1);
  if (w.rank() < 3 || w.rank() > 5) c.unsupported(fmt::format("{}-D weights", w.rank()));
  const Shape ws = w.shape();
  const size_t nd = ws.size() - 2;
  ConvTransposeOptions o;
  o.stride = c.attr_ints("strides", std::vector<int64_t>(nd, 1));
  o.dilation = c.attr_ints("dilations", std::vector<int64_t>(nd, 1));
  o.output_padding = c.attr_ints("output_padding", std::vector<int64_t>(nd, 0));
  o.padding = c.attr_ints("pads", std::vector<int64_t>(2 * nd, 0));
  o.groups = c.attr_int("group", 1);
  const std::string ap = c.attr_string("auto_pad", "NOTSET");
  std::vector<int64_t> out_shape = c.attr_ints("output_shape");
  if (out_shape.size() > nd) out_shape.erase(out_shape.begin(), out_shape.end() - nd);
  if (out_shape.empty() && (ap == "SAME_UPPER" || ap == "SAME_LOWER")) {
    const Shape s = static_spatial(c, x);
    for (size_t i = 0; i < nd; ++i) out_shape.push_back(s[2 + i] * o.stride[i]);
  }
  if (!out_shape.empty()) {
    const Shape s = static_spatial(c, x);
    for (size_t i = 0; i < nd; ++i) {
      const int64_t full = o.stride[i] * (s[2 + i] - 1) + o.output_padding[i] +
                           (ws[2 + i] - 1) * o.dilation[i] + 1;
      const int64_t total = full - out_shape[i];
      if (total < 0) {  // the wanted size is larger: grow it at the end
        o.output_padding[i] += -total;
        o.padding[i] = o.padding[i + nd] = 0;
        continue;
      }
      const int64_t small = total / 2, big = total - small;
      o.padding[i] = ap == "SAME_UPPER" ? small : big;
      o.padding[i + nd] = ap == "SAME_UPPER" ? big : small;
    }
  } else if (ap == "VALID") {
    std::fill(o.padding.begin(), o.padding.end(), 0);
  }
  std::optional<Tensor> bias;
  if (c.has_input(2)) bias = c.input(2);
  switch (nd) {
    case 1: return {conv_transpose1d(x, w, bias, o)};
    case 2: return {conv_transpose2d(x, w, bias, o)};
    default: return {conv_transpose3d(x, w, bias, o)};
  }
}

PoolOptions pool_options(NodeContext& c, const Tensor& x, bool allow_dilation) {
  const auto kernel = c.attr_ints("kernel_shape");
  if (kernel.empty() || kernel.size() > 3) c.fail("kernel_shape must have 1 to 3 values");
  Window w = window(c, x, kernel);
  PoolOptions o;
  o.kernel = w.kernel;
  o.stride = w.stride;
  o.padding = w.pads;
  o.ceil_mode = c.attr_int("ceil_mode", 0) != 0;
  if (allow_dilation) {
    o.dilation = w.dilation;
  } else {
    for (int64_t d : w.dilation)
      if (d != 1) c.unsupported("dilations other than 1 for average pooling");
  }
  return o;
}

// kiln's pooling takes pads up to half the (dilated) kernel, as PyTorch; larger ONNX pads become
// an explicit pad of x with `value` (the pooling then pads nothing).
bool pads_too_large(const PoolOptions& o) {
  const size_t nd = o.kernel.size();
  for (size_t i = 0; i < nd; ++i) {
    const int64_t d = o.dilation.empty() ? 1 : o.dilation[i];
    const int64_t half = ((o.kernel[i] - 1) * d + 1) / 2;
    if (o.padding[i] > half || o.padding[i + nd] > half) return true;
  }
  return false;
}

Tensor pad_explicitly(const Tensor& x, PoolOptions& o, double value) {
  const size_t nd = o.kernel.size();
  std::vector<int64_t> pads(2 * x.rank(), 0);
  for (size_t i = 0; i < nd; ++i) {
    pads[2 * (2 + i)] = o.padding[i];
    pads[2 * (2 + i) + 1] = o.padding[i + nd];
  }
  std::fill(o.padding.begin(), o.padding.end(), 0);
  return pad(x, pads, PadKind::constant, value);
}

Outs max_pool_op(NodeContext& c) {
  Tensor x = c.input(0);
  PoolOptions o = pool_options(c, x, true);
  if (pads_too_large(o)) {
    if (c.has_output(1)) c.unsupported("Indices with pads larger than half the kernel");
    if (o.ceil_mode) c.unsupported("ceil_mode with pads larger than half the kernel");
    return {max_pool(pad_explicitly(x, o, -INFINITY), o)};
  }
  const bool column_major = c.attr_int("storage_order", 0) != 0;
  if (!c.has_output(1)) return {max_pool(x, o)};
  auto [y, idx] = max_pool_with_indices(x, o);
  const Shape s = static_spatial(c, x);
  // storage_order = 1: a 2-D plane's position counted column by column, w * H + h, from kiln's
  // row-major h * W + w (one spatial dim: the same; three are not mapped)
  if (column_major && s.size() == 5) c.unsupported("storage_order=1 over three spatial dims");
  if (column_major && s.size() == 4) {
    const Tensor w = scalar_of(idx, static_cast<double>(s[3]));
    idx = add(mul(mod(idx, w), scalar_of(idx, static_cast<double>(s[2]))), div(idx, w));
  }
  // kiln's indices count within each (n, c) plane; ONNX's over the whole tensor: plane
  // (n * C + c) added, with N and C from x's shape when they are known only when run
  int64_t plane = 1;
  for (size_t i = 2; i < s.size(); ++i) plane *= s[i];
  if (s[0] >= 0 && s[1] >= 0) {
    Shape off_shape(s.size(), 1);
    off_shape[0] = s[0];
    off_shape[1] = s[1];
    Tensor off = reshape(arange(c.graph(), 0, static_cast<double>(s[0] * s[1] * plane),
                                static_cast<double>(plane), i64),
                         off_shape);
    return {y, add(idx, off)};
  }
  const Tensor nc = slice(shape_of(x), {0}, {2});
  const Tensor zero = known_ints(c, {0}), one = known_ints(c, {1});
  const Tensor planes = arange(reshape(zero, {}), reshape(prod(nc), {}), reshape(one, {}), i64);
  const Tensor off_shape = concat({nc, known_ints(c, std::vector<int64_t>(s.size() - 2, 1))}, 0);
  return {y,
          add(idx, mul(reshape_to(planes, off_shape), scalar_of(idx, static_cast<double>(plane))))};
}

// Sums of every pooling window, and how many positions each averages over, from one strided
// slice per kernel offset: for what kiln's pooling kernels do not take (dilated average pooling).
// Windows of ceil_mode that run past the padded input see zeros there, never counted (as the
// reference and PyTorch count: the input, and with count_pad its pads).
std::pair<Tensor, Tensor> window_sums(NodeContext& c, const Tensor& x, const PoolOptions& o,
                                      bool count_pad) {
  const Shape s = static_spatial(c, x);
  const size_t nd = o.kernel.size();
  std::vector<int64_t> out(nd), pads(2 * s.size(), 0);
  for (size_t i = 0; i < nd; ++i) {
    const int64_t d = o.dilation.empty() ? 1 : o.dilation[i];
    const int64_t span = (o.kernel[i] - 1) * d + 1, padded = s[2 + i] + o.padding[i] + o.padding[i + nd];
    if (padded < span) c.fail("the window is larger than the padded input");
    out[i] = (padded - span) / o.stride[i] + 1;
    if (o.ceil_mode && (padded - span) % o.stride[i] != 0 &&
        out[i] * o.stride[i] < s[2 + i] + o.padding[i])
      ++out[i];
    const int64_t extra = std::max<int64_t>(0, (out[i] - 1) * o.stride[i] + span - padded);
    pads[2 * (2 + i)] = o.padding[i];
    pads[2 * (2 + i) + 1] = o.padding[i + nd] + extra;
  }
  Tensor xp = pad(x, pads);
  // which padded positions count: the real input, or the input and its pads
  Shape ms(s.size(), 1);
  std::vector<int64_t> mpads(2 * s.size(), 0);
  for (size_t i = 0; i < nd; ++i) {
    const int64_t extra = pads[2 * (2 + i) + 1] - o.padding[i + nd];
    ms[2 + i] = count_pad ? s[2 + i] + o.padding[i] + o.padding[i + nd] : s[2 + i];
    mpads[2 * (2 + i)] = count_pad ? 0 : o.padding[i];
    mpads[2 * (2 + i) + 1] = count_pad ? extra : pads[2 * (2 + i) + 1];
  }
  Tensor mask = pad(full(c.graph(), ms, 1.0, x.dtype()), mpads);
  Tensor sum, count;
  std::vector<int64_t> k(nd, 0);
  while (true) {
    std::vector<int64_t> starts, stops, steps, axes;
    for (size_t i = 0; i < nd; ++i) {
      const int64_t d = o.dilation.empty() ? 1 : o.dilation[i];
      starts.push_back(k[i] * d);
      stops.push_back(k[i] * d + (out[i] - 1) * o.stride[i] + 1);
      steps.push_back(o.stride[i]);
      axes.push_back(static_cast<int64_t>(2 + i));
    }
    Tensor part = slice(xp, starts, stops, steps, axes), m = slice(mask, starts, stops, steps, axes);
    sum = sum.valid() ? add(sum, part) : part;
    count = count.valid() ? add(count, m) : m;
    size_t i = 0;
    for (; i < nd && ++k[i] == o.kernel[i]; ++i) k[i] = 0;
    if (i == nd) break;
  }
  return {sum, count};
}

bool dilated(const PoolOptions& o) {
  for (int64_t d : o.dilation)
    if (d != 1) return true;
  return false;
}

Outs avg_pool_op(NodeContext& c) {
  Tensor x = c.input(0);
  PoolOptions o = pool_options(c, x, true);
  o.count_include_pad = c.attr_int("count_include_pad", 0) != 0;
  if (dilated(o)) {
    auto [sum, count] = window_sums(c, x, o, o.count_include_pad);
    return {div(sum, count)};
  }
  o.dilation.clear();
  if (!pads_too_large(o)) return {avg_pool(x, o)};
  if (o.ceil_mode) c.unsupported("ceil_mode with pads larger than half the kernel");
  const bool include = o.count_include_pad;
  PoolOptions po = o;
  po.count_include_pad = true;
  Tensor sum_avg = avg_pool(pad_explicitly(x, po, 0), po);
  if (include) return {sum_avg};
  // average over the window's real elements only
  PoolOptions pm = o;
  pm.count_include_pad = true;
  Tensor ones = ones_shaped_like(c, x, x.dtype());
  return {div(sum_avg, avg_pool(pad_explicitly(ones, pm, 0), pm))};
}

Outs lp_pool_op(NodeContext& c) {
  Tensor x = c.input(0);
  PoolOptions o = pool_options(c, x, true);
  o.count_include_pad = true;
  if (dilated(o)) {
    const double p = static_cast<double>(c.attr_int("p", 2));
    auto [sum, count] = window_sums(c, pow(abs(x), scalar_of(x, p)), o, true);
    return {pow(sum, scalar_of(x, 1.0 / p))};
  }
  o.dilation.clear();
  if (pads_too_large(o)) x = pad_explicitly(x, o, 0);
  const double p = static_cast<double>(c.attr_int("p", 2));
  int64_t k = 1;
  for (int64_t v : o.kernel) k *= v;
  Tensor s = mul(avg_pool(pow(abs(x), scalar_of(x, p)), o), scalar_of(x, static_cast<double>(k)));
  return {pow(s, scalar_of(x, 1.0 / p))};
}

Axes spatial_axes(const Tensor& x) {
  Axes a;
  for (int i = 2; i < x.rank(); ++i) a.push_back(i);
  return a;
}
Outs global_avg_pool_op(NodeContext& c) { return {mean(c.input(0), spatial_axes(c.input(0)), true)}; }
Outs global_max_pool_op(NodeContext& c) { return {max(c.input(0), spatial_axes(c.input(0)), true)}; }

Outs batch_norm_op(NodeContext& c) {
  if (c.attr_int("training_mode", 0) != 0) {
    // normalize with the batch's statistics; also return the moved running statistics
    Tensor x = c.input(0), mean = c.input(3), var = c.input(4);
    const double m = c.attr_float("momentum", 0.9f);
    auto r = batch_norm_train(x, c.input(1), c.input(2), c.attr_float("epsilon", 1e-5f));
    Tensor run_mean = add(mul(mean, scalar_of(mean, m)), mul(cast(r.mean, mean.dtype()), scalar_of(mean, 1 - m)));
    Tensor run_var = add(mul(var, scalar_of(var, m)), mul(cast(r.var, var.dtype()), scalar_of(var, 1 - m)));
    return {r.y, run_mean, run_var};
  }
  return {batch_norm(c.input(0), c.input(3), c.input(4), c.input(1), c.input(2),
                     c.attr_float("epsilon", 1e-5f))};
}

Outs instance_norm_op(NodeContext& c) {
  return {instance_norm(c.input(0), c.input(1), c.input(2), c.attr_float("epsilon", 1e-5f))};
}

Outs layer_norm_op(NodeContext& c) {
  Tensor x = c.input(0);
  const int64_t axis = axis_of(c, c.attr_int("axis", -1), x.rank());
  const double eps = c.attr_float("epsilon", 1e-5f);
  std::optional<Tensor> bias;
  if (c.has_input(2)) bias = c.input(2);
  Tensor scale = c.input(1);
  // kiln's weight has exactly the normalized dims; ONNX's may broadcast to them
  const Shape xs = x.shape();
  const Shape norm_shape(xs.begin() + axis, xs.end());
  if (scale.shape() != norm_shape) scale = broadcast_to(scale, norm_shape);
  if (bias && bias->shape() != norm_shape) bias = broadcast_to(*bias, norm_shape);
  Outs r{layer_norm(x, scale, bias, axis, eps)};
  if (c.has_output(1) || c.has_output(2)) {
    Axes axes;
    for (int i = static_cast<int>(axis); i < x.rank(); ++i) axes.push_back(i);
    Tensor xf = cast(x, f32);
    r.push_back(mean(xf, axes, true));
    r.push_back(rsqrt(add(variance(xf, axes, true), scalar_of(xf, eps))));
  }
  return r;
}

Outs group_norm_op(NodeContext& c) {
  Tensor x = c.input(0), scale = c.input(1), bias = c.input(2);
  const int64_t g = c.required_int("num_groups");
  const int64_t ch = x.dim(1);
  if (c.version() < 21 && ch > 0 && scale.rank() == 1 && scale.dim(0) == g && g != ch) {
    // opset 18: one scale and bias per group
    scale = reshape(broadcast_to(reshape(scale, {g, 1}), {g, ch / g}), {ch});
    bias = reshape(broadcast_to(reshape(bias, {g, 1}), {g, ch / g}), {ch});
  }
  return {group_norm(x, g, scale, bias, c.attr_float("epsilon", 1e-5f))};
}

// Softmax-like ops before opset 13 work on x flattened to 2-D at `axis` (default 1).
template <int Kind>  // 0 softmax, 1 log_softmax, 2 hardmax
Outs softmax_family(NodeContext& c) {
  Tensor x = c.input(0);
  auto apply = [&](const Tensor& t, int64_t axis) {
    if (Kind == 0) return softmax(t, axis);
    if (Kind == 1) return log_softmax(t, axis);
    const int64_t n = t.dim(static_cast<int>(axis));
    if (n >= 0) return one_hot(argmax(t, axis), n, axis, t.dtype());
    // the axis' size known only when run: from t's shape
    const Tensor depth = reshape(slice(shape_of(t), {axis}, {axis + 1}), {});
    return one_hot(argmax(t, axis), depth, axis, t.dtype());
  };
  if (c.version() >= 13) return {apply(x, axis_of(c, c.attr_int("axis", -1), x.rank()))};
  const int64_t axis = axis_of(c, c.attr_int("axis", 1), x.rank());
  const Shape s = static_shape(c, x);
  int64_t outer = 1;
  for (int64_t i = 0; i < axis; ++i) outer *= s[i];
  return {reshape(apply(reshape(x, {outer, -1}), 1), s)};
}

Outs lrn_op(NodeContext& c) {
  Tensor x = c.input(0);
  const int64_t size = c.required_int("size");
  const double alpha = c.attr_float("alpha", 1e-4f), beta = c.attr_float("beta", 0.75f),
               bias = c.attr_float("bias", 1.0f);
  const int64_t ch = x.dim(1);
  if (ch < 0)
    c.unsupported(
        fmt::format("needs the static channel dim of its input, which is {}", str(x.shape())));
  std::vector<int64_t> pads(2 * x.rank(), 0);
  pads[2] = (size - 1) / 2;
  pads[3] = size - 1 - pads[2];
  Tensor sq = pad(mul(x, x), pads);
  Tensor acc;
  for (int64_t i = 0; i < size; ++i) {
    Tensor part = slice(sq, {i}, {i + ch}, {}, {1});
    acc = i ? add(acc, part) : part;
  }
  Tensor denom = pow(add(mul(acc, scalar_of(x, alpha / static_cast<double>(size))), scalar_of(x, bias)),
                     scalar_of(x, beta));
  return {div(x, denom)};
}

Outs mvn_op(NodeContext& c) {
  Tensor x = c.input(0);
  Axes axes = c.attr_ints("axes", {0, 2, 3});
  Tensor m = mean(x, axes, true);
  Tensor var = sub(mean(mul(x, x), axes, true), mul(m, m));
  return {div(sub(x, m), add(sqrt(var), scalar_of(x, 1e-9)))};
}

// Negative log likelihood with ONNX's optional class weights and ignore_index.
Tensor nll_loss(NodeContext& c, const Tensor& logp, const Tensor& target, int weight_input) {
  Tensor t = cast(target, i64);
  std::optional<Tensor> valid;
  if (c.has_attr("ignore_index")) {
    valid = not_equal(t, scalar_of(t, static_cast<double>(c.attr_int("ignore_index", 0))));
    t = where(*valid, t, scalar_of(t, 0));
  }
  Tensor picked = squeeze(gather_elements(logp, expand_dims(t, {1}), 1), {1});
  Tensor w = c.has_input(weight_input) ? gather(c.input(weight_input), t, 0)
                                       : full(c.graph(), {}, 1.0, logp.dtype());
  if (valid) w = where(*valid, w, scalar_of(w, 0));
  w = broadcast_to(w, picked.shape());
  Tensor loss = neg(mul(picked, w));
  const std::string r = c.attr_string("reduction", "mean");
  if (r == "none") return loss;
  if (r == "sum") return sum(loss);
  if (r != "mean") c.fail(fmt::format("unknown reduction '{}'", r));
  return div(sum(loss), sum(w));
}

Outs nll_op(NodeContext& c) { return {nll_loss(c, c.input(0), c.input(1), 2)}; }

Outs softmax_ce_op(NodeContext& c) {
  Tensor logp = log_softmax(c.input(0), 1);
  return {nll_loss(c, logp, c.input(1), 2), logp};
}

// Dropout: the identity (and an all-true mask), or in training mode (opset 12's third input)
// with a ratio above 0, x times a mask drawn from kiln's Philox generator (scaled by
// 1 / (1 - ratio): inverted dropout), the mask output true where an element was kept. The draws
// differ from other runtimes' generators.
Outs dropout_op(NodeContext& c) {
  Tensor x = c.input(0);
  bool training = false;
  if (c.version() >= 12 && c.has_input(2)) training = c.ints(2).at(0) != 0;
  const double ratio = training ? (c.has_input(1) ? c.doubles(1).at(0) : 0.5) : 0;
  if (!(ratio >= 0 && ratio <= 1)) c.fail(fmt::format("ratio {} is outside [0, 1]", ratio));
  if (ratio == 0) {
    Outs r{x};
    if (c.has_output(1)) r.push_back(ones_shaped_like(c, x, boolean));
    return r;
  }
  if (!is_floating(x.dtype())) c.fail("training mode needs a float input");
  const Shape shape = x.shape();
  for (int64_t d : shape)
    if (d < 0) c.unsupported("training mode needs the input's static shape while importing");
  const Tensor m = ratio == 1 ? full(c.graph(), shape, 0.0, x.dtype())
                              : training_dropout_mask(c, shape, 1 - ratio, x.dtype());
  Outs r{mul(x, m)};
  if (c.has_output(1)) r.push_back(not_equal(m, scalar_of(m, 0)));
  return r;
}

// Col2Im (opset 18): input (N, C·∏block, L) holds L blocks; they are summed into an image
// (N, C, image_shape...) at their places. That is a transposed convolution, grouped by channel,
// whose weights are one-hot: block element k of channel c lands at its kernel offset.
Outs col2im_op(NodeContext& c) {
  const Tensor x = c.input(0);
  const std::vector<int64_t> image = c.ints(1), block = c.ints(2);
  const size_t nd = block.size();
  if (nd < 1 || nd > 3 || image.size() != nd)
    c.unsupported(fmt::format("{} spatial dims (1 to 3, image_shape and block_shape alike)", nd));
  auto per_dim = [&](const char* name, int64_t fallback, size_t n) {
    std::vector<int64_t> v = c.attr_ints(name);
    if (v.empty()) v.assign(n, fallback);
    if (v.size() != n) c.fail(fmt::format("{} has {} values, {} expected", name, v.size(), n));
    return v;
  };
  const std::vector<int64_t> dil = per_dim("dilations", 1, nd), stride = per_dim("strides", 1, nd);
  const std::vector<int64_t> pads = per_dim("pads", 0, 2 * nd);
  constexpr int64_t kMax = int64_t{1} << 31;  // (every value checked before any arithmetic)
  auto in_range = [&](const std::vector<int64_t>& v, const char* name, int64_t lo) {
    for (int64_t e : v)
      if (e < lo || e >= kMax) c.fail(fmt::format("{} {} is out of range", name, e));
  };
  in_range(image, "image_shape", 1);
  in_range(block, "block_shape", 1);
  in_range(dil, "dilation", 1);
  in_range(stride, "stride", 1);
  in_range(pads, "pad", 0);
  if (x.rank() != 3 || x.dim(1) < 0)
    c.fail(fmt::format("input {} is not (N, C x prod(block_shape), L)", str(x.shape())));
  int64_t k = 1;
  for (int64_t b : block)
    if ((k *= b) > x.dim(1)) break;
  if (k > x.dim(1) || x.dim(1) % k != 0)
    c.fail(fmt::format("input {} is not (N, C x prod(block_shape), L)", str(x.shape())));
  if (x.dim(1) * k > (int64_t{1} << 26))
    c.unsupported(fmt::format("blocks of {} elements over {} channels (its one-hot weights)", k,
                              x.dim(1) / k));
  const int64_t channels = x.dim(1) / k;
  std::vector<int64_t> blocks, out_pad;
  int64_t l = 1;
  for (size_t d = 0; d < nd; ++d) {
    const int64_t span = dil[d] * (block[d] - 1) + 1;
    const int64_t n = (image[d] + pads[d] + pads[d + nd] - span) / stride[d] + 1;
    if (n <= 0)
      c.fail(fmt::format("block_shape {} does not fit image_shape {}", block[d], image[d]));
    blocks.push_back(n);
    if ((l *= n) > kMax) c.fail(fmt::format("{} blocks or more", kMax));
    // what a transposed convolution gives short of the image (its stride's remainder)
    out_pad.push_back(image[d] - ((n - 1) * stride[d] - pads[d] - pads[d + nd] + span));
  }
  if (x.dim(2) >= 0 && x.dim(2) != l)
    c.fail(fmt::format("input has {} blocks; image_shape and block_shape give {}", x.dim(2), l));
  Shape ws{channels * k, 1};
  ws.insert(ws.end(), block.begin(), block.end());
  Array w = Array::zeros(ws, f64);
  for (int64_t ch = 0; ch < channels; ++ch)
    for (int64_t e = 0; e < k; ++e)  // block element e at its own offset: one-hot over the block
      w.data<double>()[(ch * k + e) * k + e] = 1.0;
  Shape xs{x.dim(0), x.dim(1)};
  xs.insert(xs.end(), blocks.begin(), blocks.end());
  ConvTransposeOptions o;
  o.stride = stride;
  o.dilation = dil;
  o.padding = pads;
  o.output_padding = out_pad;
  o.groups = channels;
  const Tensor xi = reshape(x, xs), wt = known(c, w.astype(x.dtype()));
  if (nd == 1) return {conv_transpose1d(xi, wt, std::nullopt, o)};
  if (nd == 2) return {conv_transpose2d(xi, wt, std::nullopt, o)};
  return {conv_transpose3d(xi, wt, std::nullopt, o)};
}

}  // namespace

void add_nn_ops(std::vector<OpEntry>& t) {
  t.insert(t.end(), {
                        {"MatMul", 1, matmul_op},
                        {"Gemm", 7, gemm_op},
                        {"Conv", 1, conv_op},
                        {"ConvTranspose", 1, conv_transpose_op},
                        {"Col2Im", 18, col2im_op},
                        {"MaxPool", 8, max_pool_op},
                        {"AveragePool", 7, avg_pool_op},
                        {"LpPool", 11, lp_pool_op},
                        {"GlobalAveragePool", 1, global_avg_pool_op},
                        {"GlobalMaxPool", 1, global_max_pool_op},
                        {"BatchNormalization", 7, batch_norm_op},
                        {"InstanceNormalization", 6, instance_norm_op},
                        {"LayerNormalization", 17, layer_norm_op},
                        {"GroupNormalization", 18, group_norm_op},
                        {"Softmax", 1, softmax_family<0>},
                        {"LogSoftmax", 1, softmax_family<1>},
                        {"Hardmax", 1, softmax_family<2>},
                        {"LRN", 1, lrn_op},
                        {"MeanVarianceNormalization", 9, mvn_op},
                        {"NegativeLogLikelihoodLoss", 12, nll_op},
                        {"SoftmaxCrossEntropyLoss", 12, softmax_ce_op},
                        {"Dropout", 7, dropout_op},
                    });
}

}  // namespace kiln::onnx::detail
