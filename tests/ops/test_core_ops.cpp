// Placeholder, Constant, Full, Arange.
#include <cmath>

#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;

TEST(Placeholder, FeedsRoundTrip) {
  for (DType t : {f32, f64, i32, i64, u8, boolean, f16, bf16}) {
    Graph g;
    auto x = g.placeholder({-1, 3}, t, "x");
    Array a = random_array({5, 3}, t, -3, 3);
    Array out = eval1(g, x, {{x, a}});
    expect_equal(out, {5, 3}, to_f64(a));
  }
}

TEST(Placeholder, RejectsBadDims) {
  Graph g;
  expect_error<ShapeError>([&] { g.placeholder({2, -5}, f32, "bad"); }, {"[placeholder]", "bad", "-5"});
}

TEST(Constant, HoldsData) {
  Graph g;
  Array a = random_array({2, 3, 4}, f32);
  Array out = eval1(g, relu(g.constant(a)));
  std::vector<double> ref;
  for (double v : to_f64(a)) ref.push_back(v > 0 ? v : 0);
  expect_close(out, {2, 3, 4}, ref);
}

TEST(Full, FillsEveryDtype) {
  for (DType t : {f32, f64, f16, bf16, i8, u8, i16, u16, i32, u32, i64, u64, boolean}) {
    Graph g;
    const double v = t == boolean ? 1 : 3;
    expect_equal(eval1(g, full(g, {2, 0, 3}, v, t)), {2, 0, 3}, {});
    expect_equal(eval1(g, full(g, {4, 3}, v, t)), {4, 3}, std::vector<double>(12, v));
  }
  Graph g;
  expect_equal(eval1(g, zeros(g, {3})), {3}, {0, 0, 0});
  expect_equal(eval1(g, ones(g, {}, i32)), {}, {1});
  expect_error<ShapeError>([&] { full(g, {-1, 2}, 1); }, {"[full]", "(?, 2)"});
}

TEST(Arange, MatchesNumpyRule) {
  std::uniform_real_distribution<double> d(-5, 5);
  for (int trial = 0; trial < 20; ++trial) {
    double start = d(rng()), stop = d(rng()), step = d(rng()) / 2;
    if (std::fabs(step) < 0.05) step = 0.3;
    Graph g;
    std::vector<double> ref;
    for (int64_t i = 0; start + i * step < stop == (step > 0) && ref.size() < 1000; ++i) {
      double v = start + i * step;
      if (step > 0 ? v >= stop : v <= stop) break;
      ref.push_back(v);
    }
    Array out = eval1(g, arange(g, start, stop, step, f64));
    expect_close(out, {static_cast<int64_t>(ref.size())}, ref, 1e-12, 1e-12);
  }
  Graph g;
  expect_equal(eval1(g, arange(g, 0, 5, 1, i64)), {5}, {0, 1, 2, 3, 4});
  // integers past the dtype's range wrap, as numpy's integer arange does: 256 -> 0 in u8,
  // 128 -> -128 in i8; fractional values truncate toward zero first
  std::vector<double> u8_ref, i8_ref;
  for (int64_t i = 0; i < 300; ++i) u8_ref.push_back(static_cast<double>(i % 256));
  for (int64_t i = 120; i < 140; ++i) i8_ref.push_back(static_cast<double>(i < 128 ? i : i - 256));
  expect_equal(eval1(g, arange(g, 0, 300, 1, u8)), {300}, u8_ref);
  expect_equal(eval1(g, arange(g, 120, 140, 1, i8)), {20}, i8_ref);
  expect_equal(eval1(g, arange(g, -1.5, 1.6, 0.75, i32)), {5}, {-1, 0, 0, 0, 1});
  expect_error<ValueError>([&] { arange(g, 0, 1, 0); }, {"[arange]", "step"});
}

}  // namespace
}  // namespace kiln
