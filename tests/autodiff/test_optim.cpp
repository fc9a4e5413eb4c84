// Optimizers against the PyTorch update formulas written as float64 loops, on the quadratic
// loss L(w) = sum(c * w * w / 2 + d * w) whose gradient is c * w + d.
#include <cmath>
#include <functional>

#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;

struct Problem {
  std::vector<double> w0, c, d;
  explicit Problem(int n) {
    w0 = to_f64(random_array({n}, f64, -2, 2));
    c = to_f64(random_array({n}, f64, 0.5, 2));
    d = to_f64(random_array({n}, f64, -1, 1));
  }
};

using Step = std::function<std::vector<Tensor>(Graph&, const Tensor& w, const Tensor& grad)>;
using RefStep = std::function<void(std::vector<double>& w, const std::vector<double>& g, int t)>;

// Runs `steps` optimizer steps through kiln and through the reference; compares w after each.
void compare(const Step& make, const RefStep& ref, int steps = 6) {
  const int n = 5;
  Problem p(n);
  Graph g;
  auto w = g.variable(Array::from_vector(p.w0, {n}), "w");
  auto c = g.constant(Array::from_vector(p.c, {n}));
  auto d = g.constant(Array::from_vector(p.d, {n}));
  auto loss = sum(c * w * w * 0.5 + d * w);
  auto grad = gradients(loss, {w})[0];
  auto exe = g.compile(Device::cpu(), {}, {loss}, make(g, w, grad));
  std::vector<double> rw = p.w0;
  for (int t = 1; t <= steps; ++t) {
    exe.run(Feeds{});
    std::vector<double> gr(n);
    for (int i = 0; i < n; ++i) gr[i] = p.c[i] * rw[i] + p.d[i];
    ref(rw, gr, t);
    expect_close(g.read_variable(w), {n}, rw, 1e-12, 1e-12);
  }
}

TEST(Optim, SgdPlainAndWeightDecay) {
  compare([](Graph& g, const Tensor& w, const Tensor& gr) {
    return optim::sgd(g, {w}, {gr}, {.lr = 0.1, .weight_decay = 0.01});
  },
          [](std::vector<double>& w, const std::vector<double>& g, int) {
            for (size_t i = 0; i < w.size(); ++i) w[i] -= 0.1 * (g[i] + 0.01 * w[i]);
          });
}

TEST(Optim, SgdMomentumAndNesterov) {
  for (bool nesterov : {false, true}) {
    std::vector<double> buf(5, 0.0);
    compare([&](Graph& g, const Tensor& w, const Tensor& gr) {
      return optim::sgd(g, {w}, {gr}, {.lr = 0.05, .momentum = 0.9, .nesterov = nesterov});
    },
            [&](std::vector<double>& w, const std::vector<double>& g, int t) {
              for (size_t i = 0; i < w.size(); ++i) {
                buf[i] = t == 1 ? g[i] : 0.9 * buf[i] + g[i];
                w[i] -= 0.05 * (nesterov ? g[i] + 0.9 * buf[i] : buf[i]);
              }
            });
  }
}

TEST(Optim, AdamAndAdamW) {
  for (bool decoupled : {false, true}) {
    std::vector<double> m(5, 0.0), v(5, 0.0);
    const double lr = 0.01, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.1;
    compare([&](Graph& g, const Tensor& w, const Tensor& gr) {
      optim::AdamOptions o{.lr = lr, .weight_decay = wd};
      return decoupled ? optim::adamw(g, {w}, {gr}, o) : optim::adam(g, {w}, {gr}, o);
    },
            [&](std::vector<double>& w, const std::vector<double>& g, int t) {
              for (size_t i = 0; i < w.size(); ++i) {
                double gi = decoupled ? g[i] : g[i] + wd * w[i];
                if (decoupled) w[i] *= 1 - lr * wd;
                m[i] = b1 * m[i] + (1 - b1) * gi;
                v[i] = b2 * v[i] + (1 - b2) * gi * gi;
                const double mh = m[i] / (1 - std::pow(b1, t)), vh = v[i] / (1 - std::pow(b2, t));
                w[i] -= lr * mh / (std::sqrt(vh) + eps);
              }
            });
  }
}

TEST(Optim, RmsPropWithMomentum) {
  std::vector<double> sq(5, 0.0), buf(5, 0.0);
  compare([](Graph& g, const Tensor& w, const Tensor& gr) {
    return optim::rmsprop(g, {w}, {gr}, {.lr = 0.01, .alpha = 0.9, .momentum = 0.5});
  },
          [&](std::vector<double>& w, const std::vector<double>& g, int) {
            for (size_t i = 0; i < w.size(); ++i) {
              sq[i] = 0.9 * sq[i] + 0.1 * g[i] * g[i];
              buf[i] = 0.5 * buf[i] + g[i] / (std::sqrt(sq[i]) + 1e-8);
              w[i] -= 0.01 * buf[i];
            }
          });
}

TEST(Optim, LearningRateAsPlaceholderNeedsNoRecompile) {
  Graph g;
  auto w = g.variable(Array::from_vector<double>({1.0, -2.0}, {2}), "w");
  auto lr = g.placeholder({}, f64, "lr");
  auto grad = gradients(sum(w * w * 0.5), {w})[0];  // = w
  auto exe = g.compile(Device::cpu(), {}, {}, optim::sgd(g, {w}, {grad}, {.lr = lr}));
  std::vector<double> ref = {1.0, -2.0};
  for (double rate : {0.5, 0.25, 0.1}) {
    exe.run({{lr, Array::scalar(rate)}});
    for (auto& v : ref) v -= rate * v;
    expect_close(g.read_variable(w), {2}, ref, 1e-14, 1e-14);
  }
}

TEST(Optim, ErrorsNameTheOptimizer) {
  Graph g;
  auto w = g.variable(Array::zeros({3}, f32), "w");
  auto x = g.placeholder({3}, f32, "x");
  expect_error<ValueError>([&] { optim::sgd(g, {x}, {x}); }, {"[sgd]", "not a variable"});
  expect_error<ShapeError>([&] { optim::adam(g, {w}, {g.placeholder({4}, f32)}); },
                           {"[adam]", "(4,)", "(3,)"});
  expect_error<ValueError>([&] { optim::sgd(g, {w}, {w}, {.nesterov = true}); }, {"[sgd]", "nesterov"});
}

}  // namespace
}  // namespace kiln
