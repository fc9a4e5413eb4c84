// The 8-bit floats against their definitions: every code's value from the formats' fields, and
// rounding against the nearest code found by search (ties to the even code), saturating or not,
// from f64, f32, f16 and bf16, through convert and through the cast op.
#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "kiln/float8.h"
#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;

// A format as OCP FP8 and ONNX define it.
struct Spec {
  DType t;
  int ebits, mbits, bias;
  enum Kind { fn, fnuz, ieee } kind;  // fn: S.1111.111 is NaN, no infinity; fnuz: only 0x80 is NaN
  double max, min_subnormal;
  int nan_codes;
};
const Spec kSpecs[] = {
    {f8e4m3fn, 4, 3, 7, Spec::fn, 448, std::ldexp(1.0, -9), 2},
    {f8e4m3fnuz, 4, 3, 8, Spec::fnuz, 240, std::ldexp(1.0, -10), 1},
    {f8e5m2, 5, 2, 15, Spec::ieee, 57344, std::ldexp(1.0, -16), 6},
    {f8e5m2fnuz, 5, 2, 16, Spec::fnuz, 57344, std::ldexp(1.0, -17), 1},
};

// The value of `code` from its sign, exponent and mantissa fields.
double value_of(const Spec& s, int code) {
  const bool neg = code & 0x80;
  const int e = (code >> s.mbits) & ((1 << s.ebits) - 1), m = code & ((1 << s.mbits) - 1);
  const int all_e = (1 << s.ebits) - 1, all_m = (1 << s.mbits) - 1;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  if (s.kind == Spec::fnuz && code == 0x80) return nan;
  if (s.kind == Spec::ieee && e == all_e) return m ? nan : (neg ? -INFINITY : INFINITY);
  if (s.kind == Spec::fn && e == all_e && m == all_m) return nan;
  const double frac = static_cast<double>(m) / std::pow(2.0, s.mbits);
  const double v =
      e == 0 ? frac * std::pow(2.0, 1 - s.bias) : (1 + frac) * std::pow(2.0, e - s.bias);
  return neg ? -v : v;
}

double decoded(const Spec& s, uint8_t code) {
  double d;
  convert(&code, s.t, &d, f64, 1);
  return d;
}

// The finite non-negative codes of a format in increasing order (below the sign bit, codes
// increase with their values).
std::vector<int> finite_codes(const Spec& s) {
  std::vector<int> codes;
  for (int c = 0; c < 0x80; ++c)
    if (std::isfinite(value_of(s, c))) codes.push_back(c);
  return codes;
}

// The code kiln should give for x: the nearest finite value (ties to the code whose last bit is
// 0), found by search; past the largest value by half its spacing or more (a tie there going to
// the even side), the largest where saturating, else infinity (ieee) or NaN.
uint8_t nearest_code(const Spec& s, double x, bool saturate) {
  const uint8_t nan = s.kind == Spec::fnuz ? 0x80 : 0x7f;
  if (std::isnan(x)) return nan;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  const double a = std::fabs(x);
  static thread_local std::vector<int> codes[4];
  std::vector<int>& cs = codes[static_cast<int>(s.t) - static_cast<int>(f8e4m3fn)];
  if (cs.empty()) cs = finite_codes(s);
  const int top = cs.back();
  const double spacing = value_of(s, top) - value_of(s, cs[cs.size() - 2]);
  int best = -1;
  if (a > s.max) {
    const double half = s.max + spacing / 2;
    const bool rounds_down = a < half || (a == half && top % 2 == 0);
    if (rounds_down) best = top;
  } else {  // the two codes around a, the nearer (or the even one) wins
    const auto hi = std::lower_bound(cs.begin(), cs.end(), a,
                                     [&](int c, double v) { return value_of(s, c) < v; });
    best = *hi;
    if (hi != cs.begin()) {
      const int lo = *(hi - 1);
      const double dl = a - value_of(s, lo), dh = value_of(s, *hi) - a;
      if (dl < dh || (dl == dh && lo % 2 == 0)) best = lo;
    }
  }
  if (best < 0) {  // overflow
    if (saturate) return static_cast<uint8_t>(sign | top);
    return s.kind == Spec::ieee ? static_cast<uint8_t>(sign | (((1 << s.ebits) - 1) << s.mbits))
                                : nan;
  }
  if (best == 0 && s.kind == Spec::fnuz) return 0;  // no -0
  return static_cast<uint8_t>(sign | best);
}

// Whether two codes mean the same: equal, or both NaN.
bool same_code(const Spec& s, uint8_t a, uint8_t b) {
  return a == b || (std::isnan(value_of(s, a)) && std::isnan(value_of(s, b)));
}

TEST(Float8, EveryCodeHasItsFormatsValue) {
  for (const Spec& s : kSpecs) {
    SCOPED_TRACE(name(s.t));
    EXPECT_EQ(size_of(s.t), 1u);
    EXPECT_TRUE(is_float8(s.t));
    EXPECT_FALSE(is_floating(s.t));
    int nans = 0, infs = 0;
    double most = 0, least = INFINITY;
    for (int c = 0; c < 256; ++c) {
      const double want = value_of(s, c);
      const auto code = static_cast<uint8_t>(c);
      for (DType to : {f64, f32, f16, bf16}) {  // every value is exact in each
        Array one = Array::from_data(&code, {1}, s.t).astype(to).astype(f64);
        const double got = one.to_vector<double>()[0];
        if (std::isnan(want)) {
          EXPECT_TRUE(std::isnan(got)) << "code " << c << " to " << name(to);
        } else {
          EXPECT_EQ(got, want) << "code " << c << " to " << name(to);
          EXPECT_EQ(std::signbit(got), std::signbit(want)) << "code " << c;
        }
      }
      nans += std::isnan(want);
      infs += std::isinf(want);
      if (std::isfinite(want)) most = std::max(most, want);
      if (std::isfinite(want) && want > 0) least = std::min(least, want);
    }
    // the formats' published figures
    EXPECT_EQ(nans, s.nan_codes);
    EXPECT_EQ(infs, s.kind == Spec::ieee ? 2 : 0);
    EXPECT_EQ(most, s.max);
    EXPECT_EQ(static_cast<double>(f8::format(s.t).max), s.max);
    EXPECT_EQ(least, s.min_subnormal);
  }
}

// Values around every code: the codes' values, the midpoints between neighbours (ties), the
// doubles or floats next to them, past the largest value, the specials, and random values.
std::vector<double> probes(const Spec& s, bool single) {
  std::vector<double> v;
  std::vector<double> finite;
  for (int c : finite_codes(s)) finite.push_back(value_of(s, c));
  const double spacing = finite.back() - finite[finite.size() - 2];
  finite.push_back(s.max + spacing);  // (the value the next code would have)
  auto next = [&](double x, double to) {
    return single
               ? static_cast<double>(std::nextafter(static_cast<float>(x), static_cast<float>(to)))
               : std::nextafter(x, to);
  };
  for (size_t k = 0; k < finite.size(); ++k) {
    const double x = finite[k];
    v.insert(v.end(), {x, next(x, INFINITY), next(x, 0)});
    if (k + 1 < finite.size()) {
      const double mid = (x + finite[k + 1]) / 2;
      v.insert(v.end(), {mid, next(mid, INFINITY), next(mid, 0)});
    }
  }
  v.insert(v.end(), {s.max * 4, 1e30, INFINITY, std::numeric_limits<double>::quiet_NaN(),
                     s.min_subnormal / 2, s.min_subnormal / 4, 1e-30});
  std::uniform_real_distribution<double> exponent(-20, 17);
  for (int i = 0; i < 4000; ++i) v.push_back(std::exp2(exponent(rng())));
  const size_t n = v.size();
  for (size_t i = 0; i < n; ++i) v.push_back(-v[i]);
  if (single)
    for (double& x : v) x = static_cast<double>(static_cast<float>(x));
  return v;
}

TEST(Float8, RoundsToTheNearestCodeTiesToEven) {
  for (const Spec& s : kSpecs) {
    for (bool saturate : {true, false}) {
      for (DType from : {f64, f32}) {
        SCOPED_TRACE(
            fmt::format("{} from {}{}", name(s.t), name(from), saturate ? "" : ", not saturating"));
        const std::vector<double> x = probes(s, from == f32);
        Array src = Array::from_data(x.data(), {static_cast<int64_t>(x.size())}, f64).astype(from);
        std::vector<uint8_t> got(x.size());
        convert(src.data(), from, got.data(), s.t, static_cast<int64_t>(x.size()), saturate);
        int bad = 0;
        for (size_t i = 0; i < x.size(); ++i) {
          const uint8_t want = nearest_code(s, x[i], saturate);
          if (!same_code(s, got[i], want) && bad++ < 5)
            ADD_FAILURE() << fmt::format("{:.17g}: code {:#04x} ({}), expected {:#04x} ({})", x[i],
                                         got[i], decoded(s, got[i]), want, value_of(s, want));
        }
        EXPECT_EQ(bad, 0);
      }
    }
  }
}

// From the 16-bit floats (every f16 and bf16 value, through f32 exactly) and between the formats.
TEST(Float8, RoundsFromHalvesAndBetweenFormats) {
  for (const Spec& s : kSpecs) {
    SCOPED_TRACE(name(s.t));
    for (DType half : {f16, bf16}) {
      std::vector<uint16_t> bits(0x10000);
      for (uint32_t b = 0; b < 0x10000; ++b) bits[b] = static_cast<uint16_t>(b);
      Array h = Array::from_data(bits.data(), {0x10000}, half);
      const std::vector<double> x = h.to_vector<double>();
      for (bool saturate : {true, false}) {
        std::vector<uint8_t> got(x.size());
        convert(h.data(), half, got.data(), s.t, 0x10000, saturate);
        int bad = 0;
        for (size_t i = 0; i < x.size(); ++i)
          bad += !same_code(s, got[i], nearest_code(s, x[i], saturate));
        EXPECT_EQ(bad, 0) << "from " << name(half) << (saturate ? "" : ", not saturating");
      }
    }
    for (const Spec& o : kSpecs) {
      std::vector<uint8_t> codes(256), got(256);
      for (int c = 0; c < 256; ++c) codes[static_cast<size_t>(c)] = static_cast<uint8_t>(c);
      convert(codes.data(), o.t, got.data(), s.t, 256, false);
      for (int c = 0; c < 256; ++c)
        EXPECT_TRUE(
            same_code(s, got[static_cast<size_t>(c)], nearest_code(s, value_of(o, c), false)))
            << name(o.t) << " code " << c;
    }
  }
}

// The cast op on the CPU: saturating by default, the attribute's choice otherwise; and the ops
// that move bytes take the 8-bit floats as they are.
TEST(Float8, CastOpAndByteMovingOps) {
  for (const Spec& s : kSpecs) {
    SCOPED_TRACE(name(s.t));
    const std::vector<double> x = probes(s, true);
    const auto n = static_cast<int64_t>(x.size());
    Graph g;
    Tensor in = g.placeholder({n}, f32, "x");
    Tensor sat = cast(in, s.t), wrap = cast(in, s.t, false);
    Tensor moved = reshape(transpose(reshape(sat, {2, n / 2}), {1, 0}), {n});
    Tensor back = cast(wrap, f32);
    auto exe = g.compile(Device::cpu(), {}, {sat, wrap, moved, back});
    const Array a = Array::from_data(x.data(), {n}, f64).astype(f32);
    const std::vector<Array> out = exe.run({{in, a}});
    ASSERT_EQ(out[0].dtype(), s.t);
    const auto* p0 = static_cast<const uint8_t*>(out[0].data());
    const auto* p1 = static_cast<const uint8_t*>(out[1].data());
    const auto* p2 = static_cast<const uint8_t*>(out[2].data());
    const std::vector<double> b = out[3].to_vector<double>();
    int bad = 0;
    for (int64_t i = 0; i < n; ++i) {
      const auto k = static_cast<size_t>(i);
      const uint8_t want_sat = nearest_code(s, x[k], true), want = nearest_code(s, x[k], false);
      bad += !same_code(s, p0[i], want_sat) || !same_code(s, p1[i], want);
      const int64_t j = (i % 2) * (n / 2) + i / 2;  // transposed from (2, n/2)
      bad += p2[i] != p0[j];
      const double v = value_of(s, want);
      bad += std::isnan(v) ? !std::isnan(b[k]) : b[k] != v;
    }
    EXPECT_EQ(bad, 0);
  }
  // bitcast to and from u8: the codes as they are
  Graph g;
  Tensor in = g.placeholder({256}, u8, "codes");
  Tensor round_trip = bitcast(bitcast(in, f8e5m2), u8);
  std::vector<uint8_t> codes(256);
  for (int c = 0; c < 256; ++c) codes[static_cast<size_t>(c)] = static_cast<uint8_t>(c);
  const Array a = Array::from_data(codes.data(), {256}, u8);
  EXPECT_EQ(g.compile(Device::cpu(), {}, {round_trip}).run({{in, a}})[0].to_vector<int64_t>(),
            a.to_vector<int64_t>());
  // arithmetic is refused with the dtype named
  expect_error<DTypeError>([&] { add(cast(in, f8e4m3fn), cast(in, f8e4m3fn)); }, {"f8e4m3fn"});
}

TEST(Float8, PromotionAndNames) {
  for (const Spec& s : kSpecs) {
    EXPECT_EQ(parse_dtype(name(s.t)), s.t);
    EXPECT_EQ(promote(s.t, s.t), s.t);
    EXPECT_EQ(promote(s.t, f16), f32);
    EXPECT_EQ(promote(bf16, s.t), f32);
    EXPECT_EQ(promote(s.t, f64), f64);
    EXPECT_EQ(promote(s.t, i32), f32);
    EXPECT_EQ(promote(boolean, s.t), s.t);
  }
  EXPECT_EQ(promote(f8e4m3fn, f8e5m2), f32);
}

}  // namespace
}  // namespace kiln
