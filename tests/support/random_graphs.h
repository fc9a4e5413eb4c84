// Random graphs of small values for the elementwise fusion tests (tests/passes/test_fuse_groups.cpp
// on the CPU, tests/cuda/test_fused_groups.cpp against it): placeholders of the given shapes, then
// 6 to 19 ops, each on a value drawn from those so far and, for binary ops, a partner it
// broadcasts with (its own shape, a single value, or a row of a (3, 7) value), reductions among
// them; outputs drawn at random (the last value always one).
#pragma once

#include <fmt/format.h>

#include <random>
#include <vector>

#include "kiln/kiln.h"
#include "support/reference.h"

namespace kiln::test {

struct RandomGraph {
  std::vector<Tensor> outputs;
  Feeds feeds;
};

// `casts_and_products`: also tanh, exp, casts through i32 and products of (3, 7) values (f32
// only); without them every op is exact on both devices but for sums' order.
inline RandomGraph random_small_graph(Graph& g, std::mt19937& rng, DType t,
                                      const std::vector<Shape>& shapes, bool casts_and_products) {
  RandomGraph r;
  std::vector<Tensor> values;
  for (size_t k = 0; k < shapes.size(); ++k) {
    const Tensor p = g.placeholder(shapes[k], t, fmt::format("p{}", k));
    values.push_back(p);
    // (integers from 1 to 3, so that chains of products stay in range)
    r.feeds.push_back({p, is_floating(t) ? random_array(shapes[k], t, -2, 2)
                                         : random_nonzero(shapes[k], t, 1, 3)});
  }
  auto pick = [&]() { return values[rng() % values.size()]; };
  auto partner = [&](const Tensor& x) {
    for (int tries = 0; tries < 20; ++tries) {
      const Tensor y = pick();
      if (x.shape() == y.shape() || numel(y.shape()) == 1 || numel(x.shape()) == 1 ||
          (x.shape() == Shape{3, 7} && y.shape() == Shape{7}))
        return y;
    }
    return x;
  };
  const int ops = 6 + static_cast<int>(rng() % 14);
  for (int k = 0; k < ops; ++k) {
    const Tensor x = pick();
    const Tensor y = partner(x);
    switch (rng() % (casts_and_products ? 10 : 7)) {
      case 0:
        values.push_back(abs(x) - y);
        break;
      case 1:
        values.push_back(x + y);
        break;
      case 2:
        values.push_back(maximum(x, y));
        break;
      case 3:
        values.push_back(where(less(x, y), x, y));
        break;
      case 4:
        values.push_back(sum(x));
        break;
      case 5:
        values.push_back(x * y);
        break;
      case 6:
        values.push_back(casts_and_products && is_floating(t) ? tanh(x) : -x);
        break;
      case 7:
        values.push_back(exp(x * 0.25));
        break;
      case 8:
        values.push_back(cast(cast(x * 3.0, i32), t));
        break;
      default:
        values.push_back(x.shape() == Shape{3, 7} ? matmul(transpose(x), x) * 0.1 : x * 0.5);
    }
  }
  for (size_t k = shapes.size(); k < values.size(); ++k)
    if (rng() % 3 == 0 || k + 1 == values.size()) r.outputs.push_back(values[k]);
  return r;
}

}  // namespace kiln::test
