// Small networks that several test suites build.
#pragma once

#include "kiln/kiln.h"
#include "support/reference.h"

namespace kiln::test {

// A ResNet-shaped inference net of dtype t with constant weights: a 7x7 stride-2 stem conv with
// bias and relu, 3x3 max pooling, a residual block (3x3 conv + the block's input, relu), global
// average pooling and a linear classifier; x (2, 3, 20, 20) -> logits (2, 10).
inline Graph pooled_net(Tensor& x, Tensor& logits, DType t) {
  Graph g;
  x = g.placeholder({2, 3, 20, 20}, t, "x");
  auto w = [&](int64_t o, int64_t c, int64_t k) {
    return g.constant(random_array({o, c, k, k}, t, -0.3, 0.3));
  };
  ConvOptions stem;
  stem.stride = {2, 2};
  stem.padding = {3, 3, 3, 3};
  Tensor h = relu(conv2d(x, w(16, 3, 7), g.constant(random_array({16}, t)), stem));
  h = max_pool(h, {.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}});
  ConvOptions same;
  same.padding = {1, 1, 1, 1};
  h = relu(conv2d(h, w(16, 16, 3), std::nullopt, same) + h);
  h = reshape(global_avg_pool(h), {2, 16});
  logits = linear(h, g.constant(random_array({10, 16}, t)));
  return g;
}

}  // namespace kiln::test
