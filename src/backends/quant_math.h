// The arithmetic of int8 quantization shared by the CPU and CUDA kernels (src/backends/cpu/
// quant*.cpp, src/backends/cuda/quant*.cu), so that both round and saturate the same way and
// agree bit for bit. Functions are host and device code under nvcc.
#pragma once

#include <math.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#ifdef __CUDACC__
#define KILN_HD __host__ __device__
#else
#define KILN_HD
#endif

namespace kiln::quant_math {

/// The range of an integer type Q as doubles (i8, u8, i16, u16, i32).
template <typename Q>
struct Range;
template <>
struct Range<int8_t> {
  static constexpr double lo = -128, hi = 127;
};
template <>
struct Range<uint8_t> {
  static constexpr double lo = 0, hi = 255;
};
template <>
struct Range<int16_t> {
  static constexpr double lo = -32768, hi = 32767;
};
template <> struct Range<uint16_t> { static constexpr double lo = 0, hi = 65535; };
template <> struct Range<int32_t> {
  static constexpr double lo = -2147483648.0, hi = 2147483647.0;
};

/// Round half to even in the value's own type (the default rounding mode, as numpy's rint).
KILN_HD inline float round_even(float x) { return rintf(x); }
KILN_HD inline double round_even(double x) { return rint(x); }

KILN_HD inline bool is_nan(double x) {
#ifdef __CUDA_ARCH__
  return isnan(x);
#else
  return std::isnan(x);
#endif
}

/// r saturated to Q's range; NaN goes to the low end.
template <typename Q>
KILN_HD inline Q saturate(double r) {
  if (is_nan(r)) return static_cast<Q>(Range<Q>::lo);
  return static_cast<Q>(r < Range<Q>::lo ? Range<Q>::lo : (r > Range<Q>::hi ? Range<Q>::hi : r));
}

/// round_half_even(x / s) + zp, saturated, with the division in T (numpy's steps).
template <typename T, typename Q>
KILN_HD inline Q quantize_one(T x, T s, Q zp) {
  if constexpr (std::is_same_v<T, float> && sizeof(Q) == 1) {
    // the same in f32 (no conversions to double, a quarter of the rate on GPUs): the integer r
    // plus zp is exact while |r| <= 2^24, and beyond it both sums saturate to the same end
    const float r = round_even(x / s) + static_cast<float>(zp);
    if (r != r) return static_cast<Q>(Range<Q>::lo);  // NaN
    constexpr float lo = static_cast<float>(Range<Q>::lo), hi = static_cast<float>(Range<Q>::hi);
    return static_cast<Q>(r < lo ? lo : (r > hi ? hi : r));
  } else {
    return saturate<Q>(static_cast<double>(round_even(x / s)) + static_cast<double>(zp));
  }
}

/// (q - zp) * s: in f32 for 8/16-bit data; i32 data as f32 then f64 (the ONNX reference's steps).
template <typename Q, typename T>
KILN_HD inline T dequantize_one(Q q, Q zp, T s) {
  if constexpr (std::is_same_v<Q, int32_t>) {
    const double d = static_cast<double>(static_cast<float>(q)) - static_cast<double>(zp);
    return static_cast<T>(d * static_cast<double>(s));
  } else {
    return static_cast<T>(static_cast<T>(static_cast<float>(q) - static_cast<float>(zp)) * s);
  }
}

/// The activation of a fused int8 op's epilogue. A bool relu converts to kNone or kRelu.
enum Activation : int { kNone = 0, kRelu = 1, kGeluErf = 2, kGeluTanh = 3 };

/// Whether act is one of the GELUs (epilogues that must see the real value).
KILN_HD inline bool is_gelu(int act) { return act == kGeluErf || act == kGeluTanh; }

/// act(v) in double: max(v, 0), or GELU exact (v Φ(v) = v erfc(-v / √2) / 2) or tanh-approximated
/// (v (1 + tanh(√(2/π) (v + 0.044715 v³))) / 2), the formulas of the gelu op.
KILN_HD inline double activate(double v, int act) {
  switch (act) {
    case kRelu:
      return v < 0 ? 0.0 : v;
    case kGeluErf:
      return 0.5 * v * erfc(v * -0.70710678118654752440);
    case kGeluTanh:
      return 0.5 * v * (1.0 + tanh(0.79788456080286535588 * (v + 0.044715 * v * v * v)));
    default:
      return v;
  }
}

/// The epilogue of quantized_matmul and quantized_conv, in double: the exact integer product
/// `acc` times `mult` (the input scale times the weight's), plus bias and residual (either may
/// be skipped by the caller passing 0), the activation (Activation; relu for true), then
/// round_half_even(v / y_scale) + y_zp, saturated to Y.
template <typename Y>
KILN_HD inline Y requantize(int32_t acc, double mult, double bias, double residual, int act,
                            double y_scale, int32_t y_zp) {
  double v = static_cast<double>(acc) * mult;
  v += bias;
  v += residual;
  v = activate(v, act);
  return saturate<Y>(round_even(v / y_scale) + static_cast<double>(y_zp));
}

/// The residual an epilogue adds: f32 values, or i8/u8 ones dequantized on the way in exactly
/// as dequantize computes them ((q - zp) * scale in f32), so that a quantized residual fused into
/// the kernel gives the unfused graph's values bit for bit. Pointers are on the kernel's device.
struct Residual {
  enum Kind : int { kNone = 0, kF32 = 1, kU8 = 2, kI8 = 3 };
  int kind = kNone;
  const void* data = nullptr;
  const float* scale = nullptr;  // kU8, kI8: 0-d
  const void* zp = nullptr;      // kU8, kI8: 0-d, the residual's dtype
  KILN_HD double at(int64_t t) const {
    switch (kind) {
      case kF32:
        return static_cast<const float*>(data)[t];
      case kU8:
        return dequantize_one(static_cast<const uint8_t*>(data)[t],
                              *static_cast<const uint8_t*>(zp), *scale);
      case kI8:
        return dequantize_one(static_cast<const int8_t*>(data)[t], *static_cast<const int8_t*>(zp),
                              *scale);
      default:
        return 0.0;
    }
  }
  /// Bytes an element takes (0 without a residual).
  KILN_HD int element_bytes() const { return kind == kF32 ? 4 : kind == kNone ? 0 : 1; }
};

}  // namespace kiln::quant_math
