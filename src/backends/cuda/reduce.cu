// CUDA kernels of the reduce family. As on the CPU, a reduction views its input as groups of
// merged dims, kept or reduced, walked with strides (no transposed copy): kept innermost dims are
// "lanes" read side by side (coalesced), the innermost reduced group is a "run", other groups are
// strided. Contiguous rows (no lanes) reduce with a thread, warp or block per row; lanes with a
// (lanes x reduction) block. Few outputs over long reductions split the reduction across blocks
// and merge the partials in a fixed order, so results are deterministic. Floats accumulate in
// double (f32, f64) or float (f16, bf16), integers in uint64 (wrapping like the CPU).
#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/kernels.h"
#include "backends/geometry.h"
#include "ops/reduce_params.h"

namespace kiln::cuda {

namespace {

// ---- warp and block helpers ----

constexpr unsigned kFull = 0xffffffffu;

// Shuffles any trivially copyable value word by word (accumulators are small structs).
enum class Shfl { down, up, idx };
template <Shfl kKind, typename A> __device__ A shfl(A v, int arg) {
  constexpr int kWords = (sizeof(A) + 3) / 4;
  uint32_t w[kWords] = {};
  memcpy(w, &v, sizeof(A));
#pragma unroll
  for (int i = 0; i < kWords; ++i) {
    if constexpr (kKind == Shfl::down) w[i] = __shfl_down_sync(kFull, w[i], arg);
    else if constexpr (kKind == Shfl::up) w[i] = __shfl_up_sync(kFull, w[i], arg);
    else w[i] = __shfl_sync(kFull, w[i], arg);
  }
  A out;
  memcpy(&out, w, sizeof(A));
  return out;
}

// Merges the values of a full warp into lane 0 (a fixed tree: deterministic).
template <typename Op, typename A> __device__ A warp_merge(const Op& op, A a) {
#pragma unroll
  for (int d = 16; d > 0; d /= 2) op.merge(a, shfl<Shfl::down>(a, d));
  return a;
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline int pow2_at_least(int64_t n, int cap) {
  int p = 1;
  while (p < cap && p < n) p *= 2;
  return p;
}

// ---- the shape of a reduction ----

// Sizes and strides of merged dims, outermost first: the same index map as a broadcast input's.
using Strided = BroadcastIndex;

struct Geom {
  int64_t outputs = 1;     // rows * lanes
  int64_t lanes = 1;       // kept innermost elements (stride 1)
  int64_t count = 1;       // reduced elements per output
  int64_t run = 1;         // size of the innermost reduced group
  int64_t run_stride = 0;  // its stride
  Strided rows;            // other kept groups
  Strided red;             // other reduced groups
  __device__ int64_t base(int64_t o) const {
    const int64_t row = o / lanes;
    return rows.offset(row) + (o - row * lanes);
  }
};

// Walks reduced elements r, r + step, ... and yields their offsets from an output's base.
struct RedIter {
  int64_t q, k, qoff;
  __device__ RedIter(const Geom& g, int64_t r) : q(r / g.run), k(r - r / g.run * g.run) {
    qoff = g.red.offset(q);
  }
  __device__ int64_t offset(const Geom& g) const { return qoff + k * g.run_stride; }
  __device__ void advance(const Geom& g, int64_t step) {
    k += step;
    if (k < g.run) return;
    q += k / g.run;
    k %= g.run;
    qoff = g.red.offset(q);
  }
};

// The shared plan (backends/geometry.h) in fixed-size form for the device.
Geom plan_reduce(const Shape& shape, const std::vector<int64_t>& axes, const char* op) {
  const ReducePlan p = ::kiln::plan_reduce(shape, axes);
  Geom g;
  g.outputs = p.rows * p.lanes;
  g.lanes = p.lanes;
  g.count = p.count;
  g.run = p.run;
  g.run_stride = p.run_stride;
  auto fill = [&](Strided& s, const Shape& sizes, const std::vector<int64_t>& strides) {
    if (sizes.size() > static_cast<size_t>(kMaxRank))
      fail<UnsupportedError>("[{}] cuda kernel takes at most {} groups of kept or reduced dims, "
                             "shape {}", op, kMaxRank, str(shape));
    s.rank = static_cast<int>(sizes.size());
    for (int d = 0; d < s.rank; ++d) {
      s.dims[d] = sizes[d];
      s.strides[d] = strides[d];
    }
  };
  fill(g.rows, p.row_sizes, p.row_strides);
  fill(g.red, p.outer_sizes, p.outer_strides);
  return g;
}

// ---- reduction ops: init, add one element (with its reduced index), merge, finish ----

// Accumulator of sums and products: float for half types, double for f32/f64, uint64 for ints.
template <typename T> struct WideOf {
  using type = std::conditional_t<std::is_integral_v<T>, uint64_t, double>;
};
template <> struct WideOf<half> { using type = float; };
template <> struct WideOf<bf16_t> { using type = float; };
template <typename T> using wide_t = typename WideOf<T>::type;

__device__ inline float dev_exp(float v) { return expf(v); }
__device__ inline double dev_exp(double v) { return ::exp(v); }
__device__ inline float dev_log(float v) { return logf(v); }
__device__ inline double dev_log(double v) { return ::log(v); }

template <typename T> struct SumOp {
  using In = T;
  using Out = T;
  using Acc = wide_t<T>;
  __device__ Acc init() const { return Acc(0); }
  __device__ void add(Acc& a, T x, int64_t) const { a += static_cast<Acc>(to_acc(x)); }
  __device__ void merge(Acc& a, Acc b) const { a += b; }
  __device__ T finish(Acc a, int64_t) const { return from_acc<T>(a); }
};
template <typename T> struct ProdOp : SumOp<T> {
  using Acc = wide_t<T>;
  __device__ Acc init() const { return Acc(1); }
  __device__ void add(Acc& a, T x, int64_t) const { a *= static_cast<Acc>(to_acc(x)); }
  __device__ void merge(Acc& a, Acc b) const { a *= b; }
};
template <typename T> struct MeanOp : SumOp<T> {
  using Acc = wide_t<T>;
  __device__ T finish(Acc a, int64_t n) const { return from_acc<T>(a / static_cast<Acc>(n)); }
};
template <typename T> struct NormL1Op : SumOp<T> {
  using Acc = wide_t<T>;
  __device__ void add(Acc& a, T x, int64_t) const {
    const Acc v = static_cast<Acc>(to_acc(x));
    a += v < Acc(0) ? -v : v;
  }
};
template <typename T> struct NormL2Op : SumOp<T> {
  using Acc = wide_t<T>;
  __device__ void add(Acc& a, T x, int64_t) const {
    const Acc v = static_cast<Acc>(to_acc(x));
    a += v * v;
  }
  __device__ T finish(Acc a, int64_t) const { return from_acc<T>(sqrt(a)); }
};

// Max (kMax) or min; NaN wins, as on the CPU.
template <typename T, bool kMax> struct ExtremeOp {
  using In = T;
  using Out = T;
  using Acc = acc_t<T>;
  __device__ Acc init() const {
    if constexpr (std::is_floating_point_v<Acc>)
      return kMax ? -std::numeric_limits<Acc>::infinity() : std::numeric_limits<Acc>::infinity();
    else
      return kMax ? std::numeric_limits<Acc>::lowest() : std::numeric_limits<Acc>::max();
  }
  __device__ void merge(Acc& a, Acc x) const {
    bool take = kMax ? x > a : x < a;
    if constexpr (std::is_floating_point_v<Acc>) take = take || isnan(x);
    a = take ? x : a;
  }
  __device__ void add(Acc& a, T x, int64_t) const { merge(a, to_acc(x)); }
  __device__ T finish(Acc a, int64_t) const { return from_acc<T>(a); }
};

// Welford's running mean and sum of squared deviations; partials merge with Chan's formula.
template <typename W> struct Moments {
  W n, mean, m2;
};
template <typename T> struct VarianceOp {
  using In = T;
  using Out = T;
  using W = acc_t<wide_t<T>>;
  using Acc = Moments<W>;
  int64_t correction = 0;
  __device__ Acc init() const { return {W(0), W(0), W(0)}; }
  __device__ void add(Acc& a, T x, int64_t) const {
    const W v = static_cast<W>(to_acc(x));
    a.n += 1;
    const W d = v - a.mean;
    a.mean += d / a.n;
    a.m2 += d * (v - a.mean);
  }
  __device__ void merge(Acc& a, const Acc& b) const {
    if (b.n == 0) return;
    if (a.n == 0) {
      a = b;
      return;
    }
    const W n = a.n + b.n, d = b.mean - a.mean;
    a.mean += d * b.n / n;
    a.m2 += b.m2 + d * d * a.n * b.n / n;
    a.n = n;
  }
  __device__ T finish(const Acc& a, int64_t n) const {
    const int64_t dof = n - correction > 0 ? n - correction : 0;
    return from_acc<T>(a.m2 / static_cast<W>(dof));
  }
};

// Running maximum m and sum s of exp(x - m); in float for f32 and half types.
template <typename W> struct ExpSum {
  W m, s;
};
template <typename T> struct LogsumexpOp {
  using In = T;
  using Out = T;
  using W = acc_t<T>;
  using Acc = ExpSum<W>;
  __device__ Acc init() const { return {-std::numeric_limits<W>::infinity(), W(0)}; }
  __device__ void merge(Acc& a, const Acc& b) const {
    if (b.m > a.m) {
      a.s = a.s * dev_exp(a.m - b.m) + b.s;
      a.m = b.m;
    } else if (b.m == a.m) {
      a.s += b.s;  // also covers infinities, where m - m is NaN
    } else if (b.m < a.m) {
      a.s += b.s * dev_exp(b.m - a.m);
    } else if (b.s != W(0)) {
      a.m = std::numeric_limits<W>::quiet_NaN();  // b.m is NaN
    }
  }
  __device__ void add(Acc& a, T x, int64_t) const { merge(a, Acc{to_acc(x), W(1)}); }
  __device__ T finish(const Acc& a, int64_t) const { return from_acc<T>(a.m + dev_log(a.s)); }
};

// Index of the max (kMax) or min: the first occurrence wins, NaN wins (the first NaN).
template <typename V> struct ArgAcc {
  V v;
  int64_t i;  // -1: nothing seen
};
template <typename T, bool kMax> struct ArgOp {
  using In = T;
  using Out = int64_t;
  using V = acc_t<T>;
  using Acc = ArgAcc<V>;
  __device__ static bool better(V x, V best) {
    if constexpr (std::is_floating_point_v<V>) {
      if (isnan(best)) return false;
      if (isnan(x)) return true;
    }
    return kMax ? x > best : x < best;
  }
  __device__ Acc init() const { return {V{}, -1}; }
  __device__ void merge(Acc& a, const Acc& b) const {
    if (b.i < 0) return;
    if (a.i < 0 || better(b.v, a.v) || (!better(a.v, b.v) && b.i < a.i)) a = b;
  }
  __device__ void add(Acc& a, T x, int64_t r) const { merge(a, Acc{to_acc(x), r}); }
  __device__ int64_t finish(const Acc& a, int64_t) const { return a.i; }
};

// ---- reduction kernels ----

// 16 bytes of T, loaded at once.
template <typename T> struct alignas(16) Vec16 {
  static constexpr int kSize = 16 / sizeof(T);
  T v[kSize];
};

// W threads per output (1, 32 or kThreads), each (output, split) unit reducing [r0, r1) of its
// output's reduced elements; W > 1 only for rows without lanes (lanes == 1). `vec`: contiguous
// rows of a multiple of 16 bytes, 16-byte aligned, read 16 bytes at a time.
template <typename Op, int W>
__global__ void __launch_bounds__(kThreads)
    reduce_rows(const typename Op::In* x, typename Op::Out* y, typename Op::Acc* partial, Geom g,
                int64_t splits, bool vec, Op op) {
  using In = typename Op::In;
  constexpr int V = Vec16<In>::kSize;
  using Acc = typename Op::Acc;
  constexpr int G = kThreads / W;
  __shared__ alignas(16) unsigned char smem[(W > 32 ? W / 32 : 1) * sizeof(Acc)];
  Acc* warp_acc = reinterpret_cast<Acc*>(smem);
  const int lane = static_cast<int>(threadIdx.x) % W, grp = static_cast<int>(threadIdx.x) / W;
  const int64_t units = g.outputs * splits;
  const bool contiguous = g.red.rank == 0 && g.run_stride == 1;
  for (int64_t u = static_cast<int64_t>(blockIdx.x) * G + grp; u - grp < units;
       u += static_cast<int64_t>(gridDim.x) * G) {
    Acc a = op.init();
    int64_t o = 0, s = 0;
    if (u < units) {
      o = u / splits;
      s = u - o * splits;
      const int64_t r0 = g.count * s / splits, r1 = g.count * (s + 1) / splits;
      const auto* base = x + g.base(o);
      int64_t r = r0 + lane;
      if (vec) {
        const int64_t nv = g.count / V, v1 = nv * (s + 1) / splits;
        const auto* vb = reinterpret_cast<const Vec16<In>*>(base);
        int64_t q = nv * s / splits + lane;
        for (; q + W < v1; q += 2 * W) {  // two 16-byte loads in flight
          const Vec16<In> p0 = vb[q], p1 = vb[q + W];
#pragma unroll
          for (int k = 0; k < V; ++k) op.add(a, p0.v[k], q * V + k);
#pragma unroll
          for (int k = 0; k < V; ++k) op.add(a, p1.v[k], (q + W) * V + k);
        }
        for (; q < v1; q += W) {
          const Vec16<In> p0 = vb[q];
#pragma unroll
          for (int k = 0; k < V; ++k) op.add(a, p0.v[k], q * V + k);
        }
      } else if (contiguous) {
        for (; r + 3 * W < r1; r += 4 * W) {  // four loads in flight
          const auto v0 = base[r], v1 = base[r + W], v2 = base[r + 2 * W], v3 = base[r + 3 * W];
          op.add(a, v0, r);
          op.add(a, v1, r + W);
          op.add(a, v2, r + 2 * W);
          op.add(a, v3, r + 3 * W);
        }
        for (; r < r1; r += W) op.add(a, base[r], r);
      } else if (r < r1) {
        for (RedIter it(g, r); r < r1; r += W, it.advance(g, W)) op.add(a, base[it.offset(g)], r);
      }
    }
    if constexpr (W >= 32) a = warp_merge(op, a);
    if constexpr (W > 32) {
      const int warp = lane / 32;
      if (lane % 32 == 0) warp_acc[warp] = a;
      __syncthreads();
      if (warp == 0) {
        a = lane < W / 32 ? warp_acc[lane] : op.init();
        a = warp_merge(op, a);
      }
      __syncthreads();  // warp_acc is reused by the next unit
    }
    if (lane == 0 && u < units) {
      if (splits == 1) y[o] = op.finish(a, g.count);
      else partial[u] = a;
    }
  }
}

// Lanes > 1: blocks of (tx lanes) x (ty slices of the reduction), tx * ty <= kThreads, ty a
// power of two; each block unit is (row, lane block, split).
template <typename Op>
__global__ void __launch_bounds__(kThreads)
    reduce_lanes(const typename Op::In* x, typename Op::Out* y, typename Op::Acc* partial, Geom g,
                 int64_t lane_blocks, int64_t splits, Op op) {
  using Acc = typename Op::Acc;
  __shared__ alignas(16) unsigned char smem[kThreads * sizeof(Acc)];
  Acc* acc = reinterpret_cast<Acc*>(smem);
  const int tx = static_cast<int>(threadIdx.x), ty = static_cast<int>(threadIdx.y);
  const int nx = static_cast<int>(blockDim.x), ny = static_cast<int>(blockDim.y);
  const int64_t rows = g.outputs / g.lanes, units = rows * lane_blocks * splits;
  for (int64_t u = blockIdx.x; u < units; u += gridDim.x) {
    const int64_t s = u % splits, t = u / splits;
    const int64_t row = t / lane_blocks, lane = t % lane_blocks * nx + tx;
    const int64_t o = row * g.lanes + lane;
    const bool active = lane < g.lanes;
    Acc a = op.init();
    int64_t r = g.count * s / splits + ty;
    const int64_t r1 = g.count * (s + 1) / splits;
    if (active && r < r1) {
      const auto* base = x + g.rows.offset(row) + lane;
      for (RedIter it(g, r); r < r1; r += ny, it.advance(g, ny)) op.add(a, base[it.offset(g)], r);
    }
    acc[ty * nx + tx] = a;
    __syncthreads();
    for (int h = ny / 2; h > 0; h /= 2) {
      if (ty < h) op.merge(acc[ty * nx + tx], acc[(ty + h) * nx + tx]);
      __syncthreads();
    }
    if (ty == 0 && active) {
      if (splits == 1) y[o] = op.finish(acc[tx], g.count);
      else partial[o * splits + s] = acc[tx];
    }
    __syncthreads();
  }
}

// Merges each output's partials (a warp per output, in a fixed order).
template <typename Op>
__global__ void reduce_partials(const typename Op::Acc* partial, typename Op::Out* y,
                                int64_t outputs, int64_t splits, int64_t count, Op op) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * blockDim.x / 32;
  for (int64_t o = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32;
       o < outputs; o += warps) {
    typename Op::Acc a = op.init();
    for (int64_t s = lane; s < splits; s += 32) op.merge(a, partial[o * splits + s]);
    a = warp_merge(op, a);
    if (lane == 0) y[o] = op.finish(a, count);
  }
}

// Reducing nothing: every output is the op's identity, finished.
template <typename Op> __global__ void reduce_empty(typename Op::Out* y, int64_t outputs, Op op) {
  for (int64_t o = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; o < outputs;
       o += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[o] = op.finish(op.init(), 0);
}

// Max, min, argmax and argmin have no identity: their inference rejects reducing an empty axis
// into a non-empty output, so only ops with an identity reach reduce_empty.
template <typename Op> constexpr bool kHasIdentity = true;
template <typename T, bool kMax> constexpr bool kHasIdentity<ExtremeOp<T, kMax>> = false;
template <typename T, bool kMax> constexpr bool kHasIdentity<ArgOp<T, kMax>> = false;

template <typename Op>
void run_reduce(KernelContext& ctx, const std::vector<int64_t>& axes, const Op& op) {
  using Acc = typename Op::Acc;
  using In = typename Op::In;
  using Out = typename Op::Out;
  const char* name = ctx.op_name();
  const Geom g = plan_reduce(ctx.in(0).shape, axes, name);
  auto* y = ctx.out(0).ptr<Out>();
  const cudaStream_t stream = stream_of(ctx);
  if (g.outputs == 0) return;
  if (g.count == 0) {
    if constexpr (kHasIdentity<Op>) {
      reduce_empty<<<blocks_for(g.outputs), kThreads, 0, stream>>>(y, g.outputs, op);
      check_launch(name);
      return;
    } else {
      fail<ValueError>("[{}] cannot reduce over an empty axis of shape {}: {} has no identity",
                       name, str(ctx.in(0).shape), name);
    }
  }
  const auto* x = ctx.in(0).ptr<In>();
  const int64_t target_threads = int64_t{split_sms(ctx)} * 2048;  // a full wave
  int64_t splits = 1;
  Acc* partial = nullptr;
  auto cut = [&](int64_t units, int64_t unit_threads, int64_t per_split_min) {
    if (units * unit_threads < target_threads)
      splits = std::clamp<int64_t>(ceil_div(target_threads, units * unit_threads), 1,
                                   std::max<int64_t>(1, g.count / per_split_min));
    if (splits > 1)
      partial = static_cast<Acc*>(ctx.scratch(sizeof(Acc) * g.outputs * splits));
  };
  if (g.lanes == 1) {
    const bool vec = g.red.rank == 0 && g.run_stride == 1 && g.count % Vec16<In>::kSize == 0 &&
                     reinterpret_cast<uintptr_t>(x) % 16 == 0;
    if (g.count <= 8) {
      reduce_rows<Op, 1>
          <<<blocks_for(g.outputs), kThreads, 0, stream>>>(x, y, partial, g, 1, false, op);
    } else if (g.count <= 2048) {
      reduce_rows<Op, 32>
          <<<blocks_for(g.outputs * 32), kThreads, 0, stream>>>(x, y, partial, g, 1, vec, op);
    } else {
      cut(g.outputs, kThreads, kThreads * 16);
      reduce_rows<Op, kThreads><<<blocks_for(g.outputs * splits * kThreads), kThreads, 0, stream>>>(
          x, y, partial, g, splits, vec, op);
    }
  } else {
    int tx = pow2_at_least(g.lanes, 32);
    const int ty = pow2_at_least(g.count, kThreads / tx);
    if (tx * ty < kThreads) tx = pow2_at_least(g.lanes, kThreads / ty);
    if (tx * ty < kThreads) {  // few lanes and a short reduction: a thread per output
      reduce_rows<Op, 1>
          <<<blocks_for(g.outputs), kThreads, 0, stream>>>(x, y, partial, g, 1, false, op);
      check_launch(name);
      return;
    }
    const int64_t lane_blocks = ceil_div(g.lanes, tx), rows = g.outputs / g.lanes;
    cut(rows * lane_blocks, int64_t{tx} * ty, int64_t{ty} * 16);
    const int64_t units = rows * lane_blocks * splits;
    const unsigned grid = static_cast<unsigned>(std::min<int64_t>(units, 65535 * 8));
    reduce_lanes<Op><<<grid, dim3(tx, ty), 0, stream>>>(x, y, partial, g, lane_blocks, splits, op);
  }
  check_launch(name);
  if (splits > 1) {
    reduce_partials<<<blocks_for(g.outputs * 32), kThreads, 0, stream>>>(partial, y, g.outputs,
                                                                         splits, g.count, op);
    check_launch(name);
  }
}

// ---- op entry points ----

// The reduced axes (`spare` holds them where the node has no decoded params).
const std::vector<int64_t>& axes_of(KernelContext& ctx, ReduceParams& spare) {
  return params_of(ctx, spare).axes;
}

template <template <typename> class Op> void reduce_numeric(KernelContext& ctx) {
  ReduceParams spare;
  dispatch(ctx.in(0).dtype, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    if constexpr (std::is_same_v<T, bool>)
      fail<UnsupportedError>("[{}] cuda kernel got dtype bool", ctx.op_name());
    else run_reduce(ctx, axes_of(ctx, spare), Op<T>{});
  });
}
template <template <typename> class Op> void reduce_float(KernelContext& ctx) {
  ReduceParams spare;
  dispatch_float(ctx.in(0).dtype, ctx.op_name(),
                 [&](auto t) { run_reduce(ctx, axes_of(ctx, spare), Op<decltype(t)>{}); });
}
template <bool kMax> void reduce_extreme(KernelContext& ctx) {
  ReduceParams spare;
  dispatch(ctx.in(0).dtype, ctx.op_name(),
           [&](auto t) { run_reduce(ctx, axes_of(ctx, spare), ExtremeOp<decltype(t), kMax>{}); });
}
template <bool kMax> void arg_reduce(KernelContext& ctx) {
  const std::vector<int64_t> axes{params_of<ReduceAxisParams>(ctx).axis};
  dispatch(ctx.in(0).dtype, ctx.op_name(),
           [&](auto t) { run_reduce(ctx, axes, ArgOp<decltype(t), kMax>{}); });
}

void sum(KernelContext& ctx) { reduce_numeric<SumOp>(ctx); }
void prod(KernelContext& ctx) { reduce_numeric<ProdOp>(ctx); }
void mean(KernelContext& ctx) { reduce_float<MeanOp>(ctx); }
void norm_l1(KernelContext& ctx) { reduce_float<NormL1Op>(ctx); }
void norm_l2(KernelContext& ctx) { reduce_float<NormL2Op>(ctx); }
void logsumexp(KernelContext& ctx) { reduce_float<LogsumexpOp>(ctx); }
void max(KernelContext& ctx) { reduce_extreme<true>(ctx); }
void min(KernelContext& ctx) { reduce_extreme<false>(ctx); }
void argmax(KernelContext& ctx) { arg_reduce<true>(ctx); }
void argmin(KernelContext& ctx) { arg_reduce<false>(ctx); }
void variance(KernelContext& ctx) {
  ReduceParams spare;
  const ReduceParams& p = params_of(ctx, spare);
  dispatch_float(ctx.in(0).dtype, ctx.op_name(), [&](auto t) {
    VarianceOp<decltype(t)> op;
    op.correction = p.correction;
    run_reduce(ctx, p.axes, op);
  });
}


// ---- cumsum over an (outer, len, inner) view ----
// Positions along the axis are walked in logical order (from the end when reversed). Long axes
// with few rows are cut into chunks: chunk sums, an exclusive scan of them per row (the
// carries), then each chunk scans from its carry.

template <typename A> struct Plus {
  __device__ void merge(A& a, A b) const { a += b; }
};

__device__ inline int64_t phys(int64_t p, int64_t len, bool reverse) {
  return reverse ? len - 1 - p : p;
}

// Sum of each chunk of contiguous rows (inner == 1): a warp per (row, chunk).
template <typename T, typename Acc>
__global__ void chunk_sums_rows(const T* x, Acc* sums, int64_t outer, int64_t len, int64_t chunks,
                                int64_t chunk, bool reverse) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * blockDim.x / 32;
  const Plus<Acc> op;
  for (int64_t u = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32;
       u < outer * chunks; u += warps) {
    const int64_t row = u / chunks, p1 = std::min(len, (u % chunks + 1) * chunk);
    const T* xr = x + row * len;
    Acc a = 0;
    for (int64_t p = u % chunks * chunk + lane; p < p1; p += 32)
      a += static_cast<Acc>(to_acc(xr[phys(p, len, reverse)]));
    a = warp_merge(op, a);
    if (lane == 0) sums[u] = a;
  }
}

// Sum of each chunk of columns (inner > 1): a thread per (outer, chunk, inner) element.
template <typename T, typename Acc>
__global__ void chunk_sums_cols(const T* x, Acc* sums, int64_t outer, int64_t len, int64_t inner,
                                int64_t chunks, int64_t chunk, bool reverse) {
  const int64_t n = outer * chunks * inner;
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < n;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t j = t % inner, c = t / inner % chunks, o = t / inner / chunks;
    const int64_t p1 = std::min(len, (c + 1) * chunk);
    const T* xo = x + o * len * inner + j;
    Acc a = 0;
    for (int64_t p = c * chunk; p < p1; ++p)
      a += static_cast<Acc>(to_acc(xo[phys(p, len, reverse) * inner]));
    sums[t] = a;
  }
}

// Replaces chunk sums (outer, chunks, inner) by their exclusive scan along chunks.
template <typename Acc>
__global__ void chunk_carries(Acc* sums, int64_t outer, int64_t chunks, int64_t inner) {
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < outer * inner;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    Acc* s = sums + t / inner * chunks * inner + t % inner;
    Acc run = 0;
    for (int64_t c0 = 0; c0 < chunks; c0 += 8) {  // eight loads in flight
      Acc v[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) v[k] = c0 + k < chunks ? s[(c0 + k) * inner] : Acc(0);
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        if (c0 + k >= chunks) break;
        s[(c0 + k) * inner] = run;
        run += v[k];
      }
    }
  }
}

// Scans contiguous rows: a warp per (row, chunk), 128 elements per step, warp scans by shuffles.
template <typename T, typename Acc>
__global__ void scan_rows(const T* x, T* y, const Acc* carries, int64_t outer, int64_t len,
                          int64_t chunks, int64_t chunk, bool exclusive, bool reverse) {
  constexpr int kItems = 4;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * blockDim.x / 32;
  for (int64_t u = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32;
       u < outer * chunks; u += warps) {
    const int64_t row = u / chunks, p0 = u % chunks * chunk, p1 = std::min(len, p0 + chunk);
    const T* xr = x + row * len;
    T* yr = y + row * len;
    Acc carry = carries ? carries[u] : Acc(0);
    for (int64_t t = p0; t < p1; t += 32 * kItems) {
      Acc v[kItems];
#pragma unroll
      for (int k = 0; k < kItems; ++k) {
        const int64_t p = t + k * 32 + lane;
        v[k] = p < p1 ? static_cast<Acc>(to_acc(xr[phys(p, len, reverse)])) : Acc(0);
      }
#pragma unroll
      for (int k = 0; k < kItems; ++k) {
        Acc inc = v[k];
#pragma unroll
        for (int d = 1; d < 32; d *= 2) {
          const Acc n = shfl<Shfl::up>(inc, d);
          if (lane >= d) inc += n;
        }
        Acc exc = shfl<Shfl::up>(inc, 1);
        if (lane == 0) exc = Acc(0);
        const Acc total = shfl<Shfl::idx>(inc, 31);
        const int64_t p = t + k * 32 + lane;
        if (p < p1) yr[phys(p, len, reverse)] = from_acc<T>(carry + (exclusive ? exc : inc));
        carry += total;
      }
    }
  }
}

// Scans columns (inner > 1): a thread per (outer, chunk, inner) element, coalesced over inner.
template <typename T, typename Acc>
__global__ void scan_cols(const T* x, T* y, const Acc* carries, int64_t outer, int64_t len,
                          int64_t inner, int64_t chunks, int64_t chunk, bool exclusive,
                          bool reverse) {
  const int64_t n = outer * chunks * inner;
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < n;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t j = t % inner, c = t / inner % chunks, o = t / inner / chunks;
    const int64_t p1 = std::min(len, (c + 1) * chunk);
    const int64_t base = o * len * inner + j;
    Acc acc = carries ? carries[t] : Acc(0);
    for (int64_t p = c * chunk; p < p1; ++p) {
      const int64_t i = base + phys(p, len, reverse) * inner;
      const Acc before = acc;
      acc += static_cast<Acc>(to_acc(x[i]));
      y[i] = from_acc<T>(exclusive ? before : acc);
    }
  }
}

template <typename T>
void run_cumsum(KernelContext& ctx, const AxisSplit& v, bool exclusive, bool reverse) {
  using Acc = wide_t<T>;
  const char* name = ctx.op_name();
  const cudaStream_t stream = stream_of(ctx);
  const T* x = ctx.in(0).ptr<T>();
  T* y = ctx.out(0).ptr<T>();
  const int64_t sms = split_sms(ctx);
  // chunks per row: enough units for a full wave, chunks long enough to pay for the extra passes
  int64_t chunks = 1;
  if (v.inner == 1 && v.outer < sms * 64)
    chunks = std::clamp<int64_t>(ceil_div(sms * 64, v.outer), 1,
                                 std::min<int64_t>(1024, ceil_div(v.len, 1024)));
  if (v.inner > 1 && v.outer * v.inner < sms * 2048)
    chunks = std::clamp<int64_t>(ceil_div(sms * 2048, v.outer * v.inner), 1,
                                 std::min<int64_t>(1024, ceil_div(v.len, 64)));
  const int64_t chunk = ceil_div(v.len, chunks);
  chunks = ceil_div(v.len, chunk);
  const int64_t units = v.outer * chunks * v.inner;
  Acc* carries = nullptr;
  if (chunks > 1) {
    carries = static_cast<Acc*>(ctx.scratch(sizeof(Acc) * units));
    if (v.inner == 1)
      chunk_sums_rows<<<blocks_for(units * 32), kThreads, 0, stream>>>(x, carries, v.outer, v.len,
                                                                       chunks, chunk, reverse);
    else
      chunk_sums_cols<<<blocks_for(units), kThreads, 0, stream>>>(x, carries, v.outer, v.len,
                                                                  v.inner, chunks, chunk, reverse);
    check_launch(name);
    chunk_carries<<<blocks_for(v.outer * v.inner), kThreads, 0, stream>>>(carries, v.outer, chunks,
                                                                          v.inner);
    check_launch(name);
  }
  if (v.inner == 1)
    scan_rows<<<blocks_for(units * 32), kThreads, 0, stream>>>(x, y, carries, v.outer, v.len,
                                                               chunks, chunk, exclusive, reverse);
  else
    scan_cols<<<blocks_for(units), kThreads, 0, stream>>>(x, y, carries, v.outer, v.len, v.inner,
                                                          chunks, chunk, exclusive, reverse);
  check_launch(name);
}

void cumsum(KernelContext& ctx) {
  if (ctx.out(0).numel() == 0) return;
  const ReduceAxisParams a = params_of<ReduceAxisParams>(ctx);
  const AxisSplit v = split_at(ctx.in(0).shape, a.axis);
  const bool exclusive = a.exclusive, reverse = a.reverse;
  dispatch(ctx.in(0).dtype, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    if constexpr (std::is_same_v<T, bool>)
      fail<UnsupportedError>("[{}] cuda kernel got dtype bool", ctx.op_name());
    else
      run_cumsum<T>(ctx, v, exclusive, reverse);
  });
}

}  // namespace

void register_reduce_kernels() {
  const DTypeSet numeric = kNumericTypes;
  register_kernel(OpId::Sum, Backend::cuda, {sum, numeric, 0, false});
  register_kernel(OpId::Prod, Backend::cuda, {prod, numeric, 0, false});
  register_kernel(OpId::Mean, Backend::cuda, {mean, kFloatTypes, 0, false});
  register_kernel(OpId::NormL1, Backend::cuda, {norm_l1, kFloatTypes, 0, false});
  register_kernel(OpId::NormL2, Backend::cuda, {norm_l2, kFloatTypes, 0, false});
  register_kernel(OpId::Logsumexp, Backend::cuda, {logsumexp, kFloatTypes, 0, false});
  register_kernel(OpId::Variance, Backend::cuda, {variance, kFloatTypes, 0, false});
  register_kernel(OpId::Max, Backend::cuda, {max, kAllTypes, 0, false});
  register_kernel(OpId::Min, Backend::cuda, {min, kAllTypes, 0, false});
  register_kernel(OpId::Argmax, Backend::cuda, {argmax, kAllTypes, 0, false});
  register_kernel(OpId::Argmin, Backend::cuda, {argmin, kAllTypes, 0, false});
  register_kernel(OpId::Cumsum, Backend::cuda, {cumsum, numeric, 0, false});
}

}  // namespace kiln::cuda
