// Gradients of the pool family by finite differences: max_pool (through its indices), avg_pool,
// adaptive_avg_pool, and the gradient ops' own rules.
#include <algorithm>
#include <numeric>

#include "core/graph_impl.h"
#include "support/gradcheck.h"

namespace kiln {
namespace {
using namespace kiln::test;

// f64 values spaced well apart (by more than the checker's eps), shuffled, so that every max
// pooling window has one clear maximum.
Array distinct_array(const Shape& shape) {
  std::vector<double> v(static_cast<size_t>(numel(shape)));
  std::iota(v.begin(), v.end(), 0.0);
  std::shuffle(v.begin(), v.end(), rng());
  for (double& e : v) e = 2 * e / static_cast<double>(v.size()) - 1;
  return Array::from_vector(v, shape);
}

struct Case {
  Shape x;
  PoolOptions o;
};

// 1, 2 and 3 spatial dims with stride, padding (symmetric and not), dilation and ceil_mode.
std::vector<Case> cases(bool dilated) {
  std::vector<int64_t> none;
  auto dil = [&](std::vector<int64_t> d) { return dilated ? d : none; };
  return {
      {{2, 2, 9}, {{3}, {2}, {1}, dil({2})}},
      {{1, 2, 7}, {.kernel = {3}, .stride = {2}, .padding = {1}, .ceil_mode = true}},
      {{1, 2, 6, 7}, {{3, 2}, {2, 1}, {1, 0}, dil({1, 2})}},
      {{1, 1, 5, 6}, {{2, 3}, {}, {0, 1, 1, 0}}},
      {{1, 2, 6, 6}, {.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}, .ceil_mode = true}},
      {{1, 1, 4, 5, 5}, {{2, 3, 2}, {2, 2, 1}, {1, 1, 0}, dil({1, 1, 2})}},
      {{1, 1, 5, 4, 3}, {.kernel = {2, 2, 2}, .ceil_mode = true}},
  };
}

TEST(MaxPoolGrad, FiniteDifferences) {
  for (const Case& c : cases(true)) {
    SCOPED_TRACE(to_string(c.x));
    check_gradients([&](const std::vector<Tensor>& x) { return max_pool(x[0], c.o); },
                    {distinct_array(c.x)});
  }
}

TEST(MaxPoolGrad, IndicesOutputCarriesNoGradient) {
  // both outputs returned: the i64 indices are skipped, the values' gradient still flows
  const Case c = cases(true)[2];
  check_gradients(
      [&](Graph&, const std::vector<Tensor>& x) {
        auto [y, idx] = max_pool_with_indices(x[0], c.o);
        return std::vector<Tensor>{y, idx};
      },
      {distinct_array(c.x)});
}

TEST(MaxPoolGrad, ReusesForwardIndices) {
  // the gradient scatters at the forward node's own indices output: no second max_pool
  Graph g;
  auto x = g.placeholder({2, 3, 8, 8}, f32, "x");
  auto y = max_pool(x, {{3, 3}, {2, 2}, {1, 1}});
  auto dx = gradients(sum(y), {x})[0];
  const auto& nodes = g.impl().nodes;
  const auto& grad_node = nodes[dx.node_id()];
  ASSERT_EQ(grad_node.op, OpId::MaxPoolGrad);
  EXPECT_EQ(grad_node.inputs[1].node, y.node_id());
  EXPECT_EQ(grad_node.inputs[1].index, 1);
  EXPECT_EQ(std::count_if(nodes.begin(), nodes.end(),
                          [](const auto& n) { return n.op == OpId::MaxPool; }),
            1);
}

TEST(AvgPoolGrad, FiniteDifferences) {
  for (const Case& base : cases(false)) {
    for (bool include_pad : {false, true}) {
      Case c = base;
      c.o.count_include_pad = include_pad;
      SCOPED_TRACE(to_string(c.x) + (include_pad ? " count_include_pad" : ""));
      check_gradients([&](const std::vector<Tensor>& x) { return avg_pool(x[0], c.o); },
                      {random_array(c.x, f64)});
    }
  }
}

TEST(AdaptiveAvgPoolGrad, FiniteDifferences) {
  struct AdaptiveCase { Shape x, out; };
  for (const AdaptiveCase& c : {AdaptiveCase{{2, 2, 7}, {3}}, AdaptiveCase{{1, 2, 5, 7}, {3, 4}},
                                AdaptiveCase{{1, 1, 3, 4}, {5, 3}},
                                AdaptiveCase{{1, 1, 3, 5, 4}, {2, 3, 1}}}) {
    SCOPED_TRACE(to_string(c.x));
    check_gradients([&](const std::vector<Tensor>& x) { return adaptive_avg_pool(x[0], c.out); },
                    {random_array(c.x, f64)});
  }
  check_gradients([](const std::vector<Tensor>& x) { return global_avg_pool(x[0]); },
                  {random_array({2, 3, 4, 3}, f64)});
}

// ---- the gradient ops' own rules (second derivatives of pooling) ----

TEST(MaxPoolGradGrad, FiniteDifferences) {
  // random indices, repeats included; only dy is differentiable
  for (auto [x, y] : {std::pair<Shape, Shape>{{2, 2, 9}, {2, 2, 4}},
                      std::pair<Shape, Shape>{{1, 2, 5, 4}, {1, 2, 3, 3}},
                      std::pair<Shape, Shape>{{1, 1, 3, 4, 2}, {1, 1, 2, 2, 2}}}) {
    SCOPED_TRACE(to_string(x));
    const int64_t plane = numel(Shape(x.begin() + 2, x.end()));
    check_gradients(
        [&, x = x](const std::vector<Tensor>& in) { return max_pool_grad(in[0], in[1], x); },
        {random_array(y, f64), random_ints(y, 0, plane - 1)}, {.wrt = {0}});
  }
}

// Double backward: the gradient of sum(pool(x)^2) is differentiated again.
template <typename Pool> void check_double_backward(const Shape& shape, Pool pool, Array x) {
  SCOPED_TRACE(to_string(shape));
  check_gradients(
      [&](const std::vector<Tensor>& in) {
        Tensor y = pool(in[0]);
        return gradients(sum(y * y), {in[0]})[0];
      },
      {x});
}

TEST(MaxPoolGradGrad, DoubleBackward) {
  for (const Case& c : cases(true))
    check_double_backward(c.x, [&](const Tensor& x) { return max_pool(x, c.o); },
                          distinct_array(c.x));
}

TEST(AvgPoolGradGrad, DoubleBackward) {
  for (const Case& c : cases(false))
    check_double_backward(c.x, [&](const Tensor& x) { return avg_pool(x, c.o); },
                          random_array(c.x, f64));
}

TEST(AdaptiveAvgPoolGradGrad, DoubleBackward) {
  check_double_backward({1, 2, 5, 7}, [](const Tensor& x) { return adaptive_avg_pool(x, {3, 4}); },
                        random_array({1, 2, 5, 7}, f64));
}

TEST(AvgPoolGradGrad, FiniteDifferences) {
  for (const Case& base : cases(false)) {
    for (bool include_pad : {false, true}) {
      Case c = base;
      c.o.count_include_pad = include_pad;
      SCOPED_TRACE(to_string(c.x) + (include_pad ? " count_include_pad" : ""));
      Graph g;
      const Shape y = avg_pool(g.placeholder(c.x, f64, "x"), c.o).shape();
      check_gradients([&](const std::vector<Tensor>& x) { return avg_pool_grad(x[0], c.x, c.o); },
                      {random_array(y, f64)});
    }
  }
}

TEST(AdaptiveAvgPoolGradGrad, FiniteDifferences) {
  for (auto [x, y] : {std::pair<Shape, Shape>{{2, 2, 7}, {2, 2, 3}},
                      std::pair<Shape, Shape>{{1, 2, 5, 7}, {1, 2, 3, 4}},
                      std::pair<Shape, Shape>{{1, 1, 3, 5, 4}, {1, 1, 2, 3, 1}}}) {
    SCOPED_TRACE(to_string(x));
    check_gradients(
        [&, x = x](const std::vector<Tensor>& in) { return adaptive_avg_pool_grad(in[0], x); },
        {random_array(y, f64)});
  }
}

}  // namespace
}  // namespace kiln
