// CUDA kernels of the norm family. A row's statistics take one pass (online max/sum for softmax,
// sums or Welford for the norms) reduced across a warp (short rows) or a block (long rows), then
// a second pass writes the row; arithmetic in float for half types, double for f64. Layer, RMS,
// instance and group norm statistics of float and half types sum in double (as the CPU kernels
// do), so rows of large values (|x| near 1e20 and beyond, whose squares pass float's range)
// normalize as on the CPU.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <type_traits>

#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/kernels.h"
#include "backends/cuda/norm_nhwc.h"
#include "ops/norm_params.h"

namespace kiln::cuda {

namespace {

constexpr int kRowBlock = 512;      // threads of a block that owns one long row
constexpr int64_t kWarpRow = 1024;  // rows up to this length go to one warp each

template <typename A> __device__ A neg_inf() { return -std::numeric_limits<A>::infinity(); }

// V elements loaded or stored as one access (16 bytes when V = 16 / sizeof(T)).
template <typename T, int V> struct alignas(sizeof(T) * V) Vec { T v[V]; };
// Whether 16-byte accesses fit: every pointer 16-byte aligned and `len` (0: any) a multiple of
// the elements per access.
template <typename T> bool vectorizable(int64_t len, std::initializer_list<const void*> ptrs) {
  constexpr int64_t v = 16 / sizeof(T);
  if (len % v != 0) return false;
  for (const void* p : ptrs)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  return true;
}
// Calls f(std::integral_constant<int, V>) with V = 16 / sizeof(T) when `vec`, else V = 1.
template <typename T, typename F> void with_width(bool vec, F&& f) {
  if (vec) f(std::integral_constant<int, static_cast<int>(16 / sizeof(T))>{});
  else f(std::integral_constant<int, 1>{});
}

__device__ inline float shfl_xor(float v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }
__device__ inline double shfl_xor(double v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }
__device__ inline int64_t shfl_xor(int64_t v, int m) {
  return __shfl_xor_sync(0xffffffffu, static_cast<long long>(v), m);
}
__device__ inline float shfl0(float v) { return __shfl_sync(0xffffffffu, v, 0); }
__device__ inline double shfl0(double v) { return __shfl_sync(0xffffffffu, v, 0); }
__device__ inline int64_t shfl0(int64_t v) {
  return __shfl_sync(0xffffffffu, static_cast<long long>(v), 0);
}

// Running softmax statistics: max m and sum of exp(x - m).
template <typename A> struct MaxSum {
  A m, s;
  __device__ static MaxSum empty() { return {neg_inf<A>(), A(0)}; }
  // fmax ignores NaN (as std::max on the host does); a NaN still makes s NaN through exp
  __device__ void add(A x) {
    const A mn = fmax(m, x);
    s = (m == mn ? s : s * exp(m - mn)) + (x == neg_inf<A>() ? A(0) : exp(x - mn));
    m = mn;
  }
  __device__ static MaxSum combine(const MaxSum& a, const MaxSum& b) {
    const A mn = fmax(a.m, b.m);
    return {mn, (a.m == mn ? a.s : a.s * exp(a.m - mn)) + (b.m == mn ? b.s : b.s * exp(b.m - mn))};
  }
  __device__ MaxSum shfl(int mask) const { return {shfl_xor(m, mask), shfl_xor(s, mask)}; }
  __device__ MaxSum bcast() const { return {shfl0(m), shfl0(s)}; }
};

// Welford statistics: count, mean and sum of squared deviations (or of squares for RMS).
template <typename A> struct Moments {
  int64_t n;
  A mean, m2;
  __device__ static Moments empty() { return {0, A(0), A(0)}; }
  __device__ void add(A x) {
    ++n;
    const A d = x - mean;
    mean += d / static_cast<A>(n);
    m2 += d * (x - mean);
  }
  __device__ static Moments combine(const Moments& a, const Moments& b) {
    if (a.n == 0) return b;
    if (b.n == 0) return a;
    const int64_t n = a.n + b.n;
    const A d = b.mean - a.mean, fb = static_cast<A>(b.n) / static_cast<A>(n);
    return {n, a.mean + d * fb, a.m2 + b.m2 + d * d * static_cast<A>(a.n) * fb};
  }
  __device__ Moments shfl(int mask) const {
    return {shfl_xor(n, mask), shfl_xor(mean, mask), shfl_xor(m2, mask)};
  }
  __device__ Moments bcast() const { return {shfl0(n), shfl0(mean), shfl0(m2)}; }
};
// Sums of x and x^2 in double, for the norms of float and half types: no division per element, and
// no overflow for any float's square.
struct Sums {
  double s1, s2;
  __device__ static Sums empty() { return {0, 0}; }
  __device__ void add(float x) {
    const double d = x;
    s1 += d;
    s2 += d * d;
  }
  __device__ static Sums combine(const Sums& a, const Sums& b) {
    return {a.s1 + b.s1, a.s2 + b.s2};
  }
  __device__ Sums shfl(int mask) const { return {shfl_xor(s1, mask), shfl_xor(s2, mask)}; }
  __device__ Sums bcast() const { return {shfl0(s1), shfl0(s2)}; }
};
// Sum of squares, for RMS norm.
template <typename A> struct SquareSum {
  A s;
  __device__ static SquareSum empty() { return {A(0)}; }
  __device__ void add(A x) { s += x * x; }
  __device__ static SquareSum combine(const SquareSum& a, const SquareSum& b) {
    return {a.s + b.s};
  }
  __device__ SquareSum shfl(int mask) const { return {shfl_xor(s, mask)}; }
  __device__ SquareSum bcast() const { return {shfl0(s)}; }
};

// Reduces v over a group of G threads (a warp, or the whole block when G > 32); every thread of
// the group gets the same result. `smem` holds a slot per warp.
template <int G, typename S> __device__ S group_reduce(S v, S* smem) {
  for (int o = 16; o > 0; o >>= 1) v = S::combine(v, v.shfl(o));
  v = v.bcast();  // lanes may differ in the last bits; take lane 0's
  if constexpr (G > 32) {
    const int warp = threadIdx.x >> 5;
    __syncthreads();  // earlier readers of smem are done
    if ((threadIdx.x & 31) == 0) smem[warp] = v;
    __syncthreads();
    v = smem[0];
    for (int w = 1; w < G / 32; ++w) v = S::combine(v, smem[w]);
  }
  return v;
}

// Row geometry for G threads per row: the group's row slot, lane and the grid's row stride.
template <int G> struct RowGroup {
  int64_t first, step;
  int lane;
  __device__ RowGroup() {
    const int per_block = G >= 32 && G < kRowBlock ? blockDim.x / G : 1;
    first = static_cast<int64_t>(blockIdx.x) * per_block + threadIdx.x / G;
    step = static_cast<int64_t>(gridDim.x) * per_block;
    lane = threadIdx.x % G;
  }
};

// ---- softmax / log_softmax ----

// Rows of len = V * (len / V) elements, read and written V at a time.
template <typename T, bool kLog, int G, int V>
__global__ void softmax_rows(const T* x, T* y, int64_t rows, int64_t len) {
  using A = acc_t<T>;
  using W = Vec<T, V>;
  __shared__ MaxSum<A> smem[32];
  const RowGroup<G> g;
  const int64_t nv = len / V;
  for (int64_t r = g.first; r < rows; r += g.step) {
    const W* px = reinterpret_cast<const W*>(x + r * len);
    W* py = reinterpret_cast<W*>(y + r * len);
    MaxSum<A> st = MaxSum<A>::empty();
    for (int64_t j = g.lane; j < nv; j += G) {
      const W in = px[j];
#pragma unroll
      for (int u = 0; u < V; ++u) st.add(to_acc(in.v[u]));
    }
    st = group_reduce<G>(st, smem);
    const A f = kLog ? st.m + log(st.s) : A(1) / st.s;
    for (int64_t j = g.lane; j < nv; j += G) {
      const W in = px[j];
      W out;
#pragma unroll
      for (int u = 0; u < V; ++u) {
        const A v = to_acc(in.v[u]);
        out.v[u] = from_acc<T>(kLog ? v - f : exp(v - st.m) * f);
      }
      py[j] = out;
    }
  }
}

// Softmax along a non-last axis: one thread per (outer, inner) column, stride `inner`.
template <typename T, bool kLog>
__global__ void softmax_columns(const T* x, T* y, int64_t outer, int64_t len, int64_t inner) {
  using A = acc_t<T>;
  const int64_t cols = outer * inner;
  for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < cols;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t base = (c / inner) * len * inner + c % inner;
    MaxSum<A> st = MaxSum<A>::empty();
    for (int64_t k = 0; k < len; ++k) st.add(to_acc(x[base + k * inner]));
    const A f = kLog ? st.m + log(st.s) : A(1) / st.s;
    for (int64_t k = 0; k < len; ++k) {
      const A v = to_acc(x[base + k * inner]);
      y[base + k * inner] = from_acc<T>(kLog ? v - f : exp(v - st.m) * f);
    }
  }
}

// Launches a row kernel with a warp per row for short rows, a block per row for long ones.
template <template <int> class Launch, typename... Args>
void launch_rows(cudaStream_t stream, int64_t rows, int64_t len, Args... args) {
  if (len <= kWarpRow) {
    const int per_block = kThreads / 32;
    const unsigned grid = blocks_for(rows, per_block);
    Launch<32>::run(grid, kThreads, stream, args...);
  } else {
    const unsigned grid = static_cast<unsigned>(rows < 65535 * 8 ? rows : 65535 * 8);
    Launch<kRowBlock>::run(grid, kRowBlock, stream, args...);
  }
}

template <typename T, bool kLog, int V> struct SoftmaxLaunch {
  template <int G> struct At {
    static void run(unsigned grid, int threads, cudaStream_t s, const T* x, T* y, int64_t rows,
                    int64_t len) {
      softmax_rows<T, kLog, G, V><<<grid, threads, 0, s>>>(x, y, rows, len);
    }
  };
};

template <bool kLog> void softmax_impl(KernelContext& ctx) {
  const TensorView &x = ctx.in(0), &y = ctx.out(0);
  if (x.numel() == 0) return;
  const AxisSplit s = split_at(x.shape, params_of<SoftmaxParams>(ctx).axis);
  cudaStream_t stream = stream_of(ctx);
  dispatch_float(x.dtype, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    if (s.inner == 1) {
      with_width<T>(vectorizable<T>(s.len, {x.data, y.data}), [&](auto v) {
        launch_rows<SoftmaxLaunch<T, kLog, decltype(v)::value>::template At>(
            stream, s.outer, s.len, x.ptr<T>(), y.ptr<T>(), s.outer, s.len);
      });
    } else {
      softmax_columns<T, kLog><<<blocks_for(s.outer * s.inner), kThreads, 0, stream>>>(
          x.ptr<T>(), y.ptr<T>(), s.outer, s.len, s.inner);
    }
  });
  check_launch(ctx.op_name());
}

void softmax(KernelContext& ctx) { softmax_impl<false>(ctx); }
void log_softmax(KernelContext& ctx) { softmax_impl<true>(ctx); }

// ---- layer / RMS / instance / group norm ----

// Optional weight and bias pointers after input `first`, as has_weight / has_bias record.
template <typename T> struct Affine {
  const T* w = nullptr;
  const T* b = nullptr;
};
template <typename T>
Affine<T> affine_of(const KernelContext& ctx, const NormParams& p, int first) {
  Affine<T> a;
  int i = first;
  if (p.has_weight) a.w = ctx.in(i++).template ptr<T>();
  if (p.has_bias) a.b = ctx.in(i).template ptr<T>();
  return a;
}

// A row's statistics of elements of type T: the sum of squares for RMS norm, else sums (Welford
// moments for f64), in double.
template <typename T, bool kRms> using NormStats =
    std::conditional_t<kRms, SquareSum<double>,
                       std::conditional_t<std::is_same_v<T, double>, Moments<double>, Sums>>;
// The mean of a row of n, and its sum of squared deviations.
__device__ inline double mean_of(const Moments<double>& st, int64_t) { return st.mean; }
__device__ inline double m2_of(const Moments<double>& st, int64_t) { return st.m2; }
__device__ inline double mean_of(const Sums& st, int64_t n) {
  return st.s1 / static_cast<double>(n);
}
__device__ inline double m2_of(const Sums& st, int64_t n) {
  return fmax(st.s2 - st.s1 * (st.s1 / static_cast<double>(n)), 0.0);
}

// Adds the V-wide elements [j0, j1) (step `step`) of a row, less `shift`, to st.
template <typename T, int V, typename S, typename A>
__device__ void add_span(S& st, const Vec<T, V>* px, int64_t j0, int64_t j1, int64_t step,
                         A shift) {
  for (int64_t j = j0; j < j1; j += step) {
    const Vec<T, V> in = px[j];
#pragma unroll
    for (int u = 0; u < V; ++u) st.add(to_acc(in.v[u]) - shift);
  }
}

// Normalizes rows of `len` elements: y = (x - mean) * rstd * w + b. Weight and bias are indexed by
// position in the row (layer/RMS norm, `spatial` = 1, groups = 1) or by channel
// (r % groups) * (len / spatial) + i / spatial (instance and group norm).
template <typename T> struct NormRow {
  const T* x;
  T* y;
  int64_t len, spatial, groups;
  Affine<T> aff;
  double eps;

  // The statistics are of x - shift, with the row's first element as the shift: a row whose
  // mean is large next to its spread keeps the spread's precision in float (shifted data).
  template <bool kRms> __device__ acc_t<T> shift(int64_t r) const {
    if constexpr (kRms) return acc_t<T>(0);
    else return len > 0 ? to_acc(x[r * len]) : acc_t<T>(0);
  }

  // Writes the V-wide elements [j0, j1) (step `step`) of row r from the row's statistics.
  template <int V, bool kRms> __device__ void write(int64_t r, const NormStats<T, kRms>& st,
                                                    int64_t j0, int64_t j1, int64_t step) const {
    using A = acc_t<T>;
    double mean_d = 0, var;
    if constexpr (kRms) {
      var = st.s / static_cast<double>(len);
    } else {
      mean_d = mean_of(st, len);
      var = m2_of(st, len) / static_cast<double>(len);
    }
    const A mean = static_cast<A>(mean_d);
    const A rstd = static_cast<A>(1.0 / sqrt(var + eps));
    const A k = shift<kRms>(r);
    const int64_t ch0 = (r % groups) * (len / spatial);
    const auto* px = reinterpret_cast<const Vec<T, V>*>(x + r * len);
    auto* py = reinterpret_cast<Vec<T, V>*>(y + r * len);
    for (int64_t j = j0; j < j1; j += step) {
      const Vec<T, V> in = px[j];
      Vec<T, V> out;
#pragma unroll
      for (int u = 0; u < V; ++u) {
        const int64_t i = j * V + u;
        A v = ((to_acc(in.v[u]) - k) - mean) * rstd;
        if (aff.w || aff.b) {
          const int64_t c = ch0 + (spatial == 1 ? i : i / spatial);
          if (aff.w) v *= to_acc(aff.w[c]);
          if (aff.b) v += to_acc(aff.b[c]);
        }
        out.v[u] = from_acc<T>(v);
      }
      py[j] = out;
    }
  }
};

// G threads per row; elements are read and written V at a time (V divides len).
template <typename T, bool kRms, int G, int V>
__global__ void norm_rows(NormRow<T> nr, int64_t rows) {
  using Stats = NormStats<T, kRms>;
  __shared__ Stats smem[32];
  const RowGroup<G> g;
  const int64_t nv = nr.len / V;
  for (int64_t r = g.first; r < rows; r += g.step) {
    Stats st = Stats::empty();
    add_span<T, V>(st, reinterpret_cast<const Vec<T, V>*>(nr.x + r * nr.len), g.lane, nv, G,
                   nr.template shift<kRms>(r));
    st = group_reduce<G>(st, smem);
    nr.template write<V, kRms>(r, st, g.lane, nv, G);
  }
}

// Few long rows: each row splits into chunks of kChunk elements, a block per (chunk, row).
// norm_chunk_stats writes each chunk's statistics; norm_chunk_apply combines a row's chunks in
// order (the same result in every block) and writes its own chunk.
constexpr int64_t kChunk = 16384;

template <typename T, bool kRms, int V>
__global__ void norm_chunk_stats(NormRow<T> nr, NormStats<T, kRms>* part) {
  using Stats = NormStats<T, kRms>;
  __shared__ Stats smem[32];
  const int64_t r = blockIdx.y, j0 = blockIdx.x * (kChunk / V);
  const int64_t j1 = min(nr.len / V, j0 + kChunk / V);
  Stats st = Stats::empty();
  add_span<T, V>(st, reinterpret_cast<const Vec<T, V>*>(nr.x + r * nr.len), j0 + threadIdx.x, j1,
                 blockDim.x, nr.template shift<kRms>(r));
  st = group_reduce<kRowBlock>(st, smem);
  if (threadIdx.x == 0) part[r * gridDim.x + blockIdx.x] = st;
}

template <typename T, bool kRms, int V>
__global__ void norm_chunk_apply(NormRow<T> nr, const NormStats<T, kRms>* part) {
  using Stats = NormStats<T, kRms>;
  const int64_t r = blockIdx.y, j0 = blockIdx.x * (kChunk / V);
  const int64_t j1 = min(nr.len / V, j0 + kChunk / V);
  Stats st = part[r * gridDim.x];
  for (unsigned c = 1; c < gridDim.x; ++c) st = Stats::combine(st, part[r * gridDim.x + c]);
  nr.template write<V, kRms>(r, st, j0 + threadIdx.x, j1, blockDim.x);
}

template <typename T, bool kRms, int V> struct NormLaunch {
  template <int G> struct At {
    static void run(unsigned grid, int threads, cudaStream_t s, NormRow<T> nr, int64_t rows) {
      norm_rows<T, kRms, G, V><<<grid, threads, 0, s>>>(nr, rows);
    }
  };
};

// Rows of `len` elements; see NormRow for spatial and groups.
template <bool kRms> void norm_impl(KernelContext& ctx, const NormParams& p, int64_t len,
                                    int64_t spatial, int64_t groups) {
  const TensorView &x = ctx.in(0), &y = ctx.out(0);
  if (x.numel() == 0) return;
  const double eps = p.eps;
  const int64_t rows = x.numel() / len, chunks = (len + kChunk - 1) / kChunk;
  cudaStream_t stream = stream_of(ctx);
  dispatch_float(x.dtype, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    const NormRow<T> nr{x.ptr<T>(), y.ptr<T>(), len, spatial, groups, affine_of<T>(ctx, p, 1), eps};
    with_width<T>(vectorizable<T>(len, {x.data, y.data}), [&](auto v) {
      constexpr int V = decltype(v)::value;
      if (chunks >= 4 && rows < 256) {  // too few rows to fill the GPU a block per row
        using Stats = NormStats<T, kRms>;
        auto* part = static_cast<Stats*>(ctx.scratch(rows * chunks * sizeof(Stats)));
        const dim3 grid(static_cast<unsigned>(chunks), static_cast<unsigned>(rows));
        norm_chunk_stats<T, kRms, V><<<grid, kRowBlock, 0, stream>>>(nr, part);
        check_launch(ctx.op_name());
        norm_chunk_apply<T, kRms, V><<<grid, kRowBlock, 0, stream>>>(nr, part);
      } else {
        launch_rows<NormLaunch<T, kRms, V>::template At>(stream, rows, len, nr, rows);
      }
    });
  });
  check_launch(ctx.op_name());
}

int64_t trailing(const Shape& s, int64_t begin) {
  int64_t n = 1;
  for (size_t d = static_cast<size_t>(begin); d < s.size(); ++d) n *= s[d];
  return n;
}

void layer_norm(KernelContext& ctx) {
  const NormParams p = params_of<NormParams>(ctx);
  norm_impl<false>(ctx, p, trailing(ctx.in(0).shape, p.begin_axis), 1, 1);
}
void rms_norm(KernelContext& ctx) {
  const NormParams p = params_of<NormParams>(ctx);
  norm_impl<true>(ctx, p, trailing(ctx.in(0).shape, p.begin_axis), 1, 1);
}
// A row is one (n, group) block of C / groups channels of `spatial` elements each.
void channel_group_norm(KernelContext& ctx, const NormParams& p, int64_t groups) {
  const Shape& s = ctx.in(0).shape;
  const int64_t spatial = trailing(s, 2);
  norm_impl<false>(ctx, p, s[1] / groups * spatial, spatial, groups);
}
void instance_norm(KernelContext& ctx) {
  channel_group_norm(ctx, params_of<NormParams>(ctx), ctx.in(0).shape[1]);
}
void group_norm(KernelContext& ctx) {
  const NormParams p = params_of<NormParams>(ctx);
  channel_group_norm(ctx, p, p.groups);
}

// ---- elementwise: batch norm and dropout ----

// y[i] = f(x[i], i) over n elements, V at a time (16-byte accesses), the last n % V one by one.
template <typename T, int V, typename F>
__global__ void map_kernel(const T* x, T* y, int64_t n, F f) {
  using W = Vec<T, V>;
  const int64_t nv = n / V, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  for (int64_t j = t; j < nv; j += stride) {
    const W in = reinterpret_cast<const W*>(x)[j];
    W out;
#pragma unroll
    for (int u = 0; u < V; ++u) out.v[u] = from_acc<T>(f(to_acc(in.v[u]), j * V + u));
    reinterpret_cast<W*>(y)[j] = out;
  }
  for (int64_t i = nv * V + t; i < n; i += stride) y[i] = from_acc<T>(f(to_acc(x[i]), i));
}

template <typename T, typename F>
void launch_map(const KernelContext& ctx, const T* x, T* y, int64_t n, F f) {
  with_width<T>(vectorizable<T>(0, {x, y}), [&](auto v) {
    constexpr int V = decltype(v)::value;
    map_kernel<T, V><<<blocks_for((n + V - 1) / V), kThreads, 0, stream_of(ctx)>>>(x, y, n, f);
  });
  check_launch(ctx.op_name());
}

// Per channel: scale = w / sqrt(var + eps), shift = b - mean * scale.
template <typename T> __global__ void batch_norm_params(const T* mean, const T* var, Affine<T> aff,
                                                        int64_t c, double eps, acc_t<T>* scale,
                                                        acc_t<T>* shift) {
  using A = acc_t<T>;
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < c;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const A w = aff.w ? to_acc(aff.w[k]) : A(1), b = aff.b ? to_acc(aff.b[k]) : A(0);
    const A a = w / sqrt(to_acc(var[k]) + static_cast<A>(eps));
    scale[k] = a;
    shift[k] = b - to_acc(mean[k]) * a;
  }
}

template <typename A> struct BatchNormApply {
  const A* scale;
  const A* shift;
  int64_t spatial, c;
  __device__ A operator()(A v, int64_t i) const {
    const int64_t k = (i / spatial) % c;
    return v * scale[k] + shift[k];
  }
};

void batch_norm(KernelContext& ctx) {
  const TensorView &x = ctx.in(0), &y = ctx.out(0);
  const int64_t c = x.shape[1], spatial = trailing(x.shape, 2), n = x.numel();
  if (n == 0) return;
  const NormParams p = params_of<NormParams>(ctx);
  const double eps = p.eps;
  dispatch_float(x.dtype, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    using A = acc_t<T>;
    A* scale = static_cast<A*>(ctx.scratch(2 * static_cast<size_t>(c) * sizeof(A)));
    A* shift = scale + c;
    batch_norm_params<T><<<blocks_for(c), kThreads, 0, stream_of(ctx)>>>(
        ctx.in(1).ptr<T>(), ctx.in(2).ptr<T>(), affine_of<T>(ctx, p, 3), c, eps, scale, shift);
    check_launch(ctx.op_name());
    launch_map(ctx, x.ptr<T>(), y.ptr<T>(), n, BatchNormApply<A>{scale, shift, spatial, c});
  });
}

// ---- training batch norm ----

// x as (N, C, S): channel c's M = N * S values are N runs of S elements, run n at
// (n * C + c) * S. A block owns channel blockIdx.x and the span [j0, j1) of its values
// (j = n * S + s); there are gridDim.y spans per channel. The first kernel of each direction
// writes one partial reduction per (channel, span); the second combines a channel's partials in
// span order (the same result in every block, no atomics) and writes its span.
struct ChannelSpan {
  int64_t c, s, m, span;
  __device__ int64_t j0() const { return blockIdx.y * span; }
  __device__ int64_t j1() const { return min(m, j0() + span); }
  // Calls f(offset) for this thread's values of the span, stride blockDim.x, without a division
  // per value.
  template <typename F> __device__ void each(F&& f) const {
    const int64_t ch = blockIdx.x, end = j1(), step_n = blockDim.x / s, step_s = blockDim.x % s;
    int64_t j = j0() + threadIdx.x;
    if (j >= end) return;
    int64_t n = j / s, k = j - n * s;
    for (; j < end; j += blockDim.x) {
      f((n * c + ch) * s + k);
      n += step_n;
      k += step_s;
      if (k >= s) {
        k -= s;
        ++n;
      }
    }
  }
};

// Sums of dy and dy * (x - mean), for the backward.
template <typename A> struct Sum2 {
  A a, b;
  __device__ static Sum2 empty() { return {A(0), A(0)}; }
  __device__ static Sum2 combine(const Sum2& x, const Sum2& y) { return {x.a + y.a, x.b + y.b}; }
  __device__ Sum2 shfl(int mask) const { return {shfl_xor(a, mask), shfl_xor(b, mask)}; }
  __device__ Sum2 bcast() const { return {shfl0(a), shfl0(b)}; }
};

// A channel's partials combined by the first warp in a fixed order (lane l takes spans l, l + 32,
// ..., then a shuffle tree), so every block of the channel gets the same result.
template <typename S> __device__ S combine_spans(const S* part) {
  __shared__ S total;
  if (threadIdx.x < 32) {
    const S* p = part + static_cast<int64_t>(blockIdx.x) * gridDim.y;
    S st = S::empty();
    for (unsigned i = threadIdx.x; i < gridDim.y; i += 32) st = S::combine(st, p[i]);
    for (int o = 16; o > 0; o >>= 1) st = S::combine(st, st.shfl(o));
    if (threadIdx.x == 0) total = st;
  }
  __syncthreads();
  return total;
}

template <typename T> struct BnTrainArgs {
  ChannelSpan cs;
  const T* x;
  const T* w;  // nullptr: no weight
  const T* b;  // nullptr: no bias
  T* y;
  T* mean;
  T* var;
  double eps;
};

template <typename T> __global__ void bn_train_stats(BnTrainArgs<T> a, Moments<acc_t<T>>* part) {
  using A = acc_t<T>;
  __shared__ Moments<A> smem[32];
  Moments<A> st = Moments<A>::empty();
  a.cs.each([&](int64_t i) { st.add(to_acc(a.x[i])); });
  st = group_reduce<kThreads>(st, smem);
  if (threadIdx.x == 0) part[static_cast<int64_t>(blockIdx.x) * gridDim.y + blockIdx.y] = st;
}

template <typename T>
__global__ void bn_train_apply(BnTrainArgs<T> a, const Moments<acc_t<T>>* part) {
  using A = acc_t<T>;
  const int64_t ch = blockIdx.x;
  const Moments<A> st = combine_spans(part);
  const A mean = st.mean, var = st.m2 / static_cast<A>(a.cs.m);
  const A scale = (a.w ? to_acc(a.w[ch]) : A(1)) / sqrt(var + static_cast<A>(a.eps));
  const A shift = a.b ? to_acc(a.b[ch]) : A(0);
  if (blockIdx.y == 0 && threadIdx.x == 0) {
    a.mean[ch] = from_acc<T>(mean);
    a.var[ch] = from_acc<T>(var);
  }
  a.cs.each([&](int64_t i) { a.y[i] = from_acc<T>((to_acc(a.x[i]) - mean) * scale + shift); });
}

template <typename T> struct BnGradArgs {
  ChannelSpan cs;
  const T* dy;
  const T* x;
  const T* mean;
  const T* var;
  const T* w;  // nullptr: no weight
  T* dx;
  T* dweight;
  T* dbias;
  double eps;
};

template <typename T> __global__ void bn_train_grad_sums(BnGradArgs<T> a, Sum2<acc_t<T>>* part) {
  using A = acc_t<T>;
  __shared__ Sum2<A> smem[32];
  const A mean = to_acc(a.mean[blockIdx.x]);
  Sum2<A> st = Sum2<A>::empty();
  a.cs.each([&](int64_t i) {
    const A g = to_acc(a.dy[i]);
    st.a += g;
    st.b += g * (to_acc(a.x[i]) - mean);
  });
  st = group_reduce<kThreads>(st, smem);
  if (threadIdx.x == 0) part[static_cast<int64_t>(blockIdx.x) * gridDim.y + blockIdx.y] = st;
}

// dbias = sum(dy), dweight = sum(dy * xhat), dx = w * rstd * (dy - dbias / M - xhat * dweight / M).
template <typename T>
__global__ void bn_train_grad_apply(BnGradArgs<T> a, const Sum2<acc_t<T>>* part) {
  using A = acc_t<T>;
  const int64_t ch = blockIdx.x;
  const Sum2<A> st = combine_spans(part);
  const A mean = to_acc(a.mean[ch]);
  const A rstd = A(1) / sqrt(to_acc(a.var[ch]) + static_cast<A>(a.eps));
  const A dweight = st.b * rstd, m = static_cast<A>(a.cs.m);
  const A k = (a.w ? to_acc(a.w[ch]) : A(1)) * rstd, da = st.a / m, db = dweight / m * rstd;
  if (blockIdx.y == 0 && threadIdx.x == 0) {
    a.dweight[ch] = from_acc<T>(dweight);
    a.dbias[ch] = from_acc<T>(st.a);
  }
  a.cs.each([&](int64_t i) {
    a.dx[i] = from_acc<T>(k * (to_acc(a.dy[i]) - da - (to_acc(a.x[i]) - mean) * db));
  });
}

// Spans per channel: one when the channels alone give enough blocks, else up to enough to fill
// the GPU, each of at least kMinSpan values.
constexpr int64_t kMinSpan = 4 * kThreads;
constexpr int64_t kTargetBlocks = 1024;

ChannelSpan channel_span(const Shape& x, int64_t& spans) {
  const int64_t c = x[1], s = trailing(x, 2), m = x[0] * s;
  spans = 1;
  if (c < kTargetBlocks) {
    const int64_t by_size = (m + kMinSpan - 1) / kMinSpan;
    spans = std::max<int64_t>(1, std::min<int64_t>(by_size, (kTargetBlocks + c - 1) / c));
  }
  const int64_t span = (m + spans - 1) / spans;
  spans = (m + span - 1) / span;  // every span non-empty
  return {c, s, m, span};
}

void check_channels(const char* op, const Shape& x) {
  if (x[1] > std::numeric_limits<int32_t>::max())
    fail<UnsupportedError>("[{}] {} channels are more than a cuda grid holds (x is {})", op, x[1],
                           str(x));
}

void batch_norm_train(KernelContext& ctx) {
  const TensorView& x = ctx.in(0);
  if (x.numel() == 0) return;
  const NormParams p = params_of<NormParams>(ctx);
  check_channels(ctx.op_name(), x.shape);
  int64_t spans = 1;
  const ChannelSpan cs = channel_span(x.shape, spans);
  const dim3 grid(static_cast<unsigned>(cs.c), static_cast<unsigned>(spans));
  cudaStream_t stream = stream_of(ctx);
  dispatch_float(x.dtype, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    using Stats = Moments<acc_t<T>>;
    const Affine<T> aff = affine_of<T>(ctx, p, 1);
    const BnTrainArgs<T> a{cs,
                           x.ptr<T>(),
                           aff.w,
                           aff.b,
                           ctx.out(0).ptr<T>(),
                           ctx.out(1).ptr<T>(),
                           ctx.out(2).ptr<T>(),
                           p.eps};
    auto* part = static_cast<Stats*>(ctx.scratch(cs.c * spans * sizeof(Stats)));
    bn_train_stats<T><<<grid, kThreads, 0, stream>>>(a, part);
    check_launch(ctx.op_name());
    bn_train_apply<T><<<grid, kThreads, 0, stream>>>(a, part);
  });
  check_launch(ctx.op_name());
}

void batch_norm_train_grad(KernelContext& ctx) {
  const TensorView& x = ctx.in(1);
  if (x.numel() == 0) return;
  check_channels(ctx.op_name(), x.shape);
  int64_t spans = 1;
  const ChannelSpan cs = channel_span(x.shape, spans);
  const dim3 grid(static_cast<unsigned>(cs.c), static_cast<unsigned>(spans));
  cudaStream_t stream = stream_of(ctx);
  const NormParams p = params_of<NormParams>(ctx);
  const bool hw = p.has_weight;
  dispatch_float(x.dtype, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    using Sums = Sum2<acc_t<T>>;
    const BnGradArgs<T> a{cs,
                          ctx.in(0).ptr<T>(),
                          x.ptr<T>(),
                          ctx.in(2).ptr<T>(),
                          ctx.in(3).ptr<T>(),
                          hw ? ctx.in(4).ptr<T>() : nullptr,
                          ctx.out(0).ptr<T>(),
                          ctx.out(1).ptr<T>(),
                          ctx.out(2).ptr<T>(),
                          p.eps};
    auto* part = static_cast<Sums*>(ctx.scratch(cs.c * spans * sizeof(Sums)));
    bn_train_grad_sums<T><<<grid, kThreads, 0, stream>>>(a, part);
    check_launch(ctx.op_name());
    bn_train_grad_apply<T><<<grid, kThreads, 0, stream>>>(a, part);
  });
  check_launch(ctx.op_name());
}

// The CPU's generator, bit for bit: element i is dropped when splitmix64(key + i) < threshold.
__device__ __host__ inline uint64_t splitmix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Kept elements are x / (1 - p), divided (not multiplied by a reciprocal) as the CPU does, with
// 1 - p rounded to the arithmetic type first.
template <typename A> struct DropoutApply {
  uint64_t key, threshold;
  A keep;
  __device__ A operator()(A v, int64_t i) const {
    return splitmix64(key + static_cast<uint64_t>(i)) < threshold ? A(0) : v / keep;
  }
};

void dropout(KernelContext& ctx) {
  const TensorView &x = ctx.in(0), &y = ctx.out(0);
  const int64_t n = x.numel();
  if (n == 0) return;
  const DropoutParams d = params_of<DropoutParams>(ctx);
  const double p = d.p;
  const uint64_t key = splitmix64(d.seed);
  const auto threshold = static_cast<uint64_t>(std::ldexp(p, 64));
  dispatch_float(x.dtype, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    using A = acc_t<T>;
    launch_map(ctx, x.ptr<T>(), y.ptr<T>(), n,
               DropoutApply<A>{key, threshold, static_cast<A>(1 - p)});
  });
}

}  // namespace

void register_norm_kernels() {
  const DTypeSet floats{f32, f64, f16, bf16};
  register_kernel(OpId::Softmax, Backend::cuda, {softmax, floats, 0, false});
  register_kernel(OpId::LogSoftmax, Backend::cuda, {log_softmax, floats, 0, false});
  register_kernel(OpId::LayerNorm, Backend::cuda, {layer_norm, floats, 0, false});
  register_kernel(OpId::RmsNorm, Backend::cuda, {rms_norm, floats, 0, false});
  register_kernel(OpId::BatchNorm, Backend::cuda, {batch_norm, floats, 0, false});
  register_kernel(OpId::InstanceNorm, Backend::cuda, {instance_norm, floats, 0, false});
  register_kernel(OpId::GroupNorm, Backend::cuda, {group_norm, floats, 0, false});
  register_kernel(OpId::Dropout, Backend::cuda, {dropout, floats, 0, false});
  register_kernel(OpId::BatchNormTrain, Backend::cuda, {batch_norm_train, floats, 0, false});
  register_kernel(OpId::BatchNormTrainGrad, Backend::cuda,
                  {batch_norm_train_grad, floats, 1, false});
  register_kernel(OpId::BatchNormTrain, Backend::cuda, Layout::channels_last,
                  {batch_norm_train_nhwc, floats, 0, false});
  register_kernel(OpId::BatchNormTrainGrad, Backend::cuda, Layout::channels_last,
                  {batch_norm_train_grad_nhwc, floats, 1, false});
}

}  // namespace kiln::cuda
