// CUDA kernels of the loss family. Per-position losses are computed in double sums (as the CPU
// does); "mean" and "sum" reduce them deterministically: fixed per-block partial sums in double,
// then one block adds the partials in order. Labels the CPU rejects (out of range) give NaN and
// are reported in the step's error slot: the runtime throws ValueError after the run.
#include <algorithm>
#include <cmath>
#include <limits>

#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/kernels.h"
#include "ops/loss_params.h"

namespace kiln::cuda {

namespace {

constexpr int kMaxPartials = 1024;

using Reduce = LossParams::Reduce;
Reduce reduction(const KernelContext& ctx) { return params_of<LossParams>(ctx).reduction; }

// A loss and the number of positions it counts for (0 for an ignored position).
struct LossCount {
  double s, c;
};

__device__ inline double warp_sum(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return __shfl_sync(0xffffffffu, v, 0);
}

// Sum over the block, valid in thread 0 (blockDim a multiple of 32, at most 1024).
__device__ LossCount block_sum(LossCount v) {
  __shared__ LossCount smem[32];
  v.s = warp_sum(v.s);
  v.c = warp_sum(v.c);
  const int warp = threadIdx.x >> 5;
  if ((threadIdx.x & 31) == 0) smem[warp] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (unsigned w = 1; w < blockDim.x / 32; ++w) {
      v.s += smem[w].s;
      v.c += smem[w].c;
    }
  }
  return v;
}

// partials[block] = sum of f(i) over the block's grid-stride share of [0, n).
template <typename F> __global__ void partial_sums(int64_t n, F f, LossCount* partials) {
  LossCount acc{0, 0};
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const LossCount v = f(i);
    acc.s += v.s;
    acc.c += v.c;
  }
  acc = block_sum(acc);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

// out[0] = the total, or total / count for a mean (NaN over nothing, as on the CPU).
template <typename T>
__global__ void finish_sum(const LossCount* partials, int count, bool mean, T* out) {
  LossCount acc{0, 0};
  for (int i = threadIdx.x; i < count; i += blockDim.x) {
    acc.s += partials[i].s;
    acc.c += partials[i].c;
  }
  acc = block_sum(acc);
  if (threadIdx.x == 0) out[0] = from_acc<T>(mean ? acc.s / acc.c : acc.s);
}

// Reduces f over [0, n) into the scalar output (the grid depends on n only: deterministic).
template <typename T, typename F> void reduce_losses(KernelContext& ctx, int64_t n, F f) {
  const int grid = static_cast<int>(std::min<int64_t>(blocks_for(n), kMaxPartials));
  auto* partials = static_cast<LossCount*>(ctx.scratch(grid * sizeof(LossCount)));
  cudaStream_t stream = stream_of(ctx);
  partial_sums<<<grid, kThreads, 0, stream>>>(n, f, partials);
  check_launch(ctx.op_name());
  finish_sum<T><<<1, kThreads, 0, stream>>>(partials, grid, reduction(ctx) == Reduce::mean,
                                           ctx.out(0).ptr<T>());
  check_launch(ctx.op_name());
}

// out[i] = f(i).s for "none".
template <typename T, typename F> __global__ void write_losses(int64_t n, F f, T* out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = from_acc<T>(f(i).s);
}

// Writes f's losses, for "none".
template <typename T, typename F>
void write_each(KernelContext& ctx, int64_t n, F f) {
  if (n == 0) return;
  write_losses<T><<<blocks_for(n), kThreads, 0, stream_of(ctx)>>>(n, f, ctx.out(0).ptr<T>());
  check_launch(ctx.op_name());
}

// Writes f's losses for "none", or their sum or mean.
template <typename T, typename F>
void emit(KernelContext& ctx, int64_t n, F f) {
  if (reduction(ctx) != Reduce::none)
    reduce_losses<T>(ctx, n, f);
  else
    write_each<T>(ctx, n, f);
}

// Offset of position p (over outer x inner) at class 0.
__device__ inline int64_t base_of(const AxisSplit& s, int64_t p) {
  return (p / s.inner) * s.len * s.inner + p % s.inner;
}

// ---- softmax_cross_entropy ----

// Per-position losses over G lanes (a warp along contiguous classes, or one thread when the class
// axis is strided): lse = max + log(sum exp(x - max)), the sum in double; then lse - x[label], or
// sum_k p_k * (lse - x_k) for probability labels (L = T).
template <typename T, typename L, int G>
__global__ void sce_positions(const T* x, const L* labels, AxisSplit s, double* loss,
                              int64_t* err) {
  using A = acc_t<T>;
  const int64_t n = s.outer * s.inner, per_block = blockDim.x / G;
  const int lane = threadIdx.x % G;
  for (int64_t p = blockIdx.x * per_block + threadIdx.x / G; p < n;
       p += static_cast<int64_t>(gridDim.x) * per_block) {
    const int64_t b = base_of(s, p);
    A m = -std::numeric_limits<A>::infinity();
    for (int64_t k = lane; k < s.len; k += G) m = fmax(m, to_acc(x[b + k * s.inner]));
    if constexpr (G > 1)
      for (int o = 16; o > 0; o >>= 1) m = fmax(m, __shfl_xor_sync(0xffffffffu, m, o));
    double sum = 0;
    for (int64_t k = lane; k < s.len; k += G) sum += exp(to_acc(x[b + k * s.inner]) - m);
    if constexpr (G > 1) sum = warp_sum(sum);
    const double lse = static_cast<double>(m) + log(sum);
    double l;
    if constexpr (std::is_same_v<L, T>) {
      l = 0;
      for (int64_t k = lane; k < s.len; k += G) {
        const int64_t i = b + k * s.inner;
        l += static_cast<double>(to_acc(labels[i])) * (lse - static_cast<double>(to_acc(x[i])));
      }
      if constexpr (G > 1) l = warp_sum(l);
    } else {
      const auto c = static_cast<int64_t>(labels[p]);
      if ((c < 0 || c >= s.len) && lane == 0) report_bad_value(err, p, c);
      l = c >= 0 && c < s.len ? lse - static_cast<double>(to_acc(x[b + c * s.inner]))
                              : std::numeric_limits<double>::quiet_NaN();
    }
    if (lane == 0) loss[p] = l;
  }
}

struct LoadLoss {
  const double* loss;
  __device__ LossCount operator()(int64_t i) const { return {loss[i], 1}; }
};

void softmax_cross_entropy(KernelContext& ctx) {
  const TensorView &x = ctx.in(0), &labels = ctx.in(1);
  const int64_t axis = params_of<LossParams>(ctx).axis;
  const AxisSplit s = split_at(x.shape, axis);
  const int64_t n = s.outer * s.inner;
  double* loss = static_cast<double*>(ctx.scratch(std::max<int64_t>(n, 1) * sizeof(double)));
  describe_errors(ctx, ErrorKind::label, axis, s.len);
  cudaStream_t stream = stream_of(ctx);
  dispatch_float(x.dtype, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    auto positions = [&](auto l) {
      using L = decltype(l);
      if (n == 0) return;
      if (s.inner == 1)
        sce_positions<T, L, 32><<<blocks_for(n, kThreads / 32), kThreads, 0, stream>>>(
            x.ptr<T>(), labels.ptr<L>(), s, loss, ctx.error_slot());
      else
        sce_positions<T, L, 1><<<blocks_for(n), kThreads, 0, stream>>>(
            x.ptr<T>(), labels.ptr<L>(), s, loss, ctx.error_slot());
      check_launch(ctx.op_name());
    };
    if (is_floating(labels.dtype)) positions(T{});
    else dispatch_index(labels.dtype, ctx.op_name(), positions);
    emit<T>(ctx, n, LoadLoss{loss});
  });
}

// ---- nll ----

template <typename T, typename L> struct NllLoss {
  const T* x;
  const L* target;
  AxisSplit s;
  int64_t ignore;
  int64_t* err;
  __device__ LossCount operator()(int64_t p) const {
    const auto c = static_cast<int64_t>(target[p]);
    if (c == ignore) return {0, 0};
    if (c < 0 || c >= s.len) {
      report_bad_value(err, p, c);
      return {std::numeric_limits<double>::quiet_NaN(), 1};
    }
    return {-static_cast<double>(to_acc(x[base_of(s, p) + c * s.inner])), 1};
  }
};

void nll(KernelContext& ctx) {
  const TensorView &x = ctx.in(0), &target = ctx.in(1);
  const AxisSplit s = split_at(x.shape, x.rank() == 1 ? 0 : 1);
  const int64_t n = s.outer * s.inner, ignore = params_of<LossParams>(ctx).ignore_index;
  describe_errors(ctx, ErrorKind::label, x.rank() == 1 ? 0 : 1, s.len);
  dispatch_float(x.dtype, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    dispatch_index(target.dtype, ctx.op_name(), [&](auto ti) {
      using L = decltype(ti);
      emit<T>(ctx, n, NllLoss<T, L>{x.ptr<T>(), target.ptr<L>(), s, ignore, ctx.error_slot()});
    });
  });
}

// ---- mse ----

// (a - b)^2 at output position i: in T's arithmetic type for "none" (as the CPU), in double when
// summed.
template <typename T, bool kBroadcast, bool kDouble> struct SquaredDiff {
  const T* a;
  const T* b;
  BroadcastIndex ia, ib;
  __device__ LossCount operator()(int64_t i) const {
    const T u = a[kBroadcast ? ia.offset(i) : i], v = b[kBroadcast ? ib.offset(i) : i];
    if constexpr (kDouble) {
      const double d = static_cast<double>(to_acc(u)) - static_cast<double>(to_acc(v));
      return {d * d, 1};
    } else {
      const acc_t<T> d = to_acc(u) - to_acc(v);
      return {static_cast<double>(d * d), 1};
    }
  }
};

Shape broadcast_of(const Shape& a, const Shape& b) {
  const size_t r = std::max(a.size(), b.size());
  Shape out(r, 1);
  for (size_t d = 0; d < r; ++d) {
    const int64_t da = d + a.size() >= r ? a[d + a.size() - r] : 1;
    const int64_t db = d + b.size() >= r ? b[d + b.size() - r] : 1;
    out[d] = da == 1 ? db : da;
  }
  return out;
}

void mse(KernelContext& ctx) {
  const TensorView &a = ctx.in(0), &b = ctx.in(1);
  const Shape shape = broadcast_of(a.shape, b.shape);
  const int64_t n = numel(shape);
  const bool none = reduction(ctx) == Reduce::none;
  dispatch_float(a.dtype, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    const T *pa = a.ptr<T>(), *pb = b.ptr<T>();
    // each functor goes to the one kernel its reduction uses (kDouble: summed)
    if (a.shape == b.shape) {
      if (none)
        write_each<T>(ctx, n, SquaredDiff<T, false, false>{pa, pb, {}, {}});
      else
        reduce_losses<T>(ctx, n, SquaredDiff<T, false, true>{pa, pb, {}, {}});
      return;
    }
    const BroadcastIndex ia = make_broadcast_index(a.shape, shape, ctx.op_name());
    const BroadcastIndex ib = make_broadcast_index(b.shape, shape, ctx.op_name());
    if (none)
      write_each<T>(ctx, n, SquaredDiff<T, true, false>{pa, pb, ia, ib});
    else
      reduce_losses<T>(ctx, n, SquaredDiff<T, true, true>{pa, pb, ia, ib});
  });
}

}  // namespace

void register_loss_kernels() {
  const DTypeSet floats{f32, f64, f16, bf16};
  register_kernel(OpId::SoftmaxCrossEntropy, Backend::cuda,
                  {softmax_cross_entropy, floats, 0, false, /*reports_errors=*/true});
  register_kernel(OpId::Nll, Backend::cuda, {nll, floats, 0, false, /*reports_errors=*/true});
  register_kernel(OpId::Mse, Backend::cuda, {mse, floats, 0, false});
}

}  // namespace kiln::cuda
