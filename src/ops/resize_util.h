// The coordinate and weight math of resize (ONNX Resize, opset 19), shared by the op's gradient,
// the CPU kernel and the CUDA kernel (host and device), so every layer samples the same taps.
// ops/resize_params.h decodes a node's attributes into Params and its Dims.
//
// Along one dim of `in` elements resized to `out` with scale s, output coordinate x maps to
// x_ori by the coordinate transformation mode; x_ori = f + r with f = ceil(x_ori) - 1 and r in
// (0, 1] (the ONNX reference's "prefer the pixel on the left"). Taps are input indices
// f + start + i, i in [0, n), clamped to [0, in) (edge padding); their weights come from the
// mode's kernel at distance (start + i - r), scaled by min(s, 1) when antialiasing. nearest
// takes one tap. tf_crop_and_resize gives `extrapolation` where x_ori leaves [0, in - 1].
#pragma once

#include <math.h>
#include <stdint.h>

#include <string>

#if defined(__CUDACC__)
#define KILN_RESIZE_HD __host__ __device__
#else
#define KILN_RESIZE_HD
#endif

namespace kiln::resize_math {

enum class Mode : int { nearest, linear, cubic };
enum class Coord : int {
  half_pixel,
  half_pixel_symmetric,
  pytorch_half_pixel,
  align_corners,
  asymmetric,
  tf_crop_and_resize
};
enum class Nearest : int { round_prefer_floor, round_prefer_ceil, floor, ceil };

/// One resized dim: sizes, the scale the coordinates use, and the region of interest (fractions
/// of the input, tf_crop_and_resize only).
struct Dim {
  int64_t in = 1, out = 1;
  double scale = 1, roi_start = 0, roi_end = 1;
};

struct Params {
  Mode mode = Mode::nearest;
  Coord coord = Coord::half_pixel;
  Nearest nearest = Nearest::round_prefer_floor;
  double cubic_a = -0.75;
  bool exclude_outside = false;
  bool antialias = false;
  double extrapolation = 0;
};

/// x_ori of output coordinate x.
KILN_RESIZE_HD inline double source_coordinate(const Params& p, const Dim& d, int64_t x) {
  const double xd = static_cast<double>(x), in = static_cast<double>(d.in);
  switch (p.coord) {
    case Coord::half_pixel: return (xd + 0.5) / d.scale - 0.5;
    case Coord::half_pixel_symmetric: {
      const double adjustment = static_cast<double>(d.out) / (d.scale * in);
      return in / 2 * (1 - adjustment) + (xd + 0.5) / d.scale - 0.5;
    }
    case Coord::pytorch_half_pixel: return d.out > 1 ? (xd + 0.5) / d.scale - 0.5 : 0.0;
    case Coord::align_corners: {
      // the resized length is in * scale (not rounded), as ONNX's reference has it
      const double len = static_cast<double>(d.in) * d.scale;
      return d.out > 1 && len > 1 ? xd * (in - 1) / (len - 1) : 0.0;
    }
    case Coord::asymmetric: return xd / d.scale;
    case Coord::tf_crop_and_resize:
      // summed in the ONNX reference's order
      return (d.out > 1 ? xd * (d.roi_end - d.roi_start) * (in - 1) / static_cast<double>(d.out - 1)
                        : (d.roi_end - d.roi_start) * (in - 1) / 2) +
             d.roi_start * (in - 1);
  }
  return 0;
}

/// Whether output coordinate x takes the extrapolation value (tf_crop_and_resize outside the
/// input).
KILN_RESIZE_HD inline bool extrapolates(const Params& p, const Dim& d, double x_ori) {
  return p.coord == Coord::tf_crop_and_resize &&
         (x_ori < 0 || x_ori > static_cast<double>(d.in - 1));
}

KILN_RESIZE_HD inline int64_t clamp_index(int64_t i, int64_t n) {
  return i < 0 ? 0 : i >= n ? n - 1 : i;
}

/// The input index nearest mode takes for x_ori.
KILN_RESIZE_HD inline int64_t nearest_index(const Params& p, const Dim& d, double x_ori) {
  const double f = ::ceil(x_ori) - 1, r = x_ori - f;
  bool right = true;  // r == 1: x_ori is an integer, the right neighbour is x_ori itself
  if (r < 1) {
    switch (p.nearest) {
      case Nearest::round_prefer_floor: right = r > 0.5; break;
      case Nearest::round_prefer_ceil: right = r >= 0.5; break;
      case Nearest::floor: right = false; break;
      case Nearest::ceil: right = true; break;
    }
  }
  return clamp_index(static_cast<int64_t>(f) + (right ? 1 : 0), d.in);
}

/// The taps of linear or cubic interpolation at x_ori: indices first + i (before clamping) for
/// i in [0, n), weights weight(i) / sum.
struct Taps {
  int64_t first = 0;
  int n = 0;
  double ratio = 1, support = 1, a = -0.75;
  bool cubic = false;
  double sum = 1;

  KILN_RESIZE_HD double raw(int i) const {
    const double t = ::fabs((static_cast<double>(first_offset + i) - ratio) * support);
    if (!cubic) return t < 1 ? 1 - t : 0;
    if (t <= 1) return ((a + 2) * t - (a + 3)) * t * t + 1;
    if (t < 2) return ((a * t - 5 * a) * t + 8 * a) * t - 4 * a;
    return 0;
  }
  int first_offset = 0;  // start: the first tap's offset from f
};

/// Taps at x_ori for a linear or cubic resize of `d`; `inside(i)` excludes taps outside the
/// input when exclude_outside is set (their weight counts 0, the rest renormalize).
KILN_RESIZE_HD inline Taps make_taps(const Params& p, const Dim& d, double x_ori) {
  Taps t;
  t.cubic = p.mode == Mode::cubic;
  t.a = p.cubic_a;
  const double f = ::ceil(x_ori) - 1;
  t.ratio = x_ori - f;
  t.support = p.antialias && d.scale < 1 ? d.scale : 1.0;
  const double reach = t.cubic ? 2.0 : 1.0;
  const int start = static_cast<int>(::floor(-reach / t.support)) + 1;
  t.first_offset = start;
  t.n = 2 - 2 * start;
  t.first = static_cast<int64_t>(f) + start;
  double sum = 0;
  for (int i = 0; i < t.n; ++i) {
    const int64_t k = t.first + i;
    if (p.exclude_outside && (k < 0 || k >= d.in)) continue;
    sum += t.raw(i);
  }
  t.sum = sum;
  return t;
}

/// Weight of tap i (0 for an excluded tap).
KILN_RESIZE_HD inline double tap_weight(const Params& p, const Dim& d, const Taps& t, int i) {
  const int64_t k = t.first + i;
  if (p.exclude_outside && (k < 0 || k >= d.in)) return 0;
  return t.raw(i) / t.sum;
}

/// Host side: the mode names of the op's string attrs (-1 when unknown).
inline int mode_from(const std::string& s) {
  return s == "nearest" ? 0 : s == "linear" ? 1 : s == "cubic" ? 2 : -1;
}
inline int coord_from(const std::string& s) {
  const char* names[] = {"half_pixel",    "half_pixel_symmetric", "pytorch_half_pixel",
                         "align_corners", "asymmetric",           "tf_crop_and_resize"};
  for (int i = 0; i < 6; ++i)
    if (s == names[i]) return i;
  return -1;
}
inline int nearest_from(const std::string& s) {
  const char* names[] = {"round_prefer_floor", "round_prefer_ceil", "floor", "ceil"};
  for (int i = 0; i < 4; ++i)
    if (s == names[i]) return i;
  return -1;
}

/// Whether resizing along `d` leaves every element where it is (the dim can be skipped).
inline bool is_identity(const Params& p, const Dim& d) {
  if (d.in != d.out) return false;
  for (int64_t x = 0; x < d.out; ++x) {
    const double xo = source_coordinate(p, d, x);
    if (xo != static_cast<double>(x) || extrapolates(p, d, xo)) return false;
  }
  return true;
}

}  // namespace kiln::resize_math
