// Matmul and Linear against float64 reference loops.
#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;

// numpy.matmul in float64: 1-D operands promoted, batch dims broadcast, then squeezed back.
std::vector<double> ref_matmul(const Array& a, const Array& b, Shape& out_shape) {
  Shape sa = a.shape(), sb = b.shape();
  if (sa.size() == 1) sa.insert(sa.begin(), 1);
  if (sb.size() == 1) sb.push_back(1);
  const int64_t M = sa[sa.size() - 2], K = sa.back(), N = sb.back();
  const Shape ba(sa.begin(), sa.end() - 2), bb(sb.begin(), sb.end() - 2);
  Shape batch;
  EXPECT_TRUE(broadcast_shapes(ba, bb, batch));
  out_shape = batch;
  if (a.shape().size() > 1) out_shape.push_back(M);
  if (b.shape().size() > 1) out_shape.push_back(N);
  const auto va = to_f64(a), vb = to_f64(b);
  std::vector<double> r;
  for (int64_t i = 0; i < numel(batch); ++i) {
    const auto idx = unravel(i, batch);
    const int64_t oa = broadcast_offset(idx, ba, batch) * M * K;
    const int64_t ob = broadcast_offset(idx, bb, batch) * K * N;
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double acc = 0;
        for (int64_t k = 0; k < K; ++k) acc += va[oa + m * K + k] * vb[ob + k * N + n];
        r.push_back(acc);
      }
  }
  return r;
}

// x · wᵀ + bias in float64.
std::vector<double> ref_linear(const Array& x, const Array& w, const Array* bias) {
  const int64_t K = x.shape().back(), N = w.shape()[0];
  const int64_t rows = numel(Shape(x.shape().begin(), x.shape().end() - 1));
  const auto vx = to_f64(x), vw = to_f64(w);
  const auto vb = bias ? to_f64(*bias) : std::vector<double>(N, 0.0);
  std::vector<double> r;
  for (int64_t m = 0; m < rows; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double acc = vb[n];
      for (int64_t k = 0; k < K; ++k) acc += vx[m * K + k] * vw[n * K + k];
      r.push_back(acc);
    }
  return r;
}

struct Pair {
  Shape a, b;
};
// 1-D operands, broadcast batches both ways, size-1 dims, empty batches and K = 0.
const std::vector<Pair> kShapes = {
    {{2, 3}, {3, 4}},          {{5}, {5}},          {{5}, {5, 3}},
    {{4, 5}, {5}},             {{2, 3, 4}, {4, 5}}, {{3, 4}, {2, 4, 5}},
    {{2, 1, 3, 4}, {5, 4, 6}}, {{1, 3, 4}, {2, 4, 1}}, {{1, 1}, {1, 1}},
    {{3}, {2, 3, 4}},          {{2, 3, 4}, {4}},    {{0, 3}, {3, 4}},
    {{0, 2, 3}, {3, 4}},       {{3, 0}, {0, 4}},    {{2, 3, 0}, {0, 5}},
    {{65, 130}, {130, 33}},    {{3, 1, 17, 40}, {1, 2, 40, 9}}};

void check_matmul(const Pair& c, DType t, double rtol, double atol, double lo = -1,
                  double hi = 1) {
  SCOPED_TRACE(::testing::Message() << to_string(c.a) << " x " << to_string(c.b) << " "
                                    << name(t));
  Graph g;
  auto a = g.placeholder(c.a, t, "a");
  auto b = g.placeholder(c.b, t, "b");
  Array va = random_array(c.a, t, lo, hi), vb = random_array(c.b, t, lo, hi);
  Shape out;
  auto ref = ref_matmul(va, vb, out);
  Array y = eval1(g, matmul(a, b), {{a, va}, {b, vb}});
  if (is_integer(t)) expect_equal(y, out, ref);
  else expect_close(y, out, ref, rtol, atol);
}

TEST(Matmul, MatchesReferenceF32F64) {
  for (const Pair& c : kShapes) {
    check_matmul(c, f32, 1e-4, 1e-5);
    check_matmul(c, f64, 1e-10, 1e-12);
  }
}

// f32 products under the CPU's small-product bound run on the calling thread in blocks of 4
// rows by 64, 16 and fewer columns (src/backends/cpu/small_gemm.cpp): every row remainder and
// column tail, one B for every batch and B batched, next to products just over the bound.
TEST(Matmul, SmallProductsEveryBlockAndTail) {
  for (int64_t M : {1, 2, 3, 4, 5, 7, 22})
    for (int64_t N : {1, 15, 16, 17, 64, 80, 129, 300})
      for (int64_t K : {1, 7, 64}) check_matmul({{M, K}, {K, N}}, f32, 1e-4, 1e-5);
  check_matmul({{2, 11, 64}, {64, 300}}, f32, 1e-4, 1e-5);          // batches as rows
  check_matmul({{2, 3, 11, 16}, {2, 3, 16, 11}}, f32, 1e-4, 1e-5);  // attention's products
  check_matmul({{3, 1, 5, 16}, {1, 2, 16, 20}}, f32, 1e-4, 1e-5);   // both broadcast
  check_matmul({{64, 64}, {64, 65}}, f32, 1e-4, 1e-5);              // just over the bound
}

TEST(Matmul, IntegersAreExact) {
  for (const Pair& c : kShapes) {
    check_matmul(c, i32, 0, 0, -20, 20);
    check_matmul(c, i64, 0, 0, -1000, 1000);
  }
}

TEST(Matmul, HalfTypesComputeInF32) {
  // inputs are exact in the half type; the f32 result is rounded once to it
  check_matmul({{2, 7, 16}, {16, 5}}, bf16, 1e-2, 2e-2);
  check_matmul({{7, 16}, {3, 16, 5}}, f16, 2e-3, 2e-3);
}

TEST(Matmul, PromotesMixedDtypes) {
  Graph g;
  auto a = g.placeholder({3, 4}, i32, "a");
  auto b = g.placeholder({4, 2}, f32, "b");
  auto y = matmul(a, b);
  EXPECT_EQ(y.dtype(), f32);
  Array va = random_array({3, 4}, i32, -5, 5), vb = random_array({4, 2}, f32);
  Shape out;
  auto ref = ref_matmul(va, vb, out);
  expect_close(eval1(g, y, {{a, va}, {b, vb}}), out, ref, 1e-5, 1e-5);
}

TEST(Matmul, DynamicBatchAndRepeatedRuns) {
  Graph g;
  auto a = g.placeholder({-1, 8, 6}, f32, "a");
  auto b = g.placeholder({6, 4}, f32, "b");
  auto y = matmul(a, b);
  EXPECT_EQ(y.shape(), (Shape{-1, 8, 4}));
  // the same shapes twice: cached kernels must read the new data
  for (int64_t n : {3, 3, 5}) {
    Array va = random_array({n, 8, 6}, f32), vb = random_array({6, 4}, f32);
    Shape out;
    auto ref = ref_matmul(va, vb, out);
    expect_close(eval1(g, y, {{a, va}, {b, vb}}), out, ref, 1e-4, 1e-5);
  }
}

TEST(Matmul, ErrorsNameOpAndShapes) {
  Graph g;
  auto p = [&](const Shape& s, DType t = f32) { return g.placeholder(s, t); };
  expect_error<ShapeError>([&] { matmul(p({2, 3}), p({4, 5})); }, {"[matmul]", "(2, 3)", "(4, 5)"});
  expect_error<ShapeError>([&] { matmul(p({3}), p({4})); }, {"[matmul]", "(3,)", "(4,)"});
  expect_error<ShapeError>([&] { matmul(p({2, 3, 4}), p({3, 4, 5})); },
                           {"[matmul]", "(2, 3, 4)", "(3, 4, 5)"});
  expect_error<ShapeError>([&] { matmul(p({}), p({3})); }, {"[matmul]", "()", "(3,)"});
  expect_error<DTypeError>([&] { matmul(p({2, 2}, boolean), p({2, 2}, boolean)); },
                           {"[matmul]", "bool"});
}

void check_linear(const Shape& xs, const Shape& ws, bool with_bias, DType t, double rtol,
                  double atol) {
  SCOPED_TRACE(::testing::Message() << to_string(xs) << " " << to_string(ws) << " " << name(t)
                                    << (with_bias ? " bias" : ""));
  Graph g;
  auto x = g.placeholder(xs, t, "x");
  auto w = g.placeholder(ws, t, "w");
  auto b = g.placeholder({ws[0]}, t, "b");
  const bool ints = is_integer(t);
  Array vx = random_array(xs, t, ints ? -9 : -1, ints ? 9 : 1);
  Array vw = random_array(ws, t, ints ? -9 : -1, ints ? 9 : 1);
  Array vb = random_array({ws[0]}, t, ints ? -9 : -1, ints ? 9 : 1);
  Shape out(xs.begin(), xs.end() - 1);
  out.push_back(ws[0]);
  Feeds feeds{{x, vx}, {w, vw}};
  if (with_bias) feeds.push_back({b, vb});
  Array y = eval1(g, with_bias ? linear(x, w, b) : linear(x, w), feeds);
  auto ref = ref_linear(vx, vw, with_bias ? &vb : nullptr);
  if (ints) expect_equal(y, out, ref);
  else expect_close(y, out, ref, rtol, atol);
}

TEST(Linear, MatchesReference) {
  struct Case {
    Shape x, w;
  };
  for (const Case& c : {Case{{5}, {4, 5}}, Case{{3, 5}, {4, 5}}, Case{{2, 3, 5}, {4, 5}},
                        Case{{1, 1}, {1, 1}}, Case{{0, 5}, {4, 5}}, Case{{3, 0}, {4, 0}},
                        Case{{70, 130}, {90, 130}}}) {
    for (bool bias : {false, true}) {
      check_linear(c.x, c.w, bias, f32, 1e-4, 1e-5);
      check_linear(c.x, c.w, bias, f64, 1e-10, 1e-12);
      check_linear(c.x, c.w, bias, i64, 0, 0);
    }
  }
  check_linear({4, 3, 32}, {6, 32}, true, bf16, 1e-2, 3e-2);
}

TEST(Linear, ErrorsNameOpAndShapes) {
  Graph g;
  auto x = g.placeholder({2, 3}, f32, "x");
  expect_error<ShapeError>([&] { linear(x, g.placeholder({4, 5}, f32)); },
                           {"[linear]", "(2, 3)", "(4, 5)"});
  expect_error<ShapeError>([&] { linear(x, g.placeholder({3}, f32)); }, {"[linear]", "(3,)"});
  expect_error<ShapeError>(
      [&] { linear(x, g.placeholder({4, 3}, f32), g.placeholder({5}, f32)); },
      {"[linear]", "(5,)", "(4, 3)"});
}

}  // namespace
}  // namespace kiln
