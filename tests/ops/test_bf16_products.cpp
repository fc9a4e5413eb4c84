// bf16 linear, matmul, conv2d and conv_transpose2d on the CPU: natively through oneDNN where it
// has bf16 kernels (AVX-512 BF16; bf16 operands, f32 accumulation, one rounding to bf16), else
// through f32 copies (KILN_CPU_ISA=avx2 or baseline takes that path: ctest CpuIsa.*). Against
// float64 sums of the bf16 operands' exact values: every result within one bf16 rounding (2^-8
// relative) plus the f32 accumulation's error; linear also against the f32 product of the
// widened operands rounded to bf16 (one bf16 step plus both accumulations' errors),
// conv_transpose2d against its f32 form. Fresh random data; bias, batch dims, broadcast, K = 0,
// strides, padding and groups.
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
  for (const P p :
       {P{64, 768, 96, true}, P{7, 33, 5, false}, P{130, 256, 200, true}, P{3, 0, 4, true}}) {
    const std::string what = fmt::format("linear {}x{}x{} bias {}", p.m, p.k, p.n, p.bias);
    const Array x = random_array({p.m, p.k}, f32, -1, 1).astype(bf16);
    const Array w = random_array({p.n, p.k}, f32, -1, 1).astype(bf16);
    const Array b = random_array({p.n}, f32, -1, 1).astype(bf16);
    Graph g;
    auto px = g.placeholder({p.m, p.k}, bf16, "x");
    const Tensor y =
        linear(px, g.constant(w), p.bias ? std::optional(g.constant(b)) : std::nullopt);
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
    // (one bf16 step, plus both sides' f32 accumulation in different orders: oneDNN's bf16
    // kernels sum in other blocks than its f32 ones, AMX's than AVX-512's)
    for (size_t i = 0; i < a.size(); ++i)
      ASSERT_LE(std::abs(a[i] - e[i]),
                0x1p-7 * std::abs(e[i]) + 2 * static_cast<double>(p.k + 1) * 0x1p-22 * terms[i])
          << what << " element " << i;
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

struct ConvCase {
  Shape x;  // (N, C, H, W)
  int64_t o, k, stride, pad, groups;
  bool bias;
};

// conv2d in float64 (square kernel, stride and padding), and the sums of |terms|.
void conv_ref(const ConvCase& p, const std::vector<double>& x, const std::vector<double>& w,
              const std::vector<double>& b, const Shape& ys, std::vector<double>& y,
              std::vector<double>& terms) {
  const int64_t n = p.x[0], c = p.x[1], h = p.x[2], wd = p.x[3], oh = ys[2], ow = ys[3];
  const int64_t cg = c / p.groups, og = p.o / p.groups;
  y.assign(n * p.o * oh * ow, 0);
  terms.assign(y.size(), 0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t o = 0; o < p.o; ++o)
      for (int64_t r = 0; r < oh; ++r)
        for (int64_t q = 0; q < ow; ++q) {
          double s = p.bias ? b[o] : 0, t = p.bias ? std::abs(b[o]) : 0;
          for (int64_t cc = 0; cc < cg; ++cc)
            for (int64_t kh = 0; kh < p.k; ++kh)
              for (int64_t kw = 0; kw < p.k; ++kw) {
                const int64_t ih = r * p.stride - p.pad + kh, iw = q * p.stride - p.pad + kw;
                if (ih < 0 || ih >= h || iw < 0 || iw >= wd) continue;
                const int64_t ch = (o / og) * cg + cc;
                const double v =
                    x[((i * c + ch) * h + ih) * wd + iw] * w[((o * cg + cc) * p.k + kh) * p.k + kw];
                s += v, t += std::abs(v);
              }
          const size_t at = ((i * p.o + o) * oh + r) * ow + q;
          y[at] = s, terms[at] = t;
        }
}

TEST(Bf16Products, Conv2dMatchesFloat64) {
  for (const ConvCase& p : {ConvCase{{2, 16, 14, 14}, 32, 3, 1, 1, 1, true},
                            ConvCase{{1, 8, 11, 9}, 12, 3, 2, 0, 4, false},
                            ConvCase{{2, 3, 20, 20}, 8, 7, 2, 3, 1, true}}) {
    const std::string what = fmt::format("conv2d x {} o {} k {} stride {} pad {} groups {}",
                                         to_string(p.x), p.o, p.k, p.stride, p.pad, p.groups);
    const Array x = random_array(p.x, f32, -1, 1).astype(bf16);
    const Array w = random_array({p.o, p.x[1] / p.groups, p.k, p.k}, f32, -1, 1).astype(bf16);
    const Array b = random_array({p.o}, f32, -1, 1).astype(bf16);
    Graph g;
    auto px = g.placeholder(p.x, bf16, "x");
    ConvOptions o;
    o.stride = {p.stride, p.stride};
    o.padding = {p.pad, p.pad};
    o.groups = p.groups;
    const Tensor y =
        conv2d(px, g.constant(w), p.bias ? std::optional(g.constant(b)) : std::nullopt, o);
    EXPECT_EQ(y.dtype(), bf16);
    const Array got = g.compile(Device::cpu(), {}, {y}).run({{px, x}})[0];
    std::vector<double> want, terms;
    conv_ref(p, to_f64(x), to_f64(w), to_f64(b), got.shape(), want, terms);
    expect_bf16_close(got, want, terms, p.x[1] / p.groups * p.k * p.k + 1, what);
  }
}

// conv_transpose2d is the data gradient of conv2d: its bf16 result against the same f32 op on
// the widened operands (tested against float64 in test_conv), within one bf16 rounding plus f32
// accumulation differences.
TEST(Bf16Products, ConvTransposeMatchesItsF32Form) {
  const Array x = random_array({2, 16, 9, 9}, f32, -1, 1).astype(bf16);
  const Array w = random_array({16, 8, 3, 3}, f32, -1, 1).astype(bf16);
  ConvTransposeOptions o;
  o.stride = {2, 2};
  o.padding = {1, 1};
  o.output_padding = {1, 1};
  auto run = [&](DType t) {
    Graph g;
    auto px = g.placeholder(x.shape(), t, "x");
    const Tensor y = conv_transpose2d(px, g.constant(w.astype(t)), std::nullopt, o);
    return g.compile(Device::cpu(), {}, {y}).run({{px, x.astype(t)}})[0];
  };
  const Array got = run(bf16), wide = run(f32);
  EXPECT_EQ(got.dtype(), bf16);
  ASSERT_EQ(got.shape(), wide.shape());
  const auto a = to_f64(got), e = to_f64(wide);
  double largest = 0;
  for (double v : e) largest = std::max(largest, std::abs(v));
  EXPECT_GT(largest, 0.5);
  for (size_t i = 0; i < a.size(); ++i)
    ASSERT_LE(std::abs(a[i] - e[i]), 0x1p-8 * std::abs(e[i]) + 1e-5 * largest) << "element " << i;
}

}  // namespace
}  // namespace kiln
