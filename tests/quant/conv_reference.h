// quantized_conv problems, random data and a float64 reference of the op's definition, shared by
// tests/ops/test_quant_conv.cpp (the op) and tests/quant/test_quant_conv_fuse.cpp (the pass).
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "kiln/ops/quant.h"
#include "support/reference.h"

namespace kiln::test {

struct ConvProblem {
  Shape x;  // (N, C, H, W)
  int64_t o, kh, kw;
  std::vector<int64_t> stride, pads, dilation;  // 2, 4 (begins then ends), 2
  int64_t groups;
  DType xt, wt, yt;
  bool per_channel, bias, residual, relu;
  bool w_zero = false;  // weight zero points 0 (oneDNN's path on the CPU)
  bool x_zero = false;  // input zero point 0
  int gelu = 0;         // 1: gelu after the additions (instead of relu), 2: its tanh form
};

inline std::string describe(const ConvProblem& p) {
  return fmt::format(
      "x {} o {} k {}x{} stride {} pads {} dilation {} groups {} {}x{}->{} per_channel {} bias {} "
      "residual {} relu {} w_zero {} x_zero {} gelu {}",
      to_string(p.x), p.o, p.kh, p.kw, fmt::join(p.stride, ","), fmt::join(p.pads, ","),
      fmt::join(p.dilation, ","), p.groups, name(p.xt), name(p.wt), name(p.yt), p.per_channel,
      p.bias, p.residual, p.relu, p.w_zero, p.x_zero, p.gelu);
}

inline Shape out_shape(const ConvProblem& p) {
  const int64_t span_h = p.x[2] + p.pads[0] + p.pads[2] - (p.kh - 1) * p.dilation[0] - 1,
                span_w = p.x[3] + p.pads[1] + p.pads[3] - (p.kw - 1) * p.dilation[1] - 1;
  const int64_t oh = span_h / p.stride[0] + 1, ow = span_w / p.stride[1] + 1;
  return {p.x[0], p.o, oh, ow};
}

inline Shape weight_shape(const ConvProblem& p) { return {p.o, p.x[1] / p.groups, p.kh, p.kw}; }

inline ConvOptions conv_options(const ConvProblem& p) {
  ConvOptions o;
  o.stride = p.stride;
  o.padding = p.pads;
  o.dilation = p.dilation;
  o.groups = p.groups;
  return o;
}

struct ConvData {
  Array x, w, sx, zx, sw, zw, sy, zy, bias, res;
};

inline ConvData random_conv_data(const ConvProblem& p) {
  ConvData d;
  auto ints = [](const Shape& s, DType t) {
    return t == u8 ? random_ints(s, 0, 255, u8) : random_ints(s, -128, 127, i8);
  };
  auto zero = [](const Shape& s, DType t, bool none) {
    if (none) return t == u8 ? random_ints(s, 0, 0, u8) : random_ints(s, 0, 0, i8);
    return t == u8 ? random_ints(s, 100, 150, u8) : random_ints(s, -10, 10, i8);
  };
  const int64_t k = p.x[1] / p.groups * p.kh * p.kw;
  d.x = ints(p.x, p.xt);
  d.w = ints(weight_shape(p), p.wt);
  const Shape ws = p.per_channel ? Shape{p.o} : Shape{};
  d.sx = random_array({}, f32, 0.01, 0.03);
  d.zx = zero({}, p.xt, p.x_zero);
  d.sw = random_array(ws, f32, 0.002, 0.01);
  d.zw = zero(ws, p.wt, p.w_zero);
  // about one standard deviation of a window's sum at the scales drawn (their product varies
  // 15x, so a fixed estimate could leave outputs a few LSB wide); the output scale puts it at
  // 30-50 LSB
  const auto sw = to_f64(d.sw);
  const double sw_mean = std::accumulate(sw.begin(), sw.end(), 0.0) / static_cast<double>(sw.size());
  const double spread = to_f64(d.sx)[0] * sw_mean * 74 * 74 * std::sqrt(static_cast<double>(k));
  d.sy = random_array({}, f32, spread / 50, spread / 30);
  d.zy = zero({}, p.yt, false);
  d.bias = random_array({p.o}, f32, -spread, spread);
  d.res = random_array(out_shape(p), f32, -spread, spread);
  return d;
}

// quantize(act(conv(dequantize(x), dequantize(w)) + bias + residual)) in float64 loops, the
// dequantized values taken from the definition ((q - zp) * scale; padding reads the real 0).
inline std::vector<double> conv_reference(const ConvProblem& p, const ConvData& d) {
  const Shape os = out_shape(p);
  const auto x = to_f64(d.x), w = to_f64(d.w), sw = to_f64(d.sw), zw = to_f64(d.zw);
  const auto bias = to_f64(d.bias), res = to_f64(d.res);
  const double sx = to_f64(d.sx)[0], zx = to_f64(d.zx)[0], sy = to_f64(d.sy)[0],
               zy = to_f64(d.zy)[0];
  const int64_t N = p.x[0], C = p.x[1], H = p.x[2], W = p.x[3], cg = C / p.groups,
                og = p.o / p.groups;
  std::vector<double> out;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < p.o; ++o) {
      const size_t c = p.per_channel ? static_cast<size_t>(o) : 0;
      for (int64_t oh = 0; oh < os[2]; ++oh)
        for (int64_t ow = 0; ow < os[3]; ++ow) {
          double acc = 0;
          for (int64_t ci = 0; ci < cg; ++ci)
            for (int64_t i = 0; i < p.kh; ++i)
              for (int64_t j = 0; j < p.kw; ++j) {
                const int64_t ih = oh * p.stride[0] - p.pads[0] + i * p.dilation[0];
                const int64_t iw = ow * p.stride[1] - p.pads[1] + j * p.dilation[1];
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                const int64_t ch = (o / og) * cg + ci;
                const double xv = x[((n * C + ch) * H + ih) * W + iw] - zx;
                const double wv = w[((o * cg + ci) * p.kh + i) * p.kw + j] - zw[c];
                acc += xv * wv;
              }
          double v = acc * sx * sw[c];
          if (p.bias) v += bias[o];
          if (p.residual) v += res[((n * p.o + o) * os[2] + oh) * os[3] + ow];
          out.push_back(requantized(v, p.relu, p.gelu, sy, zy, p.yt));
        }
    }
  return out;
}

// y within `lsb` of ref everywhere (few off by one), and ref not saturated or constant.
inline void expect_conv_within_lsb(const Array& y, const std::vector<double>& ref, int lsb) {
  const auto v = to_f64(y);
  ASSERT_EQ(v.size(), ref.size());
  int off = 0, bad = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    const double e = std::abs(v[i] - ref[i]);
    off += e > 0;
    if (e > lsb && bad++ < 5) ADD_FAILURE() << "element " << i << ": " << v[i] << " vs " << ref[i];
  }
  double lo = 1e9, hi = -1e9;
  for (double r : ref) lo = std::min(lo, r), hi = std::max(hi, r);
  // (small problems with relu may cover fewer levels; none may be constant or saturated)
  if (ref.size() >= 20)
    EXPECT_GT(hi - lo, ref.size() >= 200 ? 20 : 8) << "outputs span too little of the range";
  if (lsb > 0) EXPECT_LE(off, static_cast<int>(v.size()) / 10 + 1) << "too many 1-LSB differences";
}

// Shapes, strides, padding (asymmetric too), dilation, groups (depthwise too), u8 and i8 data,
// per-tensor and per-channel weights, with and without bias, residual and relu; the last ones
// large enough for the CPU's oneDNN path (where the CPU has VNNI) and CUDA's int8 GEMM.
// clang-format off
inline std::vector<ConvProblem> conv_problems() {
  return {
      {{1, 3, 7, 7}, 4, 3, 3, {1, 1}, {1, 1, 1, 1}, {1, 1}, 1, u8, i8, u8, true, true, true, true},
      {{2, 4, 9, 8}, 6, 3, 2, {2, 1}, {0, 1, 2, 0}, {1, 2}, 2, i8, i8, i8, false, true, false,
       false},
      {{1, 6, 10, 10}, 6, 3, 3, {2, 2}, {1, 1, 1, 1}, {1, 1}, 6, u8, i8, i8, true, false, true,
       true},
      {{2, 3, 5, 6}, 5, 1, 1, {1, 1}, {0, 0, 0, 0}, {1, 1}, 1, u8, u8, u8, true, true, false,
       false},
      {{1, 2, 6, 5}, 3, 2, 3, {1, 2}, {2, 0, 0, 1}, {2, 1}, 1, i8, u8, i8, false, false, false,
       true},
      // oneDNN's path: x padded with its zero point, per-channel and per-tensor, groups
      {{2, 8, 12, 12}, 16, 3, 3, {1, 1}, {1, 1, 1, 1}, {1, 1}, 1, u8, i8, u8, true, true, true,
       true, true},
      {{2, 8, 15, 17}, 8, 3, 3, {2, 2}, {1, 0, 2, 1}, {1, 1}, 2, i8, i8, i8, false, true, false,
       false, true},
      {{1, 16, 16, 16}, 16, 3, 3, {1, 1}, {1, 1, 1, 1}, {1, 1}, 16, u8, i8, i8, true, false, true,
       true, true},
      {{1, 8, 14, 14}, 8, 3, 3, {1, 1}, {2, 2, 2, 2}, {2, 2}, 1, u8, i8, u8, true, true, false,
       false, true, true},
      {{2, 16, 8, 8}, 24, 1, 1, {1, 1}, {0, 0, 0, 0}, {1, 1}, 1, i8, i8, u8, true, false, true,
       true, true},
      // a window of 3 channels (K = 27, not a multiple of 4: CUDA pads NHWC rows to 32)
      {{2, 3, 24, 24}, 16, 3, 3, {1, 1}, {1, 1, 1, 1}, {1, 1}, 1, u8, i8, u8, true, true, true,
       true, true},
      // GELU after the additions, exact and tanh-approximated, on the exact paths and oneDNN's
      {{1, 4, 8, 8}, 6, 3, 3, {1, 1}, {1, 1, 1, 1}, {1, 1}, 1, u8, i8, u8, true, true, true,
       false, false, false, 1},
      {{2, 8, 12, 12}, 16, 3, 3, {1, 1}, {1, 1, 1, 1}, {1, 1}, 1, u8, i8, u8, true, true, true,
       false, true, false, 1},
      {{2, 16, 8, 8}, 24, 1, 1, {1, 1}, {0, 0, 0, 0}, {1, 1}, 1, i8, i8, i8, true, false, false,
       false, true, true, 2}};
}
// clang-format on

}  // namespace kiln::test
