// CPU kernels of cholesky and triangular_solve: plain loops accumulating in double, matrices (or
// right-hand sides) in parallel on the pool. cholesky reads one triangle of a and writes an
// all-NaN factor for a matrix that is not positive definite.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backends/cpu/cpu_common.h"
#include "backends/cpu/kernels.h"
#include "ops/factorization_params.h"

namespace kiln::cpu {

namespace {

int64_t batch_of(const TensorView& t) { return numel(Shape(t.shape.begin(), t.shape.end() - 2)); }

// Lower factor of one n x n matrix into l (row-major, zero above the diagonal); a(i, j) for
// i >= j reads the triangle. `rows` runs a loop over rows (serially or on the pool).
template <typename T, typename A, typename Rows>
void cholesky_one(int64_t n, A&& a, T* l, Rows&& rows) {
  std::fill(l, l + n * n, T(0));
  std::vector<double> diag(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) {
    double d = a(j, j);
    for (int64_t k = 0; k < j; ++k) d -= static_cast<double>(l[j * n + k]) * l[j * n + k];
    if (!(d > 0)) {
      std::fill(l, l + n * n, std::numeric_limits<T>::quiet_NaN());
      return;
    }
    const double ljj = std::sqrt(d);
    l[j * n + j] = static_cast<T>(ljj);
    rows(j + 1, n, [&](int64_t i) {
      double s = a(i, j);
      for (int64_t k = 0; k < j; ++k) s -= static_cast<double>(l[i * n + k]) * l[j * n + k];
      l[i * n + j] = static_cast<T>(s / ljj);
    });
  }
}

template <typename T> void cholesky_impl(KernelContext& ctx) {
  const TensorView& ta = ctx.in(0);
  const int64_t n = ta.shape.back(), batch = batch_of(ta);
  const bool upper = params_of<FactorizationParams>(ctx).upper;
  const T* pa = ta.ptr<T>();
  T* out = ctx.out(0).ptr<T>();
  auto run = [&](int64_t b, auto&& rows) {
    const T* m = pa + b * n * n;
    T* l = out + b * n * n;
    // upper: a = Uᵀ U with U = Lᵀ, read from the upper triangle
    auto a = [&](int64_t i, int64_t j) {
      return static_cast<double>(upper ? m[j * n + i] : m[i * n + j]);
    };
    cholesky_one<T>(n, a, l, rows);
    if (upper)
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < i; ++j) std::swap(l[i * n + j], l[j * n + i]);
  };
  auto serial = [](int64_t b, int64_t e, auto&& f) {
    for (int64_t i = b; i < e; ++i) f(i);
  };
  if (batch == 1 && n >= 128) {
    run(0, [&](int64_t b, int64_t e, auto&& f) {
      ctx.parallel_for(e - b, 16, [&](int64_t s, int64_t t) {
        for (int64_t i = s; i < t; ++i) f(b + i);
      });
    });
    return;
  }
  ctx.parallel_for(batch, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) run(b, serial);
  });
}

void cholesky(KernelContext& ctx) {
  dispatch_float(ctx.in(0).dtype, ctx.op_name(), [&](auto t) { cholesky_impl<decltype(t)>(ctx); });
}

// Every solve is M y = c with M = a or aᵀ: left solves op(a) x = b column by column; right
// solves x op(a) = b as op(a)ᵀ xᵀ = bᵀ, row by row.
template <typename T> void triangular_solve_impl(KernelContext& ctx) {
  const TensorView &ta = ctx.in(0), &tb = ctx.in(1);
  const FactorizationParams p = params_of<FactorizationParams>(ctx);
  const bool upper = p.upper, left = p.left, unit = p.unit_diagonal;
  const bool trans = p.transpose != !left;    // M = aᵀ
  const bool lower = trans ? upper : !upper;  // M's triangle
  const int64_t n = ta.shape.back(), batch = batch_of(ta);
  const int64_t r = tb.shape[tb.shape.size() - 2], c = tb.shape.back();
  const int64_t rhs = left ? c : r;   // solves per matrix
  const int64_t step = left ? c : 1;  // stride of y's elements
  const T* pa = ta.ptr<T>();
  const T* pb = tb.ptr<T>();
  T* out = ctx.out(0).ptr<T>();
  ctx.parallel_for(batch * rhs, std::max<int64_t>(1, 4096 / std::max<int64_t>(1, n * n)),
                   [&](int64_t w0, int64_t w1) {
                     std::vector<double> y(static_cast<size_t>(n));
                     for (int64_t w = w0; w < w1; ++w) {
                       const int64_t b = w / rhs, s = w % rhs;
                       const T* m = pa + b * n * n;
                       auto M = [&](int64_t i, int64_t j) {
                         return static_cast<double>(trans ? m[j * n + i] : m[i * n + j]);
                       };
                       const int64_t base = b * r * c + (left ? s : s * n);
                       for (int64_t t = 0; t < n; ++t) {
                         const int64_t i = lower ? t : n - 1 - t;
                         double v = pb[base + i * step];
                         const int64_t k0 = lower ? 0 : i + 1,
                                       k1 = lower ? i : n;  // the solved part of y
                         for (int64_t k = k0; k < k1; ++k) v -= M(i, k) * y[static_cast<size_t>(k)];
                         y[static_cast<size_t>(i)] = unit ? v : v / M(i, i);
                       }
                       for (int64_t i = 0; i < n; ++i)
                         out[base + i * step] = static_cast<T>(y[static_cast<size_t>(i)]);
                     }
                   });
}

void triangular_solve(KernelContext& ctx) {
  dispatch_float(ctx.in(0).dtype, ctx.op_name(),
                 [&](auto t) { triangular_solve_impl<decltype(t)>(ctx); });
}

}  // namespace

void register_factorization_kernels() {
  // f32 and f64 only (no f16/bf16 through f32: inference rejects them)
  const DTypeSet types{f32, f64};
  register_kernel(OpId::Cholesky, Backend::cpu, {cholesky, types, 0, false});
  register_kernel(OpId::TriangularSolve, Backend::cpu, {triangular_solve, types, 0, false});
}

}  // namespace kiln::cpu
