// The 8-bit float formats (OCP FP8 e4m3fn and e5m2, and the e4m3fnuz / e5m2fnuz variants with
// one NaN and no negative zero): decoding to float and rounding from float, on the host and in
// CUDA kernels.
#pragma once

#include <cmath>
#include <cstdint>

#include "kiln/dtype.h"

#if defined(__CUDACC__)
#define KILN_F8_HD __host__ __device__
#else
#define KILN_F8_HD
#endif
// (the math functions: CUDA's overloads in device code, <cmath>'s on the host)
#if defined(__CUDA_ARCH__)
#define KILN_F8_MATH
#else
#define KILN_F8_MATH std::
#endif

namespace kiln::f8 {

/// One format: `mbits` mantissa bits, exponent bias, `ieee` (the top exponent holds infinity and
/// NaNs, as e5m2's does), `uz` (0x80 is the only NaN and there is no -0, as in the *fnuz formats;
/// otherwise e4m3fn's NaN is S.1111.111 and it has no infinity), and its largest finite value.
struct Format {
  int mbits;
  int bias;
  bool ieee;
  bool uz;
  float max;
};

KILN_F8_HD inline Format format(DType t) {
  switch (t) {
    case DType::f8e4m3fnuz:
      return {3, 8, false, true, 240.0f};
    case DType::f8e5m2:
      return {2, 15, true, false, 57344.0f};
    case DType::f8e5m2fnuz:
      return {2, 16, false, true, 57344.0f};
    default:
      return {3, 7, false, false, 448.0f};  // f8e4m3fn
  }
}

/// The value of code `b`.
KILN_F8_HD inline float decode(uint8_t b, Format f) {
  const int ebits = 7 - f.mbits;
  const int emax = (1 << ebits) - 1, mmask = (1 << f.mbits) - 1;
  const bool neg = (b & 0x80) != 0;
  const int e = (b >> f.mbits) & emax, m = b & mmask;
  if (f.uz && b == 0x80) return NAN;
  if (f.ieee && e == emax) return m != 0 ? NAN : (neg ? -INFINITY : INFINITY);
  if (!f.uz && !f.ieee && e == emax && m == mmask) return NAN;  // (e4m3fn's)
  const float v =
      e == 0 ? KILN_F8_MATH ldexp(static_cast<float>(m), 1 - f.bias - f.mbits)
             : KILN_F8_MATH ldexp(static_cast<float>(m | (1 << f.mbits)), e - f.bias - f.mbits);
  return neg ? -v : v;
}

/// `x` (a float or a double: rounded once, from its own precision) rounded to the nearest code,
/// ties to even. Beyond the largest finite value: that value where `saturate` (infinities too),
/// else infinity (e5m2) or NaN (the others). NaN stays NaN.
template <typename T> KILN_F8_HD inline uint8_t encode(T x, Format f, bool saturate) {
  const uint8_t sign = KILN_F8_MATH signbit(x) ? 0x80 : 0;
  const uint8_t nan = f.uz ? 0x80 : static_cast<uint8_t>(sign | (f.ieee ? 0x7e : 0x7f));
  if (KILN_F8_MATH isnan(x)) return nan;
  const int emax = (1 << (7 - f.mbits)) - 1;
  // the largest finite code's bits below the sign
  const int top = f.ieee ? ((emax - 1) << f.mbits) | ((1 << f.mbits) - 1) : f.uz ? 0x7f : 0x7e;
  const uint8_t over = saturate ? static_cast<uint8_t>(sign | top)
                       : f.ieee ? static_cast<uint8_t>(sign | (emax << f.mbits))
                                : nan;
  const T a = x < 0 ? -x : x;
  if (KILN_F8_MATH isinf(a)) return over;
  if (a == 0) return f.uz ? 0 : sign;
  int e2 = 0;
  KILN_F8_MATH frexp(a, &e2);                               // a = m * 2^e2, m in [0.5, 1)
  const int e = e2 - 1 < 1 - f.bias ? 1 - f.bias : e2 - 1;  // subnormals share the least exponent
  // the significand in units of the last place, rounded to nearest even (the scaling is exact)
  const T n = KILN_F8_MATH rint(KILN_F8_MATH ldexp(a, f.mbits - e));
  if (KILN_F8_MATH ldexp(static_cast<double>(n), e - f.mbits) > static_cast<double>(f.max))
    return over;
  const int one = 1 << f.mbits;
  int field, mant;
  if (n < one) {  // subnormal (or zero)
    field = 0;
    mant = static_cast<int>(n);
  } else if (n >= 2 * one) {  // rounded up into the next binade
    field = e + 1 + f.bias;
    mant = 0;
  } else {
    field = e + f.bias;
    mant = static_cast<int>(n) - one;
  }
  const auto mag = static_cast<uint8_t>((field << f.mbits) | mant);
  if (mag == 0 && f.uz) return 0;  // no -0
  return static_cast<uint8_t>(sign | mag);
}

}  // namespace kiln::f8

#undef KILN_F8_HD
#undef KILN_F8_MATH
