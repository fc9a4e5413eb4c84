// The sampling math of grid_sample (ONNX GridSample, opset 20), shared by the CPU and CUDA
// kernels (host and device). Along one spatial dim of `len` elements, a normalized grid value g
// in [-1, 1] maps to x = (g + 1) / 2 (len - 1) with align_corners, else ((g + 1) len - 1) / 2.
// nearest rounds x half to even (ONNX's reference, for every spatial rank). A
// coordinate outside the border ([0, len - 1] with align_corners, else [-0.5, len - 0.5]) is
// clamped to [0, len - 1] (border) or reflected into the border (reflection). The taps are then
// x0 = floor(x) (+0, +1 for linear; -1 .. +2 for cubic, Keys A = -0.75), and each tap index is
// resolved by the padding mode: zeros (outside: the tap reads 0), border (clamp) or reflection.
// ops/resize_params.h decodes a node's attributes into Params.
#pragma once

#include <math.h>
#include <stdint.h>

#if defined(__CUDACC__)
#define KILN_GRID_HD __host__ __device__
#else
#define KILN_GRID_HD
#endif

namespace kiln::grid_math {

enum class Mode : int { linear, nearest, cubic };
enum class Padding : int { zeros, border, reflection };

constexpr int kMaxSpatial = 3;

struct Params {
  Mode mode = Mode::linear;
  Padding padding = Padding::zeros;
  bool align_corners = false;
  int spatial = 2;  // number of spatial dims
};

/// Up to 4 taps along one dim: input index (-1: reads 0) and weight.
struct AxisTaps {
  int n = 0;
  int64_t idx[4] = {};
  double w[4] = {};
};

KILN_GRID_HD inline double reflect(double x, double lo, double hi) {
  const double range = hi - lo;
  if (range <= 0) return lo;
  double r = x;
  if (x < lo) {
    const double dx = lo - x, n = ::floor(dx / range), rem = dx - n * range;
    r = ::fmod(n, 2.0) == 0 ? lo + rem : hi - rem;
  } else if (x > hi) {
    const double dx = x - hi, n = ::floor(dx / range), rem = dx - n * range;
    r = ::fmod(n, 2.0) == 0 ? hi - rem : lo + rem;
  }
  return r < lo ? lo : r > hi ? hi : r;  // rounding of huge inputs stays inside
}

/// Input index of tap i along a dim of `len` under the padding mode; -1 when it reads 0.
KILN_GRID_HD inline int64_t resolve(const Params& p, int64_t i, int64_t len) {
  if (i >= 0 && i < len) return i;
  switch (p.padding) {
    case Padding::zeros: return -1;
    case Padding::border: return i < 0 ? 0 : len - 1;
    case Padding::reflection: {
      const double lo = p.align_corners ? 0.0 : -0.5;
      const double hi =
          p.align_corners ? static_cast<double>(len) - 1 : static_cast<double>(len) - 0.5;
      const int64_t r = static_cast<int64_t>(reflect(static_cast<double>(i), lo, hi));
      return r < 0 ? 0 : r >= len ? len - 1 : r;
    }
  }
  return -1;
}

KILN_GRID_HD inline double cubic_weight(double t) {
  const double a = -0.75;
  t = ::fabs(t);
  if (t <= 1) return ((a + 2) * t - (a + 3)) * t * t + 1;
  if (t < 2) return ((a * t - 5 * a) * t + 8 * a) * t - 4 * a;
  return 0;
}

/// The taps of normalized grid value g along a dim of `len`.
KILN_GRID_HD inline AxisTaps axis_taps(const Params& p, double g, int64_t len) {
  const double l = static_cast<double>(len);
  double x = p.align_corners ? (g + 1) / 2 * (l - 1) : ((g + 1) * l - 1) / 2;
  if (p.mode == Mode::nearest) x = ::rint(x);
  const double lo = p.align_corners ? 0.0 : -0.5, hi = p.align_corners ? l - 1 : l - 0.5;
  if (!::isfinite(x)) x = lo - 4;  // NaN and inf sample outside
  if (x < lo || x > hi) {
    if (p.padding == Padding::border) x = x < 0 ? 0 : x > l - 1 ? l - 1 : x;
    else if (p.padding == Padding::reflection) x = reflect(x, lo, hi);
    else x = x < -4 ? -4 : x > l + 4 ? l + 4 : x;  // zeros: every tap this far out reads 0
  }
  AxisTaps t;
  if (p.mode == Mode::nearest) {
    t.n = 1;
    t.idx[0] = resolve(p, static_cast<int64_t>(x), len);
    t.w[0] = 1;
    return t;
  }
  const double x0 = ::floor(x), f = x - x0;
  const int64_t i0 = static_cast<int64_t>(x0);
  if (p.mode == Mode::linear) {
    t.n = 2;
    t.idx[0] = resolve(p, i0, len);
    t.idx[1] = resolve(p, i0 + 1, len);
    t.w[0] = 1 - f;
    t.w[1] = f;
    return t;
  }
  t.n = 4;
  for (int k = 0; k < 4; ++k) {
    t.idx[k] = resolve(p, i0 - 1 + k, len);
    t.w[k] = cubic_weight(f - (k - 1));
  }
  return t;
}

}  // namespace kiln::grid_math
