// CUDA training batch norm on NHWC values: x as M = N * H * W rows of C contiguous channels.
// Each direction takes three kernels:
//   1. sums: a block owns a tile of up to 64 channels and a span of rows; a thread keeps V
//      channels (one 16-byte access per row) and strides over rows, the block adds its rows in a
//      fixed order and writes one pair of sums per (span, channel);
//   2. finalize: per channel, the spans' sums in span order (the same result every run, no
//      atomics), giving the statistics, the parameter gradients and the coefficients of step 3;
//   3. apply: the same tiles as step 1, each thread's coefficients in registers.
// The forward sums are shifted by the channel's first value (one pass, accurate while the values
// sit near it, as the CPU kernel does); arithmetic in float for half types, double for f64.
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <type_traits>

#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/norm_nhwc.h"
#include "ops/norm_params.h"

namespace kiln::cuda {

namespace {

constexpr int kTileChannels = 64;        // channels of a block's tile, at most
constexpr int64_t kTargetBlocks = 1024;  // tiles * spans, when the rows allow
constexpr int64_t kMaxSpans = 1024;
constexpr int kFinalizeGroups = kThreads / 32;  // a finalize block: 32 channels x 8 span groups

template <typename T, int V> struct alignas(sizeof(T) * V) Pack { T v[V]; };

template <typename A> struct Pair { A a, b; };

// Grid geometry shared by the sums and apply kernels: grid (tiles, spans), kThreads threads;
// `tpr` threads per row (V channels each), kThreads / tpr rows at a time.
struct Tiles {
  int64_t rows = 0, span = 0;
  int c = 0, tpr = 1, tiles = 1, spans = 1;
};

Tiles tiles_for(int64_t rows, int64_t c, int v) {
  Tiles t;
  t.rows = rows;
  t.c = static_cast<int>(c);
  const int64_t per_row = (c + v - 1) / v;
  while (t.tpr < kTileChannels / v && t.tpr < per_row) t.tpr *= 2;
  const int64_t tile = int64_t{t.tpr} * v;
  t.tiles = static_cast<int>((c + tile - 1) / tile);
  const int64_t step = kThreads / t.tpr;  // rows a block covers at a time
  const int64_t by_rows = std::max<int64_t>(1, rows / (4 * step));
  const int64_t want = std::max<int64_t>(1, (kTargetBlocks + t.tiles - 1) / t.tiles);
  int64_t spans = std::min({by_rows, want, kMaxSpans});
  t.span = (rows + spans - 1) / spans;
  t.spans = static_cast<int>((rows + t.span - 1) / t.span);  // every span non-empty
  return t;
}

// This thread's first channel (c0 >= c: none) and first row, and the block's rows.
struct Place {
  int c0, lane, r0;
  int64_t begin, end;
  __device__ Place(const Tiles& t, int v) {
    lane = threadIdx.x % t.tpr;
    r0 = threadIdx.x / t.tpr;
    c0 = (blockIdx.x * t.tpr + lane) * v;
    begin = int64_t{blockIdx.y} * t.span;
    end = min(t.rows, begin + t.span);
  }
};

template <typename T> struct BnArgs {
  const T* x;
  const T* dy;    // backward only
  const T* mean;  // backward: the forward's statistics
  const T* var;
  const T* w;  // nullptr: no weight
  const T* b;  // nullptr: no bias (forward)
  T* y;        // y or dx; may be x (forward) or dy (backward)
  T* out_a;    // forward: mean, var; backward: dweight, dbias
  T* out_b;
  double eps;
};

// Step 1. Forward (kGrad false): sums of d = x - x[0, c] and d * d. Backward: sums of dy and
// dy * (x - mean).
template <typename T, int V, bool kGrad>
__global__ void bn_nhwc_sums(BnArgs<T> a, Tiles t, Pair<acc_t<T>>* part) {
  using A = acc_t<T>;
  __shared__ A sa[kThreads * V], sb[kThreads * V];
  const Place p(t, V);
  const int step = kThreads / t.tpr;
  A s1[V], s2[V], k[V];
#pragma unroll
  for (int u = 0; u < V; ++u) s1[u] = s2[u] = k[u] = A(0);
  if (p.c0 < t.c) {
#pragma unroll
    for (int u = 0; u < V; ++u) k[u] = to_acc(kGrad ? a.mean[p.c0 + u] : a.x[p.c0 + u]);
    for (int64_t r = p.begin + p.r0; r < p.end; r += step) {
      const int64_t at = r * t.c + p.c0;
      const Pack<T, V> xv = *reinterpret_cast<const Pack<T, V>*>(a.x + at);
      if constexpr (kGrad) {
        const Pack<T, V> g = *reinterpret_cast<const Pack<T, V>*>(a.dy + at);
#pragma unroll
        for (int u = 0; u < V; ++u) {
          const A gv = to_acc(g.v[u]);
          s1[u] += gv;
          s2[u] += gv * (to_acc(xv.v[u]) - k[u]);
        }
      } else {
#pragma unroll
        for (int u = 0; u < V; ++u) {
          const A d = to_acc(xv.v[u]) - k[u];
          s1[u] += d;
          s2[u] += d * d;
        }
      }
    }
  }
  // rows slot r0, tile channel lane * V + u
#pragma unroll
  for (int u = 0; u < V; ++u) {
    sa[p.r0 * t.tpr * V + p.lane * V + u] = s1[u];
    sb[p.r0 * t.tpr * V + p.lane * V + u] = s2[u];
  }
  __syncthreads();
  const int tile = t.tpr * V, ch = threadIdx.x;
  const int c = blockIdx.x * tile + ch;
  if (ch < tile && c < t.c) {
    A ta = A(0), tb = A(0);
    for (int r = 0; r < step; ++r) {
      ta += sa[r * tile + ch];
      tb += sb[r * tile + ch];
    }
    part[int64_t{blockIdx.y} * t.c + c] = {ta, tb};
  }
}

// Step 2: coef holds 4 values per channel for step 3 (forward: mean, scale, shift; backward:
// mean, k, da, db with dx = k * (dy - da - (x - mean) * db)).
template <typename T, bool kGrad>
__global__ void bn_nhwc_finalize(BnArgs<T> a, Tiles t, const Pair<acc_t<T>>* part, acc_t<T>* coef) {
  using A = acc_t<T>;
  __shared__ A sa[kFinalizeGroups][32], sb[kFinalizeGroups][32];
  const int lane = threadIdx.x % 32, group = threadIdx.x / 32;
  const int c = blockIdx.x * 32 + lane;
  A ta = A(0), tb = A(0);
  if (c < t.c)
    for (int s = group; s < t.spans; s += kFinalizeGroups) {
      const Pair<A> q = part[int64_t{s} * t.c + c];
      ta += q.a;
      tb += q.b;
    }
  sa[group][lane] = ta;
  sb[group][lane] = tb;
  __syncthreads();
  if (group != 0 || c >= t.c) return;
  ta = tb = A(0);
  for (int g = 0; g < kFinalizeGroups; ++g) ta += sa[g][lane], tb += sb[g][lane];
  const A m = static_cast<A>(t.rows), eps = static_cast<A>(a.eps);
  const A w = a.w ? to_acc(a.w[c]) : A(1);
  A* out = coef + int64_t{c} * 4;
  if constexpr (kGrad) {
    const A mean = to_acc(a.mean[c]);
    const A rstd = A(1) / sqrt(to_acc(a.var[c]) + eps);
    const A dweight = tb * rstd;
    a.out_a[c] = from_acc<T>(dweight);
    a.out_b[c] = from_acc<T>(ta);
    out[0] = mean;
    out[1] = w * rstd;
    out[2] = ta / m;
    out[3] = dweight / m * rstd;
  } else {
    const A d = ta / m, mean = to_acc(a.x[c]) + d;
    const A var = max(A(0), tb / m - d * d);
    const A scale = w / sqrt(var + eps);
    a.out_a[c] = from_acc<T>(mean);
    a.out_b[c] = from_acc<T>(var);
    out[0] = mean;
    out[1] = scale;
    out[2] = a.b ? to_acc(a.b[c]) : A(0);
    out[3] = A(0);
  }
}

// Step 3: y = (x - mean) * scale + shift, or dx = k * (dy - da - (x - mean) * db).
template <typename T, int V, bool kGrad>
__global__ void bn_nhwc_apply(BnArgs<T> a, Tiles t, const acc_t<T>* coef) {
  using A = acc_t<T>;
  const Place p(t, V);
  if (p.c0 >= t.c) return;
  const int step = kThreads / t.tpr;
  A q[4][V];
#pragma unroll
  for (int u = 0; u < V; ++u)
#pragma unroll
    for (int j = 0; j < 4; ++j) q[j][u] = coef[int64_t{p.c0 + u} * 4 + j];
  for (int64_t r = p.begin + p.r0; r < p.end; r += step) {
    const int64_t at = r * t.c + p.c0;
    const Pack<T, V> xv = *reinterpret_cast<const Pack<T, V>*>(a.x + at);
    Pack<T, V> out;
    if constexpr (kGrad) {
      const Pack<T, V> g = *reinterpret_cast<const Pack<T, V>*>(a.dy + at);
#pragma unroll
      for (int u = 0; u < V; ++u)
        out.v[u] = from_acc<T>(q[1][u] *
                               (to_acc(g.v[u]) - q[2][u] - (to_acc(xv.v[u]) - q[0][u]) * q[3][u]));
    } else {
#pragma unroll
      for (int u = 0; u < V; ++u)
        out.v[u] = from_acc<T>((to_acc(xv.v[u]) - q[0][u]) * q[1][u] + q[2][u]);
    }
    *reinterpret_cast<Pack<T, V>*>(a.y + at) = out;
  }
}

template <typename T, bool kGrad> void run(KernelContext& ctx, const BnArgs<T>& a, const Shape& x) {
  using A = acc_t<T>;
  const int64_t c = x[3], rows = x[0] * x[1] * x[2];
  if (c > std::numeric_limits<int32_t>::max() / 2 || rows * c == 0) {
    if (rows * c == 0) return;
    fail<UnsupportedError>("[{}] channels_last with {} channels (x is {})", ctx.op_name(), c,
                           str(x));
  }
  constexpr int kV = static_cast<int>(16 / sizeof(T));
  bool wide = c % kV == 0;
  for (const void* q : {static_cast<const void*>(a.x), static_cast<const void*>(a.dy),
                        static_cast<const void*>(a.y)})
    wide = wide && reinterpret_cast<uintptr_t>(q) % 16 == 0;
  cudaStream_t stream = stream_of(ctx);
  auto launch = [&](auto width) {
    constexpr int V = decltype(width)::value;
    const Tiles t = tiles_for(rows, c, V);
    auto* part = static_cast<Pair<A>*>(ctx.scratch(sizeof(Pair<A>) * t.spans * c));
    auto* coef = static_cast<A*>(ctx.scratch(sizeof(A) * 4 * c));
    const dim3 grid(static_cast<unsigned>(t.tiles), static_cast<unsigned>(t.spans));
    bn_nhwc_sums<T, V, kGrad><<<grid, kThreads, 0, stream>>>(a, t, part);
    check_launch(ctx.op_name());
    bn_nhwc_finalize<T, kGrad>
        <<<static_cast<unsigned>((c + 31) / 32), kThreads, 0, stream>>>(a, t, part, coef);
    check_launch(ctx.op_name());
    bn_nhwc_apply<T, V, kGrad><<<grid, kThreads, 0, stream>>>(a, t, coef);
    check_launch(ctx.op_name());
  };
  if (wide) launch(std::integral_constant<int, kV>{});
  else launch(std::integral_constant<int, 1>{});
}

}  // namespace

void batch_norm_train_nhwc(KernelContext& ctx) {
  const TensorView& x = ctx.in(0);
  const NormParams p = params_of<NormParams>(ctx);
  const bool hw = p.has_weight, hb = p.has_bias;
  dispatch_float(x.dtype, ctx.op_name(), [&](auto v) {
    using T = decltype(v);
    BnArgs<T> a{};
    a.x = x.ptr<T>();
    a.w = hw ? ctx.in(1).ptr<T>() : nullptr;
    a.b = hb ? ctx.in(hw ? 2 : 1).ptr<T>() : nullptr;
    a.y = ctx.out(0).ptr<T>();
    a.out_a = ctx.out(1).ptr<T>();
    a.out_b = ctx.out(2).ptr<T>();
    a.eps = p.eps;
    run<T, false>(ctx, a, x.shape);
  });
}

void batch_norm_train_grad_nhwc(KernelContext& ctx) {
  const TensorView& x = ctx.in(1);
  const NormParams p = params_of<NormParams>(ctx);
  const bool hw = p.has_weight;
  dispatch_float(x.dtype, ctx.op_name(), [&](auto v) {
    using T = decltype(v);
    BnArgs<T> a{};
    a.dy = ctx.in(0).ptr<T>();
    a.x = x.ptr<T>();
    a.mean = ctx.in(2).ptr<T>();
    a.var = ctx.in(3).ptr<T>();
    a.w = hw ? ctx.in(4).ptr<T>() : nullptr;
    a.y = ctx.out(0).ptr<T>();
    a.out_a = ctx.out(1).ptr<T>();
    a.out_b = ctx.out(2).ptr<T>();
    a.eps = p.eps;
    run<T, true>(ctx, a, x.shape);
  });
}

}  // namespace kiln::cuda
