// Gradient rules of the elementwise family, checked by finite differences. Inputs are drawn away
// from kinks (relu at 0, shrink at +-lambda, max/min ties, floor at integers), where one-sided
// differences disagree with any single rule.
#include <cmath>
#include <limits>

#include "support/gradcheck.h"

namespace kiln {
namespace {
using namespace kiln::test;

const Shape kShape{3, 4};

Array uniform(double lo, double hi, const Shape& s = kShape) {
  return random_array(s, f64, lo, hi);
}

// Uniform in [-range, range), redrawn while within 0.05 of a kink.
Array away(const std::vector<double>& kinks, double range = 2.0, const Shape& s = kShape) {
  std::uniform_real_distribution<double> u(-range, range);
  std::vector<double> v(numel(s));
  for (double& e : v) {
    auto near = [&](double x) {
      for (double k : kinks)
        if (std::fabs(x - k) < 0.05) return true;
      return false;
    };
    do e = u(rng());
    while (near(e));
  }
  return Array::from_vector(v, s);
}

// k + f with integer k in [-3, 2] and f in [0.1, 0.4]: away from integers and halves.
Array off_integers(const Shape& s = kShape) {
  std::vector<double> v = to_f64(random_ints(s, -3, 2));
  for (double& e : v) e += 0.1 + 0.3 * std::uniform_real_distribution<double>()(rng());
  return Array::from_vector(v, s);
}

// Nonzero integers in [-3, 3] as f64 (mod divisors: a/b then stays away from integers when a
// does).
Array nonzero_ints(const Shape& s) {
  std::vector<double> v = to_f64(random_ints(s, 1, 3));
  for (double& e : v)
    if (rng()() % 2) e = -e;
  return Array::from_vector(v, s);
}

// Multiples of 0.2 in [-1, 1] plus `offset`: two such arrays with offsets 0.05 and -0.05
// differ by at least 0.1 everywhere (no max/min ties).
Array grid(const Shape& s, double offset) {
  std::vector<double> v = to_f64(random_ints(s, -5, 5));
  for (double& e : v) e = e * 0.2 + offset;
  return Array::from_vector(v, s);
}

void check_unary(Tensor (*f)(const Tensor&), const Array& x) {
  check_gradients([f](const std::vector<Tensor>& t) { return f(t[0]); }, {x});
}

// One test per unary op: INPUT is an expression (parenthesize commas), the rest is f(x).
#define UNARY_GRAD(Suite, INPUT, ...)                                          \
  TEST(Suite, FiniteDifferences) {                                             \
    check_unary([](const Tensor& x) -> Tensor { return __VA_ARGS__; }, INPUT); \
  }

UNARY_GRAD(AbsGrad, (away({0.0})), abs(x))
UNARY_GRAD(SignGrad, (away({0.0})), sign(x))
UNARY_GRAD(FloorGrad, off_integers(), floor(x))
UNARY_GRAD(CeilGrad, off_integers(), ceil(x))
UNARY_GRAD(RoundGrad, off_integers(), round(x))
UNARY_GRAD(LogGrad, (uniform(0.2, 3)), log(x))
UNARY_GRAD(Log1pGrad, (uniform(-0.7, 3)), log1p(x))
UNARY_GRAD(Expm1Grad, (uniform(-2, 2)), expm1(x))
UNARY_GRAD(SqrtGrad, (uniform(0.2, 3)), sqrt(x))
UNARY_GRAD(RsqrtGrad, (uniform(0.2, 3)), rsqrt(x))
UNARY_GRAD(ReciprocalGrad, (random_nonzero(kShape, f64)), reciprocal(x))
UNARY_GRAD(SinGrad, (uniform(-4, 4)), sin(x))
UNARY_GRAD(CosGrad, (uniform(-4, 4)), cos(x))
UNARY_GRAD(TanhGrad, (uniform(-3, 3)), tanh(x))
UNARY_GRAD(SigmoidGrad, (uniform(-5, 5)), sigmoid(x))
UNARY_GRAD(ErfGrad, (uniform(-2, 2)), erf(x))
UNARY_GRAD(TanGrad, (uniform(-1.2, 1.2)), tan(x))
UNARY_GRAD(AsinGrad, (uniform(-0.9, 0.9)), asin(x))
UNARY_GRAD(AcosGrad, (uniform(-0.9, 0.9)), acos(x))
UNARY_GRAD(AtanGrad, (uniform(-4, 4)), atan(x))
UNARY_GRAD(SinhGrad, (uniform(-3, 3)), sinh(x))
UNARY_GRAD(CoshGrad, (uniform(-3, 3)), cosh(x))
UNARY_GRAD(AsinhGrad, (uniform(-4, 4)), asinh(x))
UNARY_GRAD(AcoshGrad, (uniform(1.1, 4)), acosh(x))
UNARY_GRAD(AtanhGrad, (uniform(-0.9, 0.9)), atanh(x))
UNARY_GRAD(ReluGrad, (away({0.0})), relu(x))
UNARY_GRAD(SeluGrad, (away({0.0})), selu(x))
UNARY_GRAD(SiluGrad, (uniform(-5, 5)), silu(x))
UNARY_GRAD(MishGrad, (uniform(-5, 5)), mish(x))
UNARY_GRAD(HardswishGrad, (away({-3.0, 3.0}, 5)), hardswish(x))

TEST(LeakyReluGrad, FiniteDifferences) {
  check_unary([](const Tensor& x) { return leaky_relu(x); }, away({0.0}));
  check_unary([](const Tensor& x) { return leaky_relu(x, 0.3); }, away({0.0}));
}
TEST(EluGrad, FiniteDifferences) {
  check_unary([](const Tensor& x) { return elu(x); }, away({0.0}));
  check_unary([](const Tensor& x) { return elu(x, 0.4); }, away({0.0}));
}
TEST(GeluGrad, FiniteDifferences) {
  check_unary([](const Tensor& x) { return gelu(x); }, uniform(-3, 3));
  check_unary([](const Tensor& x) { return gelu(x, GeluApprox::tanh); }, uniform(-3, 3));
}
TEST(SoftplusGrad, FiniteDifferences) {
  check_unary([](const Tensor& x) { return softplus(x); }, uniform(-4, 4));
  // beta x crosses the threshold 1 at x = 0.5: linear above, sigmoid(beta x) slope below
  check_unary([](const Tensor& x) { return softplus(x, 2.0, 1.0); }, away({0.5}));
}
TEST(SoftshrinkGrad, FiniteDifferences) {
  check_unary([](const Tensor& x) { return softshrink(x); }, away({-0.5, 0.5}));
  check_unary([](const Tensor& x) { return softshrink(x, 1.2); }, away({-1.2, 1.2}));
}
TEST(HardshrinkGrad, FiniteDifferences) {
  check_unary([](const Tensor& x) { return hardshrink(x); }, away({-0.5, 0.5}));
  check_unary([](const Tensor& x) { return hardshrink(x, 1.2); }, away({-1.2, 1.2}));
}
TEST(HardsigmoidGrad, FiniteDifferences) {
  check_unary([](const Tensor& x) { return hardsigmoid(x); }, away({-3.0, 3.0}, 5));
  check_unary([](const Tensor& x) { return hardsigmoid(x, 0.2, 0.4); }, away({-2.0, 3.0}, 5));
}
TEST(ClipGrad, FiniteDifferences) {
  check_unary([](const Tensor& x) { return clip(x, -0.5, 0.7); }, away({-0.5, 0.7}, 1.5));
  check_unary([](const Tensor& x) { return clip(x, 0.3); }, away({0.3}, 1.5));
  check_unary(
      [](const Tensor& x) { return clip(x, -std::numeric_limits<double>::infinity(), -0.2); },
      away({-0.2}, 1.5));
}

// ---- binary ops, with broadcasting ----

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

TEST(DivGrad, FiniteDifferences) {
  Fn f = [](const std::vector<Tensor>& x) { return x[0] / x[1]; };
  check_gradients(f, {random_array({2, 3}, f64), random_nonzero({3}, f64)});
  check_gradients(f, {random_array({4, 1}, f64), random_nonzero({1, 5}, f64)});
  check_gradients(f, {random_array({}, f64), random_nonzero({2, 2}, f64)});
}
TEST(PowGrad, FiniteDifferences) {
  Fn f = [](const std::vector<Tensor>& x) { return pow(x[0], x[1]); };
  check_gradients(f, {uniform(0.3, 2, {2, 3}), uniform(-2, 2, {3})});
  check_gradients(f, {uniform(0.3, 2, {4, 1}), uniform(-2, 2, {1, 3})});
  // a negative base with integer exponents: only the base's gradient exists
  check_gradients(f, {random_nonzero({2, 3}, f64), random_ints({3}, 1, 3, f64)}, {.wrt = {0}});
}
TEST(PowGrad, ZeroBaseAndZeroExponent) {
  Graph g;
  auto a = g.placeholder({3}, f64, "a");
  auto b = g.placeholder({3}, f64, "b");
  auto grads = gradients(sum(pow(a, b)), {a, b});
  Feeds feeds{{a, Array::from_vector<double>({0, 0, 2}, {3})},
              {b, Array::from_vector<double>({2, 0, 0}, {3})}};
  auto out = eval(g, grads, feeds);
  expect_close(out[0], {3}, {0, 0, 0}, 0, 0);  // 2*0^1, and 0 (not 0 * inf) for 0^0, 2^0
  expect_close(out[1], {3}, {0, 0, std::log(2.0)}, 1e-12, 0);  // 0 where the base is 0
}
TEST(MaximumGrad, FiniteDifferences) {
  Fn f = [](const std::vector<Tensor>& x) { return maximum(x[0], x[1]); };
  check_gradients(f, {grid({2, 3}, 0.05), grid({3}, -0.05)});
  check_gradients(f, {grid({4, 1}, -0.05), grid({1, 3}, 0.05)});
}
TEST(MinimumGrad, FiniteDifferences) {
  Fn f = [](const std::vector<Tensor>& x) { return minimum(x[0], x[1]); };
  check_gradients(f, {grid({2, 3}, 0.05), grid({3}, -0.05)});
  check_gradients(f, {grid({4, 1}, -0.05), grid({1, 3}, 0.05)});
}
// Ties split the gradient evenly between both inputs.
void expect_grads_at_ties(Tensor (*op)(const Tensor&, const Tensor&), const std::vector<double>& ga,
                          const std::vector<double>& gb) {
  Graph g;
  auto a = g.placeholder({3}, f64, "a");
  auto b = g.placeholder({3}, f64, "b");
  auto grads = gradients(sum(op(a, b)), {a, b});
  Feeds feeds{{a, Array::from_vector<double>({1, 2, 3}, {3})},
              {b, Array::from_vector<double>({1, 1, 5}, {3})}};
  auto out = eval(g, grads, feeds);
  expect_close(out[0], {3}, ga, 0, 0);
  expect_close(out[1], {3}, gb, 0, 0);
}
TEST(MaximumGrad, TiesSplitEvenly) { expect_grads_at_ties(maximum, {0.5, 1, 0}, {0.5, 0, 1}); }
TEST(MinimumGrad, TiesSplitEvenly) { expect_grads_at_ties(minimum, {0.5, 0, 1}, {0.5, 1, 0}); }
TEST(ModGrad, FiniteDifferences) {
  Fn f = [](const std::vector<Tensor>& x) { return mod(x[0], x[1]); };
  check_gradients(f, {off_integers({2, 3}), nonzero_ints({3})});
  check_gradients(f, {off_integers({4, 1}), nonzero_ints({1, 3})});
}

TEST(WhereGrad, FiniteDifferences) {
  GradFn f = [](Graph&, const std::vector<Tensor>& x) {
    return std::vector<Tensor>{where(x[0], x[1], x[2])};
  };
  // cond, x and y each broadcast along some axis of the (2, 3, 4) result
  check_gradients(
      f, {random_array({2, 3, 1}, boolean), random_array({3, 4}, f64), random_array({4}, f64)},
      {.wrt = {1, 2}});
  check_gradients(
      f, {random_array({4}, boolean), random_array({2, 3, 1}, f64), random_array({2, 1, 4}, f64)},
      {.wrt = {1, 2}});
}

// ---- second derivatives: check_gradients of first derivatives built with gradients() ----

TEST(TanhGrad, SecondDerivative) {
  check_gradients(
      [](Graph&, const std::vector<Tensor>& x) { return gradients(sum(tanh(x[0])), {x[0]}); },
      {uniform(-2, 2)});
}
TEST(GeluGrad, SecondDerivative) {
  check_gradients(
      [](Graph&, const std::vector<Tensor>& x) {
        return std::vector<Tensor>{gradients(sum(gelu(x[0])), {x[0]})[0],
                                   gradients(sum(gelu(x[0], GeluApprox::tanh)), {x[0]})[0]};
      },
      {uniform(-3, 3)});
}
TEST(SoftplusGrad, SecondDerivative) {
  check_gradients(
      [](Graph&, const std::vector<Tensor>& x) {
        return gradients(sum(softplus(x[0], 2.0, 1.0)), {x[0]});
      },
      {away({0.5})});
}
TEST(DivGrad, SecondDerivative) {
  check_gradients(
      [](Graph&, const std::vector<Tensor>& x) {
        return gradients(sum(x[0] / x[1]), {x[0], x[1]});
      },
      {random_array({2, 3}, f64), random_nonzero({1, 3}, f64)});
}
TEST(PowGrad, SecondDerivative) {
  check_gradients(
      [](Graph&, const std::vector<Tensor>& x) {
        return gradients(sum(pow(x[0], x[1])), {x[0], x[1]});
      },
      {uniform(0.3, 2, {2, 3}), uniform(-2, 2, {2, 3})});
}

// ---- other dtypes: the rules build their constants in the input's dtype ----

TEST(ElementwiseGrad, Float32MatchesFloat64) {
  using Op = Tensor (*)(const Tensor&);
  const std::vector<Op> ops = {
      [](const Tensor& x) { return gelu(x, GeluApprox::tanh); },
      [](const Tensor& x) { return softplus(x, 2.0, 1.0); },
      [](const Tensor& x) { return hardswish(x); },
      [](const Tensor& x) { return clip(x, -0.5, 0.7); },
      [](const Tensor& x) { return maximum(x, scalar_like(x, 0.5)); },
      [](const Tensor& x) { return pow(abs(x), scalar_like(x, 1.5)); },
  };
  const Array v = away({-0.5, 0.0, 0.5, 0.7}, 4);
  for (Op op : ops) {
    Graph g;
    auto x64 = g.placeholder(kShape, f64, "x64");
    auto x32 = g.placeholder(kShape, f32, "x32");
    auto out = eval(g, {gradients(sum(op(x64)), {x64})[0], gradients(sum(op(x32)), {x32})[0]},
                    {{x64, v}, {x32, v.astype(f32)}});
    ASSERT_EQ(out[1].dtype(), f32);
    expect_close(out[1], kShape, to_f64(out[0]), 1e-5, 1e-6);
  }
}

// ---- no gradient through bool outputs ----

TEST(ElementwiseGrad, ComparisonsAreNotDifferentiable) {
  Graph g;
  auto x = g.placeholder({3}, f32, "x");
  auto y = sum(cast(greater(x, scalar_like(x, 0)), f32));
  expect_error<UnsupportedError>([&] { gradients(y, {x}); }, {"[gradients]", "greater", "'x'"});
}

}  // namespace
}  // namespace kiln
