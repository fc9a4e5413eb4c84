// fused_matmul (the CPU's product with its epilogue; src/ops/linalg.cpp): hand-made nodes against
// float64 loops, for each step, operand form (the output's shape, a row, one value), b as (K, N)
// or (N, K), and sizes on each of the kernel's paths (small_gemm, oneDNN's product with the steps
// after it, oneDNN's post-ops).
#include <cmath>

#include "core/graph_impl.h"
#include "ops/linalg_params.h"
#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;

struct Case {
  Shape x;
  int64_t n;
  bool transpose_b;
  std::vector<MatmulStep> steps;
  std::vector<Shape> operands;  // one per add or mul
};

double activation(MatmulStep s, double v) {
  switch (s) {
    case MatmulStep::relu:
      return v < 0 ? 0 : v;
    case MatmulStep::gelu:
      return 0.5 * v * std::erfc(-v / std::sqrt(2.0));
    case MatmulStep::gelu_tanh:
      return 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
    case MatmulStep::sigmoid:
      return 1 / (1 + std::exp(-v));
    case MatmulStep::silu:
      return v / (1 + std::exp(-v));
    default:
      return std::tanh(v);
  }
}

void check(const Case& c) {
  const int64_t K = c.x.back(), N = c.n, M = numel(c.x) / std::max<int64_t>(K, 1);
  const int64_t rows = K == 0 ? numel(Shape(c.x.begin(), c.x.end() - 1)) : M;
  Shape out = c.x;
  out.back() = N;
  const Array xv = random_array(c.x, f64);
  const Array bv = random_array(c.transpose_b ? Shape{N, K} : Shape{K, N}, f64);
  std::vector<Array> ov;
  for (const Shape& s : c.operands) ov.push_back(random_array(s, f64, -2, 2));
  // float64 loops
  const auto X = to_f64(xv), B = to_f64(bv);
  std::vector<std::vector<double>> O;
  for (const Array& a : ov) O.push_back(to_f64(a));
  std::vector<double> want(static_cast<size_t>(rows * N), 0.0);
  for (int64_t m = 0; m < rows; ++m)
    for (int64_t j = 0; j < N; ++j) {
      double acc = 0;
      for (int64_t k = 0; k < K; ++k)
        acc += X[m * K + k] * B[c.transpose_b ? j * K + k : k * N + j];
      size_t o = 0;
      for (MatmulStep s : c.steps) {
        if (s != MatmulStep::add && s != MatmulStep::mul) {
          acc = activation(s, acc);
          continue;
        }
        const std::vector<double>& v = O[o];
        const int64_t at = numel(ov[o].shape()) == 1   ? 0
                           : numel(ov[o].shape()) == N ? j
                                                       : m * N + j;
        acc = s == MatmulStep::add ? acc + v[at] : acc * v[at];
        ++o;
      }
      want[m * N + j] = acc;
    }
  Graph g;
  const Tensor x = g.placeholder(c.x, f32, "x");
  std::vector<Tensor> in{x, g.constant(bv.astype(f32))};
  for (const Array& a : ov) in.push_back(g.constant(a.astype(f32)));
  std::vector<int64_t> steps;
  for (MatmulStep s : c.steps) steps.push_back(static_cast<int64_t>(s));
  Attrs a{{"transpose_b", c.transpose_b}};
  a.set("epilogue", steps);
  const Tensor y = detail::make_node1(OpId::FusedMatmul, in, a);
  EXPECT_EQ(y.shape(), out);
  auto exe = g.compile(Device::cpu(), {}, {y});
  // (f32 sums of K products of magnitude 1)
  expect_close(exe.run({{x, xv.astype(f32)}})[0], out, want, 1e-4,
               1e-5 * static_cast<double>(std::max<int64_t>(K, 1)));
}

using S = MatmulStep;

TEST(FusedMatmul, EachStepAndOperandMatchesF64Loops) {
  const std::vector<Case> cases = {
      {{3, 4, 20}, 7, false, {S::add, S::gelu}, {{7}}},
      {{5, 20}, 7, true, {S::add, S::relu, S::mul, S::tanh}, {{5, 7}, {1}}},
      {{2, 3, 9}, 6, false, {S::sigmoid, S::add, S::silu}, {{1, 1, 6}}},
      {{6, 11}, 5, true, {S::gelu_tanh}, {}},
      {{11}, 4, false, {S::mul, S::add}, {{4}, {4}}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(to_string(c.x));
    check(c);
  }
}

// Sizes past small_gemm (up to 2^22 multiply-adds: oneDNN's product, then the steps) and past
// that (oneDNN's post-ops, a first row added as the primitive's bias), both forms of b.
TEST(FusedMatmul, EachKernelPathMatchesF64Loops) {
  for (bool t : {false, true})
    for (const Shape& x : {Shape{64, 128}, Shape{2, 128, 160}}) {
      SCOPED_TRACE(to_string(x) + (t ? " b (N, K)" : " b (K, N)"));
      Shape full = x;
      full.back() = 96;
      check({x, 96, t, {S::add, S::gelu, S::mul, S::add, S::sigmoid}, {{96}, {1, 96}, full}});
      check({x, 96, t, {S::mul, S::silu}, {full}});
    }
}

// Few sums over many rows: outputs large enough that the steps after the product run in parallel
// over blocks of rows (oneDNN's product, and small_gemm's).
TEST(FusedMatmul, LargeOutputsOfSmallProductsMatchF64Loops) {
  check({{2, 2048, 8}, 64, false, {S::add, S::gelu, S::mul, S::silu}, {{64}, {2, 2048, 64}}});
  check({{4096, 2}, 16, false, {S::mul, S::gelu_tanh, S::add}, {{1}, {16}}});
  check({{3000, 8}, 40, true, {S::sigmoid, S::mul}, {{3000, 40}}});
}

// No products to sum (K = 0): the steps over zeros.
TEST(FusedMatmul, EmptyProductsGiveTheStepsOverZeros) {
  check({{4, 0}, 6, false, {S::add, S::relu}, {{6}}});
  check({{2, 3, 0}, 5, true, {S::add, S::sigmoid}, {{2, 3, 5}}});
}

}  // namespace
}  // namespace kiln
