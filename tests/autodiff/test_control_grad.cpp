// Gradients through cond (a cond over the branches' gradients) and for_loop (the forward kept
// per iteration, then the body's vector-Jacobian product from the last iteration back), checked
// by central differences in float64; and the loops whose gradients are not built.
#include "kiln/ops/control.h"
#include "support/gradcheck.h"

namespace kiln {
namespace {
using namespace kiln::test;

Tensor lt(const Tensor& a, double b) { return less(a, scalar_like(a, b)); }

// then: tanh(x * w) + x * v (v captured), else: x * x - w; the predicate from the data, away from
// its edge so that finite differences stay on one branch
TEST(CondGrad, FiniteDifferencesOnBothBranches) {
  for (double sign : {1.0, -1.0}) {
    SCOPED_TRACE(sign > 0 ? "then" : "else");
    std::vector<double> xs = to_f64(random_array({3, 4}, f64, 0.2, 1.0));
    for (double& e : xs) e *= sign;
    check_gradients(
        [](const std::vector<Tensor>& t) {
          const Tensor &x = t[0], &w = t[1], &v = t[2];
          return cond(
              lt(sum(x), 0), {x, w},
              [&](const std::vector<Tensor>& a) {
                return std::vector<Tensor>{tanh(a[0] * a[1]) + a[0] * v};
              },
              [](const std::vector<Tensor>& a) {
                return std::vector<Tensor>{a[0] * a[0] - a[1]};
              })[0];
        },
        {Array::from_vector(xs, {3, 4}), random_array({4}, f64), random_array({3, 4}, f64)});
  }
}

TEST(CondGrad, SeveralResultsAndAnIntegerOperand) {
  check_gradients(
      [](Graph& g, const std::vector<Tensor>& t) {
        const Tensor k = g.constant(Array::scalar(int64_t{3}));
        return cond(
            lt(sum(t[0]), 100), {t[0], k},
            [](const std::vector<Tensor>& a) {
              return std::vector<Tensor>{exp(a[0]), a[0] * cast(a[1], f64)};
            },
            [](const std::vector<Tensor>& a) {
              return std::vector<Tensor>{a[0], a[0]};
            });
      },
      {random_array({5}, f64)});
}

// An RNN as a loop: h = tanh(h W + xs[i]) for 4 steps, with a counter carried beside it;
// gradients for h0, W and xs (W and xs captured).
TEST(ForLoopGrad, RecurrenceMatchesFiniteDifferences) {
  check_gradients(
      [](Graph& g, const std::vector<Tensor>& t) {
        const Tensor &h0 = t[0], &w = t[1], &xs = t[2];
        const Tensor c0 = g.constant(Array::scalar(int64_t{0}));
        auto out = for_loop(4, {h0, c0}, [&](const std::vector<Tensor>& v) {
          return std::vector<Tensor>{tanh(matmul(v[1], w) + gather(xs, v[0], 0)), v[2] + 1.0};
        });
        return std::vector<Tensor>{out[0]};
      },
      {random_array({2, 3}, f64), random_array({3, 3}, f64, -0.7, 0.7),
       random_array({4, 2, 3}, f64)});
}

TEST(ForLoopGrad, ZeroTripsAndNesting) {
  // no iteration: the gradient passes straight through
  check_gradients(
      [](const std::vector<Tensor>& t) {
        return for_loop(0, {t[0]}, [](const std::vector<Tensor>& v) {
          return std::vector<Tensor>{v[1] * v[1]};
        })[0];
      },
      {random_array({3}, f64)});
  // a loop in a loop, reading a value two levels up
  check_gradients(
      [](const std::vector<Tensor>& t) {
        const Tensor& w = t[1];
        return for_loop(2, {t[0]}, [&](const std::vector<Tensor>& v) {
          return for_loop(3, {v[1]}, [&](const std::vector<Tensor>& u) {
            return std::vector<Tensor>{sin(u[1]) * w};
          });
        })[0];
      },
      {random_array({3}, f64), random_array({3}, f64, 0.5, 1.0)});
}

TEST(ForLoopGrad, NeedsATripCountKnownWhenBuilt) {
  Graph g;
  auto x = g.placeholder({3}, f64, "x");
  auto n = g.placeholder({}, i64, "n");
  auto out = for_loop(n, {x},
                      [](const std::vector<Tensor>& v) { return std::vector<Tensor>{v[1] * 2.0}; });
  expect_error<UnsupportedError>([&] { gradients(sum(out[0]), {x}); },
                                 {"[for_loop]", "trip count known when the graph is built"});
  auto w = while_loop(
      {x}, [](const std::vector<Tensor>& v) { return std::vector<Tensor>{lt(sum(v[0]), 10)}; },
      [](const std::vector<Tensor>& v) { return std::vector<Tensor>{v[0] * 2.0}; });
  expect_error<UnsupportedError>([&] { gradients(sum(w[0]), {x}); },
                                 {"[while_loop]", "gradients need max_trip_count"});
}

// x = x * a + 0.1 (a captured) while sum(x) < 12, with a counter carried beside it: the trip count
// depends on the data (and stays put under the small steps of finite differences)
TEST(WhileLoopGrad, FiniteDifferencesWithADataDependentTripCount) {
  for (int rep = 0; rep < 3; ++rep)
    check_gradients(
        [](Graph& g, const std::vector<Tensor>& t) {
          const Tensor &x0 = t[0], &a = t[1];
          const Tensor i0 = g.constant(Array::scalar(int64_t{0}));
          auto out = while_loop(
              {i0, x0},
              [](const std::vector<Tensor>& v) { return std::vector<Tensor>{lt(sum(v[1]), 12)}; },
              [&](const std::vector<Tensor>& v) {
                return std::vector<Tensor>{v[0] + 1.0, v[1] * a + 0.1};
              },
              {.max_trip_count = 64});
          return std::vector<Tensor>{out[1]};
        },
        {random_array({4}, f64, 0.1, 0.5), random_array({4}, f64, 1.1, 1.6)});
}

TEST(WhileLoopGrad, MaxTripCountStillHolds) {
  Graph g;
  auto x = g.placeholder({2}, f64, "x");
  auto w = while_loop(
      {x}, [](const std::vector<Tensor>& v) { return std::vector<Tensor>{lt(sum(v[0]), 1e9)}; },
      [](const std::vector<Tensor>& v) { return std::vector<Tensor>{v[0] * 2.0}; },
      {.max_trip_count = 5});
  auto dx = gradients(sum(w[0]), {x});
  auto exe = g.compile(Device::cpu(), {}, {dx[0]});
  expect_error<ValueError>(
      [&] {
        exe.run({{x, Array::from_vector<double>({1, 1}, {2})}});
      },
      {"[while_loop]", "max_trip_count = 5"});
  // within the limit (3 iterations from 1e8): d sum(x * 2^3) / dx = 8
  expect_close(exe.run({{x, Array::from_vector<double>({1e8, 1e8}, {2})}})[0], {2}, {8, 8}, 1e-12,
               0);
}

}  // namespace
}  // namespace kiln
