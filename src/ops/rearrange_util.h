// Index and box math of depth_to_space / space_to_depth and non_max_suppression, shared by the
// CPU and CUDA kernels (host and device), so both backends move and select exactly alike.
#pragma once

#include <stdint.h>

#if defined(__CUDACC__)
#define KILN_XFORM_HD __host__ __device__
#else
#define KILN_XFORM_HD
#endif

namespace kiln::xform_math {

/// The two tensors of depth_to_space: the depth tensor (n, c*b*b, h, w) and the space tensor
/// (n, c, h*b, w*b), NCHW or (nhwc) NHWC. space_to_depth maps them the other way.
struct SpaceDepth {
  int64_t n = 0, c = 0, h = 0, w = 0, b = 1;
  bool crd = false, nhwc = false;

  /// The depth channel holding space channel `ch` at block position (bh, bw).
  KILN_XFORM_HD int64_t depth_channel(int64_t ch, int64_t bh, int64_t bw) const {
    return crd ? (ch * b + bh) * b + bw : (bh * b + bw) * c + ch;
  }
  KILN_XFORM_HD int64_t depth_offset(int64_t i, int64_t dc, int64_t y, int64_t x) const {
    const int64_t dcs = c * b * b;
    return nhwc ? ((i * h + y) * w + x) * dcs + dc : ((i * dcs + dc) * h + y) * w + x;
  }
  KILN_XFORM_HD int64_t space_offset(int64_t i, int64_t ch, int64_t y, int64_t x) const {
    const int64_t hh = h * b, ww = w * b;
    return nhwc ? ((i * hh + y) * ww + x) * c + ch : ((i * c + ch) * hh + y) * ww + x;
  }
  /// depth_to_space: the depth-tensor offset of space-tensor element `o`.
  KILN_XFORM_HD int64_t d2s_source(int64_t o) const {
    const int64_t hh = h * b, ww = w * b;
    int64_t i, ch, y, x;
    if (nhwc) {
      ch = o % c;
      o /= c;
      x = o % ww;
      o /= ww;
      y = o % hh;
      i = o / hh;
    } else {
      x = o % ww;
      o /= ww;
      y = o % hh;
      o /= hh;
      ch = o % c;
      i = o / c;
    }
    return depth_offset(i, depth_channel(ch, y % b, x % b), y / b, x / b);
  }
  /// space_to_depth: the space-tensor offset of depth-tensor element `o`.
  KILN_XFORM_HD int64_t s2d_source(int64_t o) const {
    const int64_t dcs = c * b * b;
    int64_t i, dc, y, x;
    if (nhwc) {
      dc = o % dcs;
      o /= dcs;
      x = o % w;
      o /= w;
      y = o % h;
      i = o / h;
    } else {
      x = o % w;
      o /= w;
      y = o % h;
      o /= h;
      dc = o % dcs;
      i = o / dcs;
    }
    int64_t ch, bh, bw;
    if (crd) {
      ch = dc / (b * b);
      bh = dc / b % b;
      bw = dc % b;
    } else {
      ch = dc % c;
      bh = dc / c / b;
      bw = dc / c % b;
    }
    return space_offset(i, ch, y * b + bh, x * b + bw);
  }
};

/// ONNX NonMaxSuppression's suppression test (as ONNX Runtime's reference): corners
/// (y1, x1, y2, x2) in either order, or (x_center, y_center, width, height); no suppression for
/// empty intersections or boxes of non-positive area; else IoU > threshold. In T (float for f32).
template <typename T>
KILN_XFORM_HD inline void box_extent(const T* p, bool center, T& y0, T& x0, T& y1, T& x1) {
  if (center) {
    const T hw = p[2] / T(2), hh = p[3] / T(2);
    x0 = p[0] - hw;
    x1 = p[0] + hw;
    y0 = p[1] - hh;
    y1 = p[1] + hh;
  } else {
    y0 = p[0] < p[2] ? p[0] : p[2];
    y1 = p[0] < p[2] ? p[2] : p[0];
    x0 = p[1] < p[3] ? p[1] : p[3];
    x1 = p[1] < p[3] ? p[3] : p[1];
  }
}

/// a * b rounded on its own: device code never fuses it into an add (nvcc contracts a * b + c
/// into an fma by default, the host compiler does not), so both backends decide alike.
template <typename T> KILN_XFORM_HD inline T mul_rn(T a, T b) {
#if defined(__CUDA_ARCH__)
  if constexpr (sizeof(T) == 4) return __fmul_rn(a, b);
  else return __dmul_rn(a, b);
#else
  return a * b;
#endif
}

template <typename T>
KILN_XFORM_HD inline bool suppresses(const T* a, const T* b, bool center, T iou_threshold) {
  T ay0, ax0, ay1, ax1, by0, bx0, by1, bx1;
  box_extent(a, center, ay0, ax0, ay1, ax1);
  box_extent(b, center, by0, bx0, by1, bx1);
  const T ix0 = ax0 > bx0 ? ax0 : bx0, ix1 = ax1 < bx1 ? ax1 : bx1;
  if (!(ix1 > ix0)) return false;
  const T iy0 = ay0 > by0 ? ay0 : by0, iy1 = ay1 < by1 ? ay1 : by1;
  if (!(iy1 > iy0)) return false;
  const T inter = mul_rn(ix1 - ix0, iy1 - iy0);
  const T area_a = mul_rn(ax1 - ax0, ay1 - ay0), area_b = mul_rn(bx1 - bx0, by1 - by0);
  const T uni = area_a + area_b - inter;
  if (!(inter > T(0)) || !(area_a > T(0)) || !(area_b > T(0)) || !(uni > T(0))) return false;
  return inter / uni > iou_threshold;
}

/// Whether a score is a candidate: not NaN, and above the threshold when there is one.
template <typename T>
KILN_XFORM_HD inline bool nms_candidate(T score, bool has_threshold, T threshold) {
  return score == score && (!has_threshold || score > threshold);
}

}  // namespace kiln::xform_math
