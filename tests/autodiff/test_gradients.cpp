// The autodiff core: traversal, accumulation, broadcasting, errors.
#include "support/gradcheck.h"

namespace kiln {
namespace {
using namespace kiln::test;

TEST(Gradients, FanOutAccumulates) {
  // y = x*x + exp(x) - x: dy/dx = 2x + exp(x) - 1
  Graph g;
  auto x = g.placeholder({6}, f64, "x");
  auto y = sum(x * x + exp(x) - x);
  auto dx = gradients(y, {x})[0];
  Array v = random_array({6}, f64);
  std::vector<double> ref;
  for (double e : to_f64(v)) ref.push_back(2 * e + std::exp(e) - 1);
  expect_close(eval1(g, dx, {{x, v}}), {6}, ref, 1e-12, 1e-12);
}

TEST(Gradients, BroadcastGradientsSumBack) {
  check_gradients([](const std::vector<Tensor>& x) { return x[0] * x[1] + x[2]; },
                  {random_array({3, 1, 4}, f64), random_array({5, 1}, f64),
                   random_array({}, f64)});
}

TEST(Gradients, IncomingGradient) {
  Graph g;
  auto x = g.placeholder({4}, f64, "x");
  auto gy = g.placeholder({4}, f64, "gy");
  auto dx = gradients(exp(x), {x}, gy)[0];
  Array vx = random_array({4}, f64), vg = random_array({4}, f64);
  std::vector<double> ref;
  auto a = to_f64(vx), b = to_f64(vg);
  for (int i = 0; i < 4; ++i) ref.push_back(std::exp(a[i]) * b[i]);
  expect_close(eval1(g, dx, {{x, vx}, {gy, vg}}), {4}, ref, 1e-12, 1e-12);
}

TEST(Gradients, UnconnectedInputGetsZeros) {
  Graph g;
  auto x = g.placeholder({2, 3}, f32, "x");
  auto z = g.placeholder({3}, f32, "z");
  auto grads = gradients(sum(exp(x)), {z});
  expect_equal(eval1(g, grads[0]), {3}, {0, 0, 0});
}

TEST(Gradients, NonDifferentiablePathNamesTheOp) {
  Graph g;
  auto x = g.placeholder({2, 3}, f32, "x");
  auto y = sum(cast(argmax(x, 1), f32));
  expect_error<UnsupportedError>([&] { gradients(y, {x}); }, {"[gradients]", "argmax", "'x'"});
}

TEST(Gradients, GradientOfGradient) {
  // d2/dx2 of sum(exp(x) * x) = exp(x) * (x + 2)
  Graph g;
  auto x = g.placeholder({5}, f64, "x");
  auto dx = gradients(sum(exp(x) * x), {x})[0];
  auto d2x = gradients(sum(dx), {x})[0];
  Array v = random_array({5}, f64);
  std::vector<double> ref;
  for (double e : to_f64(v)) ref.push_back(std::exp(e) * (e + 2));
  expect_close(eval1(g, d2x, {{x, v}}), {5}, ref, 1e-12, 1e-12);
}

TEST(SumGrad, FiniteDifferences) {
  check_gradients([](const std::vector<Tensor>& x) { return sum(x[0], {0, 2}); },
                  {random_array({2, 3, 4}, f64)});
  check_gradients([](const std::vector<Tensor>& x) { return sum(x[0], {-1}, true); },
                  {random_array({3, 2}, f64)});
}
TEST(CastGrad, FiniteDifferences) {
  check_gradients([](const std::vector<Tensor>& x) { return cast(cast(x[0], f32), f64) * x[0]; },
                  {random_array({4}, f64)}, {.eps = 1e-3, .atol = 1e-4, .rtol = 1e-3});
}

TEST(AddGrad, FiniteDifferences) {
  check_gradients([](const std::vector<Tensor>& x) { return x[0] + x[1]; },
                  {random_array({2, 3}, f64), random_array({3}, f64)});
  check_gradients([](const std::vector<Tensor>& x) { return x[0] + x[1]; },
                  {random_array({4, 1}, f64), random_array({1, 5}, f64)});
}
TEST(SubGrad, FiniteDifferences) {
  check_gradients([](const std::vector<Tensor>& x) { return x[0] - x[1]; },
                  {random_array({1, 3}, f64), random_array({2, 1}, f64)});
}
TEST(MulGrad, FiniteDifferences) {
  check_gradients([](const std::vector<Tensor>& x) { return x[0] * x[1]; },
                  {random_array({2, 3}, f64), random_array({2, 1}, f64)});
}
TEST(NegGrad, FiniteDifferences) {
  check_gradients([](const std::vector<Tensor>& x) { return -x[0]; }, {random_array({5}, f64)});
}
TEST(ExpGrad, FiniteDifferences) {
  check_gradients([](const std::vector<Tensor>& x) { return exp(x[0]); },
                  {random_array({3, 2}, f64)});
}

}  // namespace
}  // namespace kiln
