// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11) and the
// distributions of the random ops, shared by the CPU and CUDA kernels (host/device functions when
// nvcc compiles them, plain inline functions otherwise).
//
// The distributions follow TensorFlow's (core/lib/random/random_distributions.h) operation for
// operation, so kiln's stateless ops equal tf.random.stateless_* (uniform bit for bit; normals
// within a few ulp, as kiln's log, sin and cos below give the same bits on every device where
// TensorFlow calls libm's): a group of outputs takes one
// Philox block per group (4 outputs for 32-bit types, 2 for 64-bit ones), group g reads the block
// at counter + g; truncated normal groups reserve 256 blocks each (rejection sampling). Output
// element i's bits therefore depend only on (key, counter, i), never on the thread computing it.
#pragma once

#include <math.h>

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define KILN_PHILOX_FN __host__ __device__ __forceinline__
#else
#define KILN_PHILOX_FN inline
#endif

namespace kiln::philox {

/// A 128-bit counter (word 0 lowest) or one block of output.
struct Block {
  uint32_t w[4];
};
/// A 64-bit key (word 0 lowest).
struct Key {
  uint32_t w[2];
};

constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;

/// Philox4x32 with 10 rounds: the block for counter `c` under key `k`.
KILN_PHILOX_FN Block philox4x32_10(Block c, Key k) {
  for (int r = 0; r < 10; ++r) {
    if (r > 0) {
      k.w[0] += kWeyl0;
      k.w[1] += kWeyl1;
    }
    const uint64_t p0 = static_cast<uint64_t>(kMul0) * c.w[0];
    const uint64_t p1 = static_cast<uint64_t>(kMul1) * c.w[2];
    c = Block{{static_cast<uint32_t>(p1 >> 32) ^ c.w[1] ^ k.w[0], static_cast<uint32_t>(p1),
               static_cast<uint32_t>(p0 >> 32) ^ c.w[3] ^ k.w[1], static_cast<uint32_t>(p0)}};
  }
  return c;
}

/// The counter `n` blocks later (TensorFlow's PhiloxRandom::Skip, carry rule included).
KILN_PHILOX_FN Block skip(Block c, uint64_t n) {
  const uint32_t lo = static_cast<uint32_t>(n);
  uint32_t hi = static_cast<uint32_t>(n >> 32);
  c.w[0] += lo;
  if (c.w[0] < lo) ++hi;
  c.w[1] += hi;
  if (c.w[1] < hi && ++c.w[2] == 0) ++c.w[3];
  return c;
}

/// TensorFlow's seed scrambling (stateless_random_ops.cc GenerateKey): seed pair -> key, counter.
KILN_PHILOX_FN void key_counter_from_seed(uint64_t s0, uint64_t s1, Key& key, Block& ctr) {
  const Block mix =
      philox4x32_10(Block{{static_cast<uint32_t>(s0), static_cast<uint32_t>(s0 >> 32),
                           static_cast<uint32_t>(s1), static_cast<uint32_t>(s1 >> 32)}},
                    Key{{0x3ec8f720u, 0x02461e29u}});
  key = Key{{mix.w[0], mix.w[1]}};
  ctr = Block{{0, 0, mix.w[2], mix.w[3]}};
}

// ---- uint32 -> floating point

/// [0, 1) from the low 23 bits: 1.m - 1 (TensorFlow's Uint32ToFloat).
KILN_PHILOX_FN float to_unit_float(uint32_t x) {
  const uint32_t bits = (x & 0x7fffffu) | 0x3f800000u;
  float f;
  memcpy(&f, &bits, sizeof f);
  return f - 1.0f;
}
/// [0, 1) from 52 bits: the low 20 bits of x0 above x1 (TensorFlow's Uint64ToDouble).
KILN_PHILOX_FN double to_unit_double(uint32_t x0, uint32_t x1) {
  const uint64_t bits = (uint64_t{1023} << 52) | (static_cast<uint64_t>(x0 & 0xfffffu) << 32) | x1;
  double d;
  memcpy(&d, &bits, sizeof d);
  return d - 1.0;
}

// Arithmetic without contraction into fused multiply-adds (nvcc contracts by default), so the
// device rounds as the host does.
KILN_PHILOX_FN float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
KILN_PHILOX_FN float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
KILN_PHILOX_FN double mul_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
KILN_PHILOX_FN double add_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}

KILN_PHILOX_FN double div_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __ddiv_rn(a, b);
#else
  return a / b;
#endif
}
KILN_PHILOX_FN double sqrt_rn(double a) {
#if defined(__CUDA_ARCH__)
  return __dsqrt_rn(a);
#else
  return ::sqrt(a);
#endif
}
KILN_PHILOX_FN float sqrt_rn(float a) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(a);
#else
  return ::sqrtf(a);
#endif
}

// ---- log, sin and cos for Box-Muller, the same bits on every device
//
// libm's functions and CUDA's differ in their last bits, so the normals would too. These use
// only IEEE-754 additions, multiplications, divisions and square roots, each correctly rounded
// and never contracted (the *_rn helpers), so the CPU and the GPU compute the same double, and
// the same float after rounding. Their error is a few units in the last place of a double: the
// float results are correctly rounded except within about 2^-29 of a rounding boundary.

/// (x^1) * sum_k c[k] x^(2k) by Horner's rule over x2 = x*x (c has n terms, c[0] first).
template <int N>
KILN_PHILOX_FN double odd_even_poly(const double (&c)[N], double x2) {
  double p = c[N - 1];
  for (int k = N - 2; k >= 0; --k) p = add_rn(mul_rn(p, x2), c[k]);
  return p;
}

/// Natural log of a finite x > 0 (Box-Muller passes [1e-7, 1)).
KILN_PHILOX_FN double log_d(double x) {
  uint64_t bits;
  memcpy(&bits, &x, sizeof bits);
  int e = static_cast<int>((bits >> 52) & 0x7ff) - 1023;
  if (e == -1023) {  // subnormal: scale into the normal range first
    x = mul_rn(x, 18014398509481984.0);  // 2^54
    memcpy(&bits, &x, sizeof bits);
    e = static_cast<int>((bits >> 52) & 0x7ff) - 1023 - 54;
  }
  bits = (bits & 0x000fffffffffffffull) | (uint64_t{1023} << 52);
  double m;
  memcpy(&m, &bits, sizeof m);  // x = 2^e m, m in [1, 2)
  if (m > 1.4142135623730951) {  // m in [sqrt(1/2), sqrt(2)): |s| <= 0.1716 below
    m = mul_rn(m, 0.5);
    ++e;
  }
  // log m = 2 atanh(s) = 2s (1 + s^2/3 + s^4/5 + ...), s = (m - 1) / (m + 1); s^2 <= 0.0295, so
  // ten terms after the first reach 2^-53
  constexpr double c[] = {1.0,        1.0 / 3,  1.0 / 5,  1.0 / 7,  1.0 / 9,  1.0 / 11,
                          1.0 / 13,   1.0 / 15, 1.0 / 17, 1.0 / 19, 1.0 / 21};
  const double s = div_rn(add_rn(m, -1.0), add_rn(m, 1.0));
  const double s2 = mul_rn(s, s);
  const double log_m = mul_rn(mul_rn(2.0, s), odd_even_poly(c, s2));
  // e ln 2 with ln 2 split so that e * hi is exact
  constexpr double ln2_hi = 6.93147180369123816490e-01, ln2_lo = 1.90821492927058770002e-10;
  const double de = static_cast<double>(e);
  return add_rn(mul_rn(de, ln2_hi), add_rn(mul_rn(de, ln2_lo), log_m));
}

/// sin and cos of x in [0, 8] (Box-Muller passes [0, 2 pi]).
KILN_PHILOX_FN void sincos_d(double x, double& sin_x, double& cos_x) {
  // x = k pi/2 + r, |r| <= pi/4 (pi/2 split so that k * hi is exact)
  constexpr double pio2_hi = 1.57079632673412561417e+00, pio2_lo = 6.07710050650619224932e-11;
  const int k = static_cast<int>(add_rn(mul_rn(x, 0.63661977236758134308), 0.5));
  const double dk = static_cast<double>(k);
  const double r = add_rn(add_rn(x, -mul_rn(dk, pio2_hi)), -mul_rn(dk, pio2_lo));
  const double r2 = mul_rn(r, r);
  // Taylor series to r^21 and r^20: (pi/4)^22 / 22! < 2^-60
  constexpr double sc[] = {1.0,
                           -1.0 / 6,
                           1.0 / 120,
                           -1.0 / 5040,
                           1.0 / 362880,
                           -1.0 / 39916800,
                           1.0 / 6227020800.0,
                           -1.0 / 1307674368000.0,
                           1.0 / 355687428096000.0,
                           -1.0 / 121645100408832000.0,
                           1.0 / 51090942171709440000.0};
  constexpr double cc[] = {1.0,
                           -1.0 / 2,
                           1.0 / 24,
                           -1.0 / 720,
                           1.0 / 40320,
                           -1.0 / 3628800,
                           1.0 / 479001600,
                           -1.0 / 87178291200.0,
                           1.0 / 20922789888000.0,
                           -1.0 / 6402373705728000.0,
                           1.0 / 2432902008176640000.0};
  const double s = mul_rn(r, odd_even_poly(sc, r2));
  const double c = odd_even_poly(cc, r2);
  switch (k & 3) {
    case 0: sin_x = s, cos_x = c; break;
    case 1: sin_x = c, cos_x = -s; break;
    case 2: sin_x = -s, cos_x = -c; break;
    default: sin_x = -c, cos_x = s; break;
  }
}

/// Box-Muller on two uint32 (TensorFlow's BoxMullerFloat, same operation order), with log, sin
/// and cos evaluated in double by the functions above and rounded to float: the same bits on
/// every device. (TensorFlow calls libm's float functions, so its bits depend on the libm; they
/// are within a few ulp of these.)
KILN_PHILOX_FN void box_muller(uint32_t x0, uint32_t x1, float& f0, float& f1) {
  float u1 = to_unit_float(x0);
  if (u1 < 1.0e-7f) u1 = 1.0e-7f;
  const float v1 = static_cast<float>(mul_rn(2.0 * 3.14159265358979323846,
                                             static_cast<double>(to_unit_float(x1))));
  const float u2 = sqrt_rn(mul_rn(-2.0f, static_cast<float>(log_d(u1))));
  double sd, cd;
  sincos_d(v1, sd, cd);
  f0 = mul_rn(static_cast<float>(sd), u2);
  f1 = mul_rn(static_cast<float>(cd), u2);
}
/// The double version (TensorFlow's BoxMullerDouble): four uint32 -> two normals.
KILN_PHILOX_FN void box_muller(uint32_t x0, uint32_t x1, uint32_t x2, uint32_t x3, double& d0,
                               double& d1) {
  double u1 = to_unit_double(x0, x1);
  if (u1 < 1.0e-7) u1 = 1.0e-7;
  const double v1 = mul_rn(2 * 3.14159265358979323846, to_unit_double(x2, x3));
  const double u2 = sqrt_rn(mul_rn(-2.0, log_d(u1)));
  double s, c;
  sincos_d(v1, s, c);
  d0 = mul_rn(s, u2);
  d1 = mul_rn(c, u2);
}

// ---- the distributions: one group of outputs from the block(s) at its counter

enum class Dist : int { uniform = 0, normal, truncated_normal, bernoulli, dropout_mask, integer };

/// Outputs per group: 4 for 32-bit results, 2 for f64 and i64.
KILN_PHILOX_FN int group_size(bool wide) { return wide ? 2 : 4; }
/// Philox blocks a group reserves: 256 * group / 4 for truncated normal (rejection), else 1.
KILN_PHILOX_FN uint64_t blocks_per_group(Dist d, bool wide) {
  return d == Dist::truncated_normal ? (wide ? 128 : 256) : 1;
}
/// Blocks a draw of n outputs consumes (how far the state's counter advances).
KILN_PHILOX_FN uint64_t blocks_for(Dist d, bool wide, int64_t n) {
  const int g = group_size(wide);
  return static_cast<uint64_t>((n + g - 1) / g) * blocks_per_group(d, wide);
}

/// Parameters of a draw, in the arithmetic type A (float or double) where they are real.
template <typename A>
struct Params {
  A a = 0, b = 1;          // uniform: min, max; normal: mean, std; truncated: mean, std
  A lo = -2, hi = 2;       // truncated: accepted range of the standard normal (open)
  A min = -2, max = 2;     // truncated: the result's clamp (absolute)
  A scale = 1;             // dropout mask: 1 / keep
  uint64_t threshold = 0;  // bernoulli, dropout mask: uint32 x < threshold is a 1
  int64_t low = 0;         // integer: [low, low + range)
  uint64_t range = 1;
};

/// The uint32 stream a truncated-normal group reads (TensorFlow's SingleSampleAdapter).
struct Stream {
  Block ctr;
  Key key;
  Block buf;
  int used = 4;
  KILN_PHILOX_FN uint32_t next() {
    if (used == 4) {
      buf = philox4x32_10(ctr, key);
      ctr = skip(ctr, 1);
      used = 0;
    }
    return buf.w[used++];
  }
};

/// Hard bound on the normal pairs one truncated group draws (TensorFlow has none); far beyond
/// what the accepted-probability check of the op builder lets a draw need.
constexpr int kMaxTruncatedPairs = 1 << 20;

/// Writes group g's outputs (count <= group size) for a value type A (float or double).
template <typename A>
KILN_PHILOX_FN void real_group(Dist d, const Params<A>& p, Block ctr, Key key, uint64_t g, A* out,
                               int count) {
  constexpr bool wide = sizeof(A) == 8;
  A v[4] = {};
  if (d == Dist::truncated_normal) {
    Stream s{skip(ctr, g * blocks_per_group(d, wide)), key, Block{}, 4};
    int k = 0;
    for (int it = 0; it < kMaxTruncatedPairs && k < group_size(wide); ++it) {
      A f[2];
      if constexpr (wide) {
        const uint32_t x0 = s.next(), x1 = s.next(), x2 = s.next(), x3 = s.next();
        box_muller(x0, x1, x2, x3, f[0], f[1]);
      } else {
        const uint32_t x0 = s.next(), x1 = s.next();
        box_muller(x0, x1, f[0], f[1]);
      }
      for (int j = 0; j < 2 && k < group_size(wide); ++j)
        if (p.lo < f[j] && f[j] < p.hi) v[k++] = f[j];
    }
    for (; k < group_size(wide); ++k) v[k] = 0;
    for (int i = 0; i < count; ++i) {
      const A r = add_rn(mul_rn(v[i], p.b), p.a);
      out[i] = r < p.min ? p.min : (r > p.max ? p.max : r);
    }
    return;
  }
  const Block x = philox4x32_10(skip(ctr, g), key);
  if (d == Dist::uniform) {
    for (int i = 0; i < group_size(wide); ++i)
      if constexpr (wide)
        v[i] = to_unit_double(x.w[2 * i], x.w[2 * i + 1]);
      else
        v[i] = to_unit_float(x.w[i]);
    for (int i = 0; i < count; ++i) out[i] = add_rn(mul_rn(v[i], p.b - p.a), p.a);
  } else if (d == Dist::normal) {
    if constexpr (wide)
      box_muller(x.w[0], x.w[1], x.w[2], x.w[3], v[0], v[1]);
    else {
      box_muller(x.w[0], x.w[1], v[0], v[1]);
      box_muller(x.w[2], x.w[3], v[2], v[3]);
    }
    for (int i = 0; i < count; ++i) out[i] = add_rn(mul_rn(v[i], p.b), p.a);
  } else {  // bernoulli, dropout mask
    const A one = d == Dist::dropout_mask ? p.scale : A(1);
    for (int i = 0; i < count; ++i) out[i] = x.w[i] < p.threshold ? one : A(0);
  }
}

/// Group g of random integers in [low, low + range): low + bits % range, 32 bits per output for
/// 32-bit and narrower types, 64 (two words, low first) for i64 (TensorFlow's UniformDistribution
/// of int32/int64). Bernoulli/dropout masks of integer or bool types come as 0/1 here too.
template <typename T>
KILN_PHILOX_FN void integer_group(Dist d, const Params<float>& p, Block ctr, Key key, uint64_t g,
                                  T* out, int count) {
  const Block x = philox4x32_10(skip(ctr, g), key);
  for (int i = 0; i < count; ++i) {
    if (d != Dist::integer) {
      out[i] = static_cast<T>(x.w[i] < p.threshold ? 1 : 0);
    } else if (sizeof(T) == 8) {
      const uint64_t bits = x.w[2 * i] | (static_cast<uint64_t>(x.w[2 * i + 1]) << 32);
      out[i] = static_cast<T>(static_cast<uint64_t>(p.low) + bits % p.range);
    } else {
      out[i] = static_cast<T>(static_cast<uint32_t>(p.low) +
                              static_cast<uint32_t>(x.w[i] % static_cast<uint32_t>(p.range)));
    }
  }
}

}  // namespace kiln::philox
