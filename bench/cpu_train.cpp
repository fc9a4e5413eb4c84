// CPU training benchmark: one training step of the MLP 784-256-Softshrink-10 with Adam (batch
// 256) and of a small convnet with SGD (batch 32, 1x28x28), and max-pool forward+backward with the
// forward's indices against recomputing the argmax in the backward pass.
// PyTorch is not installed on the CPU machines, so the steps print kiln's figures only.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "bench/timing.h"
#include "kiln/kiln.h"

namespace {
using kiln::bench::median_ms;

kiln::Array random(const kiln::Shape& s, float scale = 1.0f) {
  static std::mt19937 g(42);
  std::normal_distribution<float> d(0, scale);
  kiln::Array a = kiln::Array::empty(s, kiln::f32);
  for (int64_t i = 0; i < a.numel(); ++i) a.data<float>()[i] = d(g);
  return a;
}

kiln::Array labels(int64_t n, int64_t classes) {
  kiln::Array a = kiln::Array::empty({n}, kiln::i64);
  for (int64_t i = 0; i < n; ++i) a.data<int64_t>()[i] = i % classes;
  return a;
}

void mlp_step(int reps) {
  using namespace kiln;
  Graph g;
  auto x = g.placeholder({256, 784}, f32, "x");
  auto y = g.placeholder({256}, i64, "y");
  auto w1 = g.variable(random({256, 784}, 0.05f), "w1"), b1 = g.variable(Array::zeros({256}, f32), "b1");
  auto w2 = g.variable(random({10, 256}, 0.1f), "w2"), b2 = g.variable(Array::zeros({10}, f32), "b2");
  auto loss = softmax_cross_entropy(linear(softshrink(linear(x, w1, b1)), w2, b2), y);
  std::vector<Tensor> params{w1, b1, w2, b2};
  auto exe = g.compile(Device::cpu(), {}, {loss}, optim::adam(g, params, gradients(loss, params)));
  Array xv = random({256, 784}), yv = labels(256, 10);
  const double ms = median_ms([&] { exe.run({{x, xv}, {y, yv}}); }, reps);
  fmt::print("{:<58} kiln {:8.3f} ms  ({} kernels)\n",
             "MLP 784-256-Softshrink-10, Adam step, batch 256, f32", ms, exe.num_steps());
}

void cnn_step(int reps) {
  using namespace kiln;
  Graph g;
  auto x = g.placeholder({32, 1, 28, 28}, f32, "x");
  auto y = g.placeholder({32}, i64, "y");
  auto w1 = g.variable(random({16, 1, 3, 3}, 0.3f), "w1"), b1 = g.variable(Array::zeros({16}, f32), "b1");
  auto w2 = g.variable(random({32, 16, 3, 3}, 0.1f), "w2"), b2 = g.variable(Array::zeros({32}, f32), "b2");
  auto wf = g.variable(random({10, 32 * 7 * 7}, 0.02f), "wf"), bf = g.variable(Array::zeros({10}, f32), "bf");
  ConvOptions same;
  same.padding = {1, 1};
  PoolOptions pool2;
  pool2.kernel = {2, 2};
  auto h = max_pool(relu(conv2d(x, w1, b1, same)), pool2);
  h = max_pool(relu(conv2d(h, w2, b2, same)), pool2);
  auto loss = softmax_cross_entropy(linear(reshape(h, {32, 32 * 7 * 7}), wf, bf), y);
  std::vector<Tensor> params{w1, b1, w2, b2, wf, bf};
  auto exe = g.compile(Device::cpu(), {}, {loss},
                       optim::sgd(g, params, gradients(loss, params), {.lr = 0.01, .momentum = 0.9}));
  Array xv = random({32, 1, 28, 28}), yv = labels(32, 10);
  const double ms = median_ms([&] { exe.run({{x, xv}, {y, yv}}); }, reps);
  fmt::print("{:<58} kiln {:8.3f} ms  ({} kernels)\n",
             "CNN conv16-pool-conv32-pool-fc10, SGD step, batch 32", ms, exe.num_steps());
}

void max_pool_fwd_bwd(int reps) {
  using namespace kiln;
  const Shape in{8, 64, 112, 112};
  PoolOptions o;
  o.kernel = {3, 3};
  o.stride = {2, 2};
  o.padding = {1, 1};
  Array xv = random(in);
  // with indices: one forward gives values and indices; the backward scatters at the indices
  Graph a;
  auto xa = a.placeholder(in, f32, "x");
  auto [ya, ia] = max_pool_with_indices(xa, o);
  auto dxa = max_pool_grad(ya * 0.5 + 1.0, ia, in);
  auto ea = a.compile(Device::cpu(), {}, {ya, dxa});
  // recomputing: the backward runs the pooling again to find the argmax (optimizations off, or
  // CSE would merge the two poolings)
  Graph b;
  auto xb = b.placeholder(in, f32, "x");
  auto yb = max_pool(xb, o);
  auto again = max_pool_with_indices(xb, o).second;
  auto dxb = max_pool_grad(yb * 0.5 + 1.0, again, in);
  auto eb = b.compile(Device::cpu(), {}, {yb, dxb}, {.optimize = false});
  const double ta = median_ms([&] { ea.run({{xa, xv}}); }, reps);
  const double tb = median_ms([&] { eb.run({{xb, xv}}); }, reps);
  fmt::print("{:<58} kiln {:8.3f} ms  recomputing argmax {:8.3f} ms  ratio {:.2f}\n",
             "max-pool 3x3 s2 fwd+bwd 8x64x112x112 f32, with indices", ta, tb, ta / tb);
}
}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const int reps = quick ? 3 : 20;
  fmt::print("kiln {} CPU training benchmark (median of {} runs)\n", kiln::version(), reps);
  mlp_step(reps);
  cnn_step(reps);
  max_pool_fwd_bwd(reps);
  return 0;
}
