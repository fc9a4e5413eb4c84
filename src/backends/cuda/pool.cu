// CUDA kernels of the pool family. Every op runs as 3-D pooling (1-D and 2-D get leading spatial
// dims of size 1). Forward ops give each output a thread (small windows) or a warp (large ones);
// the gradients are in pool_grad.cu. The Layout::channels_last kernels of max and adaptive
// average pooling (2-D) and of their gradients take NHWC data.
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <type_traits>

#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/kernels.h"
#include "backends/cuda/pool_internal.cuh"

namespace kiln::cuda {

namespace pool_detail {

PoolGeom pool_geom(const Shape& x, const Shape& y) {
  const int nd = static_cast<int>(x.size()) - 2;
  PoolGeom g;
  g.planes = x[0] * x[1];
  for (int d = 0; d < nd; ++d) {
    g.in[3 - nd + d] = x[2 + d];
    g.out[3 - nd + d] = y[2 + d];
  }
  return g;
}

PoolGeom pool_geom(const PoolParams& p, const Shape& x, const Shape& y) {
  PoolGeom g = pool_geom(x, y);
  const int nd = static_cast<int>(x.size()) - 2;
  for (int d = 0; d < nd; ++d) {
    const int e = 3 - nd + d;
    g.k[e] = p.kernel[d];
    g.s[e] = p.stride[d];
    g.pad[e] = p.pads[d];
    g.pad_end[e] = p.pads[nd + d];
    g.dil[e] = p.dilation[d];
  }
  return g;
}

// (N, H, W, C) as (N, C, H, W).
Shape nchw_of(const Shape& s) { return {s[0], s[3], s[1], s[2]}; }

}  // namespace pool_detail

namespace {

using namespace pool_detail;

// Windows of at least this many taps get a warp per output.
constexpr int64_t kWarpWindow = 64;

// Input coordinates base + j * step for j in [0, count) along one dim.
struct Span {
  int64_t base, step, count;
};

// Max pooling's taps along dim e for output o: the window's taps inside the input.
__device__ Span max_span(const PoolGeom& g, int e, int64_t o) {
  const int64_t start = o * g.s[e] - g.pad[e], dil = g.dil[e], size = g.in[e];
  const int64_t lo = start < 0 ? (-start + dil - 1) / dil : 0;
  int64_t hi = start >= size ? 0 : (size - start + dil - 1) / dil;
  hi = hi < g.k[e] ? hi : g.k[e];
  return {start + lo * dil, dil, hi > lo ? hi - lo : 0};
}

// Calls f(flat in-plane index) for the box of three spans, the taps split over G lanes in
// (d, h, w) order: lane l takes taps l, l + G, ...
template <int G, typename F> __device__ void for_box(const PoolGeom& g, const Span& sd,
                                                     const Span& sh, const Span& sw, int lane,
                                                     F&& f) {
  if constexpr (G == 1) {
    for (int64_t a = 0; a < sd.count; ++a) {
      const int64_t rd = (sd.base + a * sd.step) * g.in[1];
      for (int64_t b = 0; b < sh.count; ++b) {
        const int64_t rh = (rd + sh.base + b * sh.step) * g.in[2];
        for (int64_t c = 0; c < sw.count; ++c) f(rh + sw.base + c * sw.step);
      }
    }
  } else {
    const int64_t total = sd.count * sh.count * sw.count;
    for (int64_t t = lane; t < total; t += G) {
      const int64_t c = t % sw.count, q = t / sw.count, b = q % sh.count, a = q / sh.count;
      f(((sd.base + a * sd.step) * g.in[1] + sh.base + b * sh.step) * g.in[2] + sw.base +
        c * sw.step);
    }
  }
}

template <typename T> __device__ bool is_nan(T v) {
  if constexpr (std::is_floating_point_v<T>) return v != v;
  else return false;
}

// Running maximum with its flat index; `where` < 0 when no tap was seen. NaN wins over numbers
// and the later NaN over an earlier one; among equal values the earlier index wins (the CPU's
// sequential rule `v > best || isnan(v)` over taps in index order).
template <typename A> struct MaxAt {
  A v;
  int64_t where;
  __device__ static MaxAt combine(const MaxAt& a, const MaxAt& b) {
    if (a.where < 0) return b;
    if (b.where < 0) return a;
    const bool na = is_nan(a.v), nb = is_nan(b.v);
    if (na || nb) return na && nb ? (a.where > b.where ? a : b) : (na ? a : b);
    if (a.v > b.v) return a;
    if (b.v > a.v) return b;
    return a.where < b.where ? a : b;
  }
};

template <typename V> __device__ V shfl_down(V v, int d) {
  if constexpr (sizeof(V) == 1)
    return static_cast<V>(__shfl_down_sync(0xffffffffu, static_cast<int>(v), d));
  else if constexpr (sizeof(V) == 2 && std::is_integral_v<V>)
    return static_cast<V>(__shfl_down_sync(0xffffffffu, static_cast<int>(v), d));
  else if constexpr (std::is_same_v<V, int64_t>)
    return __shfl_down_sync(0xffffffffu, static_cast<long long>(v), d);
  else return __shfl_down_sync(0xffffffffu, v, d);
}

// ---- max pooling ----

template <typename T, int G>
__global__ void max_pool_kernel(const T* x, T* y, int64_t* arg, PoolGeom g) {
  using A = acc_t<T>;
  const int64_t per_block = blockDim.x / G, n = g.planes * g.out_plane();
  const int lane = threadIdx.x % G;
  for (int64_t o = blockIdx.x * per_block + threadIdx.x / G; o < n;
       o += static_cast<int64_t>(gridDim.x) * per_block) {
    const int64_t plane = o / g.out_plane();
    const Pos p = pos_at(g.out, o % g.out_plane());
    const T* xp = x + plane * g.in_plane();
    MaxAt<A> best{std::numeric_limits<A>::lowest(), -1};
    for_box<G>(g, max_span(g, 0, p.d), max_span(g, 1, p.h), max_span(g, 2, p.w), lane,
               [&](int64_t i) {
                 best = MaxAt<A>::combine(best, {to_acc(xp[i]), i});
               });
    if constexpr (G > 1) {
      for (int d = G / 2; d > 0; d >>= 1) {
        const MaxAt<A> other{shfl_down(best.v, d), shfl_down(best.where, d)};
        best = MaxAt<A>::combine(best, other);
      }
    }
    if (lane == 0) {
      y[o] = from_acc<T>(best.v);
      arg[o] = best.where;
    }
  }
}

// The common case: 2-D windows without dilation over planes whose offsets fit 32 bits, a thread
// per output with 32-bit index math (64-bit division costs ~10x more on the GPU). Taps run in
// index order with the CPU's rule `v > best || isnan(v)`.
template <typename T> __global__ void max_pool_2d_kernel(const T* __restrict__ x, T* __restrict__ y,
                                                         int64_t* __restrict__ arg, int n, int in_h,
                                                         int in_w, int out_h, int out_w, int kh,
                                                         int kw, int sh, int sw, int ph, int pw) {
  using A = acc_t<T>;
  for (int64_t oo = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; oo < n;
       oo += int64_t{gridDim.x} * blockDim.x) {
    const int o = static_cast<int>(oo);
    const int ow = o % out_w, q = o / out_w, oh = q % out_h, plane = q / out_h;
    const T* xp = x + static_cast<int64_t>(plane) * in_h * in_w;
    const int h0 = oh * sh - ph, w0 = ow * sw - pw;
    const int h_lo = max(h0, 0), h_hi = min(h0 + kh, in_h);
    const int w_lo = max(w0, 0), w_hi = min(w0 + kw, in_w);
    A best = std::numeric_limits<A>::lowest();
    int where = -1;
    for (int h = h_lo; h < h_hi; ++h)
      for (int w = w_lo; w < w_hi; ++w) {
        const int i = h * in_w + w;
        const A v = to_acc(xp[i]);
        if (where < 0 || v > best || is_nan(v)) {
          best = v;
          where = i;
        }
      }
    y[o] = from_acc<T>(best);
    arg[o] = where;
  }
}

bool fits_2d_fast_path(const PoolGeom& g) {
  return g.in[0] == 1 && g.out[0] == 1 && g.k[0] == 1 && g.dil[1] == 1 && g.dil[2] == 1 &&
         g.planes * std::max(g.in_plane(), g.out_plane()) < (int64_t{1} << 31) &&
         g.k[1] * g.k[2] < kWarpWindow;
}

// Window taps of the largest window (for the thread-or-warp choice).
int64_t window_taps(const PoolGeom& g) { return g.k[0] * g.k[1] * g.k[2]; }

unsigned groups_grid(int64_t n, int group) { return blocks_for(n, kThreads / group); }

// ---- channels_last (NHWC, 2-D windows) ----

// V channels of one output position a thread (16-byte accesses when C allows); pack i covers
// output elements [i*V, i*V + V). Taps in index order with max_pool_2d_kernel's rule; the index
// is in-plane (h*W + w), as NCHW pooling records it.
template <typename T, int V>
__global__ void max_pool_nhwc_kernel(const T* __restrict__ x, T* __restrict__ y,
                                     int64_t* __restrict__ arg, int64_t packs, PoolGeom g, int C) {
  using A = acc_t<T>;
  const int cp = C / V;
  const int in_h = static_cast<int>(g.in[1]), in_w = static_cast<int>(g.in[2]);
  const int out_h = static_cast<int>(g.out[1]), out_w = static_cast<int>(g.out[2]);
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < packs;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int c0 = static_cast<int>(i % cp) * V;
    int64_t q = i / cp;
    const int ow = static_cast<int>(q % out_w);
    q /= out_w;
    const int oh = static_cast<int>(q % out_h);
    const int64_t n = q / out_h;
    const T* xn = x + n * in_h * in_w * int64_t{C} + c0;
    A best[V];
    int where[V];
#pragma unroll
    for (int u = 0; u < V; ++u) best[u] = std::numeric_limits<A>::lowest(), where[u] = -1;
    for (int a = 0; a < g.k[1]; ++a) {
      const int h = oh * static_cast<int>(g.s[1]) - static_cast<int>(g.pad[1]) +
                    a * static_cast<int>(g.dil[1]);
      if (h < 0 || h >= in_h) continue;
      for (int b = 0; b < g.k[2]; ++b) {
        const int w = ow * static_cast<int>(g.s[2]) - static_cast<int>(g.pad[2]) +
                      b * static_cast<int>(g.dil[2]);
        if (w < 0 || w >= in_w) continue;
        const int at = h * in_w + w;
        const Vec<T, V> v = *reinterpret_cast<const Vec<T, V>*>(xn + int64_t{at} * C);
#pragma unroll
        for (int u = 0; u < V; ++u) {
          const A e = to_acc(v.v[u]);
          if (where[u] < 0 || e > best[u] || is_nan(e)) best[u] = e, where[u] = at;
        }
      }
    }
    Vec<T, V> out;
#pragma unroll
    for (int u = 0; u < V; ++u) {
      out.v[u] = from_acc<T>(best[u]);
      if (arg) arg[i * V + u] = where[u];
    }
    reinterpret_cast<Vec<T, V>*>(y)[i] = out;
  }
}

// 1-byte data without indices (16 channels a thread): the same maxima as max_pool_nhwc_kernel,
// from T's lowest value (what an empty window gives). Each byte goes to the high half of a
// 16-bit lane, where the 16x2 max (one instruction on sm_90; __vmaxu4 is emulated) orders
// the bytes as T does: 16 channels take 8 byte moves and 8 maxima per tap. Offsets fit 32 bits.
struct Nhwc2d {
  int cp, in_h, in_w, out_h, out_w, kh, kw, sh, sw, ph, pw, dh, dw;
};

template <typename T> __device__ unsigned max16x2(unsigned a, unsigned b) {
  if constexpr (std::is_signed_v<T>) return __vmaxs2(a, b);
  else return __vmaxu2(a, b);
}

// K > 0: a K x K window, unrolled, so that a thread's taps are all loaded at once (a tap outside
// x reads as T's lowest value); K = 0: g's window, tap by tap.
template <typename T, int K> __global__ void max_pool_nhwc_bytes_kernel(const uint4* __restrict__ x,
                                                                        uint4* __restrict__ y,
                                                                        int packs, Nhwc2d g) {
  // lanes hold bytes (0, 2) and (1, 3) of a word in their high halves
  constexpr unsigned kEven = 0x2404, kOdd = 0x3414, kJoin = 0x7351;
  constexpr unsigned kLowest = std::is_signed_v<T> ? 0x80008000u : 0u;
  constexpr unsigned kLowestBytes = std::is_signed_v<T> ? 0x80808080u : 0u;
  const int kh = K > 0 ? K : g.kh, kw = K > 0 ? K : g.kw;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < packs; i += gridDim.x * blockDim.x) {
    const int c = i % g.cp, q = i / g.cp, ow = q % g.out_w, r = q / g.out_w;
    const int oh = r % g.out_h, n = r / g.out_h;
    const uint4* xn = x + n * g.in_h * g.in_w * g.cp + c;
    unsigned best[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) best[u] = kLowest;
#pragma unroll
    for (int a = 0; a < kh; ++a) {
      const int h = oh * g.sh - g.ph + a * g.dh;
      if (K == 0 && (h < 0 || h >= g.in_h)) continue;
#pragma unroll
      for (int b = 0; b < kw; ++b) {
        const int w = ow * g.sw - g.pw + b * g.dw;
        const bool in = h >= 0 && h < g.in_h && w >= 0 && w < g.in_w;
        if (K == 0 && !in) continue;
        const uint4 v = in ? xn[(h * g.in_w + w) * g.cp]
                           : make_uint4(kLowestBytes, kLowestBytes, kLowestBytes, kLowestBytes);
        const unsigned words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          best[2 * u] = max16x2<T>(best[2 * u], __byte_perm(words[u], 0, kEven));
          best[2 * u + 1] = max16x2<T>(best[2 * u + 1], __byte_perm(words[u], 0, kOdd));
        }
      }
    }
    y[i] = make_uint4(__byte_perm(best[0], best[1], kJoin), __byte_perm(best[2], best[3], kJoin),
                      __byte_perm(best[4], best[5], kJoin), __byte_perm(best[6], best[7], kJoin));
  }
}

// Whether max_pool_nhwc_bytes_kernel takes 1-byte x (N, H, W, C) to y: 16 | C, 16-byte aligned
// buffers, offsets within 32 bits.
bool takes_bytes_path(const PoolGeom& g, int64_t C, const TensorView& x, const TensorView& y) {
  constexpr int64_t kLimit = int64_t{1} << 31;
  return C % 16 == 0 && reinterpret_cast<uintptr_t>(x.data) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(y.data) % 16 == 0 && x.numel() < kLimit &&
         y.numel() < kLimit && g.in[0] == 1 && g.k[0] == 1;
}

void max_pool_nhwc(KernelContext& ctx) {
  const TensorView &x = ctx.in(0), &y = ctx.out(0);
  PoolParams spare;
  const PoolParams& p = params_of(ctx, spare);
  const PoolGeom g = pool_geom(p, nchw_of(x.shape), nchw_of(y.shape));
  const int64_t C = x.shape[3];
  if (y.numel() == 0) return;
  if (g.in[1] * g.in[2] >= (int64_t{1} << 31) || C >= (int64_t{1} << 31))
    fail<UnsupportedError>("[{}] channels_last planes of 2^31 positions or more (input {})",
                           ctx.op_name(), str(x.shape));
  // no_indices: nothing reads output 1 (fuse_quant's int8 pools), left unwritten
  int64_t* indices = p.no_indices ? nullptr : ctx.out(1).ptr<int64_t>();
  dispatch(x.dtype, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    if constexpr (std::is_same_v<T, uint8_t> || std::is_same_v<T, int8_t>) {
      if (!indices && takes_bytes_path(g, C, x, y)) {
        auto i32 = [](int64_t v) { return static_cast<int>(v); };
        const Nhwc2d d{i32(C / 16),   i32(g.in[1]),  i32(g.in[2]), i32(g.out[1]), i32(g.out[2]),
                       i32(g.k[1]),   i32(g.k[2]),   i32(g.s[1]),  i32(g.s[2]),   i32(g.pad[1]),
                       i32(g.pad[2]), i32(g.dil[1]), i32(g.dil[2])};
        const int packs = i32(y.numel() / 16);
        if (d.kh == 3 && d.kw == 3)  // (a ResNet's)
          max_pool_nhwc_bytes_kernel<T, 3><<<blocks_for(packs), kThreads, 0, stream_of(ctx)>>>(
              x.ptr<uint4>(), y.ptr<uint4>(), packs, d);
        else
          max_pool_nhwc_bytes_kernel<T, 0><<<blocks_for(packs), kThreads, 0, stream_of(ctx)>>>(
              x.ptr<uint4>(), y.ptr<uint4>(), packs, d);
        return;
      }
    }
    if constexpr (!std::is_same_v<T, bool>) {
      nhwc_width<T>(C, {x.data, y.data}, [&](auto width) {
        constexpr int W = decltype(width)::value;
        const int64_t packs = y.numel() / W;
        max_pool_nhwc_kernel<T, W><<<blocks_for(packs), kThreads, 0, stream_of(ctx)>>>(
            x.ptr<T>(), y.ptr<T>(), indices, packs, g, static_cast<int>(C));
      });
    } else {
      fail<UnsupportedError>("[{}] cuda kernel got dtype bool", ctx.op_name());
    }
  });
  check_launch(ctx.op_name());
}

void max_pool(KernelContext& ctx) {
  PoolParams spare;
  const PoolGeom g = pool_geom(params_of(ctx, spare), ctx.in(0).shape, ctx.out(0).shape);
  const int64_t n = ctx.out(0).numel();
  if (n == 0) return;
  cudaStream_t stream = stream_of(ctx);
  dispatch(ctx.in(0).dtype, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    if constexpr (!std::is_same_v<T, bool>) {
      const T* x = ctx.in(0).ptr<T>();
      T* y = ctx.out(0).ptr<T>();
      int64_t* arg = ctx.out(1).ptr<int64_t>();
      if (fits_2d_fast_path(g)) {
        auto i32 = [](int64_t v) { return static_cast<int>(v); };
        max_pool_2d_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(
            x, y, arg, i32(n), i32(g.in[1]), i32(g.in[2]), i32(g.out[1]), i32(g.out[2]),
            i32(g.k[1]), i32(g.k[2]), i32(g.s[1]), i32(g.s[2]), i32(g.pad[1]), i32(g.pad[2]));
      } else if (window_taps(g) >= kWarpWindow)
        max_pool_kernel<T, 32><<<groups_grid(n, 32), kThreads, 0, stream>>>(x, y, arg, g);
      else max_pool_kernel<T, 1><<<blocks_for(n), kThreads, 0, stream>>>(x, y, arg, g);
    } else {
      fail<UnsupportedError>("[{}] cuda kernel got dtype bool", ctx.op_name());
    }
  });
  check_launch(ctx.op_name());
}

// ---- average pooling ----

template <typename T, bool kAdaptive, int G>
__global__ void avg_pool_kernel(const T* x, T* y, PoolGeom g, bool include_pad) {
  using A = acc_t<T>;
  const int64_t per_block = blockDim.x / G, n = g.planes * g.out_plane();
  const int lane = threadIdx.x % G;
  for (int64_t o = blockIdx.x * per_block + threadIdx.x / G; o < n;
       o += static_cast<int64_t>(gridDim.x) * per_block) {
    const int64_t plane = o / g.out_plane();
    const Pos p = pos_at(g.out, o % g.out_plane());
    const T* xp = x + plane * g.in_plane();
    AvgWindow w[3];
    const int64_t at[3] = {p.d, p.h, p.w};
    for (int e = 0; e < 3; ++e)
      w[e] = kAdaptive ? adaptive_window(g, e, at[e]) : avg_window(g, e, at[e]);
    A sum = 0;
    for_box<G>(g, {w[0].lo, 1, w[0].hi - w[0].lo}, {w[1].lo, 1, w[1].hi - w[1].lo},
               {w[2].lo, 1, w[2].hi - w[2].lo}, lane, [&](int64_t i) { sum += to_acc(xp[i]); });
    if constexpr (G > 1)
      for (int d = G / 2; d > 0; d >>= 1) sum += shfl_down(sum, d);
    if (lane == 0) {
      const int64_t count = include_pad
                                ? w[0].padded * w[1].padded * w[2].padded
                                : (w[0].hi - w[0].lo) * (w[1].hi - w[1].lo) * (w[2].hi - w[2].lo);
      y[o] = from_acc<T>(sum / static_cast<A>(count));
    }
  }
}

// g: the node's geometry (adaptive: with 1-wide windows).
template <bool kAdaptive> void avg_pool_impl(KernelContext& ctx, PoolGeom g, bool include_pad) {
  const int64_t n = ctx.out(0).numel();
  if (n == 0) return;
  if (kAdaptive)  // the largest window, for the thread-or-warp choice
    for (int e = 0; e < 3; ++e) g.k[e] = (g.in[e] + g.out[e] - 1) / g.out[e] + 1;
  const bool warp = window_taps(g) >= kWarpWindow;
  if (kAdaptive)
    for (int e = 0; e < 3; ++e) g.k[e] = 1;
  cudaStream_t stream = stream_of(ctx);
  dispatch_float(ctx.in(0).dtype, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    const T* x = ctx.in(0).ptr<T>();
    T* y = ctx.out(0).ptr<T>();
    if (warp)
      avg_pool_kernel<T, kAdaptive, 32>
          <<<groups_grid(n, 32), kThreads, 0, stream>>>(x, y, g, include_pad);
    else
      avg_pool_kernel<T, kAdaptive, 1>
          <<<blocks_for(n), kThreads, 0, stream>>>(x, y, g, include_pad);
  });
  check_launch(ctx.op_name());
}

// V channels of one output position a thread; sums in index order in acc_t<T>, as the NCHW
// kernel's thread path does.
template <typename T, int V>
__global__ void adaptive_avg_pool_nhwc_kernel(const T* __restrict__ x, T* __restrict__ y,
                                              int64_t packs, PoolGeom g, int C) {
  using A = acc_t<T>;
  const int cp = C / V;
  const int64_t in_h = g.in[1], in_w = g.in[2], out_h = g.out[1], out_w = g.out[2];
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < packs;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int c0 = static_cast<int>(i % cp) * V;
    int64_t q = i / cp;
    const int64_t ow = q % out_w;
    q /= out_w;
    const int64_t oh = q % out_h, n = q / out_h;
    const AvgWindow wh = adaptive_window(g, 1, oh), ww = adaptive_window(g, 2, ow);
    const T* xn = x + n * in_h * in_w * C + c0;
    A sum[V];
#pragma unroll
    for (int u = 0; u < V; ++u) sum[u] = A(0);
    for (int64_t h = wh.lo; h < wh.hi; ++h)
      for (int64_t w = ww.lo; w < ww.hi; ++w) {
        const Vec<T, V> v = *reinterpret_cast<const Vec<T, V>*>(xn + (h * in_w + w) * C);
#pragma unroll
        for (int u = 0; u < V; ++u) sum[u] += to_acc(v.v[u]);
      }
    const A count = static_cast<A>((wh.hi - wh.lo) * (ww.hi - ww.lo));
    Vec<T, V> out;
#pragma unroll
    for (int u = 0; u < V; ++u) out.v[u] = from_acc<T>(sum[u] / count);
    reinterpret_cast<Vec<T, V>*>(y)[i] = out;
  }
}

// Few outputs (a global pool of a small batch, where V channels a thread would leave most SMs
// idle): a thread per output element, its taps walked in the same order and loaded kAhead at a
// time ahead of the sum (one memory latency, not one a tap), so results are those of
// adaptive_avg_pool_nhwc_kernel. Offsets fit 32 bits.
template <typename T>
__global__ void adaptive_avg_pool_nhwc_narrow_kernel(const T* __restrict__ x, T* __restrict__ y,
                                                     int n_out, PoolGeom g, int C) {
  using A = acc_t<T>;
  constexpr int kAhead = sizeof(T) <= 4 ? 64 : 32;  // a 7x7 window's loads all in flight
  const int in_h = static_cast<int>(g.in[1]), in_w = static_cast<int>(g.in[2]);
  const int out_h = static_cast<int>(g.out[1]), out_w = static_cast<int>(g.out[2]);
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n_out; i += gridDim.x * blockDim.x) {
    const int c = i % C, q = i / C, ow = q % out_w, r = q / out_w, oh = r % out_h, n = r / out_h;
    const AvgWindow wh = adaptive_window(g, 1, oh), ww = adaptive_window(g, 2, ow);
    const int h_lo = static_cast<int>(wh.lo), w_lo = static_cast<int>(ww.lo);
    const int w_hi = static_cast<int>(ww.hi);
    const int taps = static_cast<int>((wh.hi - wh.lo) * (ww.hi - ww.lo));
    const T* xn = x + n * in_h * in_w * C + c;
    A sum = A(0);
    int h = h_lo, w = w_lo;  // the next tap to load, (h, w) in row-major order
    for (int t0 = 0; t0 < taps; t0 += kAhead) {
      T v[kAhead];
#pragma unroll
      for (int u = 0; u < kAhead; ++u) {  // in groups of 8; loads past the last tap repeat it
        if (u % 8 == 0 && t0 + u >= taps) break;
        v[u] = xn[(h * in_w + w) * C];
        if (t0 + u + 1 < taps && ++w == w_hi) w = w_lo, ++h;
      }
#pragma unroll
      for (int u = 0; u < kAhead; ++u)
        if (t0 + u < taps) sum += to_acc(v[u]);
    }
    y[i] = from_acc<T>(sum / static_cast<A>(taps));
  }
}

void adaptive_avg_pool_nhwc(KernelContext& ctx) {
  const TensorView &x = ctx.in(0), &y = ctx.out(0);
  const PoolGeom g = pool_geom(nchw_of(x.shape), nchw_of(y.shape));
  const int64_t C = x.shape[3];
  if (y.numel() == 0) return;
  // packs of 16 bytes below half a wave of resident threads: a thread per element instead
  const int64_t wide_packs = y.numel() * static_cast<int64_t>(size_of(x.dtype)) / 16;
  const bool narrow = wide_packs < int64_t{split_sms(ctx)} * 1024 && x.numel() < (int64_t{1} << 31);
  dispatch_float(x.dtype, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    if (narrow) {
      const int n_out = static_cast<int>(y.numel());
      adaptive_avg_pool_nhwc_narrow_kernel<T><<<blocks_for(n_out, 128), 128, 0, stream_of(ctx)>>>(
          x.ptr<T>(), y.ptr<T>(), n_out, g, static_cast<int>(C));
      return;
    }
    nhwc_width<T>(C, {x.data, y.data}, [&](auto width) {
      constexpr int W = decltype(width)::value;
      const int64_t packs = y.numel() / W;
      adaptive_avg_pool_nhwc_kernel<T, W><<<blocks_for(packs), kThreads, 0, stream_of(ctx)>>>(
          x.ptr<T>(), y.ptr<T>(), packs, g, static_cast<int>(C));
    });
  });
  check_launch(ctx.op_name());
}

void avg_pool(KernelContext& ctx) {
  PoolParams spare;
  const PoolParams& p = params_of(ctx, spare);
  avg_pool_impl<false>(ctx, pool_geom(p, ctx.in(0).shape, ctx.out(0).shape), p.count_include_pad);
}
void adaptive_avg_pool(KernelContext& ctx) {
  avg_pool_impl<true>(ctx, pool_geom(ctx.in(0).shape, ctx.out(0).shape), false);
}

}  // namespace

void register_pool_kernels() {
  const DTypeSet floats{f32, f64, f16, bf16};
  register_kernel(OpId::MaxPool, Backend::cuda, {max_pool, kNumericTypes, 0, false});
  register_kernel(OpId::AvgPool, Backend::cuda, {avg_pool, floats, 0, false});
  register_kernel(OpId::AdaptiveAvgPool, Backend::cuda, {adaptive_avg_pool, floats, 0, false});
  register_kernel(OpId::MaxPool, Backend::cuda, Layout::channels_last,
                  {max_pool_nhwc, kNumericTypes, 0, false});
  register_kernel(OpId::AdaptiveAvgPool, Backend::cuda, Layout::channels_last,
                  {adaptive_avg_pool_nhwc, floats, 0, false});
  register_pool_grad_kernels();
}

}  // namespace kiln::cuda
