// Pieces of the CUDA attention kernels shared by the forward (attention.cu) and the backward
// (attention_backward.cu): the arguments, the device helpers of the warp-per-row kernels and the
// host's launch helpers. Included by .cu files only.
#pragma once

#include <cstdint>
#include <limits>
#include <type_traits>

#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/mma_util.cuh"
#include "ops/attention_params.h"
#include "ops/attention_util.h"

namespace kiln::cuda::attention_detail {

constexpr int kWarps = 8;      // query (or key) rows per block
constexpr int kMaxTile = 32;   // keys (or queries) per shared tile: one per lane
constexpr int kMaxChunks = 8;  // output dims per lane and launch (32 * 8 = 256 per slice)

template <typename C> __device__ inline C warp_max(C v) {
  for (int o = 16; o > 0; o >>= 1) v = fmax(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
template <typename C> __device__ inline C warp_sum(C v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
template <typename C> __device__ inline C neg_inf() { return -std::numeric_limits<C>::infinity(); }
template <typename C> __device__ inline C exp_of(C x) {
  if constexpr (std::is_same_v<C, double>) return exp(x);
  else return expf(x);
}

// An odd row stride (in elements) >= n: lanes reading one column of different rows of a shared
// tile hit different banks.
__host__ __device__ inline int padded(int64_t n) { return static_cast<int>(n | 1); }

template <typename T> struct Args {
  const T *q, *k, *v, *dout, *out;
  const bool* bmask;  // keep-mask, or nullptr
  const T* amask;     // additive mask, or nullptr
  attention::MaskLayout ml;
  int64_t batch, lq, lk, e, ev;
  double scale;
  bool causal;
  int tile;  // keys (queries) per shared tile, <= kMaxTile
};

// The score of query i (row qs in shared memory) and key j (row ks), or -inf where hidden.
template <typename T, typename C> __device__ inline C score(const Args<T>& a, int64_t moff,
                                                            int64_t i, int64_t j, const C* qs,
                                                            const C* ks) {
  if (j >= a.lk || i >= a.lq || (a.causal && j > i)) return neg_inf<C>();
  const int64_t mo = moff + i * a.ml.sq + j * a.ml.sk;
  if (a.bmask && !a.bmask[mo]) return neg_inf<C>();
  C s = 0;
  for (int64_t d = 0; d < a.e; ++d) s += qs[d] * ks[d];
  s *= static_cast<C>(a.scale);
  if (a.amask) s += static_cast<C>(to_acc(a.amask[mo]));
  return s;
}

// Loads rows [r0, r0 + n) of the (rows, len) matrix x (batch b) into shared memory with row
// stride ld, as C; rows past `rows` become zeros. Whole block.
template <typename T, typename C>
__device__ inline void load_rows(C* dst, int ld, const T* x, int64_t b, int64_t rows, int64_t len,
                                 int64_t r0, int n, int64_t c0 = 0, int64_t clen = -1) {
  if (clen < 0) clen = len;
  for (int64_t t = threadIdx.x; t < n * clen; t += blockDim.x) {
    const int64_t r = t / clen, c = t % clen;
    dst[r * ld + c] =
        r0 + r < rows ? static_cast<C>(to_acc(x[(b * rows + r0 + r) * len + c0 + c])) : C(0);
  }
}

// ---- host side ----

template <typename T> Args<T> args_of(const KernelContext& ctx, int iq) {
  const TensorView &tq = ctx.in(iq), &tk = ctx.in(iq + 1), &tv = ctx.in(iq + 2);
  const int r = tq.rank();
  Args<T> a{};
  a.q = tq.ptr<T>();
  a.k = tk.ptr<T>();
  a.v = tv.ptr<T>();
  a.lq = tq.shape[r - 2];
  a.e = tq.shape[r - 1];
  a.lk = tk.shape[r - 2];
  a.ev = tv.shape[r - 1];
  const Shape batch(tq.shape.begin(), tq.shape.end() - 2);
  a.batch = numel(batch);
  const AttentionParams p = params_of<AttentionParams>(ctx);
  a.scale = p.scale_for(a.e);
  a.causal = p.causal;
  if (p.has_mask) {
    const TensorView& m = ctx.in(iq == 0 ? 3 : 5);  // the grad op: after dout, q, k, v, out
    if (m.dtype == DType::boolean) a.bmask = m.ptr<bool>();
    else a.amask = m.ptr<T>();
    if (!attention::mask_layout(m.shape, batch, a.lq, a.lk, a.ml))
      fail<UnsupportedError>("[{}] at most {} batch dims on CUDA, got q shape {}", ctx.op_name(),
                             attention::kMaxBatchRank, to_string(tq.shape));
  }
  return a;
}

// The opt-in shared memory per block of `device` (attention.cu).
int smem_limit(int device);

// The largest tile (32, 16, ..., 1) whose shared memory `bytes(tile)` fits; throws when none.
template <typename F> int pick_tile(const KernelContext& ctx, F&& bytes, size_t& out) {
  const size_t limit = static_cast<size_t>(smem_limit(ctx.device()));
  for (int t = kMaxTile; t >= 1; t /= 2)
    if ((out = bytes(t)) <= limit) return t;
  fail<UnsupportedError>(
      "[{}] head dims of q {} and v {} need more shared memory than the "
      "device has",
      ctx.op_name(), to_string(ctx.in(0).shape), to_string(ctx.in(2).shape));
}

// Launches kernel<kChunks> for the smallest kChunks covering `dn` dims (at most kMaxChunks).
template <template <int> class K, typename F> void with_chunks(int dn, F&& launch) {
  if (dn <= 32) launch(K<1>{});
  else if (dn <= 64) launch(K<2>{});
  else if (dn <= 128) launch(K<4>{});
  else launch(K<8>{});
}
template <int N> struct Chunks { static constexpr int value = N; };

template <typename Kernel, typename... A> void launch_with_smem(Kernel kernel, size_t smem,
                                                                unsigned blocks, cudaStream_t s,
                                                                const char* op, const A&... args) {
  allow_smem(kernel, smem);
  kernel<<<blocks, kWarps * 32, smem, s>>>(args...);
  check_launch(op);
}

// attention_backward.cu
void scaled_dot_product_attention_grad(KernelContext& ctx);

}  // namespace kiln::cuda::attention_detail
