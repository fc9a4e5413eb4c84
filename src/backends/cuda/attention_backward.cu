// CUDA kernels of scaled_dot_product_attention_grad; the forward kernels are in attention.cu.
//
// Backward (recomputing the probabilities, flash-attention style): kernel 1 (warp per query row)
// recomputes the row's log-sum-exp, D = dO·O, and dq (or the mask's gradient); kernel 2 (warp per
// key row) streams over query tiles for dk and dv. A query that sees no key outputs zeros and
// passes no gradient.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "backends/cuda/attention_internal.cuh"

namespace kiln::cuda {

namespace {

using namespace attention_detail;

// ---- backward, kernel 1: per query row ----

template <typename T, typename C, int kChunks>
__global__ void backward_q_kernel(Args<T> a, T* dq, T* dmask, C* lse, C* dd, int64_t d0, int dn,
                                  int64_t row_blocks) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  C* smem = reinterpret_cast<C*>(smem_raw);
  const int lde = padded(a.e), ldv = padded(a.ev);
  C* qs = smem;                // [kWarps][lde]
  C* dos = qs + kWarps * lde;  // [kWarps][ldv]
  C* ks = dos + kWarps * ldv;  // [tile][lde]
  C* vs = ks + a.tile * lde;   // [tile][ldv]
  C* ps = vs + a.tile * ldv;   // [kWarps][tile]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t b = blockIdx.x / row_blocks, i0 = (blockIdx.x % row_blocks) * kWarps;
  const int64_t i = i0 + warp, row = b * a.lq + i;
  const int64_t moff = (a.bmask || a.amask) ? a.ml.batch_offset(b) : 0;
  load_rows<T, C>(qs, lde, a.q, b, a.lq, a.e, i0, kWarps);
  load_rows<T, C>(dos, ldv, a.dout, b, a.lq, a.ev, i0, kWarps);
  __syncthreads();
  const int64_t kend = a.causal ? min(a.lk, i0 + kWarps) : a.lk;
  // pass 1: the row's max and sum
  C m = neg_inf<C>(), l = 0;
  for (int64_t j0 = 0; j0 < kend; j0 += a.tile) {
    __syncthreads();
    load_rows<T, C>(ks, lde, a.k, b, a.lk, a.e, j0, a.tile);
    __syncthreads();
    const C s = lane < a.tile ? score(a, moff, i, j0 + lane, qs + warp * lde, ks + lane * lde)
                              : neg_inf<C>();
    const C mn = fmax(m, warp_max(s));
    if (mn == neg_inf<C>()) continue;
    const C alpha = m == neg_inf<C>() ? C(0) : exp_of(m - mn);
    l = l * alpha + warp_sum(s == neg_inf<C>() ? C(0) : exp_of(s - mn));
    m = mn;
  }
  const C ls = m == neg_inf<C>() ? std::numeric_limits<C>::infinity() : m + log(l);
  C di = 0;
  if (i < a.lq) {
    for (int64_t d = lane; d < a.ev; d += 32)
      di += dos[warp * ldv + d] * static_cast<C>(to_acc(a.out[row * a.ev + d]));
  }
  di = warp_sum(di);
  if (i < a.lq && lane == 0 && d0 == 0) {
    lse[row] = ls;
    dd[row] = di;
  }
  // pass 2: ds_ij = p_ij (dO_i · v_j - D_i); dq_i += scale ds_ij k_j
  C acc[kChunks];
#pragma unroll
  for (int c = 0; c < kChunks; ++c) acc[c] = 0;
  for (int64_t j0 = 0; j0 < kend; j0 += a.tile) {
    __syncthreads();
    load_rows<T, C>(ks, lde, a.k, b, a.lk, a.e, j0, a.tile);
    load_rows<T, C>(vs, ldv, a.v, b, a.lk, a.ev, j0, a.tile);
    __syncthreads();
    C ds = 0;
    if (lane < a.tile) {
      const C s = score(a, moff, i, j0 + lane, qs + warp * lde, ks + lane * lde);
      const C p = s == neg_inf<C>() ? C(0) : exp_of(s - ls);
      if (p != C(0)) {
        C dp = 0;
        for (int64_t d = 0; d < a.ev; ++d) dp += dos[warp * ldv + d] * vs[lane * ldv + d];
        ds = p * (dp - di);
      }
      if (dmask && i < a.lq && j0 + lane < a.lk) dmask[row * a.lk + j0 + lane] = from_acc<T>(ds);
      ps[warp * a.tile + lane] = ds;
    }
    __syncwarp();
    if (dq) {
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        const int d = lane + 32 * c;
        if (d < dn)
          for (int jj = 0; jj < a.tile; ++jj)
            acc[c] += ps[warp * a.tile + jj] * ks[jj * lde + d0 + d];
      }
    }
    __syncwarp();
  }
  if (i >= a.lq) return;
  if (dmask)  // keys past the causal end of this block
    for (int64_t j = kend + lane; j < a.lk; j += 32) dmask[row * a.lk + j] = from_acc<T>(C(0));
  if (!dq) return;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int d = lane + 32 * c;
    if (d < dn) dq[row * a.e + d0 + d] = from_acc<T>(acc[c] * static_cast<C>(a.scale));
  }
}

// ---- backward, kernel 2: per key row ----

template <typename T, typename C, int kChunks>
__global__ void backward_kv_kernel(Args<T> a, T* dk, T* dv, const C* lse, const C* dd, int64_t d0,
                                   int dn, int64_t row_blocks) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  C* smem = reinterpret_cast<C*>(smem_raw);
  const int lde = padded(a.e), ldv = padded(a.ev);
  C* ks = smem;                   // [kWarps][lde]
  C* vs = ks + kWarps * lde;      // [kWarps][ldv]
  C* qs = vs + kWarps * ldv;      // [tile][lde]
  C* dos = qs + a.tile * lde;     // [tile][ldv]
  C* ps = dos + a.tile * ldv;     // [kWarps][tile]
  C* dss = ps + kWarps * a.tile;  // [kWarps][tile]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t b = blockIdx.x / row_blocks, j0b = (blockIdx.x % row_blocks) * kWarps;
  const int64_t j = j0b + warp;
  const int64_t moff = (a.bmask || a.amask) ? a.ml.batch_offset(b) : 0;
  load_rows<T, C>(ks, lde, a.k, b, a.lk, a.e, j0b, kWarps);
  load_rows<T, C>(vs, ldv, a.v, b, a.lk, a.ev, j0b, kWarps);
  C accv[kChunks], acck[kChunks];
#pragma unroll
  for (int c = 0; c < kChunks; ++c) accv[c] = acck[c] = 0;
  const int64_t istart = a.causal ? min(j0b, a.lq) : 0;
  for (int64_t i0 = istart; i0 < a.lq; i0 += a.tile) {
    __syncthreads();
    load_rows<T, C>(qs, lde, a.q, b, a.lq, a.e, i0, a.tile);
    load_rows<T, C>(dos, ldv, a.dout, b, a.lq, a.ev, i0, a.tile);
    __syncthreads();
    C p = 0, ds = 0;
    const int64_t i = i0 + lane;
    if (lane < a.tile && i < a.lq && j < a.lk) {
      const C s = score(a, moff, i, j, qs + lane * lde, ks + warp * lde);
      const int64_t row = b * a.lq + i;
      p = s == neg_inf<C>() ? C(0) : exp_of(s - lse[row]);
      if (p != C(0)) {
        C dp = 0;
        for (int64_t d = 0; d < a.ev; ++d) dp += dos[lane * ldv + d] * vs[warp * ldv + d];
        ds = p * (dp - dd[row]);
      }
    }
    if (lane < a.tile) {
      ps[warp * a.tile + lane] = p;
      dss[warp * a.tile + lane] = ds;
    }
    __syncwarp();
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const int d = lane + 32 * c;
      if (d >= dn) continue;
      if (d0 + d < a.ev)
        for (int ii = 0; ii < a.tile; ++ii)
          accv[c] += ps[warp * a.tile + ii] * dos[ii * ldv + d0 + d];
      if (d0 + d < a.e)
        for (int ii = 0; ii < a.tile; ++ii)
          acck[c] += dss[warp * a.tile + ii] * qs[ii * lde + d0 + d];
    }
    __syncwarp();
  }
  if (j >= a.lk) return;
  const int64_t row = b * a.lk + j;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int64_t d = d0 + lane + 32 * c;
    if (lane + 32 * c >= dn) continue;
    if (d < a.ev) dv[row * a.ev + d] = from_acc<T>(accv[c]);
    if (d < a.e) dk[row * a.e + d] = from_acc<T>(acck[c] * static_cast<C>(a.scale));
  }
}

template <typename T> void backward(KernelContext& ctx) {
  using C = std::conditional_t<std::is_same_v<T, double>, double, float>;
  Args<T> a = args_of<T>(ctx, 1);
  a.dout = ctx.in(0).ptr<T>();
  a.out = ctx.in(4).ptr<T>();
  const bool mask_grad = params_of<AttentionParams>(ctx).mask_grad;
  T* dq = mask_grad ? nullptr : ctx.out(0).ptr<T>();
  T* dmask = mask_grad ? ctx.out(0).ptr<T>() : nullptr;
  const int64_t rows = a.batch * a.lq;
  if (!mask_grad && a.batch * a.lk > 0) {  // keys no query sees still need zero gradients
    if (rows == 0) {
      KILN_CUDA_CHECK(
          cudaMemsetAsync(ctx.out(1).data, 0, ctx.out(1).numel() * sizeof(T), stream_of(ctx)));
      KILN_CUDA_CHECK(
          cudaMemsetAsync(ctx.out(2).data, 0, ctx.out(2).numel() * sizeof(T), stream_of(ctx)));
    }
  }
  if (rows == 0) return;
  C* lse = static_cast<C*>(ctx.scratch(rows * sizeof(C)));
  C* dd = static_cast<C*>(ctx.scratch(rows * sizeof(C)));
  const int64_t slice = 32 * kMaxChunks;
  const int lde = padded(a.e), ldv = padded(a.ev);
  // kernel 1 over slices of dq's dims (one launch when only the mask's gradient is wanted)
  {
    const int64_t row_blocks = (a.lq + kWarps - 1) / kWarps;
    const int64_t dims = mask_grad ? 1 : std::max<int64_t>(a.e, 1);
    for (int64_t d0 = 0; d0 < dims; d0 += slice) {
      const int dn = mask_grad ? 0 : static_cast<int>(std::min<int64_t>(slice, a.e - d0));
      size_t smem = 0;
      a.tile = pick_tile(
          ctx,
          [&](int t) { return sizeof(C) * (kWarps * (lde + ldv) + t * (lde + ldv) + kWarps * t); },
          smem);
      T* dmask_here = d0 == 0 ? dmask : nullptr;
      with_chunks<Chunks>(std::max(dn, 1), [&](auto ch) {
        constexpr int kc = decltype(ch)::value;
        launch_with_smem(backward_q_kernel<T, C, kc>, smem,
                         static_cast<unsigned>(a.batch * row_blocks), stream_of(ctx), ctx.op_name(),
                         a, dq, dmask_here, lse, dd, d0, dn, row_blocks);
      });
    }
  }
  if (mask_grad || a.lk == 0) return;
  T *dk = ctx.out(1).ptr<T>(), *dv = ctx.out(2).ptr<T>();
  const int64_t row_blocks = (a.lk + kWarps - 1) / kWarps;
  const int64_t dims = std::max(a.e, a.ev);
  for (int64_t d0 = 0; d0 < dims; d0 += slice) {
    const int dn = static_cast<int>(std::min<int64_t>(slice, dims - d0));
    size_t smem = 0;
    a.tile = pick_tile(
        ctx,
        [&](int t) {
          return sizeof(C) * (kWarps * (lde + ldv) + t * (lde + ldv) + 2 * kWarps * t);
        },
        smem);
    with_chunks<Chunks>(dn, [&](auto ch) {
      constexpr int kc = decltype(ch)::value;
      launch_with_smem(backward_kv_kernel<T, C, kc>, smem,
                       static_cast<unsigned>(a.batch * row_blocks), stream_of(ctx), ctx.op_name(),
                       a, dk, dv, static_cast<const C*>(lse), static_cast<const C*>(dd), d0, dn,
                       row_blocks);
    });
  }
}

}  // namespace

namespace attention_detail {

void scaled_dot_product_attention_grad(KernelContext& ctx) {
  dispatch_float(ctx.in(1).dtype, ctx.op_name(), [&](auto t) { backward<decltype(t)>(ctx); });
}

}  // namespace attention_detail

}  // namespace kiln::cuda
