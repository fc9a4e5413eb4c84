// CUDA kernels of the pool family's gradients (the forward ops are in pool.cu): average-pool
// gradients gather, each input summing the outputs whose windows hold it; the max-pool gradient
// scatters with atomics (its indices are data), so its sums are order-dependent in rounding only;
// deterministic executables add with one thread per plane instead, in output order (the node has
// no window to gather by).
#include <cstdint>
#include <type_traits>

#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/kernels.h"
#include "backends/cuda/pool_internal.cuh"

namespace kiln::cuda {

namespace {

using namespace pool_detail;

// ---- gradients ----

// dx (output 0) to dy (input 0), with 1-wide windows.
PoolGeom grad_geom(const KernelContext& ctx) {
  return pool_geom(ctx.out(0).shape, ctx.in(0).shape);
}

// Each dx element sums dy[o] / count(o) over the outputs o whose windows hold it.
template <typename T, bool kAdaptive>
__global__ void avg_pool_grad_kernel(const T* dy, T* dx, PoolGeom g, bool include_pad) {
  using A = acc_t<T>;
  const int64_t n = g.planes * g.in_plane();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t plane = i / g.in_plane();
    const Pos p = pos_at(g.in, i % g.in_plane());
    const int64_t at[3] = {p.d, p.h, p.w};
    int64_t lo[3], hi[3];  // candidate outputs [lo, hi] along each dim
    for (int e = 0; e < 3; ++e) {
      if (kAdaptive) {
        lo[e] = at[e] * g.out[e] / g.in[e];
        hi[e] = ((at[e] + 1) * g.out[e] + g.in[e] - 1) / g.in[e] - 1;
      } else {
        const int64_t first = at[e] + g.pad[e] - g.k[e] + 1;
        lo[e] = first <= 0 ? 0 : (first + g.s[e] - 1) / g.s[e];
        hi[e] = (at[e] + g.pad[e]) / g.s[e];
      }
      lo[e] = max(lo[e], int64_t{0});
      hi[e] = min(hi[e], g.out[e] - 1);
    }
    const T* gp = dy + plane * g.out_plane();
    A sum = 0;
    for (int64_t od = lo[0]; od <= hi[0]; ++od) {
      const AvgWindow wd = kAdaptive ? adaptive_window(g, 0, od) : avg_window(g, 0, od);
      if (at[0] < wd.lo || at[0] >= wd.hi) continue;
      for (int64_t oh = lo[1]; oh <= hi[1]; ++oh) {
        const AvgWindow wh = kAdaptive ? adaptive_window(g, 1, oh) : avg_window(g, 1, oh);
        if (at[1] < wh.lo || at[1] >= wh.hi) continue;
        for (int64_t ow = lo[2]; ow <= hi[2]; ++ow) {
          const AvgWindow ww = kAdaptive ? adaptive_window(g, 2, ow) : avg_window(g, 2, ow);
          if (at[2] < ww.lo || at[2] >= ww.hi) continue;
          const int64_t count = include_pad ? wd.padded * wh.padded * ww.padded
                                            : (wd.hi - wd.lo) * (wh.hi - wh.lo) * (ww.hi - ww.lo);
          sum += to_acc(gp[(od * g.out[1] + oh) * g.out[2] + ow]) / static_cast<A>(count);
        }
      }
    }
    dx[i] = from_acc<T>(sum);
  }
}

// g: dx to dy with the node's window (adaptive: 1-wide windows).
template <bool kAdaptive>
void avg_pool_grad_impl(KernelContext& ctx, const PoolGeom& g, bool include_pad) {
  const int64_t n = ctx.out(0).numel();
  if (n == 0) return;
  cudaStream_t stream = stream_of(ctx);
  dispatch_float(ctx.in(0).dtype, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    avg_pool_grad_kernel<T, kAdaptive><<<blocks_for(n), kThreads, 0, stream>>>(
        ctx.in(0).ptr<T>(), ctx.out(0).ptr<T>(), g, include_pad);
  });
  check_launch(ctx.op_name());
}

// channels_last: V channels of one dx position a thread, summing dy / count over the outputs
// whose windows hold it, in the NCHW kernel's order.
template <typename T, int V>
__global__ void adaptive_avg_pool_grad_nhwc_kernel(const T* __restrict__ dy, T* __restrict__ dx,
                                                   int64_t packs, PoolGeom g, int C) {
  using A = acc_t<T>;
  const int cp = C / V;
  const int64_t in_h = g.in[1], in_w = g.in[2], out_h = g.out[1], out_w = g.out[2];
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < packs;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int c0 = static_cast<int>(i % cp) * V;
    int64_t q = i / cp;
    const int64_t w = q % in_w;
    q /= in_w;
    const int64_t h = q % in_h, n = q / in_h;
    const int64_t h_lo = max(h * out_h / in_h, int64_t{0}),
                  h_hi = min(((h + 1) * out_h + in_h - 1) / in_h - 1, out_h - 1);
    const int64_t w_lo = max(w * out_w / in_w, int64_t{0}),
                  w_hi = min(((w + 1) * out_w + in_w - 1) / in_w - 1, out_w - 1);
    const T* gn = dy + n * out_h * out_w * C + c0;
    A sum[V];
#pragma unroll
    for (int u = 0; u < V; ++u) sum[u] = A(0);
    for (int64_t oh = h_lo; oh <= h_hi; ++oh) {
      const AvgWindow wh = adaptive_window(g, 1, oh);
      if (h < wh.lo || h >= wh.hi) continue;
      for (int64_t ow = w_lo; ow <= w_hi; ++ow) {
        const AvgWindow ww = adaptive_window(g, 2, ow);
        if (w < ww.lo || w >= ww.hi) continue;
        const A count = static_cast<A>((wh.hi - wh.lo) * (ww.hi - ww.lo));
        const Vec<T, V> v = *reinterpret_cast<const Vec<T, V>*>(gn + (oh * out_w + ow) * C);
#pragma unroll
        for (int u = 0; u < V; ++u) sum[u] += to_acc(v.v[u]) / count;
      }
    }
    Vec<T, V> out;
#pragma unroll
    for (int u = 0; u < V; ++u) out.v[u] = from_acc<T>(sum[u]);
    reinterpret_cast<Vec<T, V>*>(dx)[i] = out;
  }
}

void adaptive_avg_pool_grad_nhwc(KernelContext& ctx) {
  const TensorView &dy = ctx.in(0), &dx = ctx.out(0);
  const PoolGeom g = pool_geom(nchw_of(dx.shape), nchw_of(dy.shape));
  const int64_t C = dx.shape[3];
  if (dx.numel() == 0) return;
  dispatch_float(dx.dtype, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    nhwc_width<T>(C, {dy.data, dx.data}, [&](auto width) {
      constexpr int W = decltype(width)::value;
      const int64_t packs = dx.numel() / W;
      adaptive_avg_pool_grad_nhwc_kernel<T, W><<<blocks_for(packs), kThreads, 0, stream_of(ctx)>>>(
          dy.ptr<T>(), dx.ptr<T>(), packs, g, static_cast<int>(C));
    });
  });
  check_launch(ctx.op_name());
}

void avg_pool_grad(KernelContext& ctx) {
  PoolParams spare;
  const PoolParams& p = params_of(ctx, spare);
  avg_pool_grad_impl<false>(ctx, pool_geom(p, ctx.out(0).shape, ctx.in(0).shape),
                            p.count_include_pad);
}
void adaptive_avg_pool_grad(KernelContext& ctx) {
  avg_pool_grad_impl<true>(ctx, grad_geom(ctx), false);
}

// dx (zeroed) += dy at the recorded in-plane indices; out-of-range indices are skipped and
// reported (ValueError after the run, as on the CPU).
template <typename T, typename I, typename D>
__global__ void max_pool_grad_scatter(const T* dy, const I* idx, D* dx, int64_t n,
                                      int64_t out_plane, int64_t in_plane, int64_t* err) {
  for (int64_t o = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; o < n;
       o += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const auto i = static_cast<uint64_t>(static_cast<int64_t>(idx[o]));
    if (i >= static_cast<uint64_t>(in_plane))
      report_bad_value(err, o, static_cast<int64_t>(idx[o]));
    else
      atomicAdd(dx + (o / out_plane) * in_plane + static_cast<int64_t>(i),
                static_cast<D>(to_acc(dy[o])));
  }
}

template <typename T> __global__ void narrow_kernel(const float* src, T* dst, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dst[i] = from_acc<T>(src[i]);
}

// channels_last: dy and the indices (N, OH, OW, C), dx (N, H, W, C); element o of dy (channel
// o % C of sample o / (out_plane * C)) lands at dx's position idx[o] of its sample and channel.
template <typename T, typename I, typename D>
__global__ void max_pool_grad_nhwc_scatter(const T* dy, const I* idx, D* dx, int64_t n, int64_t C,
                                           int64_t out_plane, int64_t in_plane, int64_t* err) {
  for (int64_t o = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; o < n;
       o += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const auto i = static_cast<uint64_t>(static_cast<int64_t>(idx[o]));
    if (i >= static_cast<uint64_t>(in_plane)) {
      report_bad_value(err, o, static_cast<int64_t>(idx[o]));
      continue;
    }
    const int64_t sample = o / (out_plane * C), c = o % C;
    atomicAdd(dx + (sample * in_plane + static_cast<int64_t>(i)) * C + c,
              static_cast<D>(to_acc(dy[o])));
  }
}

// Deterministic max-pool gradient: a thread per plane (NHWC: per sample and channel; C is 1 for
// NCHW) adds dy into dx (zeroed) at the recorded in-plane indices in output order, as the CPU
// does; out-of-range indices are skipped and reported.
template <typename T, typename I, typename D>
__global__ void max_pool_grad_ordered(const T* dy, const I* idx, D* dx, int64_t lines, int64_t C,
                                      int64_t out_plane, int64_t in_plane, int64_t* err) {
  for (int64_t l = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; l < lines;
       l += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t first = l / C * out_plane * C + l % C;  // dy index of the line's output 0
    const int64_t base = l / C * in_plane * C + l % C;    // dx index of its input 0
    for (int64_t r = 0; r < out_plane; ++r) {
      const int64_t o = first + r * C, v = static_cast<int64_t>(idx[o]);
      if (static_cast<uint64_t>(v) >= static_cast<uint64_t>(in_plane)) report_bad_value(err, o, v);
      else dx[base + v * C] += static_cast<D>(to_acc(dy[o]));
    }
  }
}

// kNhwc: the Layout::channels_last kernel (dy, the indices and dx (N, H, W, C)).
template <bool kNhwc> void max_pool_grad_impl(KernelContext& ctx) {
  const TensorView &dy = ctx.in(0), &idx = ctx.in(1), &dx = ctx.out(0);
  const int64_t n_in = dx.numel(), n_out = dy.numel();
  if (n_in == 0) return;
  const PoolGeom g = kNhwc ? pool_geom(nchw_of(dx.shape), nchw_of(dy.shape)) : grad_geom(ctx);
  describe_errors(ctx, ErrorKind::plane_index, 0, g.in_plane());
  cudaStream_t stream = stream_of(ctx);
  dispatch_float(dy.dtype, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    // half types accumulate in a float buffer, rounded once at the end
    using D = std::conditional_t<std::is_same_v<acc_t<T>, T>, T, float>;
    D* acc = std::is_same_v<D, T> ? reinterpret_cast<D*>(dx.ptr<T>())
                                  : static_cast<D*>(ctx.scratch(n_in * sizeof(D)));
    KILN_CUDA_CHECK(cudaMemsetAsync(acc, 0, n_in * sizeof(D), stream));
    if (n_out > 0)
      dispatch_index(idx.dtype, ctx.op_name(), [&](auto it) {
        using I = decltype(it);
        if (ctx.deterministic()) {
          const int64_t C = kNhwc ? dy.shape[3] : 1, lines = n_in / g.in_plane();
          max_pool_grad_ordered<T, I, D><<<blocks_for(lines, 64), 64, 0, stream>>>(
              dy.ptr<T>(), idx.ptr<I>(), acc, lines, C, g.out_plane(), g.in_plane(),
              ctx.error_slot());
        } else if (kNhwc) {
          max_pool_grad_nhwc_scatter<T, I, D><<<blocks_for(n_out), kThreads, 0, stream>>>(
              dy.ptr<T>(), idx.ptr<I>(), acc, n_out, dy.shape[3], g.out_plane(), g.in_plane(),
              ctx.error_slot());
        } else {
          max_pool_grad_scatter<T, I, D><<<blocks_for(n_out), kThreads, 0, stream>>>(
              dy.ptr<T>(), idx.ptr<I>(), acc, n_out, g.out_plane(), g.in_plane(), ctx.error_slot());
        }
        check_launch(ctx.op_name());
      });
    if constexpr (!std::is_same_v<D, T>)
      narrow_kernel<T><<<blocks_for(n_in), kThreads, 0, stream>>>(acc, dx.ptr<T>(), n_in);
  });
  check_launch(ctx.op_name());
}
void max_pool_grad(KernelContext& ctx) { max_pool_grad_impl<false>(ctx); }
void max_pool_grad_nhwc(KernelContext& ctx) { max_pool_grad_impl<true>(ctx); }

}  // namespace

void register_pool_grad_kernels() {
  const DTypeSet floats{f32, f64, f16, bf16};
  register_kernel(OpId::MaxPoolGrad, Backend::cuda,
                  {max_pool_grad, floats, 0, false,
                   /*reports_errors=*/true});
  register_kernel(OpId::AvgPoolGrad, Backend::cuda, {avg_pool_grad, floats, 0, false});
  register_kernel(OpId::AdaptiveAvgPoolGrad, Backend::cuda,
                  {adaptive_avg_pool_grad, floats, 0, false});
  register_kernel(OpId::MaxPoolGrad, Backend::cuda, Layout::channels_last,
                  {max_pool_grad_nhwc, floats, 0, false,
                   /*reports_errors=*/true});
  register_kernel(OpId::AdaptiveAvgPoolGrad, Backend::cuda, Layout::channels_last,
                  {adaptive_avg_pool_grad_nhwc, floats, 0, false});
}

}  // namespace kiln::cuda
