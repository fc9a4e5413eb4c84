// Gradient rules of the transform family, checked by central differences. Index inputs are i64
// placeholders left out with .wrt.
#include <algorithm>
#include <numeric>

#include "support/gradcheck.h"

namespace kiln {
namespace {
using namespace kiln::test;
using Ts = std::vector<Tensor>;

// Random values at least 0.05 apart (a shuffled grid plus noise), so topk and sort see no ties
// within the finite-difference step.
Array distinct_array(const Shape& shape) {
  std::vector<double> v(numel(shape));
  std::iota(v.begin(), v.end(), 0.0);
  std::shuffle(v.begin(), v.end(), rng());
  std::uniform_real_distribution<double> noise(0.0, 0.05);
  for (double& e : v) e = 0.1 * e - 1 + noise(rng());
  return Array::from_vector(v, shape);
}

Array ints(const std::vector<int64_t>& v, const Shape& shape) {
  return Array::from_vector(v, shape);
}

TEST(ReshapeGrad, FiniteDifferences) {
  check_gradients([](const Ts& x) { return reshape(x[0], {3, -1}); },
                  {random_array({2, 3, 2}, f64)});
  check_gradients([](const Ts& x) { return squeeze(expand_dims(x[0], {0, 2}), {0}); },
                  {random_array({2, 3}, f64)});
}

TEST(TransposeGrad, FiniteDifferences) {
  check_gradients([](const Ts& x) { return permute(x[0], {2, 0, 1}); },
                  {random_array({2, 3, 4}, f64)});
  check_gradients([](const Ts& x) { return transpose(x[0]); }, {random_array({3, 2, 2}, f64)});
}

TEST(SplitGrad, FiniteDifferences) {
  // the middle piece is unused: its cotangent is zeros
  check_gradients(
      [](Graph&, const Ts& x) {
        auto parts = split(x[0], 3, 1);
        return Ts{parts[0], parts[2] * parts[2]};
      },
      {random_array({2, 6}, f64)});
  check_gradients([](const Ts& x) { return split(x[0], {1, 3}, 0)[1]; },
                  {random_array({4, 2}, f64)});
}

TEST(ConcatGrad, FiniteDifferences) {
  check_gradients([](const Ts& x) { return concat({x[0], x[1], x[0]}, 1); },
                  {random_array({2, 1, 3}, f64), random_array({2, 4, 3}, f64)});
  check_gradients([](const Ts& x) { return stack({x[0], x[1]}, -1); },
                  {random_array({3, 2}, f64), random_array({3, 2}, f64)});
}

TEST(SliceGrad, UnitSteps) {
  check_gradients([](const Ts& x) { return slice(x[0], {1, -3}, {3, 100}); },
                  {random_array({4, 5}, f64)});
  check_gradients([](const Ts& x) { return slice(x[0], {-1}, {0}, {-1}, {1}); },
                  {random_array({2, 5}, f64)});
}

TEST(SliceGrad, LargeAndNegativeSteps) {
  check_gradients([](const Ts& x) { return slice(x[0], {1}, {7}, {2}); },
                  {random_array({7}, f64)});
  check_gradients([](const Ts& x) { return slice(x[0], {0, 6}, {5, -100}, {3, -4}); },
                  {random_array({5, 8}, f64)});
  check_gradients([](const Ts& x) { return slice(x[0], {-2, 1}, {-100, 4}, {-2, 1}); },
                  {random_array({6, 4}, f64)});
  // a step past the end takes one element
  check_gradients([](const Ts& x) { return slice(x[0], {2, -1}, {5, -5}, {1000, -(1LL << 62)}); },
                  {random_array({5, 3}, f64)});
}

TEST(SliceGrad, EmptySliceGivesZeros) {
  Graph g;
  auto x = g.placeholder({4}, f64, "x");
  auto dx = gradients(sum(slice(x, {3}, {1})), {x})[0];
  expect_equal(eval1(g, dx, {{x, random_array({4}, f64)}}), {4}, {0, 0, 0, 0});
}

TEST(PadGrad, Constant) {
  check_gradients([](const Ts& x) { return pad(x[0], {1, 2, 0, 1}, PadKind::constant, 3); },
                  {random_array({2, 3}, f64)});
  // negative pads crop
  check_gradients([](const Ts& x) { return pad(x[0], {-1, 2, 1, -2}); },
                  {random_array({3, 4}, f64)});
}

TEST(PadGrad, Reflect) {
  check_gradients([](const Ts& x) { return pad(x[0], {2, 3, 0, 2}, PadKind::reflect); },
                  {random_array({4, 3}, f64)});
  check_gradients([](const Ts& x) { return pad(x[0], {-1, 2, 1, 0}, PadKind::reflect); },
                  {random_array({3, 2}, f64)});
}

TEST(PadGrad, Edge) {
  check_gradients([](const Ts& x) { return pad(x[0], {3, 4, 1, 0}, PadKind::edge); },
                  {random_array({2, 3}, f64)});
  check_gradients([](const Ts& x) { return pad(x[0], {2, -1}, PadKind::edge); },
                  {random_array({1}, f64)});
}

TEST(TileGrad, FiniteDifferences) {
  check_gradients([](const Ts& x) { return tile(x[0], {2, 1, 3}); }, {random_array({2, 3}, f64)});
  check_gradients([](const Ts& x) { return tile(x[0], {3}); }, {random_array({2, 2}, f64)});
}

TEST(BroadcastToGrad, FiniteDifferences) {
  check_gradients([](const Ts& x) { return broadcast_to(x[0], {2, 3, 4}); },
                  {random_array({3, 1}, f64)});
  check_gradients([](const Ts& x) { return broadcast_to(x[0], {3, -1, 2}); },
                  {random_array({1, 2, 1}, f64)});
}

TEST(FlipGrad, FiniteDifferences) {
  check_gradients([](const Ts& x) { return flip(x[0], {0, 2}) * x[0]; },
                  {random_array({2, 3, 2}, f64)});
}

TEST(GatherGrad, RepeatedAndNegativeIndices) {
  check_gradients([](const Ts& x) { return gather(x[0], x[1], 1); },
                  {random_array({3, 4, 2}, f64), ints({1, -1, 1, 0, 3, -4}, {2, 3})},
                  {.wrt = {0}});
  check_gradients([](const Ts& x) { return gather(x[0], x[1], -1); },
                  {random_array({2, 5}, f64), random_ints({4}, -5, 4, i32)}, {.wrt = {0}});
}

TEST(GatherGrad, ScalarIndexAndSecondOrder) {
  check_gradients([](const Ts& x) { return gather(x[0], x[1], 0); },
                  {random_array({3, 2}, f64), ints({-2}, {})}, {.wrt = {0}});
  // the gradient of the gradient runs through scatter_elements' and gather_elements' rules
  check_gradients(
      [](const Ts& x) {
        const Tensor y = gather(x[0], x[1], 0);
        return gradients(sum(y * y * y), {x[0]})[0];
      },
      {random_array({4}, f64), ints({2, 0, 2}, {3})}, {.wrt = {0}});
}

TEST(GatherElementsGrad, FiniteDifferences) {
  check_gradients([](const Ts& x) { return gather_elements(x[0], x[1], 1); },
                  {random_array({3, 4}, f64), random_ints({3, 5}, -4, 3)}, {.wrt = {0}});
  check_gradients([](const Ts& x) { return gather_elements(x[0], x[1], 0); },
                  {random_array({3, 2}, f64), random_ints({4, 2}, 0, 2)}, {.wrt = {0}});
}

// x (2, 4), updates (2, 3) with duplicate targets in both rows
std::vector<Array> scatter_inputs(bool nonzero = false) {
  return {random_array({2, 4}, f64), ints({1, 3, 1, -1, 0, 3}, {2, 3}),
          nonzero ? random_nonzero({2, 3}, f64, 0.5, 1.5) : random_array({2, 3}, f64)};
}

Tensor scatter_with(ScatterReduction r, const Ts& x) {
  return scatter_elements(x[0], x[1], x[2], 1, r);
}

TEST(ScatterElementsGrad, NoneKeepsLastDuplicate) {
  check_gradients([](const Ts& x) { return scatter_with(ScatterReduction::none, x); },
                  scatter_inputs(), {.wrt = {0, 2}});
  check_gradients(
      [](const Ts& x) { return scatter_elements(x[0], x[1], x[2], 0); },
      {random_array({3, 2}, f64), ints({2, 2, 0, 2}, {2, 2}), random_array({2, 2}, f64)},
      {.wrt = {0, 2}});
}

TEST(ScatterElementsGrad, Add) {
  check_gradients([](const Ts& x) { return scatter_with(ScatterReduction::add, x); },
                  scatter_inputs(), {.wrt = {0, 2}});
}

TEST(ScatterElementsGrad, Mul) {
  check_gradients([](const Ts& x) { return scatter_with(ScatterReduction::mul, x); },
                  scatter_inputs(true), {.wrt = {0, 2}});
}

TEST(ScatterElementsGrad, MaxAndMin) {
  for (auto r : {ScatterReduction::max, ScatterReduction::min})
    check_gradients([r](const Ts& x) { return scatter_with(r, x); },
                    {distinct_array({2, 4}), ints({1, 3, 1, -1, 0, 3}, {2, 3}),
                     distinct_array({2, 3})},
                    {.wrt = {0, 2}});
}

TEST(TopkGrad, FiniteDifferences) {
  check_gradients([](const Ts& x) { return topk(x[0], 2).first; }, {distinct_array({3, 5})});
  check_gradients([](const Ts& x) { return topk(x[0], 3, 0, /*largest=*/false).first; },
                  {distinct_array({4, 2})});
}

TEST(SortGrad, FiniteDifferences) {
  check_gradients([](const Ts& x) { return sort(x[0]); }, {distinct_array({2, 5})});
  check_gradients([](const Ts& x) { return sort(x[0], 0, /*descending=*/true); },
                  {distinct_array({4, 3})});
}

TEST(CoordinateAlongAxisGrad, DependsOnShapeOnly) {
  check_gradients([](const Ts& x) { return x[0] * coordinate_along_axis(x[0], 1, f64); },
                  {random_array({2, 3}, f64)});
}

}  // namespace
}  // namespace kiln
