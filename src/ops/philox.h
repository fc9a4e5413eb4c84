// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11) and the
// distributions of the random ops, shared by the CPU and CUDA kernels (host/device functions when
// nvcc compiles them, plain inline functions otherwise).
//
// The distributions follow TensorFlow's (core/lib/random/random_distributions.h) bit for bit on
// the CPU, so kiln's stateless ops equal tf.random.stateless_*: a group of outputs takes one
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

/// Box-Muller on two uint32 (TensorFlow's BoxMullerFloat, same operation order). The host uses
/// libm's float logf/sqrtf/sincosf as TensorFlow's Linux build does; the device evaluates log,
/// sin and cos in double and rounds, which gives the correctly rounded float and so differs from
/// libm only where libm's float result is not correctly rounded (rare; see docs/ops.md).
KILN_PHILOX_FN void box_muller(uint32_t x0, uint32_t x1, float& f0, float& f1) {
  float u1 = to_unit_float(x0);
  if (u1 < 1.0e-7f) u1 = 1.0e-7f;
  const float v1 = static_cast<float>(2.0 * 3.14159265358979323846 * to_unit_float(x1));
#if defined(__CUDA_ARCH__)
  const float lg = static_cast<float>(::log(static_cast<double>(u1)));
  const float u2 = __fsqrt_rn(-2.0f * lg);
  const float s = static_cast<float>(::sin(static_cast<double>(v1)));
  const float c = static_cast<float>(::cos(static_cast<double>(v1)));
#else
  const float u2 = ::sqrtf(-2.0f * ::logf(u1));
  float s, c;
  ::sincosf(v1, &s, &c);
#endif
  f0 = mul_rn(s, u2);
  f1 = mul_rn(c, u2);
}
/// The double version (TensorFlow's BoxMullerDouble): four uint32 -> two normals.
KILN_PHILOX_FN void box_muller(uint32_t x0, uint32_t x1, uint32_t x2, uint32_t x3, double& d0,
                               double& d1) {
  double u1 = to_unit_double(x0, x1);
  if (u1 < 1.0e-7) u1 = 1.0e-7;
  const double v1 = mul_rn(2 * 3.14159265358979323846, to_unit_double(x2, x3));
  const double u2 = ::sqrt(mul_rn(-2.0, ::log(u1)));
  const double s = ::sin(v1), c = ::cos(v1);
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
