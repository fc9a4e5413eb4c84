// Binary elementwise ops (div pow maximum minimum mod), comparisons and logic: float64
// references on fresh random inputs, numpy's integer semantics, broadcasting both ways, empty
// and scalar operands, and errors.
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <optional>

#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;

using BinaryOp = std::function<Tensor(const Tensor&, const Tensor&)>;
using BinaryRef = std::function<double(double, double)>;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// out = f(a, b) with numpy broadcasting, in float64.
std::vector<double> ref_binary(const Array& a, const Array& b, const Shape& out,
                               const BinaryRef& f) {
  auto va = to_f64(a), vb = to_f64(b);
  std::vector<double> r(static_cast<size_t>(numel(out)));
  for (int64_t i = 0; i < numel(out); ++i) {
    auto idx = unravel(i, out);
    r[i] = f(va[broadcast_offset(idx, a.shape(), out)], vb[broadcast_offset(idx, b.shape(), out)]);
  }
  return r;
}

struct BroadcastCase { Shape a, b, out; };
const std::vector<BroadcastCase> kBroadcastCases = {
    {{3, 4}, {3, 4}, {3, 4}},       {{3, 1}, {1, 4}, {3, 4}},    {{2, 3, 4}, {4}, {2, 3, 4}},
    {{4}, {2, 3, 4}, {2, 3, 4}},    {{}, {5}, {5}},              {{5}, {}, {5}},
    {{}, {}, {}},                   {{0, 3}, {3}, {0, 3}},       {{7, 1, 5}, {1, 6, 1}, {7, 6, 5}},
    {{40000}, {40000}, {40000}}};

// Inputs for one dtype: b is drawn away from zero when the op divides.
struct Inputs { double lo, hi; bool nonzero_b; };

// Checks op against ref over every broadcast case in dtype t; output dtype out_t (t if void).
void check_binary(const BinaryOp& op, const BinaryRef& ref, DType t, Inputs in, double rtol,
                  double atol, std::optional<DType> out_t = std::nullopt) {
  for (const auto& c : kBroadcastCases) {
    SCOPED_TRACE(std::string(name(t)) + " " + to_string(c.a) + " with " + to_string(c.b));
    Graph g;
    auto a = g.placeholder(c.a, t, "a");
    auto b = g.placeholder(c.b, t, "b");
    auto y = op(a, b);
    EXPECT_EQ(y.dtype(), out_t.value_or(t));
    Array va = random_array(c.a, t, in.lo, in.hi);
    Array vb = in.nonzero_b ? random_nonzero(c.b, t, 0.25, in.hi)
                            : random_array(c.b, t, in.lo, in.hi);
    expect_close(eval1(g, y, {{a, va}, {b, vb}}), c.out, ref_binary(va, vb, c.out, ref), rtol,
                 atol);
  }
}

// Expects op(a, b) == expected exactly for explicit values of dtype t.
void expect_values(const BinaryOp& op, DType t, const std::vector<double>& a,
                   const std::vector<double>& b, const std::vector<double>& expected) {
  Graph g;
  const Shape shape{static_cast<int64_t>(a.size())};
  auto pa = g.placeholder(shape, t, "a");
  auto pb = g.placeholder(shape, t, "b");
  Array va = Array::from_vector(a, shape).astype(t), vb = Array::from_vector(b, shape).astype(t);
  expect_equal(eval1(g, op(pa, pb), {{pa, va}, {pb, vb}}), shape, expected);
}

double floor_div_ref(double a, double b) { return b == 0 ? 0 : std::floor(a / b); }
double mod_ref(double a, double b) { return b == 0 ? 0 : a - b * std::floor(a / b); }
double max_ref(double a, double b) {
  return std::isnan(a) || std::isnan(b) ? kNaN : std::fmax(a, b);
}
double min_ref(double a, double b) {
  return std::isnan(a) || std::isnan(b) ? kNaN : std::fmin(a, b);
}

TEST(Add, IntegerOverflowWraps) {
  const double big = std::numeric_limits<int32_t>::max();
  expect_values(add, i32, {big, -big}, {1, -2}, {-big - 1, big});
  expect_values(mul, i8, {100, -128}, {3, -1}, {44, -128});
  expect_values(sub, i16, {-32768}, {1}, {32767});
}

TEST(Add, DynamicDimsResolveAtCompile) {
  Graph g;
  auto a = g.placeholder({-1, 3}, f32, "a");
  auto b = g.placeholder({3}, f32, "b");
  auto y = maximum(a, b) + exp(a);
  EXPECT_EQ(to_string(y.shape()), to_string(Shape{-1, 3}));
  Array va = random_array({4, 3}, f32), vb = random_array({3}, f32);
  auto ref = ref_binary(va, vb, {4, 3},
                        [](double x, double z) { return std::max(x, z) + std::exp(x); });
  expect_close(eval1(g, y, {{a, va}, {b, vb}}), {4, 3}, ref, 1e-6, 1e-6);
}

TEST(Sub, AllDtypesBroadcast) {
  auto ref = [](double a, double b) { return a - b; };
  check_binary(sub, ref, f32, {-10, 10, false}, 1e-6, 1e-6);
  check_binary(sub, ref, i64, {-1000, 1000, false}, 0, 0);
  // u8 wraps below zero, as numpy
  check_binary(sub, [](double a, double b) { return std::fmod(a - b + 256, 256); }, u8,
               {100, 200, false}, 0, 0);
  check_binary(sub, ref, f16, {-10, 10, false}, 1e-3, 1e-2);
}

TEST(Mul, AllDtypesBroadcast) {
  auto ref = [](double a, double b) { return a * b; };
  check_binary(mul, ref, f64, {-10, 10, false}, 1e-12, 0);
  check_binary(mul, ref, i32, {-1000, 1000, false}, 0, 0);
  check_binary(mul, ref, i8, {-11, 11, false}, 0, 0);
  check_binary(mul, ref, bf16, {-10, 10, false}, 1e-2, 1e-2);
}

TEST(Div, FloatsDivideTruly) {
  auto ref = [](double a, double b) { return a / b; };
  check_binary(div, ref, f32, {-10, 10, true}, 1e-6, 1e-7);
  check_binary(div, ref, f64, {-10, 10, true}, 1e-12, 1e-14);
  check_binary(div, ref, bf16, {-10, 10, true}, 1e-2, 1e-2);
}

TEST(Div, IntegersFloorDivide) {
  check_binary(div, floor_div_ref, i32, {-50, 50, true}, 0, 0);
  check_binary(div, floor_div_ref, i64, {-1000, 1000, true}, 0, 0);
  check_binary(div, floor_div_ref, i8, {-100, 100, true}, 0, 0);
  expect_values(div, i32, {7, -7, 7, -7, 6}, {2, 2, -2, -2, 3}, {3, -4, -4, 3, 2});
}

// Documented: integer x / 0 = 0; the minimum over -1 wraps instead of trapping.
TEST(Div, IntegerEdgeCases) {
  expect_values(div, i32, {5, -5, 0}, {0, 0, 0}, {0, 0, 0});
  const int64_t lo = std::numeric_limits<int64_t>::min();
  Graph g;
  auto a = g.placeholder({2}, i64, "a");
  auto b = g.placeholder({2}, i64, "b");
  Array out = eval1(g, a / b, {{a, Array::from_vector<int64_t>({lo, lo}, {2})},
                               {b, Array::from_vector<int64_t>({-1, 0}, {2})}});
  EXPECT_EQ(out.to_vector<int64_t>(), (std::vector<int64_t>{lo, 0}));
  expect_values(div, f32, {1, -1, 0}, {0, 0, 0}, {kInf, -kInf, kNaN});
}

TEST(Div, OperatorsWithScalars) {
  Graph g;
  auto x = g.placeholder({6}, f64, "x");
  Array v = random_nonzero({6}, f64);
  auto vx = to_f64(v);
  std::vector<double> r1, r2;
  for (double e : vx) r1.push_back(e / 4), r2.push_back(3 / e);
  expect_close(eval1(g, x / 4.0, {{x, v}}), {6}, r1, 1e-12, 0);
  expect_close(eval1(g, 3.0 / x, {{x, v}}), {6}, r2, 1e-12, 0);
  auto n = g.placeholder({3}, i32, "n");
  expect_equal(eval1(g, n / 2.0, {{n, Array::from_vector<double>({-3, 3, 4}, {3}).astype(i32)}}),
               {3}, {-2, 1, 2});
}

TEST(Div, PromotesAndReportsShapes) {
  Graph g;
  auto a = g.placeholder({2, 3}, i32, "a");
  auto b = g.placeholder({3}, f32, "b");
  EXPECT_EQ(div(a, b).dtype(), f32);
  expect_error<ShapeError>([&] { div(a, g.placeholder({4}, f32, "c")); },
                           {"[div]", "(2, 3)", "(4,)"});
  auto t = g.placeholder({3}, boolean, "t");
  expect_error<DTypeError>([&] { div(t, t); }, {"[div]", "bool"});
}

TEST(Pow, Floats) {
  auto ref = [](double a, double b) { return std::pow(a, b); };
  check_binary(pow, ref, f32, {0.1, 3, false}, 1e-6, 1e-6);
  check_binary(pow, ref, f64, {0.1, 3, false}, 1e-12, 1e-13);
  check_binary(pow, ref, f16, {0.1, 3, false}, 3e-3, 3e-3);
  expect_values(pow, f64, {-2, -2, 0, 4, -1}, {3, 2, 0, 0.5, 0.5}, {-8, 4, 1, 2, kNaN});
}

// Exponents of 2 and 3 run as products on the CPU where every exponent is that one value (a
// single value, an array of it, or a constant inside a fused program); an array with one other
// exponent takes pow element by element. Each against float64 pow of the same f32 inputs.
TEST(Pow, SquaresAndCubesAsProducts) {
  const Shape s{3, 700};
  const Array xv = random_array(s, f32, -3, 3);
  const std::vector<double> x = to_f64(xv);
  std::vector<float> mixed(static_cast<size_t>(numel(s)), 2.f);
  mixed[1234] = 5.f;
  Graph g;
  const Tensor xt = g.placeholder(s, f32, "x");
  const std::vector<Tensor> outs{
      pow(xt, g.constant(Array::scalar(2.f))),
      pow(xt, g.constant(Array::from_vector(std::vector<float>(mixed.size(), 3.f), s))),
      pow(xt, g.constant(Array::from_vector(mixed, s))),
      pow(xt, g.constant(Array::scalar(3.f))) * 0.5f + xt};  // (a fused program)
  const auto got = g.compile(Device::cpu(), {}, outs).run({{xt, xv}});
  std::vector<std::vector<double>> want(4, std::vector<double>(x.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    want[0][i] = x[i] * x[i];
    want[1][i] = std::pow(x[i], 3.0);
    want[2][i] = std::pow(x[i], static_cast<double>(mixed[i]));
    want[3][i] = static_cast<double>(static_cast<float>(std::pow(x[i], 3.0)) * 0.5f) + x[i];
  }
  for (size_t k = 0; k < 4; ++k) expect_close(got[k], s, want[k], 1e-6, 1e-6);
}

TEST(Pow, Integers) {
  check_binary(pow, [](double a, double b) { return std::pow(a, b); }, i64, {0, 7, false}, 0, 0);
  expect_values(pow, i32, {-3, -3, 0, 5, 2}, {3, 0, 0, 1, 10}, {-27, 1, 1, 5, 1024});
  // negative exponents truncate; overflow wraps like numpy
  expect_values(pow, i32, {1, -1, -1, 2, 0}, {-3, -3, -2, -1, -1}, {1, -1, 1, 0, 0});
  expect_values(pow, i8, {2, 3}, {7, 5}, {-128, -13});
}

TEST(Maximum, MatchesReference) {
  check_binary(maximum, max_ref, f32, {-5, 5, false}, 0, 0);
  check_binary(maximum, max_ref, f64, {-5, 5, false}, 0, 0);
  check_binary(maximum, max_ref, i32, {-5, 5, false}, 0, 0);
  check_binary(maximum, max_ref, u8, {0, 255, false}, 0, 0);
  check_binary(maximum, max_ref, f16, {-5, 5, false}, 0, 0);
}

TEST(Maximum, PropagatesNaN) {
  expect_values(maximum, f32, {kNaN, 1, kNaN, -kInf}, {1, kNaN, kNaN, 2}, {kNaN, kNaN, kNaN, 2});
}

TEST(Minimum, MatchesReference) {
  check_binary(minimum, min_ref, f32, {-5, 5, false}, 0, 0);
  check_binary(minimum, min_ref, f64, {-5, 5, false}, 0, 0);
  check_binary(minimum, min_ref, i64, {-5, 5, false}, 0, 0);
  check_binary(minimum, min_ref, bf16, {-5, 5, false}, 0, 0);
}

TEST(Minimum, PropagatesNaN) {
  expect_values(minimum, f64, {kNaN, 1, kInf}, {1, kNaN, 2}, {kNaN, kNaN, 2});
}

TEST(Mod, FloatsTakeDivisorSign) {
  check_binary(mod, mod_ref, f32, {-10, 10, true}, 1e-6, 2e-6);
  check_binary(mod, mod_ref, f64, {-10, 10, true}, 1e-12, 1e-12);
  check_binary(mod, mod_ref, f16, {-10, 10, true}, 1e-2, 2e-2);
  expect_values(mod, f64, {5.5, -5.5, 5.5, -5.5, 1, 3}, {2, 2, -2, -2, 0, kInf},
                {1.5, 0.5, -0.5, -1.5, kNaN, 3});
}

TEST(Mod, Integers) {
  check_binary(mod, mod_ref, i32, {-50, 50, true}, 0, 0);
  check_binary(mod, mod_ref, i16, {-300, 300, true}, 0, 0);
  check_binary(mod, mod_ref, u8, {1, 255, true}, 0, 0);
  // documented: x mod 0 = 0
  expect_values(mod, i64, {7, -7, 7, -7, 7}, {3, 3, -3, -3, 0}, {1, 2, -2, -1, 0});
}

// Comparisons promote, then compare; the result is bool.
void check_compare(const BinaryOp& op, const BinaryRef& ref) {
  check_binary(op, ref, f32, {-3, 3, false}, 0, 0, boolean);
  check_binary(op, ref, f64, {-3, 3, false}, 0, 0, boolean);
  check_binary(op, ref, i32, {-3, 3, false}, 0, 0, boolean);  // small range: many ties
  check_binary(op, ref, f16, {-3, 3, false}, 0, 0, boolean);
  check_binary(op, ref, boolean, {0, 1, false}, 0, 0, boolean);
  Graph g;
  auto a = g.placeholder({4}, i32, "a");
  auto b = g.placeholder({4}, f64, "b");
  EXPECT_EQ(op(a, b).dtype(), boolean);
  std::vector<double> av{1, 2, 3, -4}, bv{1.5, 2, 2.5, -4};
  std::vector<double> ref_v;
  for (size_t i = 0; i < 4; ++i) ref_v.push_back(ref(av[i], bv[i]));
  expect_equal(eval1(g, op(a, b), {{a, Array::from_vector(av, {4}).astype(i32)},
                                   {b, Array::from_vector(bv, {4})}}),
               {4}, ref_v);
  expect_error<ShapeError>([&] { op(a, g.placeholder({3}, f32, "c")); }, {"(4,)", "(3,)"});
}

#define KILN_COMPARE_TEST(Pascal, fn, expr)                                            \
  TEST(Pascal, MatchesReference) {                                                     \
    check_compare(fn, [](double a, double b) { return static_cast<double>(expr); });   \
  }
KILN_COMPARE_TEST(Equal, equal, a == b)
KILN_COMPARE_TEST(NotEqual, not_equal, a != b)
KILN_COMPARE_TEST(Less, less, a < b)
KILN_COMPARE_TEST(LessEqual, less_equal, a <= b)
KILN_COMPARE_TEST(Greater, greater, a > b)
KILN_COMPARE_TEST(GreaterEqual, greater_equal, a >= b)

TEST(Equal, NaNIsUnequal) {
  expect_values(equal, f32, {kNaN, 1}, {kNaN, 1}, {0, 1});
  expect_values(not_equal, f32, {kNaN, 1}, {kNaN, 1}, {1, 0});
  expect_values(less, f64, {kNaN, -kInf}, {1, 0}, {0, 1});
}

void check_logical(const BinaryOp& op, const BinaryRef& ref, const char* name) {
  check_binary(op, ref, boolean, {0, 1, false}, 0, 0);
  Graph g;
  auto a = g.placeholder({2, 3}, f32, "a");
  auto b = g.placeholder({2, 3}, boolean, "b");
  expect_error<DTypeError>([&] { op(a, b); }, {std::string("[") + name + "]", "f32", "(2, 3)"});
}
TEST(LogicalAnd, MatchesReference) {
  check_logical(logical_and, [](double a, double b) { return double(a && b); }, "logical_and");
}
TEST(LogicalOr, MatchesReference) {
  check_logical(logical_or, [](double a, double b) { return double(a || b); }, "logical_or");
}
TEST(LogicalXor, MatchesReference) {
  check_logical(logical_xor, [](double a, double b) { return double(a != b); }, "logical_xor");
}
TEST(LogicalNot, MatchesReference) {
  for (Shape s : {Shape{3, 50}, Shape{}, Shape{0}}) {
    Graph g;
    auto x = g.placeholder(s, boolean, "x");
    Array v = random_array(s, boolean);
    std::vector<double> ref;
    for (double e : to_f64(v)) ref.push_back(e == 0);
    expect_equal(eval1(g, logical_not(x), {{x, v}}), s, ref);
  }
  Graph g;
  expect_error<DTypeError>([&] { logical_not(g.placeholder({2}, i32, "i")); },
                           {"[logical_not]", "i32"});
}

}  // namespace
}  // namespace kiln
