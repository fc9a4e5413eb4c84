// Unary elementwise ops: each op is checked against a float64 std:: reference on fresh random
// inputs in f32, f64, f16 and bf16 (and i32 where the op takes integers), plus its special
// values, empty and scalar inputs, and dtype/attribute errors.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <vector>

#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;

using UnaryOp = std::function<Tensor(const Tensor&)>;
using UnaryRef = std::function<double(double)>;

struct UnarySpec {
  UnaryOp op;
  UnaryRef ref;
  double lo, hi;      // input range
  bool takes_ints;    // also runs on integers (compared exactly)
  const char* name;   // "[name]" starts its errors
  // Inputs where the op jumps: random inputs within 1e-3 of one are moved 1e-3 away, since the
  // kernel compares against the threshold rounded to its arithmetic type (0.4f, not 0.4).
  std::vector<double> jumps = {};
};

// Tolerances per dtype: f16/bf16 results are rounded once from f32.
struct Tol { double rtol, atol; };
Tol tolerance(DType t) {
  switch (t) {
    case DType::f64: return {1e-12, 1e-13};
    case DType::f32: return {1e-6, 1e-6};
    case DType::f16: return {2e-3, 2e-3};
    default: return {1e-2, 1e-2};
  }
}

void check_unary_dtype(const UnarySpec& s, DType t, const Shape& shape) {
  SCOPED_TRACE(std::string(s.name) + " " + name(t) + " " + to_string(shape));
  Graph g;
  auto x = g.placeholder(shape, t, "x");
  auto y = s.op(x);
  EXPECT_EQ(y.dtype(), t);
  Array v = random_array(shape, t, s.lo, s.hi);
  if (!s.jumps.empty()) {
    std::vector<double> e = to_f64(v);
    for (double& x : e)
      for (double j : s.jumps)
        if (std::fabs(x - j) < 1e-3) x = x < j ? j - 1e-3 : j + 1e-3;
    v = Array::from_vector(e, shape).astype(t);
  }
  std::vector<double> ref;
  for (double e : to_f64(v)) ref.push_back(s.ref(e));
  Array out = eval1(g, y, {{x, v}});
  if (is_integer(t)) {
    expect_equal(out, shape, ref);
  } else {
    const Tol tol = tolerance(t);
    expect_close(out, shape, ref, tol.rtol, tol.atol);
  }
}

void check_unary(const UnarySpec& s) {
  for (DType t : {f32, f64, f16, bf16}) check_unary_dtype(s, t, {3, 1, 67});
  check_unary_dtype(s, f32, {});        // scalar
  check_unary_dtype(s, f64, {0, 5});    // empty
  check_unary_dtype(s, f32, {40000});   // several threads
  if (s.takes_ints) {
    check_unary_dtype(s, i32, {5, 9});
    check_unary_dtype(s, i64, {17});
  } else {
    Graph g;
    auto x = g.placeholder({2, 3}, i32, "x");
    expect_error<DTypeError>([&] { s.op(x); }, {std::string("[") + s.name + "]", "i32", "(2, 3)"});
  }
}

double sigmoid_ref(double x) { return 1.0 / (1.0 + std::exp(-x)); }
double softplus_ref(double x, double beta, double threshold) {
  return beta * x > threshold ? x : std::log(1.0 + std::exp(beta * x)) / beta;
}
constexpr double kSeluAlpha = 1.6732632423543772848170429916717;
constexpr double kSeluScale = 1.0507009873554804934193349852946;
constexpr double kPi = 3.14159265358979323846;

// One TEST per op, named after it.
#define KILN_UNARY_TEST(Pascal, op_expr, ref_expr, lo, hi, ints, name)                  \
  TEST(Pascal, MatchesReference) {                                                      \
    check_unary({[](const Tensor& x) { return op_expr; }, [](double x) { return ref_expr; }, \
                 lo, hi, ints, name});                                                  \
  }

KILN_UNARY_TEST(Neg, neg(x), -x, -100, 100, true, "neg")
KILN_UNARY_TEST(Abs, abs(x), std::fabs(x), -100, 100, true, "abs")
KILN_UNARY_TEST(Sign, sign(x), (x > 0) - (x < 0), -3, 3, true, "sign")
KILN_UNARY_TEST(Exp, exp(x), std::exp(x), -5, 5, false, "exp")
KILN_UNARY_TEST(Log, log(x), std::log(x), 0.05, 20, false, "log")
KILN_UNARY_TEST(Log1p, log1p(x), std::log1p(x), -0.9, 5, false, "log1p")
KILN_UNARY_TEST(Expm1, expm1(x), std::expm1(x), -3, 3, false, "expm1")
KILN_UNARY_TEST(Sqrt, sqrt(x), std::sqrt(x), 0, 50, false, "sqrt")
KILN_UNARY_TEST(Rsqrt, rsqrt(x), 1 / std::sqrt(x), 0.05, 50, false, "rsqrt")
KILN_UNARY_TEST(Reciprocal, reciprocal(x), 1 / x, 0.1, 10, false, "reciprocal")
KILN_UNARY_TEST(Sin, sin(x), std::sin(x), -kPi, kPi, false, "sin")
KILN_UNARY_TEST(Cos, cos(x), std::cos(x), -kPi, kPi, false, "cos")
KILN_UNARY_TEST(Tanh, tanh(x), std::tanh(x), -4, 4, false, "tanh")
KILN_UNARY_TEST(Sigmoid, sigmoid(x), sigmoid_ref(x), -8, 8, false, "sigmoid")
KILN_UNARY_TEST(Relu, relu(x), x > 0 ? x : 0, -50, 50, true, "relu")
KILN_UNARY_TEST(LeakyRelu, leaky_relu(x, 0.2), x > 0 ? x : 0.2 * x, -4, 4, false, "leaky_relu")
KILN_UNARY_TEST(Elu, elu(x, 0.7), x > 0 ? x : 0.7 * std::expm1(x), -4, 4, false, "elu")
KILN_UNARY_TEST(Selu, selu(x), kSeluScale * (x > 0 ? x : kSeluAlpha * std::expm1(x)), -4, 4,
                false, "selu")
KILN_UNARY_TEST(Gelu, gelu(x), 0.5 * x * std::erfc(-x / std::sqrt(2.0)), -5, 5, false, "gelu")
KILN_UNARY_TEST(Silu, silu(x), x * sigmoid_ref(x), -8, 8, false, "silu")
// past 20 softplus is linear
KILN_UNARY_TEST(Mish, mish(x), x * std::tanh(softplus_ref(x, 1.0, 20.0)), -8, 24, false, "mish")
KILN_UNARY_TEST(Softplus, softplus(x, 2.0, 6.0), softplus_ref(x, 2.0, 6.0), -5, 5, false,
                "softplus")
KILN_UNARY_TEST(Softshrink, softshrink(x, 0.4), x > 0.4 ? x - 0.4 : (x < -0.4 ? x + 0.4 : 0), -2,
                2, false, "softshrink")
TEST(Hardshrink, MatchesReference) {
  check_unary({[](const Tensor& x) { return hardshrink(x, 0.4); },
               [](double x) { return std::fabs(x) > 0.4 ? x : 0; },
               -2,
               2,
               false,
               "hardshrink",
               {-0.4, 0.4}});
}
KILN_UNARY_TEST(Hardswish, hardswish(x), x * std::clamp(x + 3, 0.0, 6.0) / 6, -5, 5, false,
                "hardswish")
KILN_UNARY_TEST(Hardsigmoid, hardsigmoid(x, 0.3, 0.4), std::clamp(0.3 * x + 0.4, 0.0, 1.0), -5, 5,
                false, "hardsigmoid")
KILN_UNARY_TEST(Erf, erf(x), std::erf(x), -3, 3, false, "erf")
KILN_UNARY_TEST(Floor, floor(x), std::floor(x), -20, 20, true, "floor")
KILN_UNARY_TEST(Ceil, ceil(x), std::ceil(x), -20, 20, true, "ceil")
KILN_UNARY_TEST(Round, round(x), std::nearbyint(x), -20, 20, true, "round")
KILN_UNARY_TEST(Clip, clip(x, -1, 2), std::clamp(x, -1.0, 2.0), -3, 3, true, "clip")
// trigonometric and hyperbolic: inputs inside each domain (tan away from its poles)
KILN_UNARY_TEST(Tan, tan(x), std::tan(x), -1.4, 1.4, false, "tan")
KILN_UNARY_TEST(Asin, asin(x), std::asin(x), -0.99, 0.99, false, "asin")
KILN_UNARY_TEST(Acos, acos(x), std::acos(x), -0.99, 0.99, false, "acos")
KILN_UNARY_TEST(Atan, atan(x), std::atan(x), -6, 6, false, "atan")
KILN_UNARY_TEST(Sinh, sinh(x), std::sinh(x), -4, 4, false, "sinh")
KILN_UNARY_TEST(Cosh, cosh(x), std::cosh(x), -4, 4, false, "cosh")
KILN_UNARY_TEST(Asinh, asinh(x), std::asinh(x), -10, 10, false, "asinh")
KILN_UNARY_TEST(Acosh, acosh(x), std::acosh(x), 1.01, 10, false, "acosh")
KILN_UNARY_TEST(Atanh, atanh(x), std::atanh(x), -0.99, 0.99, false, "atanh")

// Expects op(values) == expected exactly, in dtype t.
void expect_values(const UnaryOp& op, DType t, const std::vector<double>& in,
                   const std::vector<double>& expected) {
  Graph g;
  const Shape shape{static_cast<int64_t>(in.size())};
  auto x = g.placeholder(shape, t, "x");
  expect_equal(eval1(g, op(x), {{x, Array::from_vector(in, shape).astype(t)}}), shape, expected);
}

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

TEST(Neg, IntegerMinimumWraps) {
  const int64_t lo = std::numeric_limits<int64_t>::min();
  Graph g;
  auto x = g.placeholder({2}, i64, "x");
  Array out = eval1(g, neg(x), {{x, Array::from_vector<int64_t>({lo, 5}, {2})}});
  EXPECT_EQ(out.to_vector<int64_t>(), (std::vector<int64_t>{lo, -5}));
  expect_error<DTypeError>([&] { neg(g.placeholder({3}, u8, "u")); }, {"[neg]", "u8"});
}

TEST(Abs, UnsignedIsIdentity) { expect_values(abs, u8, {0, 7, 255}, {0, 7, 255}); }

TEST(Sign, ZeroAndNaN) {
  expect_values(sign, f32, {0.0, -0.0, kNaN, -kInf, 3.5}, {0, 0, kNaN, -1, 1});
  expect_values(sign, u8, {0, 9}, {0, 1});
}

TEST(Round, HalfToEven) {
  for (DType t : {f32, f64, f16})
    expect_values(round, t, {0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.25, -3.75},
                  {0, 2, 2, -0, -2, -2, 3, -4});
}

TEST(Floor, SpecialValues) { expect_values(floor, f64, {-1.5, -0.0, 2.0, kInf}, {-2, 0, 2, kInf}); }
TEST(Ceil, SpecialValues) { expect_values(ceil, f64, {-1.5, 0.2, 2.0, kNaN}, {-1, 1, 2, kNaN}); }

TEST(Exp, SpecialValues) { expect_values(exp, f32, {-kInf, 0, kNaN}, {0, 1, kNaN}); }
TEST(Log, SpecialValues) { expect_values(log, f64, {0, 1, -1, kInf}, {-kInf, 0, kNaN, kInf}); }
TEST(Sqrt, NegativeGivesNaN) { expect_values(sqrt, f32, {-1, 4}, {kNaN, 2}); }
TEST(Reciprocal, ZeroGivesInf) { expect_values(reciprocal, f32, {0.0, -0.0}, {kInf, -kInf}); }
TEST(Rsqrt, ZeroGivesInf) { expect_values(rsqrt, f64, {0.0, 0.25}, {kInf, 2}); }
TEST(Sigmoid, Saturates) { expect_values(sigmoid, f32, {-200, 200, 0}, {0, 1, 0.5}); }
TEST(Tanh, Saturates) { expect_values(tanh, f64, {-kInf, kInf}, {-1, 1}); }

// Outside their domains the inverse functions give NaN; atanh(+-1) is +-inf.
TEST(Asin, OutsideDomain) {
  for (DType t : {f32, f64}) {
    expect_values(asin, t, {2, -1.5, 0, kNaN}, {kNaN, kNaN, 0, kNaN});
    expect_values(acos, t, {2, -1.5, 1}, {kNaN, kNaN, 0});
    expect_values(acosh, t, {0.5, -2, 1, kInf}, {kNaN, kNaN, 0, kInf});
    expect_values(atanh, t, {1, -1, 2, 0}, {kInf, -kInf, kNaN, 0});
  }
}
TEST(Sinh, Overflows) {
  expect_values(sinh, f32, {-kInf, 100, 0}, {-kInf, kInf, 0});
  expect_values(cosh, f32, {-kInf, -100, 0}, {kInf, kInf, 1});
  expect_values(asinh, f64, {-kInf, 0, kNaN}, {-kInf, 0, kNaN});
  expect_values(tan, f64, {0, kInf}, {0, kNaN});
}
TEST(Atan, Saturates) {
  check_unary_dtype({[](const Tensor& x) { return atan(x); }, [](double x) { return std::atan(x); },
                     -1e6, 1e6, false, "atan"},
                    f32, {300});
  expect_values(atan, f64, {-kInf, kInf}, {-kPi / 2, kPi / 2});
}

TEST(Relu, KeepsNaN) {
  expect_values(relu, f32, {-1, kNaN, 2, -kInf}, {0, kNaN, 2, 0});
  Graph g;
  expect_error<DTypeError>([&] { relu(g.placeholder({3}, u8, "u")); }, {"[relu]", "u8"});
}

TEST(LeakyRelu, DefaultAlphaAndErrors) {
  check_unary({[](const Tensor& x) { return leaky_relu(x); },
               [](double x) { return x > 0 ? x : 0.01 * x; }, -3, 3, false, "leaky_relu"});
  Graph g;
  auto x = g.placeholder({4}, f32, "x");
  expect_error<ValueError>([&] { leaky_relu(x, kNaN); }, {"[leaky_relu]", "alpha", "(4,)"});
}

TEST(Elu, DefaultAlphaAndErrors) {
  check_unary({[](const Tensor& x) { return elu(x); },
               [](double x) { return x > 0 ? x : std::expm1(x); }, -3, 3, false, "elu"});
  Graph g;
  expect_error<ValueError>([&] { elu(g.placeholder({4}, f32, "x"), kInf); }, {"[elu]", "alpha"});
}

// Far tails too: f32 runs four elements at a time through the C library's vector erfc where
// there is one (its underflow to 0 below about -13, x itself above).
TEST(Gelu, WideRange) {
  const UnarySpec s{[](const Tensor& x) { return gelu(x); },
                    [](double x) { return 0.5 * x * std::erfc(-x / std::sqrt(2.0)); }, -14, 14,
                    false, "gelu"};
  for (DType t : {f32, f64}) check_unary_dtype(s, t, {4099});
}

TEST(Gelu, TanhApproximation) {
  auto ref = [](double x) {
    return 0.5 * x * (1 + std::tanh(std::sqrt(2 / kPi) * (x + 0.044715 * x * x * x)));
  };
  check_unary({[](const Tensor& x) { return gelu(x, GeluApprox::tanh); }, ref, -5, 5, false,
               "gelu"});
}

// f32 tanh and GELU go four elements at a time through the C library's vector functions: an
// element's result must not depend on where it falls (a tensor's last few elements, or a chunk
// of the fused kernel), so the same values run as one tensor and as tensors of three elements
// (no full group of four) agree bit for bit.
TEST(VectorActivations, SameResultWhereverTheElementFalls) {
  const std::vector<std::pair<const char*, UnaryOp>> ops = {
      {"tanh", [](const Tensor& x) { return tanh(x); }},
      {"gelu", [](const Tensor& x) { return gelu(x); }},
      {"gelu tanh", [](const Tensor& x) { return gelu(x, GeluApprox::tanh); }}};
  constexpr int64_t kN = 3000, kPiece = 3;
  for (const auto& [what, op] : ops) {
    SCOPED_TRACE(what);
    const Array x = random_array({kN}, f32, -6, 6);
    Graph whole;
    auto wx = whole.placeholder({kN}, f32, "x");
    // both on the CPU (KILN_DEVICE picks the default device; CUDA's tanh is another function)
    const Array all = whole.compile(Device::cpu(), {}, {op(wx)}).run({{wx, x}})[0];
    Graph g;
    auto px = g.placeholder({kPiece}, f32, "x");
    auto exe = g.compile(Device::cpu(), {}, {op(px)});
    int64_t differ = 0;
    for (int64_t i = 0; i < kN; i += kPiece) {
      Array piece = Array::empty({kPiece}, f32);
      std::memcpy(piece.data(), x.data<float>() + i, sizeof(float) * kPiece);
      const Array y = exe.run({{px, piece}})[0];
      differ += std::memcmp(y.data(), all.data<float>() + i, sizeof(float) * kPiece) != 0;
    }
    EXPECT_EQ(differ, 0) << "pieces of " << kPiece << " whose results differ from the whole's";
  }
}

TEST(Softplus, DefaultsAndErrors) {
  check_unary({[](const Tensor& x) { return softplus(x); },
               [](double x) { return softplus_ref(x, 1, 20); }, -30, 30, false, "softplus"});
  Graph g;
  auto x = g.placeholder({2, 2}, f32, "x");
  expect_error<ValueError>([&] { softplus(x, 0.0); }, {"[softplus]", "beta", "(2, 2)"});
  expect_error<ValueError>([&] { softplus(x, 1.0, kNaN); }, {"[softplus]", "threshold"});
}

TEST(Softshrink, NegativeLambdaIsAnError) {
  Graph g;
  expect_error<ValueError>([&] { softshrink(g.placeholder({3}, f32, "x"), -0.1); },
                           {"[softshrink]", "lambda", "-0.1"});
}

TEST(Hardshrink, NegativeLambdaIsAnError) {
  Graph g;
  expect_error<ValueError>([&] { hardshrink(g.placeholder({3}, f32, "x"), -1); },
                           {"[hardshrink]", "lambda"});
}

TEST(Hardsigmoid, Defaults) {
  check_unary({[](const Tensor& x) { return hardsigmoid(x); },
               [](double x) { return std::clamp(x / 6 + 0.5, 0.0, 1.0); }, -5, 5, false,
               "hardsigmoid"});
}

TEST(Clip, IntegersAndOneSidedBounds) {
  check_unary_dtype({[](const Tensor& x) { return clip(x, -10.5, 20.5); },
                     [](double x) { return std::clamp(x, -10.0, 20.0); }, -50, 50, true, "clip"},
                    i32, {30});
  check_unary_dtype({[](const Tensor& x) { return clip(x, 0.0); },
                     [](double x) { return std::max(x, 0.0); }, -5, 5, true, "clip"},
                    f64, {30});
  // bounds beyond the dtype's range saturate
  expect_values([](const Tensor& x) { return clip(x, -1000, 1000); }, i8, {-128, 5, 127},
                {-128, 5, 127});
  expect_values([](const Tensor& x) { return clip(x, 0, 1); }, f32, {kNaN, 3}, {kNaN, 1});
}

TEST(Clip, MinAboveMaxIsAnError) {
  Graph g;
  auto x = g.placeholder({2, 3}, f32, "x");
  expect_error<ValueError>([&] { clip(x, 3, 1); }, {"[clip]", "min 3", "max 1", "(2, 3)"});
  expect_error<ValueError>([&] { clip(x, kNaN, 1); }, {"[clip]", "nan"});
}

// A chain of unary ops runs in place on intermediates.
TEST(Tanh, ChainOfUnaryOpsInPlace) {
  Graph g;
  auto x = g.placeholder({1000}, f32, "x");
  auto y = sigmoid(tanh(exp(x) * 0.5));
  Array v = random_array({1000}, f32, -3, 3);
  std::vector<double> ref;
  for (double e : to_f64(v)) ref.push_back(sigmoid_ref(std::tanh(std::exp(e) * 0.5)));
  expect_close(eval1(g, y, {{x, v}}), {1000}, ref, 1e-6, 1e-6);
}

}  // namespace
}  // namespace kiln
