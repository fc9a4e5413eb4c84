// CPU kernels of the loss family. Reductions sum per-position losses in double over fixed blocks,
// so a loss does not depend on the thread count.
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>

#include "backends/cpu/cpu_common.h"
#include "backends/cpu/kernels.h"
#include "ops/loss_params.h"

namespace kiln::cpu {

namespace {

using Reduce = LossParams::Reduce;
Reduce reduction(const KernelContext& ctx) { return params_of<LossParams>(ctx).reduction; }

// Sum of loss(i) for i in [0, n), in blocks of fixed size whose partial sums add up in order.
template <typename F>
double block_sum(const KernelContext& ctx, int64_t n, F&& loss) {
  constexpr int64_t kBlock = 4096;
  std::vector<double> partial(static_cast<size_t>((n + kBlock - 1) / kBlock), 0.0);
  ctx.parallel_for(static_cast<int64_t>(partial.size()), 1, [&](int64_t b, int64_t e) {
    for (int64_t k = b; k < e; ++k) {
      double s = 0;
      for (int64_t i = k * kBlock; i < std::min(n, (k + 1) * kBlock); ++i) s += loss(i);
      partial[k] = s;
    }
  });
  return std::accumulate(partial.begin(), partial.end(), 0.0);
}

// Writes loss(i) for each of n positions, or their sum or mean over `count` into one scalar.
template <typename T, typename F>
void write_losses(const KernelContext& ctx, int64_t n, int64_t count, F&& loss) {
  T* out = ctx.out(0).ptr<T>();
  const Reduce r = reduction(ctx);
  if (r == Reduce::none) {
    ctx.parallel_for(n, 4096, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) out[i] = static_cast<T>(loss(i));
    });
    return;
  }
  const double total = block_sum(ctx, n, loss);
  // a mean over nothing is NaN, like numpy's
  out[0] = static_cast<T>(r == Reduce::sum ? total : total / static_cast<double>(count));
}

// ---- softmax_cross_entropy ----

// Checked before the parallel loops: labels index a class, or equal ignore_index when allowed.
template <typename L>
int64_t check_indices(const char* op, const L* labels, int64_t n, int64_t classes,
                      std::optional<int64_t> ignore) {
  int64_t counted = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t l = labels[i];
    if (ignore && l == *ignore) continue;
    if (l < 0 || l >= classes)
      fail<ValueError>("[{}] label {} at position {} is out of range for {} classes", op, l, i,
                       classes);
    ++counted;
  }
  return counted;
}

// log(sum(exp(x))) over the classes of one position, shifted by the max for stability.
template <typename T>
double logsumexp(const T* x, int64_t classes, int64_t stride) {
  T mx = -std::numeric_limits<T>::infinity();
  for (int64_t k = 0; k < classes; ++k) mx = std::max(mx, x[k * stride]);
  double s = 0;
  for (int64_t k = 0; k < classes; ++k) s += std::exp(x[k * stride] - mx);
  return mx + std::log(s);
}

void softmax_cross_entropy(KernelContext& ctx) {
  const TensorView &x = ctx.in(0), &labels = ctx.in(1);
  const AxisSplit s = split_at(x.shape, params_of<LossParams>(ctx).axis);
  const int64_t n = s.outer * s.inner;
  dispatch_float(x.dtype, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    const T* px = x.ptr<T>();
    if (is_floating(labels.dtype)) {
      // -sum_k p_k * log_softmax(x)_k = sum_k p_k * (lse - x_k)
      const T* pl = labels.ptr<T>();
      write_losses<T>(ctx, n, n, [&](int64_t p) {
        const int64_t b = s.base(p);
        const double lse = logsumexp(px + b, s.len, s.inner);
        double l = 0;
        for (int64_t k = 0; k < s.len; ++k)
          l += pl[b + k * s.inner] * (lse - px[b + k * s.inner]);
        return l;
      });
      return;
    }
    dispatch_index(labels.dtype, ctx.op_name(), [&](auto li) {
      using L = decltype(li);
      const L* pl = labels.ptr<L>();
      check_indices(ctx.op_name(), pl, n, s.len, std::nullopt);
      write_losses<T>(ctx, n, n, [&](int64_t p) {
        const int64_t b = s.base(p);
        return logsumexp(px + b, s.len, s.inner) - px[b + pl[p] * s.inner];
      });
    });
  });
}

// ---- nll ----

void nll(KernelContext& ctx) {
  const TensorView &x = ctx.in(0), &target = ctx.in(1);
  const AxisSplit s = split_at(x.shape, x.rank() == 1 ? 0 : 1);
  const int64_t n = s.outer * s.inner, ignore = params_of<LossParams>(ctx).ignore_index;
  dispatch_float(x.dtype, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    const T* px = x.ptr<T>();
    dispatch_index(target.dtype, ctx.op_name(), [&](auto ti) {
      using L = decltype(ti);
      const L* pt = target.ptr<L>();
      const int64_t counted = check_indices(ctx.op_name(), pt, n, s.len, ignore);
      write_losses<T>(ctx, n, counted, [&](int64_t p) {
        return pt[p] == ignore ? 0.0 : -static_cast<double>(px[s.base(p) + pt[p] * s.inner]);
      });
    });
  });
}

// ---- mse ----

void mse(KernelContext& ctx) {
  const TensorView &a = ctx.in(0), &b = ctx.in(1);
  dispatch_float(a.dtype, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    const auto sq = [](T u, T v) { return static_cast<T>((u - v) * (u - v)); };
    if (reduction(ctx) == Reduce::none) {
      binary_map<T, T, T>(ctx, a, b, ctx.out(0), sq);
      return;
    }
    Shape shape;
    broadcast_shapes(a.shape, b.shape, shape);
    const int64_t n = numel(shape);
    if (a.shape == b.shape) {
      const T *pa = a.ptr<T>(), *pb = b.ptr<T>();
      write_losses<T>(ctx, n, n, [&](int64_t i) {
        const double d = static_cast<double>(pa[i]) - pb[i];
        return d * d;
      });
      return;
    }
    // broadcast inputs: materialize the squared differences once, then reduce them
    std::vector<T> diff(static_cast<size_t>(n));
    binary_map<T, T, T>(ctx, a, b, TensorView{diff.data(), shape, a.dtype}, sq);
    write_losses<T>(ctx, n, n, [&](int64_t i) { return static_cast<double>(diff[i]); });
  });
}

}  // namespace

void register_loss_kernels() {
  const DTypeSet floats{f32, f64, f16, bf16};
  register_kernel(OpId::SoftmaxCrossEntropy, Backend::cpu, {softmax_cross_entropy, floats});
  register_kernel(OpId::Nll, Backend::cpu, {nll, floats});
  register_kernel(OpId::Mse, Backend::cpu, {mse, floats});
}

}  // namespace kiln::cpu
