// Gradients of the reduce family by finite differences, over several axis sets with keepdims
// both ways. (Sum's own check lives in test_gradients.cpp.)
#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "support/gradcheck.h"

namespace kiln {
namespace {
using namespace kiln::test;

using ReduceFn = Tensor (*)(const Tensor&, const Axes&, bool);

struct AxesCase {
  Shape x;
  Axes axes;
};
// Reduced over one axis, several (negative ones too) and all.
const std::vector<AxesCase> kAxesCases = {
    {{5}, {0}},  {{3, 4}, {1}},       {{3, 4}, {0}},  {{2, 3, 4}, {0, 2}},
    {{2, 3, 4}, {-1, -2}}, {{2, 3, 2}, {}}, {{2, 1, 3}, {1}},
};

void check_reduction(ReduceFn f, const std::function<Array(const Shape&)>& draw) {
  for (const AxesCase& c : kAxesCases)
    for (bool keepdims : {false, true}) {
      SCOPED_TRACE(to_string(c.x) + " axes " + std::to_string(c.axes.size()) +
                   (keepdims ? " keepdims" : ""));
      check_gradients([&](const std::vector<Tensor>& x) { return f(x[0], c.axes, keepdims); },
                      {draw(c.x)});
    }
}
Array uniform(const Shape& s) { return random_array(s, f64); }
Array away_from_zero(const Shape& s) { return random_nonzero(s, f64, 0.25, 1.5); }

// f64 values spaced well apart and shuffled: no ties for max and min.
Array distinct(const Shape& s) {
  std::vector<double> v(static_cast<size_t>(numel(s)));
  std::iota(v.begin(), v.end(), 0.0);
  std::shuffle(v.begin(), v.end(), rng());
  for (double& e : v) e = 2 * e / static_cast<double>(v.size()) - 1;
  return Array::from_vector(v, s);
}

TEST(MeanGrad, FiniteDifferences) {
  check_reduction([](const Tensor& x, const Axes& a, bool k) { return mean(x, a, k); }, uniform);
}

TEST(MaxGrad, FiniteDifferences) {
  check_reduction([](const Tensor& x, const Axes& a, bool k) { return max(x, a, k); }, distinct);
}

TEST(MaxGrad, TiesShareTheGradientEvenly) {
  Graph g;
  auto x = g.placeholder({2, 4}, f64, "x");
  auto dx = gradients(max(x, {1}), {x})[0];
  Array v = Array::from_vector<double>({1, 3, 3, 2, 5, 5, 5, 4}, {2, 4});
  expect_close(eval1(g, dx, {{x, v}}), {2, 4}, {0, 0.5, 0.5, 0, 1.0 / 3, 1.0 / 3, 1.0 / 3, 0},
               1e-12, 1e-12);
}

TEST(MinGrad, FiniteDifferences) {
  check_reduction([](const Tensor& x, const Axes& a, bool k) { return min(x, a, k); }, distinct);
}

TEST(MinGrad, TiesShareTheGradientEvenly) {
  Graph g;
  auto x = g.placeholder({4}, f64, "x");
  auto dx = gradients(min(x) * 4.0, {x})[0];
  expect_close(eval1(g, dx, {{x, Array::from_vector<double>({2, -1, 0, -1}, {4})}}), {4},
               {0, 2, 0, 2}, 1e-12, 1e-12);
}

TEST(ProdGrad, FiniteDifferences) {
  check_reduction([](const Tensor& x, const Axes& a, bool k) { return prod(x, a, k); },
                  away_from_zero);
}

TEST(ProdGrad, ZerosGetTheProductOfTheOthers) {
  // rows with no zero, one zero and two zeros: prod is a polynomial, so finite differences
  // hold at the zeros too
  Array v = random_nonzero({3, 4}, f64, 0.5, 1.5);
  double* d = v.data<double>();
  d[5] = 0;
  d[8] = d[10] = 0;
  check_gradients([](const std::vector<Tensor>& x) { return prod(x[0], {1}); }, {v});
  check_gradients([](const std::vector<Tensor>& x) { return prod(x[0], {0}, true); }, {v});
  check_gradients([](const std::vector<Tensor>& x) { return prod(x[0]); }, {v});
}

TEST(LogsumexpGrad, FiniteDifferences) {
  check_reduction([](const Tensor& x, const Axes& a, bool k) { return logsumexp(x, a, k); },
                  [](const Shape& s) { return random_array(s, f64, -3, 3); });
}

TEST(VarianceGrad, FiniteDifferences) {
  for (int64_t correction : {0, 1}) {
    SCOPED_TRACE("correction " + std::to_string(correction));
    for (const AxesCase& c : kAxesCases) {
      if (c.x == Shape{2, 1, 3}) continue;  // one element per group: no sample variance
      for (bool keepdims : {false, true})
        check_gradients(
            [&](const std::vector<Tensor>& x) {
              return variance(x[0], c.axes, keepdims, correction);
            },
            {random_array(c.x, f64)});
    }
  }
}

TEST(NormL1Grad, FiniteDifferences) {
  check_reduction([](const Tensor& x, const Axes& a, bool k) { return norm_l1(x, a, k); },
                  away_from_zero);
}

TEST(NormL2Grad, FiniteDifferences) {
  check_reduction([](const Tensor& x, const Axes& a, bool k) { return norm_l2(x, a, k); },
                  uniform);
}

TEST(NormL2Grad, ZeroNormGivesZeroGradient) {
  Graph g;
  auto x = g.placeholder({2, 3}, f64, "x");
  auto dx = gradients(norm_l2(x, {1}), {x})[0];
  Array v = Array::from_vector<double>({0, 0, 0, 3, 0, 4}, {2, 3});
  expect_close(eval1(g, dx, {{x, v}}), {2, 3}, {0, 0, 0, 0.6, 0, 0.8}, 1e-12, 1e-12);
}

TEST(CumsumGrad, FiniteDifferences) {
  for (bool exclusive : {false, true})
    for (bool reverse : {false, true})
      for (int64_t axis : {0, 1, -1}) {
        SCOPED_TRACE(fmt::format("axis {} exclusive {} reverse {}", axis, exclusive, reverse));
        check_gradients(
            [&](const std::vector<Tensor>& x) { return cumsum(x[0], axis, exclusive, reverse); },
            {random_array({3, 4, 2}, f64)});
      }
}

TEST(ReduceGrad, ArgmaxAndArgminAreNotDifferentiable) {
  Graph g;
  auto x = g.placeholder({2, 3}, f32, "x");
  expect_error<UnsupportedError>([&] { gradients(sum(cast(argmin(x, 0), f32)), {x}); },
                                 {"[gradients]", "argmin", "'x'"});
  expect_error<UnsupportedError>([&] { gradients(sum(cast(argmax(x, 1), f32)), {x}); },
                                 {"[gradients]", "argmax", "'x'"});
}

}  // namespace
}  // namespace kiln
