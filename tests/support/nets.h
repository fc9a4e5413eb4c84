// Small networks that several test suites build.
#pragma once

#include <cmath>
#include <string>
#include <vector>

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

// A ResNet-shaped training network in f32 on x (4, 3, 16, 16) with i64 labels (4): a 3x3 stem
// conv (12 channels) with batch norm and relu, 3x3 stride-2 max pooling, a residual block (two 3x3
// convs with batch norm, the block's input added before the last relu), a downsampling block
// (3x3 and 1x1 stride-2 convs, 24 channels, each with batch norm, added), global average
// pooling, a linear classifier (10 classes, with bias) and the mean softmax cross entropy.
// Parameters are variables (batch norm then also updates running statistics: bn_updates) or,
// without `variables`, placeholders to be fed with `values`.
struct TrainNet {
  Tensor x, labels, loss;
  std::vector<Tensor> params;
  std::vector<Array> values;  // the parameters' initial values
  std::vector<Tensor> bn_updates;
  std::vector<Tensor> stats;  // the running statistics (variables only), initially 0 and 1
};

inline TrainNet train_net(Graph& g, bool variables) {
  TrainNet t;
  t.x = g.placeholder({4, 3, 16, 16}, f32, "x");
  t.labels = g.placeholder({4}, i64, "labels");
  int count = 0;
  auto param = [&](const Array& a) {
    const std::string name = "p" + std::to_string(count++);
    const Tensor p = variables ? g.variable(a, name) : g.placeholder(a.shape(), f32, name);
    t.params.push_back(p);
    t.values.push_back(a);
    return p;
  };
  auto conv = [&](const Tensor& h, int64_t o, int64_t k, int64_t stride) {
    const int64_t c = h.shape()[1];
    ConvOptions opt;
    opt.stride = {stride, stride};
    opt.padding = {k / 2, k / 2};
    const double r = 1.5 / std::sqrt(static_cast<double>(c * k * k));
    return conv2d(h, param(random_array({o, c, k, k}, f32, -r, r)), std::nullopt, opt);
  };
  auto bn = [&](const Tensor& h) {
    const int64_t c = h.shape()[1];
    const Tensor w = param(random_array({c}, f32, 0.5, 1.5)), b = param(random_array({c}, f32));
    if (!variables) return batch_norm_train(h, w, b, 1e-5).y;
    const Tensor rm = g.variable(Array::zeros({c}, f32));
    const Tensor rv = g.variable(Array::from_vector(std::vector<float>(c, 1.0f), {c}));
    t.stats.insert(t.stats.end(), {rm, rv});
    BatchNormTraining r = batch_norm_training(h, rm, rv, w, b, 0.1, 1e-5);
    t.bn_updates.insert(t.bn_updates.end(), r.updates.begin(), r.updates.end());
    return r.y;
  };
  Tensor h = relu(bn(conv(t.x, 12, 3, 1)));
  h = max_pool(h, {.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}});
  h = relu(bn(conv(relu(bn(conv(h, 12, 3, 1))), 12, 3, 1)) + h);
  h = relu(bn(conv(relu(bn(conv(h, 24, 3, 2))), 24, 3, 1)) + bn(conv(h, 24, 1, 2)));
  h = reshape(global_avg_pool(h), {4, 24});
  const Tensor logits =
      linear(h, param(random_array({10, 24}, f32, -0.3, 0.3)), param(random_array({10}, f32)));
  t.loss = softmax_cross_entropy(logits, t.labels);
  return t;
}

}  // namespace kiln::test
