// Gradient rules of depth_to_space, space_to_depth, embedding (and embedding_grad's own rule),
// masked_fill and roll, checked by central differences. Index and mask inputs are left out
// with .wrt.
#include "support/gradcheck.h"

namespace kiln {
namespace {
using namespace kiln::test;
using Ts = std::vector<Tensor>;

TEST(DepthToSpaceGrad, BothModesAndLayouts) {
  for (auto mode : {SpaceDepthMode::dcr, SpaceDepthMode::crd})
    for (bool nhwc : {false, true}) {
      const Shape s = nhwc ? Shape{2, 2, 3, 8} : Shape{2, 8, 2, 3};
      check_gradients(
          [=](const Ts& x) {
            return depth_to_space(x[0], 2, {mode, nhwc});
          },
          {random_array(s, f64)});
    }
}

TEST(SpaceToDepthGrad, BothModesAndLayouts) {
  for (auto mode : {SpaceDepthMode::dcr, SpaceDepthMode::crd})
    for (bool nhwc : {false, true}) {
      const Shape s = nhwc ? Shape{1, 4, 6, 3} : Shape{1, 3, 4, 6};
      check_gradients(
          [=](const Ts& x) {
            return space_to_depth(x[0], 2, {mode, nhwc});
          },
          {random_array(s, f64)});
    }
}

TEST(PixelShuffleGrad, LeadingDims) {
  check_gradients([](const Ts& x) { return pixel_shuffle(x[0], 2); },
                  {random_array({2, 2, 8, 2, 3}, f64)});
  check_gradients([](const Ts& x) { return pixel_unshuffle(x[0], 3); },
                  {random_array({2, 3, 3}, f64)});
}

TEST(EmbeddingGrad, RepeatedRowsAndPadding) {
  // rows 1 and 3 are read twice
  const Array idx = Array::from_vector(std::vector<int64_t>{1, 3, 2, 1, 0, 3}, {2, 3});
  check_gradients([](const Ts& x) { return embedding(x[0], x[1]); },
                  {random_array({5, 3}, f64), idx}, {.wrt = {0}});
  // the padding row is read but gets no gradient (PyTorch's padding_idx), unlike finite
  // differences would say: the other rows get theirs
  Graph g;
  auto w = g.placeholder({5, 3}, f64, "w");
  auto i = g.constant(idx);
  auto dw = gradients(sum(embedding(w, i, -3)), {w})[0];
  expect_equal(eval1(g, dw, {{w, random_array({5, 3}, f64)}}), {5, 3},
               {1, 1, 1, 2, 2, 2, 0, 0, 0, 2, 2, 2, 0, 0, 0});
}

TEST(EmbeddingGradGrad, LinearInGrad) {
  const Array idx = Array::from_vector(std::vector<int64_t>{1, 3, 2, 1}, {4});
  check_gradients([](const Ts& x) { return embedding_grad(x[0], x[1], 5, 3); },
                  {idx, random_array({4, 2, 2}, f64)}, {.wrt = {1}});
  check_gradients([](const Ts& x) { return embedding_grad(x[0], x[1], 4); },
                  {idx, random_array({4}, f64)}, {.wrt = {1}});
}

TEST(MaskedFillGrad, MaskBlocksGradient) {
  check_gradients([](const Ts& x) { return masked_fill(x[0], x[1], 3.5); },
                  {random_array({3, 4, 2}, f64), random_array({4, 1}, boolean)}, {.wrt = {0}});
}

TEST(RollGrad, AxesAndFlattened) {
  check_gradients(
      [](const Ts& x) {
        return roll(x[0], {2, -1}, {0, 2});
      },
      {random_array({3, 2, 4}, f64)});
  check_gradients([](const Ts& x) { return roll(x[0], {5}); }, {random_array({3, 4}, f64)});
}

}  // namespace
}  // namespace kiln
