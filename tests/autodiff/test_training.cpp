// End-to-end training: a tiny MLP trained by kiln (gradients + SGD on variables) follows the loss
// trajectory of the same model trained by a hand-written float64 reference (explicit backprop).
#include <cmath>

#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;

constexpr int N = 6, I = 4, H = 8, C = 3;

struct Ref {
  std::vector<double> w1, b1, w2, b2;  // (H, I), (H), (C, H), (C)
  // One SGD step on (x, y); returns the loss before the step.
  double step(const std::vector<double>& x, const std::vector<int64_t>& y, double lr) {
    std::vector<double> h(N * H), z(N * C), dz(N * C), dh(N * H);
    double loss = 0;
    for (int n = 0; n < N; ++n) {
      for (int j = 0; j < H; ++j) {
        double a = b1[j];
        for (int i = 0; i < I; ++i) a += w1[j * I + i] * x[n * I + i];
        h[n * H + j] = std::tanh(a);
      }
      double mx = -1e300;
      for (int c = 0; c < C; ++c) {
        double a = b2[c];
        for (int j = 0; j < H; ++j) a += w2[c * H + j] * h[n * H + j];
        z[n * C + c] = a;
        mx = std::max(mx, a);
      }
      double se = 0;
      for (int c = 0; c < C; ++c) se += std::exp(z[n * C + c] - mx);
      loss += (std::log(se) + mx - z[n * C + y[n]]) / N;
      for (int c = 0; c < C; ++c)
        dz[n * C + c] = (std::exp(z[n * C + c] - mx) / se - (c == y[n] ? 1 : 0)) / N;
    }
    std::vector<double> gw2(C * H, 0), gb2(C, 0), gw1(H * I, 0), gb1(H, 0);
    for (int n = 0; n < N; ++n) {
      for (int c = 0; c < C; ++c) {
        gb2[c] += dz[n * C + c];
        for (int j = 0; j < H; ++j) gw2[c * H + j] += dz[n * C + c] * h[n * H + j];
      }
      for (int j = 0; j < H; ++j) {
        double d = 0;
        for (int c = 0; c < C; ++c) d += dz[n * C + c] * w2[c * H + j];
        d *= 1 - h[n * H + j] * h[n * H + j];
        gb1[j] += d;
        for (int i = 0; i < I; ++i) gw1[j * I + i] += d * x[n * I + i];
      }
    }
    for (size_t k = 0; k < w1.size(); ++k) w1[k] -= lr * gw1[k];
    for (size_t k = 0; k < b1.size(); ++k) b1[k] -= lr * gb1[k];
    for (size_t k = 0; k < w2.size(); ++k) w2[k] -= lr * gw2[k];
    for (size_t k = 0; k < b2.size(); ++k) b2[k] -= lr * gb2[k];
    return loss;
  }
};

TEST(Training, TinyMlpFollowsReferenceTrajectory) {
  Array w1 = random_array({H, I}, f64), b1 = random_array({H}, f64);
  Array w2 = random_array({C, H}, f64), b2 = random_array({C}, f64);
  Array xs = random_array({N, I}, f64, -2, 2), ys = random_ints({N}, 0, C - 1);
  Ref ref{to_f64(w1), to_f64(b1), to_f64(w2), to_f64(b2)};

  Graph g;
  auto vw1 = g.variable(w1, "w1"), vb1 = g.variable(b1, "b1");
  auto vw2 = g.variable(w2, "w2"), vb2 = g.variable(b2, "b2");
  auto x = g.placeholder({N, I}, f64, "x");
  auto y = g.placeholder({N}, i64, "y");
  auto loss = softmax_cross_entropy(linear(tanh(linear(x, vw1, vb1)), vw2, vb2), y);
  std::vector<Tensor> params{vw1, vb1, vw2, vb2};
  auto step = optim::sgd(g, params, gradients(loss, params), {.lr = 0.5});
  auto exe = g.compile(Device::cpu(), {}, {loss}, step);

  const auto xv = to_f64(xs);
  const auto yv = ys.to_vector<int64_t>();
  for (int s = 0; s < 8; ++s) {
    const double want = ref.step(xv, yv, 0.5);
    const double got = to_f64(exe.run({{x, xs}, {y, ys}})[0])[0];
    EXPECT_NEAR(got, want, 1e-12) << "step " << s;
  }
  expect_close(g.read_variable(vw1), {H, I}, ref.w1, 1e-10, 1e-12);
  expect_close(g.read_variable(vb2), {C}, ref.b2, 1e-10, 1e-12);
}

}  // namespace
}  // namespace kiln
