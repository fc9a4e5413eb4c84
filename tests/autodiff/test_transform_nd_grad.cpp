// Gradient rules of gather_nd and scatter_nd, checked by central differences. Index inputs are
// i64 arrays left out with .wrt.
#include <algorithm>
#include <numeric>

#include "support/gradcheck.h"

namespace kiln {
namespace {
using namespace kiln::test;
using Ts = std::vector<Tensor>;

Array ints(const std::vector<int64_t>& v, const Shape& shape) {
  return Array::from_vector(v, shape);
}

// Values at least 0.05 apart, so max/min see no ties within the finite-difference step.
Array distinct_array(const Shape& shape) {
  std::vector<double> v(numel(shape));
  std::iota(v.begin(), v.end(), 0.0);
  std::shuffle(v.begin(), v.end(), rng());
  std::uniform_real_distribution<double> noise(0.0, 0.05);
  for (double& e : v) e = 0.1 * e - 1 + noise(rng());
  return Array::from_vector(v, shape);
}

TEST(GatherNdGrad, RepeatedAndNegativeTuples) {
  // tuples (1, 2) and (-2, -1) pick the same slice of x
  check_gradients([](const Ts& x) { return gather_nd(x[0], x[1]); },
                  {random_array({3, 3, 2}, f64), ints({1, 2, -2, -1, 0, 0, 2, 1}, {4, 2})},
                  {.wrt = {0}});
  check_gradients([](const Ts& x) { return gather_nd(x[0], x[1]); },
                  {random_array({4, 3}, f64), ints({3, -1, 0, 3, 3}, {5, 1})}, {.wrt = {0}});
}

TEST(GatherNdGrad, BatchDims) {
  check_gradients([](const Ts& x) { return gather_nd(x[0], x[1], 1); },
                  {random_array({2, 4, 3}, f64), ints({1, 2, 1, -1, 0, 2, 3, 0}, {2, 2, 2})},
                  {.wrt = {0}});
  check_gradients([](const Ts& x) { return gather_nd(x[0], x[1], 2); },
                  {random_array({2, 3, 4, 2}, f64), random_ints({2, 3, 5, 1}, -4, 3)},
                  {.wrt = {0}});
}

TEST(GatherNdGrad, SecondOrder) {
  check_gradients(
      [](const Ts& x) {
        const Tensor y = gather_nd(x[0], x[1]);
        return gradients(sum(y * y * y), {x[0]})[0];
      },
      {random_array({3, 2}, f64), ints({2, 0, 2, 1, 2, 0}, {3, 2})}, {.wrt = {0}});
}

// x (3, 4), tuples of one component: row slices, with row 1 written twice
std::vector<Array> scatter_inputs(bool nonzero = false) {
  return {random_array({3, 4}, f64), ints({1, -1, 1}, {3, 1}),
          nonzero ? random_nonzero({3, 4}, f64, 0.5, 1.5) : random_array({3, 4}, f64)};
}

TEST(ScatterNdGrad, NoneKeepsLastDuplicate) {
  check_gradients([](const Ts& x) { return scatter_nd(x[0], x[1], x[2]); }, scatter_inputs(),
                  {.wrt = {0, 2}});
  check_gradients([](const Ts& x) { return scatter_nd(x[0], x[1], x[2]); },
                  {random_array({3, 2}, f64), ints({2, 1, 0, 0, -1, 1}, {3, 2}),
                   random_array({3}, f64)},
                  {.wrt = {0, 2}});
}

TEST(ScatterNdGrad, AddAndMul) {
  check_gradients(
      [](const Ts& x) { return scatter_nd(x[0], x[1], x[2], ScatterReduction::add); },
      scatter_inputs(), {.wrt = {0, 2}});
  check_gradients(
      [](const Ts& x) { return scatter_nd(x[0], x[1], x[2], ScatterReduction::mul); },
      scatter_inputs(true), {.wrt = {0, 2}});
}

TEST(ScatterNdGrad, MaxAndMin) {
  for (auto r : {ScatterReduction::max, ScatterReduction::min})
    check_gradients([r](const Ts& x) { return scatter_nd(x[0], x[1], x[2], r); },
                    {distinct_array({3, 4}), ints({1, -1, 1}, {3, 1}), distinct_array({3, 4})},
                    {.wrt = {0, 2}});
}

}  // namespace
}  // namespace kiln
