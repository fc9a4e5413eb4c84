// Gradients of composite models against PyTorch in float64: golden data made by
// scripts/golden_grads.py (committed under tests/data/golden).
#include <cstdlib>

#include "support/reference.h"

#ifndef KILN_TEST_DATA_DIR
#error "KILN_TEST_DATA_DIR must point at tests/data"
#endif

namespace kiln {
namespace {
using namespace kiln::test;

Array golden(const std::string& name) {
  // KILN_TEST_DATA_DIR in the environment wins (suites run from a copied build elsewhere)
  const char* env = std::getenv("KILN_TEST_DATA_DIR");
  return Array::load_npy(std::string(env ? env : KILN_TEST_DATA_DIR) + "/golden/" + name + ".npy");
}
Array golden64(const std::string& name) { return golden(name).astype(f64); }

void expect_matches(const Array& got, const std::string& name) {
  SCOPED_TRACE(name);
  Array want = golden(name);
  expect_close(got, want.shape(), to_f64(want), 1e-6, 1e-12);
}

TEST(GoldenTorch, MlpSoftshrinkCrossEntropy) {
  Graph g;
  std::vector<std::string> names = {"x", "w1", "b1", "w2", "b2"};
  std::vector<Tensor> t;
  for (auto& n : names) t.push_back(g.constant(golden64("mlp_" + n)));
  auto y = g.constant(golden("mlp_y"));
  auto h = softshrink(linear(t[0], t[1], t[2]), 0.5);
  auto loss = softmax_cross_entropy(linear(h, t[3], t[4]), y);
  auto grads = gradients(loss, t);
  std::vector<Tensor> targets{loss};
  targets.insert(targets.end(), grads.begin(), grads.end());
  auto out = eval(g, targets, {}, {.optimize = false});
  expect_matches(out[0], "mlp_loss");
  for (size_t i = 0; i < names.size(); ++i) expect_matches(out[i + 1], "mlp_grad_" + names[i]);
}

TEST(GoldenTorch, CnnBatchNormMaxPool) {
  Graph g;
  std::vector<std::string> names = {"x", "cw", "cb", "gamma", "beta", "lw", "lb"};
  std::vector<Tensor> t;
  for (auto& n : names) t.push_back(g.constant(golden64("cnn_" + n)));
  auto y = g.constant(golden("cnn_y"));
  auto rm = g.variable(Array::zeros({4}, f64), "bn.running_mean");
  auto rv = g.variable(Array::zeros({4}, f64), "bn.running_var");
  ConvOptions pad1;
  pad1.padding = {1, 1};
  PoolOptions pool2;
  pool2.kernel = {2, 2};
  auto h = conv2d(t[0], t[1], t[2], pad1);
  h = batch_norm_training(h, rm, rv, t[3], t[4]).y;
  h = max_pool(relu(h), pool2);
  auto loss = softmax_cross_entropy(linear(reshape(h, {4, 64}), t[5], t[6]), y);
  auto grads = gradients(loss, t);
  std::vector<Tensor> targets{loss};
  targets.insert(targets.end(), grads.begin(), grads.end());
  auto out = eval(g, targets);
  expect_matches(out[0], "cnn_loss");
  for (size_t i = 0; i < names.size(); ++i) expect_matches(out[i + 1], "cnn_grad_" + names[i]);
}

}  // namespace
}  // namespace kiln
