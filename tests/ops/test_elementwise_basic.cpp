// Add, Sub, Mul, Neg, Exp, Relu, Cast: the first elementwise tests (the rest of the family is in
// test_elementwise_unary.cpp, _binary.cpp and _select.cpp).
#include <cmath>
#include <limits>

#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;

// out = f(a, b) with numpy broadcasting, in float64.
template <typename F>
std::vector<double> ref_binary(const Array& a, const Array& b, const Shape& out, F f) {
  auto va = to_f64(a), vb = to_f64(b);
  std::vector<double> r(static_cast<size_t>(numel(out)));
  for (int64_t i = 0; i < numel(out); ++i) {
    auto idx = unravel(i, out);
    r[i] = f(va[broadcast_offset(idx, a.shape(), out)], vb[broadcast_offset(idx, b.shape(), out)]);
  }
  return r;
}

TEST(Add, BroadcastsBothWays) {
  struct Case { Shape a, b, out; };
  for (auto c : {Case{{3, 4}, {3, 4}, {3, 4}}, Case{{3, 1}, {1, 4}, {3, 4}},
                 Case{{2, 3, 4}, {4}, {2, 3, 4}}, Case{{}, {5}, {5}}, Case{{0, 3}, {3}, {0, 3}},
                 Case{{7, 1, 5}, {1, 6, 1}, {7, 6, 5}}}) {
    for (DType t : {f32, f64, i32, i64}) {
      Graph g;
      auto a = g.placeholder(c.a, t, "a");
      auto b = g.placeholder(c.b, t, "b");
      Array va = random_array(c.a, t, -50, 50), vb = random_array(c.b, t, -50, 50);
      Array out = eval1(g, a + b, {{a, va}, {b, vb}});
      expect_close(out, c.out, ref_binary(va, vb, c.out, [](double x, double y) { return x + y; }));
    }
  }
}

TEST(Add, PromotesDtypes) {
  Graph g;
  auto a = g.placeholder({3}, i32, "a");
  auto b = g.placeholder({3}, f32, "b");
  auto y = a + b;
  EXPECT_EQ(y.dtype(), f32);
  Array va = random_array({3}, i32, -9, 9), vb = random_array({3}, f32);
  expect_close(eval1(g, y, {{a, va}, {b, vb}}), {3},
               ref_binary(va, vb, {3}, [](double x, double y) { return x + y; }));
}

TEST(Add, ErrorsNameOpAndShapes) {
  Graph g;
  auto a = g.placeholder({2, 3}, f32, "a");
  auto b = g.placeholder({4}, f32, "b");
  expect_error<ShapeError>([&] { add(a, b); }, {"[add]", "(2, 3)", "(4,)"});
}

TEST(Add, HalfTypesComputeInF32) {
  for (DType t : {f16, bf16}) {
    Graph g;
    auto a = g.placeholder({64}, t, "a");
    auto b = g.placeholder({64}, t, "b");
    Array va = random_array({64}, t), vb = random_array({64}, t);
    Array out = eval1(g, a + b, {{a, va}, {b, vb}});
    EXPECT_EQ(out.dtype(), t);
    // inputs are exactly representable; the sum is rounded once to the half type
    auto ref = ref_binary(va, vb, {64}, [](double x, double y) { return x + y; });
    expect_close(out, {64}, ref, t == f16 ? 1e-3 : 8e-3, 1e-3);
  }
}

TEST(Sub, MatchesReference) {
  Graph g;
  auto a = g.placeholder({4, 5}, f64, "a");
  auto b = g.placeholder({5}, f64, "b");
  Array va = random_array({4, 5}, f64), vb = random_array({5}, f64);
  expect_close(eval1(g, a - b, {{a, va}, {b, vb}}), {4, 5},
               ref_binary(va, vb, {4, 5}, [](double x, double y) { return x - y; }));
}

TEST(Mul, MatchesReference) {
  Graph g;
  auto a = g.placeholder({4, 1}, f32, "a");
  auto b = g.placeholder({1, 5}, f32, "b");
  Array va = random_array({4, 1}, f32), vb = random_array({1, 5}, f32);
  expect_close(eval1(g, a * b, {{a, va}, {b, vb}}), {4, 5},
               ref_binary(va, vb, {4, 5}, [](double x, double y) { return x * y; }));
}

TEST(Neg, MatchesReference) {
  Graph g;
  auto x = g.placeholder({10}, i64, "x");
  Array v = random_array({10}, i64, -100, 100);
  std::vector<double> ref;
  for (double e : to_f64(v)) ref.push_back(-e);
  expect_equal(eval1(g, -x, {{x, v}}), {10}, ref);
}

TEST(Exp, MatchesReference) {
  Graph g;
  auto x = g.placeholder({100}, f32, "x");
  Array v = random_array({100}, f32, -5, 5);
  std::vector<double> ref;
  for (double e : to_f64(v)) ref.push_back(std::exp(e));
  expect_close(eval1(g, exp(x), {{x, v}}), {100}, ref, 1e-6);
  expect_error<DTypeError>([&] { exp(g.placeholder({2}, i32, "i")); }, {"[exp]", "i32"});
}

TEST(Relu, MatchesReference) {
  Graph g;
  auto x = g.placeholder({3, 7}, f32, "x");
  Array v = random_array({3, 7}, f32);
  std::vector<double> ref;
  for (double e : to_f64(v)) ref.push_back(e > 0 ? e : 0);
  expect_close(eval1(g, relu(x), {{x, v}}), {3, 7}, ref);
}

TEST(Cast, BetweenAllDtypes) {
  for (DType from : {f32, f64, i32, i64, u8, boolean}) {
    for (DType to : {f32, f64, i8, i32, i64, boolean, f16, bf16}) {
      Graph g;
      auto x = g.placeholder({17}, from, "x");
      Array v = random_array({17}, from, 0, 100);
      if (is_floating(from)) v = random_array({17}, from, 0, 100);
      std::vector<double> ref;
      for (double e : to_f64(v)) {
        double r = to == boolean ? (e != 0) : is_integer(to) ? std::trunc(e) : e;
        if (to == f16) r = static_cast<float>(float16_t(static_cast<float>(e)));
        if (to == bf16) r = static_cast<float>(bfloat16_t(static_cast<float>(e)));
        if (to == f32) r = static_cast<float>(e);
        ref.push_back(r);
      }
      expect_equal(eval1(g, cast(x, to), {{x, v}}), {17}, ref);
    }
  }
}

TEST(Cast, FloatToIntegerSaturatesAndNanGivesZero) {
  const std::vector<double> vals{1e10, -1e10, NAN, INFINITY, -INFINITY, 2.7, -2.7, 127.9, -128.9,
                                 255.5, 3e38, -3e38};
  for (DType from : {f32, f64}) {
    for (DType to : {i8, u8, i16, i32, i64}) {
      Graph g;
      auto x = g.placeholder({static_cast<int64_t>(vals.size())}, from, "x");
      // the limits of `to`, as doubles
      const double lo = to == u8 ? 0 : to == i8 ? -128 : to == i16 ? -32768 : to == i32 ? -2147483648.0 : -9223372036854775808.0;
      const double hi = to == u8 ? 255 : to == i8 ? 127 : to == i16 ? 32767 : to == i32 ? 2147483647.0 : 9223372036854775807.0;
      std::vector<double> ref;
      for (double e : vals) {
        const double v = from == f32 ? static_cast<double>(static_cast<float>(e)) : e;
        ref.push_back(std::isnan(v) ? 0 : v <= lo ? lo : v >= hi ? hi : std::trunc(v));
      }
      const Array got = eval1(g, cast(x, to), {{x, Array::from_vector(vals, {static_cast<int64_t>(vals.size())}).astype(from)}});
      const auto g64 = got.astype(i64).to_vector<int64_t>();
      for (size_t i = 0; i < vals.size(); ++i)
        EXPECT_EQ(g64[i], ref[i] >= 9.2e18 ? std::numeric_limits<int64_t>::max()
                                           : static_cast<int64_t>(ref[i]))
            << name(from) << "->" << name(to) << " of " << vals[i];
    }
  }
}

}  // namespace
}  // namespace kiln
