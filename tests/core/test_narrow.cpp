// The narrow types besides the 8-bit floats (test_float8.cpp) against their definitions: every
// code's value from the formats' fields, rounding against the nearest value found by search (ties
// to even) or, for f8e8m0fnu, against ONNX's rules written with frexp, from f64 and f32, through
// convert and through the cast op; and the dtype properties the rest of kiln relies on.
#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "core/graph_impl.h"
#include "core/op_id.h"
#include "kiln/narrow.h"
#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;

const double kNaN = std::numeric_limits<double>::quiet_NaN();

// f4e2m1fn's value from its fields: S.EE.M, bias 1, no infinity or NaN (OCP MX).
double e2m1_value(int code) {
  const int e = (code >> 1) & 3, m = code & 1;
  const double v = e == 0 ? m * 0.5 : std::ldexp(1 + m / 2.0, e - 1);
  return code & 8 ? -v : v;
}
// The integers' two's complement codes.
int int_bits(DType t) { return t == i4 || t == u4 ? 4 : 2; }
bool int_signed(DType t) { return t == i4 || t == i2; }
double int_value(DType t, int code) {
  const int n = int_bits(t);
  code &= (1 << n) - 1;
  return int_signed(t) && code >= (1 << (n - 1)) ? code - (1 << n) : code;
}
double e8m0_value(int code) { return code == 255 ? kNaN : std::ldexp(1.0, code - 127); }

double value_of(DType t, int code) {
  if (t == f4e2m1fn) return e2m1_value(code & 15);
  if (t == f8e8m0fnu) return e8m0_value(code);
  return int_value(t, code);
}
int num_codes(DType t) { return t == f8e8m0fnu ? 256 : t == f4e2m1fn ? 16 : 1 << int_bits(t); }

double decoded(DType t, uint8_t code) {
  double d;
  convert(&code, t, &d, f64, 1);
  return d;
}

// f4e2m1fn's code for x: the nearest of its values by search, a tie to the even code; past 6,
// infinities too, 6 with x's sign; NaN +6.
uint8_t e2m1_code(double x) {
  if (std::isnan(x)) return 7;
  const uint8_t sign = std::signbit(x) ? 8 : 0;
  const double a = std::fabs(x);
  if (a > 6) return static_cast<uint8_t>(sign | 7);  // (1e30 is as far from 4 as from 6)
  int best = 0;
  for (int c = 1; c < 8; ++c) {
    const double d = std::fabs(e2m1_value(c) - a), bd = std::fabs(e2m1_value(best) - a);
    if (d < bd || (d == bd && c % 2 == 0)) best = c;
  }
  return static_cast<uint8_t>(sign | best);
}
// An integer type's code for x: the nearest integer (ties to even), clamped; NaN 0.
uint8_t int_code(DType t, double x) {
  if (std::isnan(x)) return 0;
  const int n = int_bits(t);
  const double lo = int_signed(t) ? -(1 << (n - 1)) : 0;
  const double hi = int_signed(t) ? (1 << (n - 1)) - 1 : (1 << n) - 1;
  double r = std::floor(x);
  if (x - r > 0.5 || (x - r == 0.5 && std::fmod(r, 2) != 0)) r += 1;
  r = std::min(std::max(r, lo), hi);
  return static_cast<uint8_t>(static_cast<int>(r) & ((1 << n) - 1));
}
// f8e8m0fnu's code for x (ONNX's Cast, written with frexp): |x| = m 2^e, m in [1, 2), gives code
// e + 127, plus one where rounding up says (up: m > 1; nearest: m >= 1.5); an f32 subnormal (below
// 2^-126, code 0's 2^-127 then counting as m 2^-127 with m in [0, 2)) rounds up to code 1 where
// m > 0 (up) or m > 1 (nearest). Past code 254, 254 where saturating, else NaN; infinities and
// NaN give NaN.
uint8_t e8m0_code(float xf, narrow::Round round, bool saturate) {
  const double x = std::fabs(static_cast<double>(xf));
  if (!std::isfinite(x)) return 255;
  int code;
  bool up;
  if (x < std::ldexp(1.0, -126)) {
    const double m = x / std::ldexp(1.0, -127);
    code = 0;
    up = round == narrow::Round::up ? m > 0 : round == narrow::Round::nearest ? m > 1 : false;
  } else {
    int e2;
    const double m = 2 * std::frexp(x, &e2);  // in [1, 2)
    code = e2 - 1 + 127;
    up = round == narrow::Round::up ? m > 1 : round == narrow::Round::nearest ? m >= 1.5 : false;
  }
  if (up) code = code == 254 && saturate ? 254 : code + 1;
  return static_cast<uint8_t>(code);
}

constexpr DType kTypes[] = {f8e8m0fnu, f4e2m1fn, i4, u4, i2, u2};

TEST(Narrow, DTypeProperties) {
  for (DType t : kTypes) {
    SCOPED_TRACE(name(t));
    EXPECT_EQ(size_of(t), 1u);
    EXPECT_TRUE(is_narrow(t));
    EXPECT_FALSE(is_floating(t));
    EXPECT_FALSE(is_integer(t));
    EXPECT_FALSE(is_float8(t));
    EXPECT_EQ(parse_dtype(name(t)), t);
    EXPECT_EQ(promote(t, f32), f32);
    EXPECT_EQ(promote(t, f64), f64);
    EXPECT_EQ(promote(t, i32), f32);
  }
  EXPECT_TRUE(is_signed(i4) && is_signed(i2) && is_signed(f4e2m1fn));
  EXPECT_FALSE(is_signed(u4) || is_signed(u2) || is_signed(f8e8m0fnu));
  for (DType t : {f8e4m3fn, f8e5m2fnuz}) EXPECT_TRUE(is_narrow(t));
  for (DType t : {f32, bf16, i8, u8, u64, boolean}) EXPECT_FALSE(is_narrow(t));
}

TEST(Narrow, EveryCodeHasItsFormatsValue) {
  for (DType t : kTypes) {
    SCOPED_TRACE(name(t));
    for (int c = 0; c < 256; ++c) {
      // (a 4- or 2-bit type's byte above its code is ignored)
      const double want = value_of(t, c);
      const auto code = static_cast<uint8_t>(t == f4e2m1fn ? c & 15 : c);
      for (DType to : {f64, f32, f16, bf16}) {
        if (t == f8e8m0fnu && to != f64 && to != f32) continue;  // (2^±127 is past the halves)
        const double got = Array::from_data(&code, {1}, t).astype(to).to_vector<double>()[0];
        if (std::isnan(want)) EXPECT_TRUE(std::isnan(got)) << "code " << c;
        else EXPECT_EQ(got, want) << "code " << c << " to " << name(to);
      }
    }
    // the formats' published ranges
    double lo = INFINITY, hi = -INFINITY;
    for (int c = 0; c < num_codes(t); ++c)
      if (std::isfinite(value_of(t, c)))
        lo = std::min(lo, value_of(t, c)), hi = std::max(hi, value_of(t, c));
    const std::pair<double, double> range =
        t == f4e2m1fn    ? std::pair{-6.0, 6.0}
        : t == f8e8m0fnu ? std::pair{std::ldexp(1.0, -127), std::ldexp(1.0, 127)}
        : t == i4        ? std::pair{-8.0, 7.0}
        : t == u4        ? std::pair{0.0, 15.0}
        : t == i2        ? std::pair{-2.0, 1.0}
                         : std::pair{0.0, 3.0};
    EXPECT_EQ(lo, range.first);
    EXPECT_EQ(hi, range.second);
  }
}

// Values around every code: the values, the midpoints between neighbours (ties), the numbers next
// to them, far past the range, specials, and random values of both signs.
std::vector<double> probes(DType t) {
  std::vector<double> v;
  std::vector<double> values;
  for (int c = 0; c < num_codes(t); ++c)
    if (std::isfinite(value_of(t, c))) values.push_back(value_of(t, c));
  std::sort(values.begin(), values.end());
  values.push_back(values.back() * 2);
  for (size_t k = 0; k < values.size(); ++k) {
    const double x = values[k];
    v.insert(v.end(), {x, std::nextafter(x, INFINITY), std::nextafter(x, -INFINITY)});
    if (k + 1 < values.size()) {
      const double mid = (x + values[k + 1]) / 2, m15 = x * 1.5;
      v.insert(v.end(), {mid, std::nextafter(mid, INFINITY), std::nextafter(mid, -INFINITY), m15,
                         std::nextafter(m15, INFINITY), std::nextafter(m15, -INFINITY)});
    }
  }
  v.insert(v.end(), {0.0, -0.0, 1e30, -1e30, INFINITY, -INFINITY, kNaN, 1e-40, 3e-39, 1e-45,
                     static_cast<double>(std::numeric_limits<float>::max())});
  std::uniform_real_distribution<double> exponent(-30, 30);
  for (int i = 0; i < 2000; ++i) v.push_back(std::exp2(exponent(rng())));
  std::uniform_real_distribution<double> near(-20, 20);
  for (int i = 0; i < 2000; ++i) v.push_back(near(rng()));
  const size_t n = v.size();
  for (size_t i = 0; i < n; ++i) v.push_back(-v[i]);
  return v;
}

TEST(Narrow, RoundsAsItsRulesSay) {
  const narrow::Round rounds[] = {narrow::Round::up, narrow::Round::down, narrow::Round::nearest};
  for (DType t : kTypes) {
    for (DType from : {f64, f32}) {
      for (narrow::Round round : rounds) {
        for (bool saturate : {true, false}) {
          if (t != f8e8m0fnu && (round != narrow::Round::up || !saturate)) continue;
          SCOPED_TRACE(fmt::format("{} from {}, round {}{}", name(t), name(from),
                                   static_cast<int>(round), saturate ? "" : ", not saturating"));
          std::vector<double> x = probes(t);
          if (from == f32)
            for (double& v : x) v = static_cast<double>(static_cast<float>(v));
          const Array src =
              Array::from_data(x.data(), {static_cast<int64_t>(x.size())}, f64).astype(from);
          std::vector<uint8_t> got(x.size());
          convert(src.data(), from, got.data(), t, static_cast<int64_t>(x.size()), saturate, round);
          int bad = 0;
          for (size_t i = 0; i < x.size(); ++i) {
            // (f8e8m0fnu rounds from x's f32 bits, as ONNX does)
            const uint8_t want = t == f8e8m0fnu
                                     ? e8m0_code(static_cast<float>(x[i]), round, saturate)
                                 : t == f4e2m1fn ? e2m1_code(x[i])
                                                 : int_code(t, x[i]);
            if (got[i] != want && bad++ < 5)
              ADD_FAILURE() << fmt::format("{:.17g}: code {:#04x} ({}), expected {:#04x} ({})",
                                           x[i], got[i], decoded(t, got[i]), want,
                                           value_of(t, want));
          }
          EXPECT_EQ(bad, 0);
        }
      }
    }
  }
}

// From the integer types: the nearest value in range (i64's extremes too), through the cast op on
// the CPU; and between the narrow types, every code.
TEST(Narrow, FromIntegersAndBetweenNarrowTypes) {
  const std::vector<int64_t> ints = {0,
                                     1,
                                     -1,
                                     2,
                                     -2,
                                     3,
                                     -3,
                                     7,
                                     -8,
                                     8,
                                     -9,
                                     15,
                                     16,
                                     100,
                                     -100,
                                     1000,
                                     int64_t{1} << 40,
                                     std::numeric_limits<int64_t>::min(),
                                     std::numeric_limits<int64_t>::max()};
  for (DType t : kTypes) {
    SCOPED_TRACE(name(t));
    for (DType from : {i64, i32, i8, u8}) {
      Array src = Array::from_data(ints.data(), {static_cast<int64_t>(ints.size())}, i64);
      if (from == u8 || from == i8) src = src.astype(f64).astype(i32);  // (saturated first)
      src = src.astype(from);
      Graph g;
      Tensor in = g.placeholder(src.shape(), from, "x");
      auto exe = g.compile(Device::cpu(), {}, {cast(in, t)});
      const Array out = exe.run({{in, src}})[0];
      const auto* codes = static_cast<const uint8_t*>(out.data());
      const std::vector<double> v = src.to_vector<double>();
      for (size_t i = 0; i < v.size(); ++i) {
        // (through f32, exactly as the code goes: integers past 2^24 keep their sign and size)
        const double xf = static_cast<double>(static_cast<float>(v[i]));
        const uint8_t want = t == f8e8m0fnu
                                 ? e8m0_code(static_cast<float>(xf), narrow::Round::up, true)
                             : t == f4e2m1fn ? e2m1_code(xf)
                                             : int_code(t, xf);
        EXPECT_EQ(codes[i], want) << name(from) << " " << v[i];
      }
    }
    for (DType o : kTypes) {
      if (o == t) continue;  // (a copy, bytes as they are)
      std::vector<uint8_t> codes(256), got(256);
      for (int c = 0; c < 256; ++c) codes[static_cast<size_t>(c)] = static_cast<uint8_t>(c);
      convert(codes.data(), o, got.data(), t, 256);
      for (int c = 0; c < 256; ++c) {
        const double v = value_of(o, c);
        const uint8_t want = t == f8e8m0fnu
                                 ? e8m0_code(static_cast<float>(v), narrow::Round::up, true)
                             : t == f4e2m1fn ? e2m1_code(v)
                                             : int_code(t, v);
        EXPECT_EQ(got[static_cast<size_t>(c)], want) << name(o) << " code " << c;
      }
    }
  }
}

// The cast op: the rounding attribute, a bad one refused, and the byte-moving ops.
TEST(Narrow, CastOpRoundingAndByteMovingOps) {
  const std::vector<float> x = {0.f, 0.124f, 0.25f, 0.5f, 1.1f, 1.5f, 2.9f, 3e38f, -6.f, NAN};
  const auto n = static_cast<int64_t>(x.size());
  Graph g;
  Tensor in = g.placeholder({n}, f32, "x");
  std::vector<Tensor> outs;
  const narrow::Round rounds[] = {narrow::Round::up, narrow::Round::down, narrow::Round::nearest};
  for (narrow::Round r : rounds)
    for (bool saturate : {true, false}) outs.push_back(cast(in, f8e8m0fnu, {saturate, r}));
  Tensor q = cast(in, i4);
  outs.push_back(reshape(transpose(reshape(q, {2, n / 2}), {1, 0}), {n}));
  outs.push_back(bitcast(q, u8));
  auto exe = g.compile(Device::cpu(), {}, outs);
  const std::vector<Array> got = exe.run({{in, Array::from_data(x.data(), {n}, f32)}});
  size_t k = 0;
  for (narrow::Round r : rounds) {
    for (bool saturate : {true, false}) {
      ASSERT_EQ(got[k].dtype(), f8e8m0fnu);
      const auto* c = static_cast<const uint8_t*>(got[k++].data());
      for (int64_t i = 0; i < n; ++i)
        EXPECT_EQ(c[i], e8m0_code(x[static_cast<size_t>(i)], r, saturate))
            << x[static_cast<size_t>(i)] << " round " << static_cast<int>(r) << " " << saturate;
    }
  }
  const auto* moved = static_cast<const uint8_t*>(got[k++].data());
  const auto* bytes = static_cast<const uint8_t*>(got[k].data());
  for (int64_t i = 0; i < n; ++i) {
    const int64_t j = (i % 2) * (n / 2) + i / 2;  // transposed from (2, n/2)
    EXPECT_EQ(moved[i], int_code(i4, x[static_cast<size_t>(j)]));
    EXPECT_EQ(bytes[i], int_code(i4, x[static_cast<size_t>(i)]));  // the code, high bits 0
  }
  Graph bad;
  Tensor b = bad.placeholder({2}, f32, "x");
  expect_error<ValueError>(
      [&] {
        detail::make_node1(OpId::Cast, {b},
                           Attrs{{"dtype", f8e8m0fnu}, {"round", std::string("sideways")}});
      },
      {"[cast] round must be", "sideways"});
}

}  // namespace
}  // namespace kiln
