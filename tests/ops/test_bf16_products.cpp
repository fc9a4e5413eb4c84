// bf16 linear and matmul on the CPU: natively through oneDNN where it has a bf16 kernel (AVX-512
// BF16; bf16 operands, f32 accumulation, one rounding to bf16), else through f32 copies
// (KILN_CPU_ISA=avx2 or baseline takes that path: ctest CpuIsa.*). Against float64 sums of the
// bf16 operands' exact values: every result within one bf16 rounding (2^-8 relative) plus the f32
// accumulation's error; and the same as the product in f32 of the widened operands, rounded to
// bf16, within one bf16 step. Fresh random data; bias, batch dims, broadcast and K = 0.
#include <fmt/format.h>

#include <cmath>

#include "kiln/kiln.h"
#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;

// |got - want| <= 2^-8 |want| + k 2^-22 sum|terms| for each element (want and the sums of the
// absolute terms in float64), and the results not all zero.
void expect_bf16_close(const Array& got, const std::vector<double>& want,
                       const std::vector<double>& abs_terms, int64_t k, const std::string& what) {
  const auto g = to_f64(got);
  ASSERT_EQ(g.size(), want.size()) << what;
  int bad = 0;
  double largest = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    largest = std::max(largest, std::abs(want[i]));
    const double tol = 0x1p-8 * std::abs(want[i]) + static_cast<double>(k) * 0x1p-22 * abs_terms[i];
    if (std::abs(g[i] - want[i]) > tol && bad++ < 5)
      ADD_FAILURE() << what << " element " << i << ": " << g[i] << " vs " << want[i];
  }
  if (!want.empty() && k > 0) EXPECT_GT(largest, 0.1) << what;
}

// y = x (M, K) · wᵀ (+ bias) in float64, and the sums of |terms| per element.
void linear_ref(const std::vector<double>& x, const std::vector<double>& w,
                const std::vector<double>* bias, int64_t m, int64_t k, int64_t n,
                std::vector<double>& y, std::vector<double>& abs_terms) {
  y.assign(m * n, 0);
  abs_terms.assign(m * n, 0);
  for (int64_t r = 0; r < m; ++r)
    for (int64_t j = 0; j < n; ++j) {
      double s = bias ? (*bias)[j] : 0, a = bias ? std::abs((*bias)[j]) : 0;
      for (int64_t i = 0; i < k; ++i) {
        s += x[r * k + i] * w[j * k + i];
        a += std::abs(x[r * k + i] * w[j * k + i]);
      }
      y[r * n + j] = s;
      abs_terms[r * n + j] = a;
    }
}

TEST(Bf16Products, LinearMatchesFloat64) {
  struct P {
    int64_t m, k, n;
    bool bias;
  };
  for (const P p : {P{64, 768, 96, true}, P{7, 33, 5, false}, P{130, 256, 200, true},
                    P{3, 0, 4, true}}) {
    const std::string what = fmt::format("linear {}x{}x{} bias {}", p.m, p.k, p.n, p.bias);
    const Array x = random_array({p.m, p.k}, f32, -1, 1).astype(bf16);
    const Array w = random_array({p.n, p.k}, f32, -1, 1).astype(bf16);
    const Array b = random_array({p.n}, f32, -1, 1).astype(bf16);
    Graph g;
    auto px = g.placeholder({p.m, p.k}, bf16, "x");
    const Tensor y = linear(px, g.constant(w), p.bias ? std::optional(g.constant(b)) : std::nullopt);
    EXPECT_EQ(y.dtype(), bf16);
    const Array got = g.compile(Device::cpu(), {}, {y}).run({{px, x}})[0];
    std::vector<double> want, terms;
    const std::vector<double> bias = to_f64(b);
    linear_ref(to_f64(x), to_f64(w), p.bias ? &bias : nullptr, p.m, p.k, p.n, want, terms);
    expect_bf16_close(got, want, terms, p.k + 1, what);
    // the product of the widened operands in f32, rounded once
    Graph gf;
    auto fx = gf.placeholder({p.m, p.k}, f32, "x");
    const Tensor yf = linear(fx, gf.constant(w.astype(f32)),
                             p.bias ? std::optional(gf.constant(b.astype(f32))) : std::nullopt);
    const Array wide = gf.compile(Device::cpu(), {}, {yf}).run({{fx, x.astype(f32)}})[0];
    const auto a = to_f64(got), e = to_f64(wide.astype(bf16));
    for (size_t i = 0; i < a.size(); ++i)
      ASSERT_LE(std::abs(a[i] - e[i]), 0x1p-7 * std::abs(e[i]) + 1e-30) << what << " element " << i;
  }
}

TEST(Bf16Products, BatchedMatmulMatchesFloat64) {
  // (batch broadcast over a's leading dim)
  const int64_t bsz = 3, m = 20, k = 160, n = 24;
  const Array a = random_array({bsz, m, k}, f32, -1, 1).astype(bf16);
  const Array bm = random_array({1, k, n}, f32, -1, 1).astype(bf16);
  Graph g;
  auto pa = g.placeholder({bsz, m, k}, bf16, "a");
  const Tensor y = matmul(pa, g.constant(bm));
  EXPECT_EQ(y.dtype(), bf16);
  const Array got = g.compile(Device::cpu(), {}, {y}).run({{pa, a}})[0];
  EXPECT_EQ(got.shape(), (Shape{bsz, m, n}));
  const auto av = to_f64(a), bv = to_f64(bm);
  std::vector<double> want, terms;
  for (int64_t q = 0; q < bsz; ++q)
    for (int64_t r = 0; r < m; ++r)
      for (int64_t j = 0; j < n; ++j) {
        double s = 0, t = 0;
        for (int64_t i = 0; i < k; ++i) {
          const double v = av[(q * m + r) * k + i] * bv[i * n + j];
          s += v, t += std::abs(v);
        }
        want.push_back(s);
        terms.push_back(t);
      }
  expect_bf16_close(got, want, terms, k, "batched matmul");
}

}  // namespace
}  // namespace kiln
