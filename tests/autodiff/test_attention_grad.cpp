// Gradients of attention, cholesky and triangular_solve against central differences in float64.
// Cholesky and triangular_solve read one triangle of a: the other holds junk that must neither
// change the result nor get a gradient.
#include <cmath>

#include "support/gradcheck.h"
#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;
using Ts = std::vector<Tensor>;

// Symmetric positive-definite x xᵀ + n I over the batch, with junk above (upper: below) the
// diagonal.
Array spd_with_junk(const Shape& batch, int64_t n, bool upper) {
  Shape s = batch;
  s.push_back(n);
  s.push_back(n);
  const auto x = to_f64(random_array(s, f64));
  Array a = Array::zeros(s, f64);
  double* p = a.data<double>();
  for (int64_t b = 0; b < numel(batch); ++b)
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double v = i == j ? static_cast<double>(n) : 0.0;
        for (int64_t k = 0; k < n; ++k) v += x[(b * n + i) * n + k] * x[(b * n + j) * n + k];
        if (upper ? j < i : j > i) v = 100.0 + static_cast<double>(i - j);
        p[(b * n + i) * n + j] = v;
      }
  return a;
}

// Diagonal of magnitude [1, 2], small entries elsewhere.
Array random_triangular(const Shape& s) {
  Array a = random_array(s, f64, -0.4, 0.4);
  const int64_t n = s.back();
  double* p = a.data<double>();
  for (int64_t b = 0; b < a.numel() / (n * n); ++b)
    for (int64_t i = 0; i < n; ++i) {
      double& d = p[(b * n + i) * n + i];
      d = (d < 0 ? -1 : 1) * (1 + std::abs(d) * 2.5);
    }
  return a;
}

TEST(ScaledDotProductAttentionGrad, FiniteDifferences) {
  const AttentionOptions causal{true, 0.6};
  check_gradients([&](const Ts& x) { return scaled_dot_product_attention(x[0], x[1], x[2]); },
                  {random_array({2, 3, 4}, f64), random_array({2, 5, 4}, f64),
                   random_array({2, 5, 3}, f64)});
  check_gradients(
      [&](const Ts& x) {
        return scaled_dot_product_attention(x[0], x[1], x[2], std::nullopt, causal);
      },
      {random_array({1, 6, 3}, f64), random_array({1, 4, 3}, f64),
       random_array({1, 4, 2}, f64)});
  // several CPU blocks of queries (16) and keys (64)
  check_gradients(
      [&](const Ts& x) {
        return scaled_dot_product_attention(x[0], x[1], x[2], std::nullopt, causal);
      },
      {random_array({1, 17, 2}, f64), random_array({1, 65, 2}, f64),
       random_array({1, 65, 1}, f64)});
  // additive mask (broadcast over the batch): its gradient too
  check_gradients(
      [&](const Ts& x) { return scaled_dot_product_attention(x[0], x[1], x[2], x[3], causal); },
      {random_array({2, 4, 3}, f64), random_array({2, 5, 3}, f64),
       random_array({2, 5, 2}, f64), random_array({4, 5}, f64, -1, 1)});
  // bool mask with a fully masked row: not differentiated, the rest checks
  Array keep = Array::zeros({3, 4}, DType::boolean);
  for (int i = 0; i < 12; ++i) keep.data<bool>()[i] = i >= 4 && i % 3 != 1;
  check_gradients(
      [&](const Ts& x) { return scaled_dot_product_attention(x[0], x[1], x[2], x[3]); },
      {random_array({2, 3, 5}, f64), random_array({2, 4, 5}, f64),
       random_array({2, 4, 2}, f64), keep});
}

TEST(CholeskyGrad, FiniteDifferences) {
  for (bool upper : {false, true}) {
    check_gradients([&](const Ts& x) { return cholesky(x[0], upper); },
                    {spd_with_junk({2}, 4, upper)});
    // through a symmetric input built from x: gradients reach both triangles
    check_gradients(
        [&](const Ts& x) {
          auto s = matmul(x[0], transpose(x[0], {0, 2, 1})) + 3.0;
          return cholesky(s, upper);
        },
        {random_array({1, 3, 3}, f64)});
  }
}

TEST(TriangularSolveGrad, FiniteDifferences) {
  for (int f = 0; f < 16; ++f) {
    const TriangularSolveOptions o{(f & 1) != 0, (f & 2) != 0, (f & 4) != 0, (f & 8) != 0};
    SCOPED_TRACE(::testing::Message() << "upper " << o.upper << " left " << o.left
                                      << " transpose " << o.transpose << " unit "
                                      << o.unit_diagonal);
    check_gradients([&](const Ts& x) { return triangular_solve(x[0], x[1], o); },
                    {random_triangular({2, 3, 3}), random_array({1, 3, 3}, f64)});
  }
}

}  // namespace
}  // namespace kiln
