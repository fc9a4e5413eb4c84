// Launchers of the elementwise CUDA kernels (unary, binary, where) and the value conversions of
// Array::convert, shared by core.cu and elementwise*.cu. A launch takes a functor on raw element
// values; flat (same-shape or scalar) inputs run with 16-byte vector loads/stores when aligned,
// other broadcasts through a collapsed index map.
#pragma once

#include <algorithm>
#include <array>
#include <climits>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "backends/cuda/cuda_common.cuh"
#include "core/int_cast.h"

namespace kiln::cuda::ew {

// ---- conversions, exactly as Array::convert ----

// To an integer: truncation toward zero, saturating at the type's range; NaN gives 0.
template <typename D> __device__ inline D saturate(double v) {
  if (!(v == v)) return D(0);
  if (v <= static_cast<double>(std::numeric_limits<D>::min())) return std::numeric_limits<D>::min();
  if (v >= static_cast<double>(std::numeric_limits<D>::max())) return std::numeric_limits<D>::max();
  return static_cast<D>(v);
}

template <typename T> constexpr bool kHalf = std::is_same_v<T, half> || std::is_same_v<T, bf16_t>;

template <typename S> __device__ inline double to_double(S v) {
  if constexpr (kHalf<S>) return static_cast<double>(to_acc(v));
  else if constexpr (std::is_same_v<S, bool>) return v ? 1.0 : 0.0;
  else return static_cast<double>(v);
}
template <typename D> __device__ inline D from_double(double v) {
  if constexpr (kHalf<D>) return from_acc<D>(static_cast<float>(v));
  else if constexpr (std::is_same_v<D, bool>) return v != 0;
  else if constexpr (std::is_floating_point_v<D>) return static_cast<D>(v);
  else return saturate<D>(v);
}
/// One element of convert(S -> D), S != D.
template <typename S, typename D> __device__ inline D convert_value(S v) {
  constexpr bool ints = std::is_integral_v<S> && std::is_integral_v<D> &&
                        !std::is_same_v<S, bool> && !std::is_same_v<D, bool>;
  if constexpr (std::is_same_v<S, int64_t> && std::is_same_v<D, int32_t>) return static_cast<int32_t>(v);
  else if constexpr (ints) return saturate_int<D>(v);
  else if constexpr (kHalf<S> && std::is_same_v<D, float>) return to_acc(v);
  else if constexpr (std::is_same_v<S, float> && kHalf<D>) return from_acc<D>(v);
  else return from_double<D>(to_double(v));
}

// ---- launch helpers ----

template <typename T, int V> struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

template <typename... T> constexpr int vec_width() {
  constexpr size_t m = std::max({sizeof(T)...});
  return static_cast<int>(16 / m);
}
inline bool aligned(const void* p, size_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}
// Vector paths pay off only past a few waves of threads.
constexpr int64_t kVecMin = 4096;

/// Output-index -> offsets of N inputs broadcast to the output, with size-1 dims dropped and
/// adjacent dims merged where every input walks them contiguously (or not at all).
template <int N> struct Bcast {
  int rank = 0;
  int64_t dims[kMaxRank] = {};
  int64_t strides[N][kMaxRank] = {};
  __device__ void offsets(int64_t i, int64_t (&off)[N]) const {
#pragma unroll
    for (int k = 0; k < N; ++k) off[k] = 0;
    for (int d = rank - 1; d >= 0; --d) {
      // 32-bit division while the index fits (64-bit division is emulated and slow).
      const int64_t q = (i | dims[d]) <= INT32_MAX
                            ? static_cast<uint32_t>(i) / static_cast<uint32_t>(dims[d])
                            : i / dims[d];
      const int64_t r = i - q * dims[d];
#pragma unroll
      for (int k = 0; k < N; ++k) off[k] += r * strides[k][d];
      i = q;
    }
  }
};
template <int N>
Bcast<N> make_bcast(const Shape& out, const std::array<const Shape*, N>& ins, const char* op) {
  BroadcastIndex bi[N];
  for (int k = 0; k < N; ++k) bi[k] = make_broadcast_index(*ins[k], out, op);
  Bcast<N> b;
  for (int d = 0; d < static_cast<int>(out.size()); ++d) {
    if (out[d] == 1) continue;
    if (b.rank > 0) {
      const int p = b.rank - 1;
      bool merge = true;
      for (int k = 0; k < N; ++k) merge = merge && b.strides[k][p] == bi[k].strides[d] * out[d];
      if (merge) {
        b.dims[p] *= out[d];
        for (int k = 0; k < N; ++k) b.strides[k][p] = bi[k].strides[d];
        continue;
      }
    }
    b.dims[b.rank] = out[d];
    for (int k = 0; k < N; ++k) b.strides[k][b.rank] = bi[k].strides[d];
    ++b.rank;
  }
  if (b.rank == 0) {
    b.rank = 1;
    b.dims[0] = 1;
  }
  return b;
}

__device__ inline int64_t thread_index() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ inline int64_t grid_stride() { return static_cast<int64_t>(blockDim.x) * gridDim.x; }

// ---- unary ----

template <typename In, typename Out, int V, typename F>
__global__ void unary_flat(const In* x, Out* o, int64_t n, F f) {
  const int64_t nv = n / V, step = grid_stride(), t = thread_index();
  if constexpr (V > 1) {
    for (int64_t i = t; i < nv; i += step) {
      const Pack<In, V> a = reinterpret_cast<const Pack<In, V>*>(x)[i];
      Pack<Out, V> r;
#pragma unroll
      for (int k = 0; k < V; ++k) r.v[k] = f(a.v[k]);
      reinterpret_cast<Pack<Out, V>*>(o)[i] = r;
    }
  }
  for (int64_t i = (V > 1 ? nv * V : 0) + t; i < n; i += step) o[i] = f(x[i]);
}

/// o[i] = f(x[i]) for dense x and o of the same numel; f maps In to Out.
template <typename In, typename Out, typename F>
void launch_unary(const TensorView& x, const TensorView& o, F f, cudaStream_t s, const char* op) {
  const int64_t n = o.numel();
  if (n == 0) return;
  const In* px = x.ptr<In>();
  Out* po = o.ptr<Out>();
  constexpr int V = vec_width<In, Out>();
  if (V > 1 && n >= kVecMin && aligned(px, sizeof(In) * V) && aligned(po, sizeof(Out) * V))
    unary_flat<In, Out, V><<<blocks_for(n / V), kThreads, 0, s>>>(px, po, n, f);
  else unary_flat<In, Out, 1><<<blocks_for(n), kThreads, 0, s>>>(px, po, n, f);
  check_launch(op);
}

// ---- binary ----

template <typename T, int V> __device__ inline Pack<T, V> load_pack(const T* p, int64_t i, bool scalar) {
  if (scalar) {
    Pack<T, V> r;
    const T v = p[0];
#pragma unroll
    for (int k = 0; k < V; ++k) r.v[k] = v;
    return r;
  }
  return reinterpret_cast<const Pack<T, V>*>(p)[i];
}

// Inputs are dense of numel n, or a single value (`*_scalar`).
template <typename A, typename B, typename Out, int V, typename F>
__global__ void binary_flat(const A* a, const B* b, Out* o, int64_t n, bool a_scalar, bool b_scalar,
                            F f) {
  const int64_t nv = n / V, step = grid_stride(), t = thread_index();
  if constexpr (V > 1) {
    for (int64_t i = t; i < nv; i += step) {
      const Pack<A, V> pa = load_pack<A, V>(a, i, a_scalar);
      const Pack<B, V> pb = load_pack<B, V>(b, i, b_scalar);
      Pack<Out, V> r;
#pragma unroll
      for (int k = 0; k < V; ++k) r.v[k] = f(pa.v[k], pb.v[k]);
      reinterpret_cast<Pack<Out, V>*>(o)[i] = r;
    }
  }
  for (int64_t i = (V > 1 ? nv * V : 0) + t; i < n; i += step)
    o[i] = f(a[a_scalar ? 0 : i], b[b_scalar ? 0 : i]);
}

template <typename A, typename B, typename Out, typename F>
__global__ void binary_bcast(const A* a, const B* b, Out* o, int64_t n, Bcast<2> m, F f) {
  const int64_t step = grid_stride();
  for (int64_t i = thread_index(); i < n; i += step) {
    int64_t off[2];
    m.offsets(i, off);
    o[i] = f(a[off[0]], b[off[1]]);
  }
}

inline bool flat_input(const TensorView& t, int64_t n) { return t.numel() == n || t.numel() == 1; }

/// o = f(a, b) with numpy broadcasting; f maps (A, B) to Out.
template <typename A, typename B, typename Out, typename F>
void launch_binary(const TensorView& a, const TensorView& b, const TensorView& o, F f,
                   cudaStream_t s, const char* op) {
  const int64_t n = o.numel();
  if (n == 0) return;
  const A* pa = a.ptr<A>();
  const B* pb = b.ptr<B>();
  Out* po = o.ptr<Out>();
  if (flat_input(a, n) && flat_input(b, n)) {
    const bool as = a.numel() != n, bs = b.numel() != n;
    constexpr int V = vec_width<A, B, Out>();
    if (V > 1 && n >= kVecMin && (as || aligned(pa, sizeof(A) * V)) &&
        (bs || aligned(pb, sizeof(B) * V)) && aligned(po, sizeof(Out) * V))
      binary_flat<A, B, Out, V><<<blocks_for(n / V), kThreads, 0, s>>>(pa, pb, po, n, as, bs, f);
    else binary_flat<A, B, Out, 1><<<blocks_for(n), kThreads, 0, s>>>(pa, pb, po, n, as, bs, f);
  } else {
    const Bcast<2> m = make_bcast<2>(o.shape, {&a.shape, &b.shape}, op);
    binary_bcast<A, B, Out><<<blocks_for(n), kThreads, 0, s>>>(pa, pb, po, n, m, f);
  }
  check_launch(op);
}

// ---- adapters from element types to the arithmetic type (acc_t) and back ----

template <typename Out, typename F> struct Acc1 {
  F f;
  template <typename In> __device__ Out operator()(In x) const { return from_acc<Out>(f(to_acc(x))); }
};
template <typename Out, typename F> struct Acc2 {
  F f;
  template <typename In> __device__ Out operator()(In a, In b) const {
    return from_acc<Out>(f(to_acc(a), to_acc(b)));
  }
};

/// out = Op<A>(x) for float dtypes (A = acc_t of the element type); `params` initialize Op's
/// members in order.
template <template <typename> class Op, typename... P> void unary_float(KernelContext& ctx, P... params) {
  dispatch_float(ctx.in(0).dtype, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    using A = acc_t<T>;
    launch_unary<T, T>(ctx.in(0), ctx.out(0), Acc1<T, Op<A>>{Op<A>{static_cast<A>(params)...}},
                       stream_of(ctx), ctx.op_name());
  });
}

// ---- where ----

template <typename T, int V>
__global__ void where_flat(const bool* c, const T* x, const T* y, T* o, int64_t n, bool cs, bool xs,
                           bool ys) {
  const int64_t nv = n / V, step = grid_stride(), t = thread_index();
  if constexpr (V > 1) {
    for (int64_t i = t; i < nv; i += step) {
      const Pack<bool, V> pc = load_pack<bool, V>(c, i, cs);
      const Pack<T, V> px = load_pack<T, V>(x, i, xs), py = load_pack<T, V>(y, i, ys);
      Pack<T, V> r;
#pragma unroll
      for (int k = 0; k < V; ++k) r.v[k] = pc.v[k] ? px.v[k] : py.v[k];
      reinterpret_cast<Pack<T, V>*>(o)[i] = r;
    }
  }
  for (int64_t i = (V > 1 ? nv * V : 0) + t; i < n; i += step)
    o[i] = c[cs ? 0 : i] ? x[xs ? 0 : i] : y[ys ? 0 : i];
}

template <typename T>
__global__ void where_bcast(const bool* c, const T* x, const T* y, T* o, int64_t n, Bcast<3> m) {
  const int64_t step = grid_stride();
  for (int64_t i = thread_index(); i < n; i += step) {
    int64_t off[3];
    m.offsets(i, off);
    o[i] = c[off[0]] ? x[off[1]] : y[off[2]];
  }
}

/// o = c ? x : y with broadcasting; T is an unsigned type of the element's size.
template <typename T>
void launch_where(const TensorView& c, const TensorView& x, const TensorView& y,
                  const TensorView& o, cudaStream_t s, const char* op) {
  const int64_t n = o.numel();
  if (n == 0) return;
  const bool* pc = c.ptr<bool>();
  const T *px = x.ptr<T>(), *py = y.ptr<T>();
  T* po = o.ptr<T>();
  if (flat_input(c, n) && flat_input(x, n) && flat_input(y, n)) {
    const bool cs = c.numel() != n, xs = x.numel() != n, ys = y.numel() != n;
    constexpr int V = vec_width<T>();
    if (n >= kVecMin && (cs || aligned(pc, V)) && (xs || aligned(px, sizeof(T) * V)) &&
        (ys || aligned(py, sizeof(T) * V)) && aligned(po, sizeof(T) * V))
      where_flat<T, V><<<blocks_for(n / V), kThreads, 0, s>>>(pc, px, py, po, n, cs, xs, ys);
    else where_flat<T, 1><<<blocks_for(n), kThreads, 0, s>>>(pc, px, py, po, n, cs, xs, ys);
  } else {
    const Bcast<3> m = make_bcast<3>(o.shape, {&c.shape, &x.shape, &y.shape}, op);
    where_bcast<T><<<blocks_for(n), kThreads, 0, s>>>(pc, px, py, po, n, m);
  }
  check_launch(op);
}

}  // namespace kiln::cuda::ew
