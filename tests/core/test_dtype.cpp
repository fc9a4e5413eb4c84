#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;

TEST(DTypeTest, NamesRoundTrip) {
  for (int i = 0; i < kNumDTypes; ++i) {
    DType t = static_cast<DType>(i);
    EXPECT_EQ(parse_dtype(name(t)), t);
  }
  expect_error<DTypeError>([] { parse_dtype("f12"); }, {"[dtype]", "f12"});
}

TEST(DTypeTest, Promotion) {
  EXPECT_EQ(promote(f32, f32), f32);
  EXPECT_EQ(promote(boolean, i8), i8);
  EXPECT_EQ(promote(i32, f16), f16);
  EXPECT_EQ(promote(f16, bf16), f32);
  EXPECT_EQ(promote(f16, f32), f32);
  EXPECT_EQ(promote(f32, f64), f64);
  EXPECT_EQ(promote(u8, i8), i16);
  EXPECT_EQ(promote(u8, i32), i32);
  EXPECT_EQ(promote(i16, i64), i64);
  // integers of one signedness: the wider; mixed: the signed one when wider, else the signed type
  // of twice the unsigned one's width (numpy's table; u64 with a signed type is f64 there too)
  EXPECT_EQ(promote(u16, u8), u16);
  EXPECT_EQ(promote(u32, u64), u64);
  EXPECT_EQ(promote(u16, i8), i32);
  EXPECT_EQ(promote(u16, i32), i32);
  EXPECT_EQ(promote(u32, i16), i64);
  EXPECT_EQ(promote(u32, i64), i64);
  EXPECT_EQ(promote(u64, i8), f64);
  EXPECT_EQ(promote(u64, i64), f64);
  EXPECT_EQ(promote(u64, f32), f32);
  EXPECT_EQ(promote(boolean, u32), u32);
  for (int a = 0; a < kNumDTypes; ++a)
    for (int b = 0; b < kNumDTypes; ++b)
      EXPECT_EQ(promote(static_cast<DType>(a), static_cast<DType>(b)),
                promote(static_cast<DType>(b), static_cast<DType>(a)));
}

// f16 conversion against an independent rule: the nearest representable half, ties to even.
TEST(DTypeTest, HalfConversionRoundsToNearestEven) {
  // every half bit pattern round-trips exactly
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    float16_t h;
    h.bits = static_cast<uint16_t>(bits);
    float f = static_cast<float>(h);
    if (std::isnan(f)) continue;
    EXPECT_EQ(float16_t(f).bits, h.bits) << bits;
  }
  std::uniform_real_distribution<float> d(-70000.f, 70000.f);
  for (int i = 0; i < 20000; ++i) {
    float f = d(rng());
    if (i % 2) f *= 1e-4f;
    float16_t h(f);
    const double got = static_cast<float>(h);
    // neighbours of the result must not be closer (a zero's are the smallest subnormals: the
    // draw can be exactly 0, and stepping the bits of +0 down would give a NaN)
    float16_t up = h, dn = h;
    if ((h.bits & 0x7fffu) == 0) {
      up.bits = 0x0001;
      dn.bits = 0x8001;
    } else {
      up.bits++;
      dn.bits--;
    }
    const double e = std::fabs(got - f);
    if (std::isinf(got)) {
      EXPECT_GE(std::fabs(f), 65504.0 + 16.0);
      continue;
    }
    EXPECT_LE(e, std::fabs(static_cast<float>(up) - f) + 0.0) << f;
    EXPECT_LE(e, std::fabs(static_cast<float>(dn) - f) + 0.0) << f;
  }
}

TEST(DTypeTest, Bfloat16Conversion) {
  std::uniform_real_distribution<float> d(-1e6f, 1e6f);
  for (int i = 0; i < 20000; ++i) {
    float f = d(rng());
    bfloat16_t b(f);
    double got = static_cast<float>(b);
    EXPECT_LE(std::fabs(got - f), std::fabs(f) * (1.0 / 256.0)) << f;
  }
  EXPECT_TRUE(std::isnan(static_cast<float>(bfloat16_t(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(ShapeTest, Broadcast) {
  Shape out;
  EXPECT_TRUE(broadcast_shapes({3, 1}, {1, 4}, out));
  EXPECT_EQ(out, (Shape{3, 4}));
  EXPECT_TRUE(broadcast_shapes({}, {2, 2}, out));
  EXPECT_EQ(out, (Shape{2, 2}));
  EXPECT_FALSE(broadcast_shapes({3}, {4}, out));
  EXPECT_EQ(to_string({2, -1}), "(2, ?)");
  EXPECT_EQ(normalize_axis(-1, 3), 2);
  EXPECT_EQ(normalize_axis(3, 3), -1);
}

// f32 values of every kind for the conversion tests: random bits, values near the half types'
// ranges, ties of f16 and of bf16 rounding, subnormals, overflow, infinities and NaNs (quiet and
// signaling, both signs).
std::vector<float> conversion_values() {
  std::mt19937 rng(12345);
  std::vector<float> values;
  for (int i = 0; i < 200000; ++i) {
    uint32_t u = rng();
    if (i % 4 == 1) u = (u & 0x83ffffffu) | 0x38000000u;  // near the half's range
    if (i % 4 == 2) u = (u & 0x8000e000u) | ((rng() % 40 + 100) << 23) | 0x1000u;  // f16 ties
    if (i % 8 == 3) u = (u & 0xffff0000u) | 0x8000u;                               // bf16 ties
    if (i % 8 == 7) u &= 0x807fffffu;                                              // f32 subnormals
    float f;
    std::memcpy(&f, &u, 4);
    values.push_back(f);
  }
  for (float f :
       {0.0f, -0.0f, 65504.0f, 65519.99f, 65520.0f, 5.96e-8f, 2.98e-8f, 2.99e-8f, 6.1e-5f,
        std::numeric_limits<float>::max(), -std::numeric_limits<float>::max(),
        std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::infinity(),
        -std::numeric_limits<float>::infinity(), std::nanf(""), -std::nanf(""),
        std::numeric_limits<float>::signaling_NaN(), -std::numeric_limits<float>::signaling_NaN()})
    values.push_back(f);
  return values;
}

// convert() between a half type H (f16, bf16) and f32 takes the CPU's vector instructions where
// it has them (F16C for f16, AVX-512 for bf16): every H bit pattern widened, and f32 values of
// every kind narrowed, must give H's scalar conversion's bits exactly, at every alignment and
// length (whole vectors and the rest).
template <typename H> void expect_conversions_match_scalar(DType h) {
  SCOPED_TRACE(name(h));
  std::vector<uint16_t> halves(65536);
  for (uint32_t b = 0; b < 65536; ++b) halves[b] = static_cast<uint16_t>(b);
  std::vector<float> widened(halves.size());
  convert(halves.data(), h, widened.data(), f32, static_cast<int64_t>(halves.size()));
  for (uint32_t b = 0; b < 65536; ++b) {
    H x;
    x.bits = static_cast<uint16_t>(b);
    const float want = static_cast<float>(x);
    uint32_t got_bits, want_bits;
    std::memcpy(&got_bits, &widened[b], 4);
    std::memcpy(&want_bits, &want, 4);
    ASSERT_EQ(got_bits, want_bits) << "bits " << b;
  }
  const std::vector<float> values = conversion_values();
  for (size_t off : {size_t{0}, size_t{1}, size_t{5}, size_t{15}}) {
    const int64_t n = static_cast<int64_t>(values.size() - off);
    std::vector<uint16_t> narrowed(static_cast<size_t>(n));
    convert(values.data() + off, f32, narrowed.data(), h, n);
    for (int64_t i = 0; i < n; ++i) {
      const float f = values[off + static_cast<size_t>(i)];
      uint32_t u;
      std::memcpy(&u, &f, 4);
      ASSERT_EQ(narrowed[static_cast<size_t>(i)], H(f).bits) << "f32 " << f << " bits " << u;
    }
  }
}

TEST(DTypeTest, ArrayConversionsOfHalvesMatchTheScalarOnes) {
  expect_conversions_match_scalar<float16_t>(f16);
  expect_conversions_match_scalar<bfloat16_t>(bf16);
}

// convert() between f32 and i32, i8, u8 takes AVX-512 where the CPU has it: the results must be
// the rule's (to an integer: truncation toward zero, saturation, NaN 0; to f32: the nearest
// value) for f32 values of every kind and every integer kind at the edges, at every alignment.
template <typename I> void expect_int_conversions_follow_the_rule(DType it) {
  SCOPED_TRACE(name(it));
  std::vector<float> values = conversion_values();
  for (float f : {0.5f, -0.5f, 0.999f, -0.999f, 127.5f, 128.f, -128.5f, -129.f, 255.5f, 256.f,
                  2147483520.f, 2147483648.f, -2147483648.f, -2147483904.f, 1e10f, -1e10f})
    values.push_back(f);
  std::mt19937 rng(7);
  for (int i = 0; i < 1000; ++i)
    values.push_back(std::uniform_real_distribution<float>(-300, 300)(rng));
  constexpr double lo = std::numeric_limits<I>::min(), hi = std::numeric_limits<I>::max();
  for (size_t off : {size_t{0}, size_t{3}, size_t{15}}) {
    const int64_t n = static_cast<int64_t>(values.size() - off);
    std::vector<I> ints(static_cast<size_t>(n));
    convert(values.data() + off, f32, ints.data(), it, n);
    for (int64_t i = 0; i < n; ++i) {
      const double v = values[off + static_cast<size_t>(i)];
      const I want = !(v == v) ? I(0) : v <= lo ? I(lo) : v >= hi ? I(hi) : static_cast<I>(v);
      ASSERT_EQ(ints[static_cast<size_t>(i)], want) << "f32 " << v;
    }
  }
  std::vector<I> ints;
  for (int i = 0; i < 100000; ++i) ints.push_back(static_cast<I>(rng()));
  for (I v : {std::numeric_limits<I>::min(), std::numeric_limits<I>::max(), I(0), I(-1), I(1)})
    ints.push_back(v);
  for (size_t off : {size_t{0}, size_t{5}}) {
    const int64_t n = static_cast<int64_t>(ints.size() - off);
    std::vector<float> floats(static_cast<size_t>(n));
    convert(ints.data() + off, it, floats.data(), f32, n);
    for (int64_t i = 0; i < n; ++i) {
      const I v = ints[off + static_cast<size_t>(i)];
      ASSERT_EQ(floats[static_cast<size_t>(i)], static_cast<float>(static_cast<double>(v))) << +v;
    }
  }
}

TEST(DTypeTest, ArrayConversionsBetweenF32AndIntegersFollowTheRule) {
  expect_int_conversions_follow_the_rule<int32_t>(i32);
  expect_int_conversions_follow_the_rule<int8_t>(i8);
  expect_int_conversions_follow_the_rule<uint8_t>(u8);
}

// Integer to integer: the value where the target holds it, else the nearer end of its range
// (i64 -> i32 wraps, as it always has), checked in 128-bit arithmetic on values near every
// type's ends and at random over 64 bits.
template <typename T> __int128 as128(const void* p, int64_t i) {
  return static_cast<__int128>(static_cast<const T*>(p)[i]);
}
__int128 value_at(DType t, const void* p, int64_t i) {
  switch (t) {
    case i8:
      return as128<int8_t>(p, i);
    case u8:
      return as128<uint8_t>(p, i);
    case i16:
      return as128<int16_t>(p, i);
    case u16:
      return as128<uint16_t>(p, i);
    case i32:
      return as128<int32_t>(p, i);
    case u32:
      return as128<uint32_t>(p, i);
    case i64:
      return as128<int64_t>(p, i);
    default:
      return as128<uint64_t>(p, i);
  }
}
void range_of(DType t, __int128& lo, __int128& hi) {
  const int bits = 8 * static_cast<int>(size_of(t));
  const __int128 one = 1;
  lo = is_signed(t) ? -(one << (bits - 1)) : 0;
  hi = is_signed(t) ? (one << (bits - 1)) - 1 : (one << bits) - 1;
}

TEST(DTypeTest, ArrayConversionsBetweenIntegersSaturate) {
  const DType ints[] = {i8, u8, i16, u16, i32, u32, i64, u64};
  std::uniform_int_distribution<uint64_t> bits64;
  std::uniform_int_distribution<int> near(-300, 300);
  for (DType st : ints) {
    __int128 lo, hi;
    range_of(st, lo, hi);
    // (values near both ends and 0, and random bit patterns, written as st's values)
    std::vector<__int128> src128;
    for (int k = 0; k < 3000; ++k) {
      __int128 v;
      switch (k % 4) {
        case 0:
          v = lo + (near(rng()) + 300);
          break;
        case 1:
          v = hi - (near(rng()) + 300);
          break;
        case 2:
          v = near(rng());
          break;
        default:
          v = static_cast<__int128>(bits64(rng())) % (hi - lo + 1) + lo;
      }
      src128.push_back(std::min(std::max(v, lo), hi));
    }
    const int64_t n = static_cast<int64_t>(src128.size());
    Array src = Array::empty({n}, st);
    for (int64_t i = 0; i < n; ++i) {
      const uint64_t b =
          static_cast<uint64_t>(src128[static_cast<size_t>(i)]);  // (two's complement)
      std::memcpy(static_cast<char*>(src.data()) + i * static_cast<int64_t>(size_of(st)), &b,
                  size_of(st));
    }
    for (int64_t i = 0; i < n; ++i)
      ASSERT_TRUE(value_at(st, src.data(), i) == src128[static_cast<size_t>(i)]);
    for (DType dt : ints) {
      const Array out = src.astype(dt);
      __int128 dlo, dhi;
      range_of(dt, dlo, dhi);
      for (int64_t i = 0; i < n; ++i) {
        const __int128 v = src128[static_cast<size_t>(i)];
        __int128 want = std::min(std::max(v, dlo), dhi);
        if (st == i64 && dt == i32) want = static_cast<int32_t>(static_cast<uint32_t>(v));
        ASSERT_TRUE(value_at(dt, out.data(), i) == want)
            << name(st) << " -> " << name(dt) << " of " << static_cast<long double>(v) << ": got "
            << static_cast<long double>(value_at(dt, out.data(), i));
      }
    }
  }
}

}  // namespace
}  // namespace kiln
