// quantize, dequantize and fake_quantize against numpy-style reference loops: x / scale in x's
// float type, round half to even (std::nearbyint), + zero point, saturate (NaN low), and
// (q as f32 - zp as f32) * scale. Results must match bit for bit. The scale of each element is
// found from its multi-index, independently of the kernels' row walk. Numpy's own results are
// checked in tests/quant/test_quant_golden.cpp.
#include <cmath>
#include <limits>

#include "kiln/ops/quant.h"
#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;

struct Layout {
  Shape x;
  int64_t axis = 0, block = 0;
  bool per_tensor = true;
  Shape scale() const {
    if (per_tensor) return {};
    if (block == 0) return {x[axis]};
    Shape s = x;
    s[axis] = (x[axis] + block - 1) / block;
    return s;
  }
  // The scale index of element i of x.
  int64_t index(int64_t i) const {
    if (per_tensor) return 0;
    std::vector<int64_t> idx = unravel(i, x);
    if (block == 0) return idx[axis];
    idx[axis] /= block;
    return ravel(idx, scale());
  }
};

std::pair<double, double> range_of(DType t) {
  switch (t) {
    case u8:
      return {0, 255};
    case i8:
      return {-128, 127};
    default:
      return {-32768, 32767};
  }
}

// numpy: rint(x / s) in x's type, + zp, clip, NaN -> low.
template <typename T>
double ref_quantize(T x, T s, double zp, DType qt) {
  const auto [lo, hi] = range_of(qt);
  const double r = static_cast<double>(std::nearbyint(x / s)) + zp;
  return std::isnan(r) ? lo : std::min(hi, std::max(lo, r));
}

std::vector<double> ref_quantize_all(const Array& x, const Array& s, const Array& zp,
                                     const Layout& l, DType qt) {
  const auto vz = to_f64(zp);
  std::vector<double> out(static_cast<size_t>(x.numel()));
  for (int64_t i = 0; i < x.numel(); ++i) {
    const int64_t k = l.index(i);
    out[i] = x.dtype() == f32
                 ? ref_quantize<float>(x.data<float>()[i], s.data<float>()[k], vz[k], qt)
                 : ref_quantize<double>(x.data<double>()[i], s.data<double>()[k], vz[k], qt);
  }
  return out;
}

// (float(q) - float(zp)) * s in s's type.
std::vector<double> ref_dequantize_all(const std::vector<double>& q, const Array& s,
                                       const Array& zp, const Layout& l) {
  const auto vz = to_f64(zp);
  std::vector<double> out(q.size());
  for (size_t i = 0; i < q.size(); ++i) {
    const int64_t k = l.index(static_cast<int64_t>(i));
    const float d = static_cast<float>(q[i]) - static_cast<float>(vz[k]);
    out[i] = s.dtype() == f32 ? static_cast<double>(d * s.data<float>()[k])
                              : static_cast<double>(d) * s.data<double>()[k];
  }
  return out;
}

// Exact comparison that treats -0 and 0 alike and NaN as equal to NaN.
void expect_bits(const Array& a, const std::vector<double>& ref) {
  const auto v = to_f64(a);
  ASSERT_EQ(v.size(), ref.size());
  int bad = 0;
  for (size_t i = 0; i < v.size() && bad < 5; ++i)
    if (!(v[i] == ref[i] || (std::isnan(v[i]) && std::isnan(ref[i])))) {
      ADD_FAILURE() << "element " << i << ": " << v[i] << " != " << ref[i];
      ++bad;
    }
}

std::vector<Layout> layouts() {
  return {{{257}, 0, 0, true},      {{3, 4, 5}, 1, 0, false}, {{6, 7}, 0, 0, false},
          {{2, 3, 9}, 2, 0, false}, {{6, 10}, 1, 4, false},   {{5, 6, 3}, 0, 2, false},
          {{4, 8}, 1, 8, false},    {{0, 3}, 1, 0, false}};
}

// Scales around 0.02-0.1 and x spread so that a part saturates; zero points across the range.
struct Params {
  Array s, zp;
};
Params random_params(const Layout& l, DType xt, DType qt) {
  const auto [lo, hi] = range_of(qt);
  const double zlo = qt == i16 ? -300 : lo / 4 + (qt == u8 ? 64 : 0),
               zhi = zlo + (qt == i16 ? 600 : 64);
  return {random_array(l.scale(), f64, 0.02, 0.1).astype(xt),
          random_ints(l.scale(), static_cast<int64_t>(zlo), static_cast<int64_t>(zhi), qt)};
}

TEST(Quantize, MatchesNumpyReferenceBitForBit) {
  for (const Layout& l : layouts())
    for (DType xt : {f32, f64})
      for (DType qt : {i8, u8, i16}) {
        SCOPED_TRACE(::testing::Message() << to_string(l.x) << " axis " << l.axis << " block "
                                          << l.block << " " << name(xt) << "->" << name(qt));
        const double span = qt == i16 ? 2000 : 12;
        const Array x = random_array(l.x, xt, -span, span);
        const Params p = random_params(l, xt, qt);
        Graph g;
        auto px = g.placeholder(l.x, xt, "x");
        const Tensor q = quantize(px, g.constant(p.s), g.constant(p.zp), {l.axis, l.block});
        EXPECT_EQ(q.dtype(), qt);
        const Array y = eval1(g, q, {{px, x}});
        EXPECT_EQ(y.dtype(), qt);
        expect_bits(y, ref_quantize_all(x, p.s, p.zp, l, qt));
      }
}

TEST(Quantize, RoundsHalfToEvenAndSaturates) {
  // scale 0.5: x = k / 4 divides exactly onto halves; NaN goes low, infinities saturate
  std::vector<float> xs;
  for (int k = -20; k <= 20; ++k) xs.push_back(static_cast<float>(k) * 0.25f);
  const float inf = std::numeric_limits<float>::infinity();
  for (float v : {std::nanf(""), inf, -inf, 1e30f, -1e30f, 63.75f, -64.25f}) xs.push_back(v);
  const Array x = Array::from_vector(xs, {static_cast<int64_t>(xs.size())});
  Graph g;
  auto px = g.placeholder(x.shape(), f32, "x");
  const Tensor s = g.constant(Array::scalar(0.5f));
  const auto y = eval(g, {quantize(px, s, i8), quantize(px, s, u8)}, {{px, x}});
  const auto q8 = to_f64(y[0]), qu = to_f64(y[1]);
  for (size_t i = 0; i < 41; ++i) {
    const double h = static_cast<double>(xs[i]) * 2;  // the exact quotient: k or k + 0.5
    const double f = std::floor(h);
    const double want = h == f ? h : (std::fmod(f, 2) == 0 ? f : f + 1);  // ties to even
    EXPECT_EQ(q8[i], want) << "x " << xs[i];
    EXPECT_EQ(qu[i], std::max(0.0, want)) << "x " << xs[i];
  }
  EXPECT_EQ(q8[41], -128);  // NaN
  EXPECT_EQ(qu[41], 0);
  EXPECT_EQ(q8[42], 127);
  EXPECT_EQ(q8[43], -128);
  EXPECT_EQ(q8[44], 127);
  EXPECT_EQ(q8[45], -128);
  EXPECT_EQ(q8[46], 127);   // 127.5 rounds to 128 (even), saturates
  EXPECT_EQ(q8[47], -128);  // -128.5 rounds to -128
  EXPECT_EQ(qu[44], 255);
}

// 8-bit outputs of f32 data take their sum rint(x / s) + zp in f32 (quant_math.h): exact while
// |rint(x / s)| <= 2^24, and saturated the same way as the double reference beyond. Quotients
// around 2^24 and 2^25, up to the largest float, with zero points at both ends of the range; x
// and s in several scale ranges.
TEST(Quantize, LargeQuotientsSaturateAsInDouble) {
  std::vector<float> qs;
  for (float m : {16777216.f, 33554432.f, 1e30f, 3.4e38f})
    for (float d : {-3.f, -1.f, 0.f, 1.f, 2.f}) qs.push_back(m + d * (m > 4e7f ? m * 1e-6f : 1.f));
  for (float v : {-300.f, -256.f, -200.f, -129.f, -128.f, 127.f, 128.f, 200.f, 255.f, 300.f})
    qs.push_back(v);
  const size_t n = qs.size();
  for (size_t i = 0; i < n; ++i) qs.push_back(-qs[i]);
  for (float scale : {1.f, 0.0625f, 3.f}) {
    std::vector<float> xs;
    for (float q : qs) xs.push_back(std::isfinite(q * scale) ? q * scale : q);
    const Array x = Array::from_vector(xs, {static_cast<int64_t>(xs.size())});
    const Array sa = Array::scalar(scale);
    for (const auto& [qt, zp] : std::vector<std::pair<DType, int>>{
             {i8, -128}, {i8, 127}, {i8, -7}, {u8, 0}, {u8, 255}, {u8, 200}}) {
      SCOPED_TRACE(::testing::Message() << name(qt) << " zp " << zp << " scale " << scale);
      const Array za = Array::scalar(static_cast<double>(zp)).astype(qt);
      Graph g;
      auto px = g.placeholder(x.shape(), f32, "x");
      const Array y = eval1(g, quantize(px, g.constant(sa), g.constant(za)), {{px, x}});
      expect_bits(y, ref_quantize_all(x, sa, za, {x.shape(), 0, 0, true}, qt));
    }
  }
}

TEST(Quantize, HalfInputsRunThroughF32) {
  const Array x = random_array({3, 33}, f32, -3, 3);
  const Array s = random_array({33}, f64, 0.02, 0.05).astype(f32);
  Graph g;
  auto px = g.placeholder(x.shape(), bf16, "x");
  const Array y = eval1(g, quantize(px, g.constant(s), i8, {.axis = 1}), {{px, x.astype(bf16)}});
  // x and the scale (cast to x's dtype by quantize) in bf16, divided in f32
  const Array xb = x.astype(bf16).astype(f32), sb = s.astype(bf16).astype(f32);
  expect_bits(y, ref_quantize_all(xb, sb, Array::zeros({33}, i8), {{3, 33}, 1, 0, false}, i8));
}

TEST(Quantize, RejectsBadInputs) {
  Graph g;
  auto x = g.placeholder({4, 6}, f32, "x");
  auto s6 = g.constant(Array::from_vector(std::vector<float>(6, 0.1f), {6}));
  expect_error<ShapeError>([&] { quantize(x, s6, i8, {.axis = 0}); },
                           {"[quantize]", "(6,)", "(4, 6)"});
  expect_error<DTypeError>([&] { quantize(x, s6, f32, {.axis = 1}); }, {"[quantize]", "f32"});
  expect_error<DTypeError>(
      [&] {
        quantize(g.placeholder({4, 6}, i32, "i"), s6, i8, {.axis = 1});
      },
      {"[quantize]", "i32"});
  auto sg = g.constant(Array::from_vector(std::vector<float>(8, 0.1f), {4, 2}));
  expect_error<ShapeError>([&] { quantize(x, sg, i8, {.axis = 1, .block_size = 2}); },
                           {"[quantize]", "block_size 2", "(4, 3)", "(4, 2)"});
  expect_error<ValueError>([&] { quantize(x, s6, i8, {.axis = 5}); }, {"[quantize]", "axis"});
  expect_error<ShapeError>(
      [&] {
        quantize(x, s6, g.constant(Array::from_vector(std::vector<int8_t>(3, 0), {3})),
                 {.axis = 1});
      },
      {"[quantize]", "zero_point"});
}

TEST(Dequantize, MatchesNumpyReferenceBitForBit) {
  for (const Layout& l : layouts())
    for (DType st : {f32, f64})
      for (DType qt : {i8, u8, i16, i32}) {
        SCOPED_TRACE(::testing::Message() << to_string(l.x) << " axis " << l.axis << " block "
                                          << l.block << " " << name(qt) << "->" << name(st));
        const auto [lo, hi] = qt == i32 ? std::pair<double, double>{-3e7, 3e7} : range_of(qt);
        const Array q = random_ints(l.x, static_cast<int64_t>(lo), static_cast<int64_t>(hi), qt);
        const Params p = random_params(l, st, qt == i32 ? i16 : qt);
        const Array zp = p.zp.astype(qt);
        Graph g;
        auto pq = g.placeholder(l.x, qt, "q");
        const Array y =
            eval1(g, dequantize(pq, g.constant(p.s), g.constant(zp), {l.axis, l.block}), {{pq, q}});
        EXPECT_EQ(y.dtype(), st);
        std::vector<double> ref;
        if (qt == i32) {  // through f32, then f64 (the ONNX reference's steps)
          const auto vq = to_f64(q), vz = to_f64(zp);
          for (int64_t i = 0; i < q.numel(); ++i) {
            const int64_t k = l.index(i);
            const double d = static_cast<double>(static_cast<float>(vq[i])) - vz[k];
            const double sk = to_f64(p.s)[k];
            ref.push_back(st == f32 ? static_cast<double>(static_cast<float>(d * sk)) : d * sk);
          }
        } else {
          ref = ref_dequantize_all(to_f64(q), p.s, zp, l);
        }
        expect_bits(y, ref);
      }
}

TEST(Dequantize, RejectsBadInputs) {
  Graph g;
  auto q = g.placeholder({4, 6}, i8, "q");
  auto s = g.constant(Array::scalar(0.1f));
  expect_error<DTypeError>([&] { dequantize(q, s, g.constant(Array::scalar(uint8_t{3}))); },
                           {"[dequantize]", "u8", "i8"});
  expect_error<DTypeError>([&] { dequantize(g.placeholder({2}, f32, "f"), s); },
                           {"[dequantize]", "f32"});
  expect_error<DTypeError>([&] { dequantize(q, g.constant(Array::scalar(int8_t{1}))); },
                           {"[dequantize]", "scale"});
}

TEST(FakeQuantize, EqualsDequantizeOfQuantize) {
  for (const Layout& l : layouts())
    for (DType qt : {i8, u8}) {
      SCOPED_TRACE(::testing::Message() << to_string(l.x) << " " << name(qt));
      const Array x = random_array(l.x, f32, -10, 10);
      const Params p = random_params(l, f32, qt);
      Graph g;
      auto px = g.placeholder(l.x, f32, "x");
      const Tensor s = g.constant(p.s), zp = g.constant(p.zp);
      const QuantizeOptions o{l.axis, l.block};
      const auto y =
          eval(g, {fake_quantize(px, s, zp, o), dequantize(quantize(px, s, zp, o), s, zp, o)},
               {{px, x}});
      expect_bits(y[0], to_f64(y[1]));
    }
}

TEST(FakeQuantize, QuantizeOutputCarriesNoGradient) {
  Graph g;
  auto px = g.placeholder({4}, f32, "x");
  const Tensor y = sum(
      dequantize(quantize(px, g.constant(Array::scalar(0.1f))), g.constant(Array::scalar(0.1f))));
  expect_error<UnsupportedError>([&] { gradients(y, {px}); }, {"[gradients]", "quantize", "i8"});
}

}  // namespace
}  // namespace kiln
