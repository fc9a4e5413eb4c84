// Reductions against float64 loops: each output's input values are gathered by plain index
// arithmetic and reduced in the test.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;

using Values = std::vector<double>;
using Builder = std::function<Tensor(const Tensor&, const Axes&, bool)>;

std::vector<int64_t> resolved(const Axes& axes, int rank) {
  std::vector<int64_t> r;
  for (int64_t a : axes) r.push_back(a < 0 ? a + rank : a);
  if (axes.empty())
    for (int d = 0; d < rank; ++d) r.push_back(d);
  return r;
}
bool has(const std::vector<int64_t>& v, int64_t d) {
  return std::find(v.begin(), v.end(), d) != v.end();
}
Shape reduced_shape(const Shape& s, const Axes& axes, bool keepdims) {
  auto r = resolved(axes, static_cast<int>(s.size()));
  Shape out;
  for (size_t d = 0; d < s.size(); ++d) {
    if (!has(r, d)) out.push_back(s[d]);
    else if (keepdims) out.push_back(1);
  }
  return out;
}
// The input values reduced into each output element, in row-major order.
std::vector<Values> groups(const Array& x, const Axes& axes) {
  const Shape& s = x.shape();
  auto r = resolved(axes, x.rank());
  Shape kept = reduced_shape(s, axes, false);
  std::vector<Values> g(static_cast<size_t>(numel(kept)));
  auto v = to_f64(x);
  for (int64_t i = 0; i < x.numel(); ++i) {
    auto idx = unravel(i, s);
    std::vector<int64_t> k;
    for (size_t d = 0; d < s.size(); ++d)
      if (!has(r, d)) k.push_back(idx[d]);
    g[ravel(k, kept)].push_back(v[i]);
  }
  return g;
}
template <typename F> Values ref_reduce(const Array& x, const Axes& axes, F f) {
  Values out;
  for (auto& g : groups(x, axes)) out.push_back(f(g));
  return out;
}

double ref_sum(const Values& v) {
  double s = 0;
  for (double e : v) s += e;
  return s;
}
double ref_mean(const Values& v) { return ref_sum(v) / static_cast<double>(v.size()); }
double ref_max(const Values& v) {
  double m = -std::numeric_limits<double>::infinity();
  for (double e : v) m = std::isnan(e) || std::isnan(m) ? NAN : std::max(m, e);
  return m;
}
double ref_min(const Values& v) {
  double m = std::numeric_limits<double>::infinity();
  for (double e : v) m = std::isnan(e) || std::isnan(m) ? NAN : std::min(m, e);
  return m;
}
double ref_prod(const Values& v) {
  double p = 1;
  for (double e : v) p *= e;
  return p;
}
Values ref_arg(const Array& x, int64_t axis, bool is_max) {
  Values out;
  for (auto& g : groups(x, {axis})) {
    size_t best = 0;
    for (size_t i = 1; i < g.size(); ++i)
      if (is_max ? g[i] > g[best] : g[i] < g[best]) best = i;
    out.push_back(static_cast<double>(best));
  }
  return out;
}

// Axis sets over a rank-4 input: single, negative, adjacent, non-adjacent, all.
const std::vector<Axes> kAxisSets = {{},     {0},    {-1},   {1},       {2, 0},
                                     {1, 3}, {0, 1}, {-3, -1}, {0, 1, 2, 3}, {1, 2}};

// Checks `build` against `ref` over kAxisSets, both keepdims, on a (2, 3, 4, 5) input and a few
// shapes with size-1 dims.
template <typename F>
void check_axis_sets(const Builder& build, DType t, F ref, double lo, double hi,
                     double rtol = 1e-5, double atol = 1e-6) {
  for (const Shape& shape : {Shape{2, 3, 4, 5}, Shape{3, 1, 4, 1}, Shape{1, 7, 1, 2}}) {
    for (const Axes& axes : kAxisSets) {
      for (bool keepdims : {false, true}) {
        SCOPED_TRACE(fmt::format("shape {} axes ({}) keepdims {} dtype {}", to_string(shape),
                                 fmt::join(axes, ", "), keepdims, name(t)));
        Graph g;
        auto x = g.placeholder(shape, t, "x");
        Array v = random_array(shape, t, lo, hi);
        Array out = eval1(g, build(x, axes, keepdims), {{x, v}});
        EXPECT_EQ(out.dtype(), t);
        expect_close(out, reduced_shape(shape, axes, keepdims), ref_reduce(v, axes, ref), rtol,
                     atol);
      }
    }
  }
}

// Large inputs exercise the split (few outputs) and lane (kept last dim, in blocks) paths.
template <typename F> void check_large(const Builder& build, DType t, F ref, double lo, double hi) {
  struct Case { Shape shape; Axes axes; };
  for (const Case& c : {Case{{300001}, {}}, Case{{3, 70001}, {1}}, Case{{90001, 3}, {0}},
                        Case{{41, 67, 37}, {0, 2}}, Case{{5, 20000, 2}, {0, 1}},
                        Case{{2100, 1030}, {0}}, Case{{3, 1500, 2}, {1}}}) {
    SCOPED_TRACE(fmt::format("shape {} axes ({})", to_string(c.shape), fmt::join(c.axes, ", ")));
    Graph g;
    auto x = g.placeholder(c.shape, t, "x");
    Array v = random_array(c.shape, t, lo, hi);
    expect_close(eval1(g, build(x, c.axes, false), {{x, v}}), reduced_shape(c.shape, c.axes, false),
                 ref_reduce(v, c.axes, ref), 1e-5, 1e-6);
  }
}

Array eval_reduce(const Builder& build, const Array& v, const Axes& axes, bool keepdims = false) {
  Graph g;
  auto x = g.placeholder(v.shape(), v.dtype(), "x");
  return eval1(g, build(x, axes, keepdims), {{x, v}});
}

// ---- Sum ----

TEST(Sum, AxisCombinations) {
  for (DType t : {f32, f64}) check_axis_sets(Builder(sum), t, ref_sum, -1, 1);
  check_axis_sets(Builder(sum), i32, ref_sum, -1000, 1000, 0, 0);
  check_axis_sets(Builder(sum), i64, ref_sum, -1000, 1000, 0, 0);
}

TEST(Sum, LargeInputsAccumulateInDouble) {
  check_large(Builder(sum), f32, ref_sum, -1, 1);
  check_large(Builder(sum), f64, ref_sum, -1, 1);
  // a large offset: float accumulation would lose the small parts
  Array v = random_array({1 << 20}, f32, 1000, 1001);
  expect_close(eval_reduce(Builder(sum), v, {}), {}, {ref_sum(to_f64(v))}, 1e-7, 0);
}

TEST(Sum, IntegersKeepTheirDtypeAndBoolCountsInI64) {
  Array v = random_array({4, 6}, i8, -5, 5);
  Array out = eval_reduce(Builder(sum), v, {1});
  EXPECT_EQ(out.dtype(), i8);
  expect_equal(out, {4}, ref_reduce(v, {1}, ref_sum));
  Array b = random_array({5, 7}, boolean);
  out = eval_reduce(Builder(sum), b, {0});
  EXPECT_EQ(out.dtype(), i64);
  expect_equal(out, {7}, ref_reduce(b, {0}, ref_sum));
}

TEST(Sum, EmptyReductionIsZero) {
  Array v = random_array({0, 3}, f32);
  expect_equal(eval_reduce(Builder(sum), v, {0}), {3}, {0, 0, 0});
  expect_equal(eval_reduce(Builder(sum), v, {1}), {0}, {});
  expect_equal(eval_reduce(Builder(sum), v, {}, true), {1, 1}, {0});
}

TEST(Sum, ScalarInput) {
  Array v = random_array({}, f64);
  expect_equal(eval_reduce(Builder(sum), v, {}), {}, to_f64(v));
}

TEST(Sum, HalfTypesComputeInF32) {
  for (DType t : {f16, bf16}) {
    Array v = random_array({6, 40}, t);
    Array out = eval_reduce(Builder(sum), v, {-1});
    EXPECT_EQ(out.dtype(), t);
    expect_close(out, {6}, ref_reduce(v, {-1}, ref_sum), t == f16 ? 1e-3 : 8e-3, 2e-2);
  }
}

TEST(Sum, DynamicDimsPropagate) {
  Graph g;
  auto x = g.placeholder({-1, 4, 3}, f32, "x");
  auto y = sum(x, {1}, true);
  EXPECT_EQ(y.shape(), (Shape{-1, 1, 3}));
  EXPECT_EQ(sum(x, {0}).shape(), (Shape{4, 3}));
}

TEST(Sum, ErrorsNameOpAndShape) {
  Graph g;
  auto x = g.placeholder({2, 3}, f32, "x");
  expect_error<ValueError>([&] { sum(x, {2}); }, {"[sum]", "axis 2", "(2, 3)"});
  expect_error<ValueError>([&] { sum(x, {-3}); }, {"[sum]", "axis -3", "(2, 3)"});
  expect_error<ValueError>([&] { sum(x, {1, -1}); }, {"[sum]", "repeated", "(2, 3)"});
}

// ---- Mean ----

TEST(Mean, AxisCombinations) {
  for (DType t : {f32, f64}) check_axis_sets(Builder(mean), t, ref_mean, -1, 1);
  check_large(Builder(mean), f32, ref_mean, -1, 1);
}

TEST(Mean, HalfAndEmpty) {
  Array v = random_array({3, 50}, bf16);
  expect_close(eval_reduce(Builder(mean), v, {1}), {3}, ref_reduce(v, {1}, ref_mean), 8e-3, 1e-3);
  Array e = random_array({0, 2}, f32);
  expect_close(eval_reduce(Builder(mean), e, {0}), {2}, {NAN, NAN});
}

TEST(Mean, IntegerInputIsDTypeError) {
  Graph g;
  auto x = g.placeholder({2, 3}, i32, "x");
  expect_error<DTypeError>([&] { mean(x); }, {"[mean]", "i32", "(2, 3)"});
  expect_error<DTypeError>([&] { mean(g.placeholder({4}, boolean, "b")); }, {"[mean]", "bool"});
}

// ---- Max / Min ----

TEST(Max, AxisCombinations) {
  for (DType t : {f32, f64}) check_axis_sets(Builder(max), t, ref_max, -1, 1);
  check_axis_sets(Builder(max), i16, ref_max, -300, 300, 0, 0);
  check_large(Builder(max), f32, ref_max, -1, 1);
}

TEST(Max, NanPropagatesAndBoolWorks) {
  Array v = random_array({3, 4}, f32);
  v.data<float>()[5] = NAN;
  expect_close(eval_reduce(Builder(max), v, {1}), {3}, ref_reduce(v, {1}, ref_max));
  Array b = random_array({4, 9}, boolean);
  expect_equal(eval_reduce(Builder(max), b, {1}), {4}, ref_reduce(b, {1}, ref_max));
}

// f32 max and min over runs long enough for the CPU's vector path (AVX-512: four registers of
// sixteen, then sixteen at a time, then one), whole and per row, with NaNs at the start, in the
// middle and in the tail of some rows and infinities in others: the loop's values.
TEST(Max, LongRunsMatchTheLoopWithNansAndInfinities) {
  for (int64_t n : {63, 64, 65, 80, 127, 1000, 4103}) {
    SCOPED_TRACE(n);
    Array v = random_array({5, n}, f32, -100, 100);
    float* p = v.data<float>();
    p[1 * n + 0] = NAN;
    p[2 * n + n / 2] = NAN;
    p[3 * n + n - 1] = NAN;
    p[4 * n + 3] = std::numeric_limits<float>::infinity();
    p[4 * n + n - 2] = -std::numeric_limits<float>::infinity();
    expect_close(eval_reduce(Builder(max), v, {1}), {5}, ref_reduce(v, {1}, ref_max), 0, 0);
    expect_close(eval_reduce(Builder(min), v, {1}), {5}, ref_reduce(v, {1}, ref_min), 0, 0);
    // the whole array's extremes, without NaN and with one
    Array clean = random_array({3, n}, f32, -100, 100);
    clean.data<float>()[n + 7] = 1e30f;
    clean.data<float>()[2 * n + n - 1] = -1e30f;
    expect_close(eval_reduce(Builder(max), clean, {}), {}, ref_reduce(clean, {}, ref_max), 0, 0);
    expect_close(eval_reduce(Builder(min), clean, {}), {}, ref_reduce(clean, {}, ref_min), 0, 0);
    expect_close(eval_reduce(Builder(max), v, {}), {}, {NAN}, 0, 0);
  }
}

TEST(Max, EmptyReductionIsValueError) {
  Graph g;
  auto x = g.placeholder({0, 3}, f32, "x");
  expect_error<ValueError>([&] { max(x, {0}); }, {"[max]", "(0, 3)", "axis 0"});
  EXPECT_EQ(max(x, {1}).shape(), (Shape{0}));  // nothing to reduce into
  // a dynamic dim is checked when the graph is compiled
  Graph g2;
  auto d = g2.placeholder({-1, 3}, f32, "d");
  auto y = max(d, {0});
  expect_error<ValueError>([&] { g2.compile(Device::cpu(), {{d, {0, 3}}}, {y}); },
                           {"[max]", "(0, 3)"});
}

TEST(Min, AxisCombinations) {
  for (DType t : {f32, f64}) check_axis_sets(Builder(min), t, ref_min, -1, 1);
  check_axis_sets(Builder(min), u8, ref_min, 0, 255, 0, 0);
  check_large(Builder(min), f64, ref_min, -1, 1);
  Array h = random_array({5, 6}, f16);
  expect_equal(eval_reduce(Builder(min), h, {0}), {6}, ref_reduce(h, {0}, ref_min));
  Graph g;
  expect_error<ValueError>([&] { min(g.placeholder({2, 0}, i32, "x")); }, {"[min]", "(2, 0)"});
}

// ---- Prod ----

TEST(Prod, AxisCombinations) {
  for (DType t : {f32, f64}) check_axis_sets(Builder(prod), t, ref_prod, 0.5, 1.5);
}

TEST(Prod, IntegersWithoutOverflow) {
  for (DType t : {i32, i64}) {
    for (const Axes& axes : {Axes{-1}, Axes{0, 2}, Axes{1}}) {
      Array v = random_array({3, 4, 5}, t, -3, 3);
      Array out = eval_reduce(Builder(prod), v, axes);
      EXPECT_EQ(out.dtype(), t);
      expect_equal(out, reduced_shape({3, 4, 5}, axes, false), ref_reduce(v, axes, ref_prod));
    }
  }
}

TEST(Prod, EmptyIsOneAndBoolIsI64) {
  expect_equal(eval_reduce(Builder(prod), random_array({2, 0}, f32), {1}), {2}, {1, 1});
  Array b = random_array({3, 4}, boolean);
  Array out = eval_reduce(Builder(prod), b, {1});
  EXPECT_EQ(out.dtype(), i64);
  expect_equal(out, {3}, ref_reduce(b, {1}, ref_prod));
}

// ---- Argmax / Argmin ----

template <typename F> void check_arg(F build, bool is_max) {
  const Shape shape{3, 4, 5};
  for (DType t : {f32, f64, i32, bf16}) {
    for (int64_t axis : {0, 1, 2, -1, -3}) {
      for (bool keepdims : {false, true}) {
        Graph g;
        auto x = g.placeholder(shape, t, "x");
        // integers in a small range have ties: the first occurrence must win
        Array v = random_array(shape, t, -4, 4);
        Array out = eval1(g, build(x, axis, keepdims), {{x, v}});
        EXPECT_EQ(out.dtype(), i64);
        expect_equal(out, reduced_shape(shape, {axis}, keepdims), ref_arg(v, axis, is_max));
      }
    }
  }
  Array big = random_array({7, 3000}, f32);
  Graph g;
  auto x = g.placeholder(big.shape(), f32, "x");
  expect_equal(eval1(g, build(x, 0, false), {{x, big}}), {3000}, ref_arg(big, 0, is_max));
  expect_equal(eval1(g, build(x, 1, false), {{x, big}}), {7}, ref_arg(big, 1, is_max));
}

TEST(Argmax, MatchesReference) { check_arg(argmax, true); }
TEST(Argmin, MatchesReference) { check_arg(argmin, false); }

TEST(Argmax, ErrorsNameOpAndShape) {
  Graph g;
  auto x = g.placeholder({2, 0}, f32, "x");
  expect_error<ValueError>([&] { argmax(x, 1); }, {"[argmax]", "(2, 0)"});
  expect_error<ValueError>([&] { argmax(x, 2); }, {"[argmax]", "axis 2", "(2, 0)"});
  expect_error<ValueError>([&] { argmin(x, -3); }, {"[argmin]", "axis -3", "(2, 0)"});
}

// ---- Logsumexp ----

double ref_logsumexp(const Values& v) {
  double m = ref_max(v), s = 0;
  if (std::isinf(m)) return m;
  for (double e : v) s += std::exp(e - m);
  return m + std::log(s);
}

TEST(Logsumexp, AxisCombinations) {
  for (DType t : {f32, f64}) check_axis_sets(Builder(logsumexp), t, ref_logsumexp, -20, 20);
  check_large(Builder(logsumexp), f32, ref_logsumexp, -50, 50);
}

TEST(Logsumexp, InfinitiesAndEmpty) {
  const double inf = std::numeric_limits<double>::infinity();
  Array v = Array::from_vector(std::vector<double>{-inf, -inf, 1.0, -inf, inf, 2.0, inf, inf, 3.0},
                               {3, 3});
  expect_close(eval_reduce(Builder(logsumexp), v, {1}), {3},
               {ref_logsumexp({-inf, -inf, 1.0}), inf, inf});
  expect_close(eval_reduce(Builder(logsumexp), v, {0}), {3},
               {inf, inf, ref_logsumexp({1.0, 2.0, 3.0})});
  expect_close(eval_reduce(Builder(logsumexp), random_array({0, 2}, f64), {0}), {2}, {-inf, -inf});
  Graph g;
  expect_error<DTypeError>([&] { logsumexp(g.placeholder({3}, i64, "x")); },
                           {"[logsumexp]", "i64", "(3,)"});
}

// ---- Variance ----

// Variance with `correction` subtracted from the count, by two passes in double.
std::function<double(const Values&)> ref_variance(int64_t correction) {
  return [correction](const Values& v) {
    double m = ref_mean(v), ss = 0;
    for (double e : v) ss += (e - m) * (e - m);
    return ss / static_cast<double>(static_cast<int64_t>(v.size()) - correction);
  };
}

TEST(Variance, AxisCombinationsAndCorrection) {
  for (int64_t correction : {0, 1}) {
    auto build = [&](const Tensor& x, const Axes& a, bool k) {
      return variance(x, a, k, correction);
    };
    for (DType t : {f32, f64}) check_axis_sets(build, t, ref_variance(correction), -2, 2);
  }
}

TEST(Variance, AccurateWithLargeMean) {
  // f32 data around 1e4: one-pass sums of squares in float would cancel catastrophically
  for (Shape shape : {Shape{200000}, Shape{50, 4000}}) {
    Array v = random_array(shape, f32, 1e4, 1e4 + 1);
    Graph g;
    auto x = g.placeholder(shape, f32, "x");
    expect_close(eval1(g, variance(x, {-1}, false, 1), {{x, v}}),
                 reduced_shape(shape, {-1}, false), ref_reduce(v, {-1}, ref_variance(1)), 1e-4, 0);
  }
}

TEST(Variance, ErrorsAndEmpty) {
  Graph g;
  expect_error<DTypeError>([&] { variance(g.placeholder({2, 2}, i32, "x")); },
                           {"[variance]", "i32", "(2, 2)"});
  expect_error<ValueError>([&] { variance(g.placeholder({2, 2}, f32, "y"), {}, false, -1); },
                           {"[variance]", "correction", "(2, 2)"});
  // one element with correction 1 divides 0 by 0, as PyTorch does
  Array one = random_array({3, 1}, f64);
  Graph g2;
  auto x = g2.placeholder({3, 1}, f64, "x");
  expect_close(eval1(g2, variance(x, {1}, false, 1), {{x, one}}), {3}, {NAN, NAN, NAN});
}

// ---- Norms ----

double ref_l1(const Values& v) {
  double s = 0;
  for (double e : v) s += std::abs(e);
  return s;
}
double ref_l2(const Values& v) {
  double s = 0;
  for (double e : v) s += e * e;
  return std::sqrt(s);
}

TEST(NormL1, AxisCombinations) {
  for (DType t : {f32, f64}) check_axis_sets(Builder(norm_l1), t, ref_l1, -1, 1);
  check_large(Builder(norm_l1), f32, ref_l1, -1, 1);
  Array h = random_array({4, 30}, f16);
  expect_close(eval_reduce(Builder(norm_l1), h, {1}), {4}, ref_reduce(h, {1}, ref_l1), 1e-3, 1e-3);
  Graph g;
  expect_error<DTypeError>([&] { norm_l1(g.placeholder({2}, i32, "x")); }, {"[norm_l1]", "i32"});
}

TEST(NormL2, AxisCombinations) {
  for (DType t : {f32, f64}) check_axis_sets(Builder(norm_l2), t, ref_l2, -1, 1);
  check_large(Builder(norm_l2), f64, ref_l2, -1, 1);
  expect_equal(eval_reduce(Builder(norm_l2), random_array({0, 3}, f32), {0}), {3}, {0, 0, 0});
  Graph g;
  expect_error<DTypeError>([&] { norm_l2(g.placeholder({2}, u8, "x")); }, {"[norm_l2]", "u8"});
}

// ---- Cumsum ----

Values ref_cumsum(const Array& x, int64_t axis, bool exclusive, bool reverse) {
  const Shape& s = x.shape();
  const int64_t a = axis < 0 ? axis + x.rank() : axis;
  auto v = to_f64(x);
  Values out(v.size());
  for (int64_t i = 0; i < x.numel(); ++i) {
    auto idx = unravel(i, s);
    double acc = 0;
    for (int64_t j = 0; j < s[a]; ++j) {
      const bool before = reverse ? j > idx[a] : j < idx[a];
      if (before || (!exclusive && j == idx[a])) {
        auto other = idx;
        other[a] = j;
        acc += v[ravel(other, s)];
      }
    }
    out[i] = acc;
  }
  return out;
}

TEST(Cumsum, AxesExclusiveReverse) {
  const Shape shape{3, 4, 300};
  for (DType t : {f32, f64, i32}) {
    for (int64_t axis : {0, 1, -1}) {
      for (bool exclusive : {false, true}) {
        for (bool reverse : {false, true}) {
          SCOPED_TRACE(fmt::format("{} axis {} exclusive {} reverse {}", name(t), axis, exclusive,
                                   reverse));
          Graph g;
          auto x = g.placeholder(shape, t, "x");
          Array v = random_array(shape, t, -100, 100);
          Array out = eval1(g, cumsum(x, axis, exclusive, reverse), {{x, v}});
          EXPECT_EQ(out.dtype(), t);
          expect_close(out, shape, ref_cumsum(v, axis, exclusive, reverse), 1e-5, 1e-3);
        }
      }
    }
  }
}

TEST(Cumsum, BoolHalfEmptyAndErrors) {
  Graph g;
  auto b = g.placeholder({2, 5}, boolean, "b");
  Array vb = random_array({2, 5}, boolean);
  Array out = eval1(g, cumsum(b, 1), {{b, vb}});
  EXPECT_EQ(out.dtype(), i64);
  expect_equal(out, {2, 5}, ref_cumsum(vb, 1, false, false));
  auto h = g.placeholder({16}, f16, "h");
  Array vh = random_array({16}, f16);
  expect_close(eval1(g, cumsum(h, 0), {{h, vh}}), {16}, ref_cumsum(vh, 0, false, false), 2e-3,
               2e-3);
  auto e = g.placeholder({0, 3}, f32, "e");
  expect_equal(eval1(g, cumsum(e, 0), {{e, random_array({0, 3}, f32)}}), {0, 3}, {});
  expect_error<ValueError>([&] { cumsum(e, 2); }, {"[cumsum]", "axis 2", "(0, 3)"});
}

}  // namespace
}  // namespace kiln
