// The narrow storage types (kiln/dtype.h): the 8-bit floats (kiln/float8.h), f8e8m0fnu, f4e2m1fn
// and the 4- and 2-bit integers i4 u4 i2 u2, one byte an element with the code in its low bits.
// Decoding a code to float and rounding a float or double to a code, on the host and in CUDA
// kernels; cast converts every other type through f32 (f64 sources round once, from double).
//
// - f8e8m0fnu: 2^(code - 127), 0xff the only NaN; no sign, no zero (OCP MX's scale type). A value
//   takes its f32 exponent, rounded by its fraction as `Round` says (up, the default: any fraction
//   rounds up; down: truncated; nearest: up from a fraction of one half), as ONNX's Cast; the sign
//   is dropped. Infinities and NaN give NaN; a value past 2^127 gives 2^127 where `saturate`, else
//   NaN.
// - f4e2m1fn: sign, 2 exponent bits (bias 1), 1 mantissa bit: 0, 0.5, 1, 1.5, 2, 3, 4, 6, signed.
//   Rounded to nearest even; beyond 6, infinities included, 6 with the sign; NaN gives 6 (ONNX's
//   float4 note: the format has no NaN or infinity, so `saturate` does not apply).
// - i4 [-8, 7], u4 [0, 15], i2 [-2, 1], u2 [0, 3] (two's complement codes): rounded to the nearest
//   integer, ties to even (ONNX's int4 note), and saturated to the range; NaN gives 0. Integers
//   saturate, as kiln's integer casts do.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kiln/dtype.h"
#include "kiln/float8.h"

#if defined(__CUDACC__)
#define KILN_NARROW_HD __host__ __device__
#else
#define KILN_NARROW_HD
#endif
#if defined(__CUDA_ARCH__)
#define KILN_NARROW_MATH
#else
#define KILN_NARROW_MATH std::
#endif

namespace kiln::narrow {

/// How a value rounds to f8e8m0fnu (ONNX Cast's round_mode).
enum class Round : uint8_t { up, down, nearest };

/// How a cast rounds to a narrow type: saturation (the 8-bit floats and f8e8m0fnu) and f8e8m0fnu's
/// rounding.
struct Rules {
  bool saturate = true;
  Round round = Round::up;
};

/// One narrow type's description, computed once for a kernel's elements.
struct Codec {
  enum Kind : uint8_t { float8, e8m0, e2m1, integer };
  Kind kind = float8;
  f8::Format f8{};  // float8
  int bits = 0;     // integer: 4 or 2
  bool is_signed = false;
};

KILN_NARROW_HD inline Codec codec(DType t) {
  Codec c;
  switch (t) {
    case DType::f8e8m0fnu:
      c.kind = Codec::e8m0;
      break;
    case DType::f4e2m1fn:
      c.kind = Codec::e2m1;
      break;
    case DType::i4:
    case DType::u4:
    case DType::i2:
    case DType::u2:
      c.kind = Codec::integer;
      c.bits = t == DType::i4 || t == DType::u4 ? 4 : 2;
      c.is_signed = t == DType::i4 || t == DType::i2;
      break;
    default:
      c.f8 = f8::format(t);
  }
  return c;
}

/// The value of code `b` (for the integers, of its low `bits` bits).
KILN_NARROW_HD inline float decode(uint8_t b, const Codec& c) {
  switch (c.kind) {
    case Codec::e8m0:
      return b == 0xff ? NAN : KILN_NARROW_MATH ldexp(1.0f, static_cast<int>(b) - 127);
    case Codec::e2m1: {
      const int m = b & 7, e = m >> 1;
      const float v = e == 0
                          ? 0.5f * static_cast<float>(m & 1)
                          : KILN_NARROW_MATH ldexp(1.0f + 0.5f * static_cast<float>(m & 1), e - 1);
      return (b & 8) ? -v : v;
    }
    case Codec::integer: {
      const int span = 1 << c.bits, v = b & (span - 1);
      return static_cast<float>(c.is_signed && v >= span / 2 ? v - span : v);
    }
    default:
      return f8::decode(b, c.f8);
  }
}

/// `x` (a float or a double) as code, by `r` where the type takes it.
template <typename T>
KILN_NARROW_HD inline uint8_t encode(T x, const Codec& c, const Rules& r = Rules{}) {
  switch (c.kind) {
    case Codec::e8m0: {  // (from x's f32 bits, as ONNX's reference)
      const float f = static_cast<float>(x);
#if defined(__CUDA_ARCH__)
      const uint32_t u = __float_as_uint(f);
#else
      uint32_t u;
      std::memcpy(&u, &f, 4);
#endif
      uint32_t e = (u >> 23) & 0xff;
      if (e == 0xff) return 0xff;
      bool up = false;
      if (r.round == Round::up) {
        up = (u & 0x7fffff) != 0;
      } else if (r.round == Round::nearest) {
        const bool half = (u & 0x400000) != 0, rest = (u & 0x3fffff) != 0;
        up = half && (rest || e > 0);
      }
      if (up && !(r.saturate && e == 0xfe)) ++e;
      return static_cast<uint8_t>(e);
    }
    case Codec::e2m1: {
      if (KILN_NARROW_MATH isnan(x)) return 7;
      const uint8_t sign = KILN_NARROW_MATH signbit(x) ? 8 : 0;
      const T a = x < 0 ? -x : x;
      // the midpoints between neighbouring values; a tie goes to the even code
      const uint8_t m = a <= T(0.25)   ? 0
                        : a < T(0.75)  ? 1
                        : a <= T(1.25) ? 2
                        : a < T(1.75)  ? 3
                        : a <= T(2.5)  ? 4
                        : a < T(3.5)   ? 5
                        : a <= T(5)    ? 6
                                       : 7;
      return static_cast<uint8_t>(sign | m);
    }
    case Codec::integer: {
      if (KILN_NARROW_MATH isnan(x)) return 0;
      const int span = 1 << c.bits;
      const T lo = c.is_signed ? T(-span / 2) : T(0),
              hi = c.is_signed ? T(span / 2 - 1) : T(span - 1);
      const T v = KILN_NARROW_MATH rint(x < lo ? lo : x > hi ? hi : x);
      return static_cast<uint8_t>(static_cast<int>(v) & (span - 1));
    }
    default:
      return f8::encode(x, c.f8, r.saturate);
  }
}

}  // namespace kiln::narrow

#undef KILN_NARROW_HD
#undef KILN_NARROW_MATH
