// MIL's neural network ops mapped onto kiln's: products, convolution, pooling, normalization,
// resizing and attention (src/io/coreml/mil.h; semantics as coremltools' op definitions, iOS15
// to iOS18). Window parameters (strides, pads, kernel sizes) must be known while importing.
#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "io/coreml/mil.h"
#include "kiln/ops/attention.h"
#include "kiln/ops/core.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/nn.h"
#include "kiln/ops/norm.h"
#include "kiln/ops/reduce.h"
#include "kiln/ops/transform.h"

namespace kiln::coreml::detail {

namespace {

// A parameter in x's dtype: from iOS17 on, weights, biases and statistics may have their own.
Tensor like(const Tensor& t, const Tensor& x) {
  return t.dtype() == x.dtype() ? t : cast(t, x.dtype());
}

std::optional<Tensor> optional_in(OpContext& c, const char* name, const Tensor& x) {
  if (!c.has(name)) return std::nullopt;
  return like(c.in(name), x);
}

// The number of spatial dims of x (N, C, spatial...), from 1 to `most`.
int spatial_dims(const OpContext& c, const Tensor& x, int most = 3) {
  const int n = x.rank() - 2;
  if (n < 1 || n > most)
    c.fail("takes x of rank 3 to {}, got shape {}", most + 2, to_string(x.shape()));
  return n;
}

// x's dim `axis`, which the mapping needs to know while importing.
int64_t static_dim(const OpContext& c, const Tensor& x, int axis, const char* why) {
  const int64_t d = x.dim(axis);
  if (d < 0)
    c.fail("{} needs x's dim {} known while importing, x has shape {}", why, axis,
           to_string(x.shape()));
  return d;
}

// A list with one value per spatial dim (strides, dilations, kernel_sizes), each positive.
std::vector<int64_t> per_dim(OpContext& c, const char* name, int n,
                             std::optional<int64_t> fallback) {
  const std::vector<int64_t> v =
      fallback ? c.ints(name, std::vector<int64_t>(n, *fallback)) : c.ints(name);
  if (static_cast<int>(v.size()) != n)
    c.fail("parameter '{}' has {} values for {} spatial dims", name, v.size(), n);
  for (int64_t e : v)
    if (e < 1) c.fail("parameter '{}' ({}) must be positive", name, fmt::join(v, ", "));
  return v;
}

// MIL's `pad` lists (begin, end) for each spatial dim in turn; kiln's lists every begin, then
// every end.
std::vector<int64_t> custom_pads(OpContext& c, int n) {
  const std::vector<int64_t> p = c.ints("pad", std::vector<int64_t>(2 * n, 0));
  if (static_cast<int>(p.size()) != 2 * n)
    c.fail("parameter 'pad' has {} values for {} spatial dims (a begin and an end each)", p.size(),
           n);
  std::vector<int64_t> r(2 * n);
  for (int i = 0; i < n; ++i) {
    r[i] = p[2 * i];
    r[n + i] = p[2 * i + 1];
  }
  for (int64_t e : r)
    if (e < 0) c.fail("parameter 'pad' ({}) must not be negative", fmt::join(p, ", "));
  return r;
}

// pad_type same and same_lower as explicit pads (begins, then ends): out = ceil(in / stride),
// the odd pixel at the end (same) or at the beginning (same_lower).
std::vector<int64_t> same_pads(const OpContext& c, const Tensor& x,
                               const std::vector<int64_t>& kernel,
                               const std::vector<int64_t>& stride, bool lower) {
  const int n = static_cast<int>(kernel.size());
  std::vector<int64_t> r(2 * n);
  for (int i = 0; i < n; ++i) {
    const int64_t in = static_dim(c, x, 2 + i, "pad_type 'same'");
    const int64_t out = (in + stride[i] - 1) / stride[i];
    const int64_t total = std::max<int64_t>(0, (out - 1) * stride[i] + kernel[i] - in);
    r[i] = lower ? total - total / 2 : total / 2;
    r[n + i] = total - r[i];
  }
  return r;
}

// y, once its shape matches the output's declared one (where both are known): a window or
// resize whose sizes would differ from Core ML's fails instead of computing other values.
Tensor declared(const OpContext& c, const Tensor& y) {
  const Shape want = c.out_shape(), got = y.shape();
  bool same = want.size() == got.size();
  for (size_t i = 0; same && i < want.size(); ++i)
    same = want[i] < 0 || got[i] < 0 || want[i] == got[i];
  if (!same)
    c.fail("gives shape {} where the program declares {}", to_string(got), to_string(want));
  return y;
}

// avg_pool, max_pool and l2_pool's windows; `kiln_pads`: the pads go to kiln's pooling, which
// takes at most half the kernel on a side.
PoolOptions pool_options(OpContext& c, const Tensor& x, bool kiln_pads = true) {
  const int n = spatial_dims(c, x);
  PoolOptions o;
  o.kernel = per_dim(c, "kernel_sizes", n, std::nullopt);
  o.stride = per_dim(c, "strides", n, 1);
  o.ceil_mode = c.flag("ceil_mode", false);
  const std::string type = c.text("pad_type", "valid");
  if (type == "valid") o.padding.assign(2 * n, 0);
  else if (type == "custom") o.padding = custom_pads(c, n);
  else if (type == "same" || type == "same_lower")
    o.padding = same_pads(c, x, o.kernel, o.stride, type == "same_lower");
  else c.fail("unknown pad_type '{}'", type);
  for (int i = 0; kiln_pads && i < n; ++i)
    if (2 * std::max(o.padding[i], o.padding[n + i]) > o.kernel[i])
      c.fail("parameter 'pad' ({} before, {} after spatial dim {}) exceeds half the kernel ({})",
             o.padding[i], o.padding[n + i], i, o.kernel[i]);
  return o;
}

// MIL's pooled size of one spatial dim (coremltools' spatial_dimensions_out_shape).
int64_t pooled_size(int64_t in, int64_t k, int64_t s, int64_t pads, bool ceil_mode) {
  if (!ceil_mode) return (in + pads - k) / s + 1;
  int64_t out = (in + pads - k + s - 1) / s + 1;
  // the last window starts inside the input or its begin pad
  if (pads > 0 && 2 * (out - 1) * s >= 2 * in + pads) --out;
  return out;
}

// l2_pool: sqrt of the sum of squares over each window, the sums as averages over windows that
// never reach past zeros padded on explicitly (so every divisor is the kernel's size).
Tensor l2_pool(OpContext& c, const Tensor& x) {
  const PoolOptions o = pool_options(c, x, false);
  const int n = static_cast<int>(o.kernel.size());
  std::vector<int64_t> pads(2 * x.rank(), 0);
  int64_t window = 1;
  for (int i = 0; i < n; ++i) {
    const int64_t in = static_dim(c, x, 2 + i, "l2_pool");
    const int64_t begin = o.padding[i], pads_sum = begin + o.padding[n + i];
    const int64_t out = pooled_size(in, o.kernel[i], o.stride[i], pads_sum, o.ceil_mode);
    if (out < 1) c.fail("has no window along spatial dim {} (size {})", i, in);
    pads[2 * (2 + i)] = begin;
    // up to the last window's end; a negative pad drops what no window reads
    pads[2 * (2 + i) + 1] = (out - 1) * o.stride[i] + o.kernel[i] - in - begin;
    window *= o.kernel[i];
  }
  PoolOptions plain;
  plain.kernel = o.kernel;
  plain.stride = o.stride;
  plain.count_include_pad = true;
  const Tensor sums = mul(avg_pool(pad(mul(x, x), pads), plain), scalar_like(x, window));
  return sqrt(sums);
}

// x with its last two dims swapped.
Tensor swap_last(const Tensor& x) {
  std::vector<int64_t> perm(x.rank());
  for (int i = 0; i < x.rank(); ++i) perm[i] = i;
  std::swap(perm[x.rank() - 1], perm[x.rank() - 2]);
  return transpose(x, perm);
}

// conv_transpose: pads and output padding for pad_type same (out = in * stride, the odd pixel
// cropped at the end) and for an output_shape (the sizes past the natural output added at the
// end, as TensorFlow's conv2d_transpose).
void transpose_sizes(OpContext& c, const Tensor& x, const Tensor& w, const std::string& type,
                     ConvTransposeOptions& o) {
  const int n = x.rank() - 2;
  std::vector<int64_t> target;
  if (c.has("output_shape")) {
    target = c.ints("output_shape");
    if (static_cast<int>(target.size()) == n + 2) target.erase(target.begin(), target.begin() + 2);
    if (static_cast<int>(target.size()) != n)
      c.fail("parameter 'output_shape' has {} values for {} spatial dims", target.size(), n);
  } else if (type != "same") {
    return;  // the natural output: (in - 1) * stride + dilated kernel - pads
  }
  o.output_padding.assign(n, 0);
  for (int i = 0; i < n; ++i) {
    const int64_t in = static_dim(c, x, 2 + i, "conv_transpose's pad_type 'same' or output_shape");
    const int64_t k = static_dim(c, w, 2 + i, "conv_transpose's pad_type 'same' or output_shape");
    const int64_t full = (in - 1) * o.stride[i] + (k - 1) * o.dilation[i] + 1;
    const int64_t want = target.empty() ? in * o.stride[i] : target[i];
    if (type == "same") {
      const int64_t total = std::max<int64_t>(0, full - want);
      o.padding[i] = total / 2;
      o.padding[n + i] = total - total / 2;
    }
    const int64_t extra = want - (full - o.padding[i] - o.padding[n + i]);
    if (extra < 0 || extra >= std::max(o.stride[i], o.dilation[i]))
      c.fail(
          "parameter 'output_shape' asks for size {} along spatial dim {}, which pad_type '{}' "
          "cannot give (its natural size is {}; at most {} more can be added)",
          want, i, type, full - o.padding[i] - o.padding[n + i],
          std::max(o.stride[i], o.dilation[i]) - 1);
    o.output_padding[i] = extra;
  }
}

// x resized over its last two dims to (h, w); its other dims stay, known or not.
Tensor resize_hw(OpContext& c, const Tensor& x, int64_t h, int64_t w, const ResizeOptions& o) {
  const int r = x.rank();
  Shape sizes = x.shape();
  sizes[r - 2] = h;
  sizes[r - 1] = w;
  if (is_static(sizes)) return declared(c, resize(x, sizes, o));
  const Tensor lead = slice(shape_of(x), {0}, {r - 2});
  const Tensor hw = constant(c.graph(), Array::from_vector<int64_t>({h, w}, {2}));
  return declared(c, resize_to(x, concat({lead, hw}), o));
}

// resize_bilinear's sampling grid (coremltools' definition): `out` points along a dim of `in`,
// clamped to [0, in - 1].
std::vector<double> sampling_grid(const OpContext& c, const std::string& mode, int64_t in,
                                  int64_t out) {
  std::vector<double> g(out);
  for (int64_t i = 0; i < out; ++i) {
    double p = 0;
    if (mode == "STRICT_ALIGN_CORNERS" || mode == "ALIGN_CORNERS") {
      if (out > 1) p = i * static_cast<double>(in - 1) / static_cast<double>(out - 1);
      else if (mode == "ALIGN_CORNERS") p = (in - 1) / 2.0;
    } else if (mode == "DEFAULT") {
      p = i * static_cast<double>(in) / static_cast<double>(out);
    } else if (mode == "OFFSET_CORNERS") {
      const double delta = static_cast<double>(std::max<int64_t>(1, in - 1)) / out;
      p = 0.5 * delta + i * delta;
    } else if (mode == "UNALIGN_CORNERS") {
      const double spacing = static_cast<double>(in) / out;
      p = i * spacing + 0.5 * spacing - 0.5;
    } else {
      c.fail("unknown sampling_mode '{}'", mode);
    }
    g[i] = std::min(static_cast<double>(in - 1), std::max(0.0, p));
  }
  return g;
}

// x interpolated linearly along `axis` (not negative) at the coordinates `pts`, in [0, n - 1].
Tensor lerp_axis(Graph& g, const Tensor& x, int axis, const std::vector<double>& pts) {
  const int64_t n = static_cast<int64_t>(pts.size()), in = x.dim(axis);
  std::vector<int64_t> lo(n), hi(n);
  std::vector<double> frac(n);
  for (int64_t i = 0; i < n; ++i) {
    lo[i] = static_cast<int64_t>(std::floor(pts[i]));
    hi[i] = std::min(lo[i] + 1, in - 1);
    frac[i] = pts[i] - static_cast<double>(lo[i]);
  }
  Shape fs(x.rank() - axis, 1);  // broadcasts over the dims after `axis`
  fs[0] = n;
  const Tensor f = constant(g, Array::from_vector(frac, fs).astype(x.dtype()));
  const Tensor a = gather(x, constant(g, Array::from_vector(lo, {n})), axis);
  const Tensor b = gather(x, constant(g, Array::from_vector(hi, {n})), axis);
  return add(a, mul(sub(b, a), f));
}

// einsum's equation as MIL reads it: each letter numbered by its first appearance.
std::vector<std::vector<int>> einsum_labels(const OpContext& c, const std::string& eq) {
  std::string s;
  for (char ch : eq)
    if (ch != ' ') s += ch;
  const size_t arrow = s.find("->");
  const size_t comma = s.find(',');
  if (arrow == std::string::npos || comma == std::string::npos || comma > arrow ||
      s.find(',', comma + 1) < arrow)
    c.fail("equation '{}' is not of the form 'x,y->z'", eq);
  std::vector<std::string> parts = {s.substr(0, comma), s.substr(comma + 1, arrow - comma - 1),
                                    s.substr(arrow + 2)};
  std::vector<std::vector<int>> r;
  std::string seen;
  for (const std::string& p : parts) {
    r.emplace_back();
    for (char ch : p) {
      if (seen.find(ch) == std::string::npos) seen += ch;
      r.back().push_back(static_cast<int>(seen.find(ch)));
    }
  }
  return r;
}

}  // namespace

void add_nn_ops(OpTable& t) {
  // x · weightᵀ + bias, weight (D_out, D_in) as kiln's linear
  t["linear"] = [](OpContext& c) {
    const Tensor x = c.in("x");
    c.set(0, linear(x, like(c.in("weight"), x), optional_in(c, "bias", x)));
  };
  t["matmul"] = [](OpContext& c) {
    // numpy's matmul after the optional transposes (which leave a 1-d y as it is); from iOS17
    // a const operand may have another dtype than the result's
    const DType dt = c.out_dtype();
    Tensor x = c.in("x"), y = c.in("y");
    if (x.dtype() != dt) x = cast(x, dt);
    if (y.dtype() != dt) y = cast(y, dt);
    if (c.flag("transpose_x", false)) {
      if (x.rank() < 2) c.fail("transpose_x needs x of rank 2 or more, got rank {}", x.rank());
      x = swap_last(x);
    }
    if (c.flag("transpose_y", false) && y.rank() >= 2) y = swap_last(y);
    c.set(0, matmul(x, y));
  };
  t["einsum"] = [](OpContext& c) {
    // the two forms MIL defines, "nchw,nwhu->nchu" and "chw,whu->chu" (letters renamed
    // freely): a matmul over dims -3 and -1 with the others batch (size 1 broadcasts)
    const std::string eq = c.text("equation");
    const auto labels = einsum_labels(c, eq);
    const std::vector<Tensor> v = c.ins("values");
    if (v.size() != 2) c.fail("takes 2 values, got {}", v.size());
    std::vector<int64_t> perm;
    if (labels == std::vector<std::vector<int>>{{0, 1, 2, 3}, {0, 3, 2, 4}, {0, 1, 2, 4}})
      perm = {0, 2, 1, 3};
    else if (labels == std::vector<std::vector<int>>{{0, 1, 2}, {2, 1, 3}, {0, 1, 3}})
      perm = {1, 0, 2};
    else c.fail("equation '{}' is not one of MIL's forms 'nchw,nwhu->nchu' and 'chw,whu->chu'", eq);
    for (const Tensor& e : v)
      if (e.rank() != static_cast<int>(perm.size()))
        c.fail("equation '{}' takes operands of rank {}, got shape {}", eq, perm.size(),
               to_string(e.shape()));
    const Tensor y = like(v[1], v[0]);
    c.set(0, transpose(matmul(transpose(v[0], perm), transpose(y, perm)), perm));
  };

  t["conv"] = [](OpContext& c) {
    const Tensor x = c.in("x");
    const int n = spatial_dims(c, x);
    ConvOptions o;
    o.stride = per_dim(c, "strides", n, 1);
    o.dilation = per_dim(c, "dilations", n, 1);
    o.groups = c.int_of("groups", 1);
    const std::string type = c.text("pad_type", "valid");
    if (type == "valid") o.pad_mode = PadMode::valid;
    else if (type == "same") o.pad_mode = PadMode::same_upper;  // the odd pixel at the end
    else if (type == "same_lower") o.pad_mode = PadMode::same_lower;
    else if (type == "custom") o.padding = custom_pads(c, n);
    else c.fail("unknown pad_type '{}'", type);
    const Tensor w = like(c.in("weight"), x);
    const auto b = optional_in(c, "bias", x);
    const Tensor y = n == 1 ? conv1d(x, w, b, o) : n == 2 ? conv2d(x, w, b, o) : conv3d(x, w, b, o);
    c.set(0, declared(c, y));
  };
  t["conv_transpose"] = [](OpContext& c) {
    // weight (C_in, C_out / groups, kernel...), as PyTorch's ConvTranspose
    const Tensor x = c.in("x");
    const int n = spatial_dims(c, x);
    const Tensor w = like(c.in("weight"), x);
    ConvTransposeOptions o;
    o.stride = per_dim(c, "strides", n, 1);
    o.dilation = per_dim(c, "dilations", n, 1);
    o.groups = c.int_of("groups", 1);
    const std::string type = c.text("pad_type", "valid");
    if (type == "custom") o.padding = custom_pads(c, n);
    else if (type == "valid" || type == "same") o.padding.assign(2 * n, 0);
    else c.fail("unknown pad_type '{}' (conv_transpose takes valid, same and custom)", type);
    transpose_sizes(c, x, w, type, o);
    const auto b = optional_in(c, "bias", x);
    const Tensor y = n == 1   ? conv_transpose1d(x, w, b, o)
                     : n == 2 ? conv_transpose2d(x, w, b, o)
                              : conv_transpose3d(x, w, b, o);
    c.set(0, declared(c, y));
  };

  t["max_pool"] = [](OpContext& c) {
    const Tensor x = c.in("x");
    c.set(0, declared(c, max_pool(x, pool_options(c, x))));
  };
  t["avg_pool"] = [](OpContext& c) {
    const Tensor x = c.in("x");
    PoolOptions o = pool_options(c, x);
    o.count_include_pad = !c.flag("exclude_padding_from_average", false);
    c.set(0, declared(c, avg_pool(x, o)));
  };
  t["l2_pool"] = [](OpContext& c) {
    const Tensor x = c.in("x");
    c.set(0, declared(c, l2_pool(c, x)));
  };

  t["batch_norm"] = [](OpContext& c) {
    const Tensor x = c.in("x");
    c.set(0, batch_norm(x, like(c.in("mean"), x), like(c.in("variance"), x),
                        optional_in(c, "gamma", x), optional_in(c, "beta", x),
                        c.number("epsilon", 1e-5)));
  };
  t["instance_norm"] = [](OpContext& c) {
    const Tensor x = c.in("x");
    c.set(0, instance_norm(x, optional_in(c, "gamma", x), optional_in(c, "beta", x),
                           c.number("epsilon", 1e-5)));
  };
  t["layer_norm"] = [](OpContext& c) {
    // over `axes` (absent: every dim); gamma and beta have those dims' sizes, in dim order
    const Tensor x = c.in("x");
    const int r = x.rank();
    Axes axes;
    if (c.has("axes")) {
      for (int64_t a : c.ints("axes")) axes.push_back(axis_of(c, a, r));
    } else {
      for (int a = 0; a < r; ++a) axes.push_back(a);
    }
    std::sort(axes.begin(), axes.end());
    if (axes.empty()) c.fail("parameter 'axes' is empty");
    if (std::adjacent_find(axes.begin(), axes.end()) != axes.end())
      c.fail("parameter 'axes' names a dim twice");
    const auto gamma = optional_in(c, "gamma", x), beta = optional_in(c, "beta", x);
    const double eps = c.number("epsilon", 1e-5);
    const int64_t k = static_cast<int64_t>(axes.size());
    if (axes.front() == r - k) {  // trailing dims: kiln's layer_norm
      c.set(0, layer_norm(x, gamma, beta, r - k, eps));
      return;
    }
    const Tensor d = sub(x, mean(x, axes, true));
    Tensor y = mul(d, rsqrt(add(mean(mul(d, d), axes, true), scalar_like(x, eps))));
    // gamma and beta onto x's rank, their dims at `axes`
    auto placed = [&](const Tensor& p, const char* name) {
      if (p.rank() != k)
        c.fail("parameter '{}' has shape {} for {} normalized dims", name, to_string(p.shape()), k);
      Shape s(r, 1);
      for (int64_t i = 0; i < k; ++i) s[axes[i]] = p.dim(static_cast<int>(i));
      return reshape(p, s);
    };
    if (gamma) y = mul(y, placed(*gamma, "gamma"));
    if (beta) y = add(y, placed(*beta, "beta"));
    c.set(0, y);
  };
  t["l2_norm"] = [](OpContext& c) {
    // x / sqrt(sum(x²) + epsilon) over the last three dims; the leading dims are batch
    const Tensor x = c.in("x");
    const int r = x.rank();
    if (r < 3) c.fail("takes x of rank 3 or more, got shape {}", to_string(x.shape()));
    const Tensor ss = sum(mul(x, x), {r - 3, r - 2, r - 1}, true);
    c.set(0, mul(x, rsqrt(add(ss, scalar_like(x, c.number("epsilon", 1e-6))))));
  };
  t["local_response_norm"] = [](OpContext& c) {
    // x / (k + alpha / size * sum of x² over `size` channels)^beta; the window of channel i is
    // [i - size / 2, i + (size - 1) / 2] (PyTorch's LocalResponseNorm), summed as an average
    // pool over (N, 1, C, spatial...)
    const Tensor x = c.in("x");
    const int64_t size = c.int_of("size");
    if (size < 1) c.fail("parameter 'size' ({}) must be positive", size);
    const double alpha = c.number("alpha", 1e-4), beta = c.number("beta", 0.75);
    const double k = c.number("k", 1.0);
    if (x.rank() < 3) c.fail("takes x of rank 3 or more, got shape {}", to_string(x.shape()));
    Tensor sq = mul(x, x);
    if (x.rank() > 4) {  // the spatial dims as one
      const int64_t n = static_dim(c, x, 0, "local_response_norm of rank 5 or more");
      sq = reshape(sq, {n, static_dim(c, x, 1, "local_response_norm of rank 5 or more"), -1});
    }
    PoolOptions o;
    const int dims = sq.rank() - 1;  // C and the spatial dims
    o.kernel.assign(dims, 1);
    o.kernel[0] = size;
    o.stride.assign(dims, 1);
    o.padding.assign(2 * dims, 0);
    o.padding[0] = size / 2;
    o.padding[dims] = (size - 1) / 2;
    o.count_include_pad = true;
    Tensor avg = squeeze(avg_pool(expand_dims(sq, {1}), o), {1});
    if (x.rank() > 4) avg = reshape_to(avg, shape_of(x));
    const Tensor base = add(mul(avg, scalar_like(x, alpha)), scalar_like(x, k));
    c.set(0, div(x, pow(base, scalar_like(x, beta))));
  };

  t["upsample_nearest_neighbor"] = [](OpContext& c) {
    // output index i reads floor(i / scale) (as PyTorch's nearest upsampling)
    const Tensor x = c.in("x");
    const int r = x.rank();
    if (r < 3) c.fail("takes x of rank 3 or more, got shape {}", to_string(x.shape()));
    const double sh = c.number("scale_factor_height", 1), sw = c.number("scale_factor_width", 1);
    if (sh <= 0 || sw <= 0) c.fail("scale factors ({}, {}) must be positive", sh, sw);
    ResizeOptions o;
    o.mode = ResizeMode::nearest;
    o.coordinate_transformation_mode = ResizeCoordinates::asymmetric;
    o.nearest_mode = NearestMode::floor;
    o.scales.assign(r, 1.0);
    o.scales[r - 2] = sh;
    o.scales[r - 1] = sw;
    const auto h =
        static_cast<int64_t>(std::floor(sh * static_dim(c, x, r - 2, "upsample_nearest_neighbor")));
    const auto w =
        static_cast<int64_t>(std::floor(sw * static_dim(c, x, r - 1, "upsample_nearest_neighbor")));
    c.set(0, resize_hw(c, x, h, w, o));
  };
  t["upsample_bilinear"] = [](OpContext& c) {
    // align_corners samples i * (in - 1) / (out - 1); half_pixel_centers (iOS16, default: not
    // align_corners) samples (i + 0.5) * in / out - 0.5; neither samples i * in / out
    const Tensor x = c.in("x");
    const int r = x.rank();
    if (r < 3) c.fail("takes x of rank 3 or more, got shape {}", to_string(x.shape()));
    const double sh = c.number("scale_factor_height", 1), sw = c.number("scale_factor_width", 1);
    if (sh <= 0 || sw <= 0) c.fail("scale factors ({}, {}) must be positive", sh, sw);
    const bool align = c.flag("align_corners", true);
    const bool half = c.flag("half_pixel_centers", !align);
    if (align && half) c.fail("align_corners and half_pixel_centers are both true");
    ResizeOptions o;
    o.mode = ResizeMode::linear;
    o.coordinate_transformation_mode = align  ? ResizeCoordinates::align_corners
                                       : half ? ResizeCoordinates::half_pixel
                                              : ResizeCoordinates::asymmetric;
    const auto h =
        static_cast<int64_t>(std::floor(sh * static_dim(c, x, r - 2, "upsample_bilinear")));
    const auto w =
        static_cast<int64_t>(std::floor(sw * static_dim(c, x, r - 1, "upsample_bilinear")));
    c.set(0, resize_hw(c, x, h, w, o));
  };
  t["resize_nearest_neighbor"] = [](OpContext& c) {
    // output index i reads floor((i + 0.5) * in / out) (TensorFlow's half_pixel_centers, which
    // coremltools maps here)
    const Tensor x = c.in("x");
    if (x.rank() < 3) c.fail("takes x of rank 3 or more, got shape {}", to_string(x.shape()));
    ResizeOptions o;
    o.mode = ResizeMode::nearest;
    o.coordinate_transformation_mode = ResizeCoordinates::half_pixel;
    o.nearest_mode = NearestMode::round_prefer_ceil;
    c.set(0, resize_hw(c, x, c.int_of("target_size_height"), c.int_of("target_size_width"), o));
  };
  t["resize_bilinear"] = [](OpContext& c) {
    // each of the last two dims interpolated at its sampling_mode's grid
    const Tensor x = c.in("x");
    const int r = x.rank();
    if (r < 3) c.fail("takes x of rank 3 or more, got shape {}", to_string(x.shape()));
    const std::string mode = c.text("sampling_mode", "DEFAULT");
    const int64_t h = c.int_of("target_size_height", 1), w = c.int_of("target_size_width", 1);
    if (h < 1 || w < 1) c.fail("target size ({}, {}) must be positive", h, w);
    const int64_t in_h = static_dim(c, x, r - 2, "resize_bilinear");
    const int64_t in_w = static_dim(c, x, r - 1, "resize_bilinear");
    Tensor y = lerp_axis(c.graph(), x, r - 2, sampling_grid(c, mode, in_h, h));
    y = lerp_axis(c.graph(), y, r - 1, sampling_grid(c, mode, in_w, w));
    c.set(0, declared(c, y));
  };

  t["resample"] = [](OpContext& c) {
    // x (B, C, H, W) sampled at coordinates (B, H', W', 2) of (w, h) pairs: kiln's grid_sample,
    // whose conventions are PyTorch's (as coremltools' grid_sampler conversion assumes)
    const Tensor x = c.in("x");
    if (x.rank() != 4) c.fail("takes x of rank 4, got shape {}", to_string(x.shape()));
    Tensor g = like(c.in("coordinates"), x);
    GridSampleOptions o;
    o.align_corners = c.flag("align_corners", false);
    const std::string mode = c.text("sampling_mode");
    if (mode == "bilinear") o.mode = GridSampleMode::linear;
    else if (mode == "nearest") o.mode = GridSampleMode::nearest;
    else c.fail("unknown sampling_mode '{}'", mode);
    const std::string coords = c.text("coordinates_mode");
    if (coords == "normalized_zero_to_one") {
      g = sub(mul(g, scalar_like(g, 2)), scalar_like(g, 1));
    } else if (coords == "unnormalized") {
      // [0, size - 1] spans the corner pixels' centres: the align_corners reading only
      if (!o.align_corners)
        c.fail("coordinates_mode 'unnormalized' is supported with align_corners true only");
      const int64_t h = static_dim(c, x, 2, "coordinates_mode 'unnormalized'");
      const int64_t w = static_dim(c, x, 3, "coordinates_mode 'unnormalized'");
      const std::vector<double> scale = {w > 1 ? 2.0 / (w - 1) : 0.0, h > 1 ? 2.0 / (h - 1) : 0.0};
      const std::vector<double> shift = {w > 1 ? -1.0 : 0.0, h > 1 ? -1.0 : 0.0};
      g = add(mul(g, constant(c.graph(), Array::from_vector(scale, {2}).astype(g.dtype()))),
              constant(c.graph(), Array::from_vector(shift, {2}).astype(g.dtype())));
    } else if (coords != "normalized_minus_one_to_one") {
      c.fail("unknown coordinates_mode '{}'", coords);
    }
    const std::string pad_mode = c.text("padding_mode");
    double value = 0;
    if (pad_mode == "constant") {
      o.padding_mode = GridSamplePadding::zeros;
      value = c.number("padding_value", 0);
    } else if (pad_mode == "border") {
      o.padding_mode = GridSamplePadding::border;
    } else if ((pad_mode == "reflection" && o.align_corners) ||
               (pad_mode == "symmetric" && !o.align_corners)) {
      // PyTorch's reflection mirrors about the corner pixels' centres with align_corners (the
      // edge not repeated: MIL's reflection), about the image's edges without (MIL's symmetric)
      o.padding_mode = GridSamplePadding::reflection;
    } else if (pad_mode == "reflection" || pad_mode == "symmetric") {
      c.fail("padding_mode '{}' is supported with align_corners {} only", pad_mode,
             pad_mode == "reflection" ? "true" : "false");
    } else {
      c.fail("unknown padding_mode '{}'", pad_mode);
    }
    if (value == 0) {
      c.set(0, grid_sample(x, g, o));
      return;
    }
    // a constant pad: the taps outside weigh in as zeros, so sample x - value and add it back
    const Tensor v = scalar_like(x, value);
    c.set(0, add(grid_sample(sub(x, v), g, o), v));
  };

  t["scaled_dot_product_attention"] = [](OpContext& c) {
    // softmax(q kᵀ / sqrt(E) + mask) v; a bool mask keeps the keys where true
    const Tensor q = c.in("query");
    std::optional<Tensor> mask;
    if (c.has("attn_mask")) {
      const Tensor m = c.in("attn_mask");
      mask = m.dtype() == boolean ? m : like(m, q);
    }
    c.set(0, scaled_dot_product_attention(q, like(c.in("key"), q), like(c.in("value"), q), mask));
  };
}

}  // namespace kiln::coreml::detail
