// Gradients of the loss family against finite differences: cross entropy, nll, mse.
#include <cmath>

#include "support/gradcheck.h"

namespace kiln {
namespace {
using namespace kiln::test;

using Inputs = std::vector<Tensor>;
constexpr Reduction kReductions[] = {Reduction::none, Reduction::mean, Reduction::sum};

Shape without(Shape s, int64_t axis) {
  s.erase(s.begin() + axis);
  return s;
}

// Index labels (integer inputs are fed but not differentiated).
TEST(SoftmaxCrossEntropyGrad, IndexLabels) {
  struct Case {
    Shape shape;
    int64_t axis;
  };
  for (const Case& c : {Case{{4, 5}, 1}, Case{{2, 3, 4}, 1}, Case{{3, 2}, 0}, Case{{5}, 0}})
    for (DType lt : {i32, i64})
      for (Reduction r : kReductions)
        check_gradients(
            [&](const Inputs& x) { return softmax_cross_entropy(x[0], x[1], r, c.axis); },
            {random_array(c.shape, f64, -2, 2),
             random_ints(without(c.shape, c.axis), 0, c.shape[c.axis] - 1, lt)});
}

// Probability labels get a gradient too; rows that do not sum to one test the general rule.
TEST(SoftmaxCrossEntropyGrad, ProbabilityLabels) {
  struct Case {
    Shape shape;
    int64_t axis;
  };
  for (const Case& c : {Case{{3, 4}, -1}, Case{{2, 3, 4}, 1}, Case{{4, 3}, 0}})
    for (Reduction r : kReductions)
      check_gradients([&](const Inputs& x) { return softmax_cross_entropy(x[0], x[1], r, c.axis); },
                      {random_array(c.shape, f64, -2, 2), random_array(c.shape, f64, 0, 1)});
}

TEST(SoftmaxCrossEntropyGrad, MeanOverDynamicBatch) {
  // d mean / dx = (softmax(x) - one_hot(l)) / N, with N known only when run
  Graph g;
  auto x = g.placeholder({-1, 3}, f64, "x");
  auto l = g.placeholder({-1}, i64, "l");
  auto dx = gradients(softmax_cross_entropy(x, l), {x})[0];
  Array vx = random_array({4, 3}, f64), vl = random_ints({4}, 0, 2);
  const std::vector<double> xs = to_f64(vx), ls = to_f64(vl);
  std::vector<double> ref;
  for (int i = 0; i < 4; ++i) {
    double z = 0;
    for (int k = 0; k < 3; ++k) z += std::exp(xs[i * 3 + k]);
    for (int k = 0; k < 3; ++k) ref.push_back((std::exp(xs[i * 3 + k]) / z - (ls[i] == k)) / 4);
  }
  expect_close(eval1(g, dx, {{x, vx}, {l, vl}}), {4, 3}, ref, 1e-12, 1e-12);
}

// Targets with exactly every `stride`-th position set to ignore_index.
Array targets_with_ignored(const Shape& shape, int64_t classes, int64_t ignore, int64_t stride) {
  std::vector<int64_t> t = random_ints(shape, 0, classes - 1).to_vector<int64_t>();
  for (size_t i = 0; i < t.size(); ++i)
    if (i % stride == 0)
      t[i] = ignore;
    else if (t[i] == ignore)
      t[i] = (ignore + 1) % classes;
  return Array::from_vector(t, shape);
}

TEST(NllGrad, FiniteDifferences) {
  for (Reduction r : kReductions) {
    check_gradients([&](const Inputs& x) { return nll(x[0], x[1], r); },
                    {random_array({4, 5}, f64, -3, 0), random_ints({4}, 0, 4)});
    check_gradients([&](const Inputs& x) { return nll(x[0], x[1], r); },
                    {random_array({2, 3, 4}, f64, -3, 0), random_ints({2, 4}, 0, 2, i32)});
    check_gradients([&](const Inputs& x) { return nll(x[0], x[1], r); },
                    {random_array({5}, f64, -3, 0), random_ints({}, 0, 4)});
  }
}

// Ignored positions get no gradient and do not count towards the mean, also when ignore_index
// names a real class.
TEST(NllGrad, IgnoreIndex) {
  for (Reduction r : kReductions)
    for (int64_t ignore : {-100, 1}) {
      check_gradients([&](const Inputs& x) { return nll(x[0], x[1], r, ignore); },
                      {random_array({6, 4}, f64, -3, 0), targets_with_ignored({6}, 4, ignore, 3)});
      check_gradients(
          [&](const Inputs& x) { return nll(x[0], x[1], r, ignore); },
          {random_array({2, 3, 4}, f64, -3, 0), targets_with_ignored({2, 4}, 3, ignore, 2)});
    }
}

TEST(MseGrad, FiniteDifferences) {
  for (Reduction r : kReductions) {
    check_gradients([&](const Inputs& x) { return mse(x[0], x[1], r); },
                    {random_array({3, 4}, f64), random_array({3, 4}, f64)});
    check_gradients([&](const Inputs& x) { return mse(x[0], x[1], r); },
                    {random_array({3, 1, 4}, f64), random_array({2, 4}, f64)});
    check_gradients([&](const Inputs& x) { return mse(x[0], x[1], r); },
                    {random_array({}, f64), random_array({5}, f64)});
  }
}

}  // namespace
}  // namespace kiln
