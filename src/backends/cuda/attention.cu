// CUDA kernels of scaled_dot_product_attention and its gradient, kiln's own flash-style kernels:
// one pass over K/V tiles with an online softmax, never forming the (Lq, Lk) scores.
//
// Forward: a block of kWarps warps owns kWarps query rows (one per warp) of one batch entry; the
// block stages a tile of up to 32 keys and values in shared memory (as float; double for f64),
// each lane scores one key of the tile, the warp updates its running max, sum and output
// accumulator (lanes own output dims, in registers). f16/bf16 load and store in their type and
// compute in float. Output dims beyond 32·kChunks run as further launches over dim slices.
//
// Forward on tensor cores (f16/bf16, head dims e == ev of 32, 64 or 128), flash-attention-2
// style: a block of 4 warps owns 64 query rows and streams over tiles of 64 keys, staged one tile
// ahead with asynchronous copies; each warp owns 16 of the rows. S = Q Kᵀ and O += P V run as
// mma.sync m16n8k16 products with float accumulation, operands from ldmatrix; scores,
// probabilities and the output accumulator never leave registers (S's accumulator fragments,
// rounded to the input type, are the A fragments of P V). Softmax runs in base 2.
//
// Forward in f32 (head dims e == ev of 32, 64 or 128): register tiles, a block of 256 threads
// owning 64 query rows and streaming over tiles of 64 keys; each thread scores 4 x 4 (query, key)
// pairs from float4 reads of shared memory and accumulates O += P V for 4 rows and D / 16 output
// dims (the probabilities pass through shared memory). KILN_ATTENTION_F32_TILES=0 turns it off.
//
// The backward kernels (scaled_dot_product_attention_grad) are in attention_backward.cu.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <map>
#include <mutex>
#include <type_traits>
#include <utility>

#include "backends/cuda/attention_internal.cuh"
#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/kernels.h"
#include "backends/cuda/mma_util.cuh"
#include "ops/attention_util.h"

namespace kiln::cuda {

namespace attention_detail {

int smem_limit(int device) {
  int v = 0;
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  return v;
}

}  // namespace attention_detail

namespace {

using namespace attention_detail;

// ---- forward ----

template <typename T, typename C, int kChunks>
__global__ void forward_kernel(Args<T> a, T* out, int64_t d0, int dn, int64_t row_blocks) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  C* smem = reinterpret_cast<C*>(smem_raw);
  const int lde = padded(a.e);
  C* qs = smem;                             // [kWarps][lde]
  C* ks = qs + kWarps * lde;                // [tile][lde]
  C* vs = ks + a.tile * lde;                // [tile][dn]
  C* ps = vs + a.tile * dn;                 // [kWarps][tile]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t b = blockIdx.x / row_blocks, i0 = (blockIdx.x % row_blocks) * kWarps;
  const int64_t i = i0 + warp;
  const int64_t moff = (a.bmask || a.amask) ? a.ml.batch_offset(b) : 0;
  load_rows<T, C>(qs, lde, a.q, b, a.lq, a.e, i0, kWarps);
  C m = neg_inf<C>(), l = 0, acc[kChunks];
#pragma unroll
  for (int c = 0; c < kChunks; ++c) acc[c] = 0;
  const int64_t kend = a.causal ? min(a.lk, i0 + kWarps) : a.lk;
  for (int64_t j0 = 0; j0 < kend; j0 += a.tile) {
    __syncthreads();  // previous tile consumed
    load_rows<T, C>(ks, lde, a.k, b, a.lk, a.e, j0, a.tile);
    load_rows<T, C>(vs, dn, a.v, b, a.lk, a.ev, j0, a.tile, d0, dn);
    __syncthreads();
    const C s = lane < a.tile ? score(a, moff, i, j0 + lane, qs + warp * lde, ks + lane * lde)
                              : neg_inf<C>();
    const C mn = fmax(m, warp_max(s));
    if (mn == neg_inf<C>()) continue;  // nothing visible yet (uniform over the warp)
    const C alpha = m == neg_inf<C>() ? C(0) : exp_of(m - mn);
    const C p = s == neg_inf<C>() ? C(0) : exp_of(s - mn);
    l = l * alpha + warp_sum(p);
    m = mn;
    if (lane < a.tile) ps[warp * a.tile + lane] = p;
    __syncwarp();
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const int d = lane + 32 * c;
      C sum = 0;
      if (d < dn)
        for (int jj = 0; jj < a.tile; ++jj) sum += ps[warp * a.tile + jj] * vs[jj * dn + d];
      acc[c] = acc[c] * alpha + sum;
    }
    __syncwarp();
  }
  if (i >= a.lq) return;
  const C inv = l > 0 ? C(1) / l : C(0);
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int d = lane + 32 * c;
    if (d < dn) out[(b * a.lq + i) * a.ev + d0 + d] = from_acc<T>(acc[c] * inv);
  }
}

// ---- forward on tensor cores ----

constexpr int kTcRows = 64;   // query rows per block (16 per warp)
constexpr int kTcKeys = 64;   // keys per tile
constexpr int kTcWarps = 4;

// Shared-memory layout of the tensor-core kernel: q (kTcRows rows) and two stages of k and v
// (kTcKeys rows each), rows of D 16-bit values padded by 16 bytes, so that the 8 row addresses
// of an ldmatrix fall in different banks.
template <int D> struct TcLayout {
  static constexpr int ld = D + 8;  // elements
  static constexpr size_t q = 0;
  static constexpr size_t k = q + 2 * kTcRows * ld;           // bytes; two stages
  static constexpr size_t v = k + 2 * 2 * kTcKeys * ld;       // two stages
  static constexpr size_t bytes = v + 2 * 2 * kTcKeys * ld;
  static constexpr size_t stage = 2 * kTcKeys * ld;           // bytes of one k (or v) stage
};

// c (16x8, float) += a (16x16) * b (16x8), 16-bit inputs. Fragments: a0 (row g, cols 2t, 2t+1),
// a1 (row g+8), a2 (row g, cols 8+2t..), a3 (row g+8, cols 8+2t..); b0 (rows 2t, 2t+1, col g),
// b1 (rows 8+2t..); c0, c1 (row g, cols 2t, 2t+1), c2, c3 (row g+8); g = lane/4, t = lane%4.
template <typename T>
__device__ __forceinline__ void mma16816(float (&c)[4], const unsigned (&a)[4], unsigned b0,
                                         unsigned b1) {
  if constexpr (std::is_same_v<T, half>)
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats as two 16-bit values in one register (lo in the low half).
template <typename T> __device__ __forceinline__ unsigned pack2(float lo, float hi) {
  if constexpr (std::is_same_v<T, half>) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const unsigned*>(&h);
  } else {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const unsigned*>(&h);
  }
}

// Starts the copies of rows [r0, r0 + n) of the contiguous (rows, D) matrix x of batch entry b
// into shared memory with row stride ld; rows past `rows` become zeros. Whole block.
template <typename T, int D>
__device__ inline void stage_rows(T* dst, const T* x, int64_t b, int64_t rows, int64_t r0,
                                  int n) {
  constexpr int kVec = 8, kLd = D + 8;  // 16-bit values per 16 bytes
  for (int t = threadIdx.x; t < n * (D / kVec); t += blockDim.x) {
    const int r = t / (D / kVec), c = (t % (D / kVec)) * kVec;
    const bool in = r0 + r < rows;
    const T* src = x + (b * rows + (in ? r0 + r : 0)) * D + c;
    cp_async16(dst + r * kLd + c, src, in ? 16 : 0);
  }
}

// Score v of query i and key j (in log2 units) with the masks applied: -inf for a key past lk,
// after i (causal) or hidden by the keep-mask; the additive mask added (in log2 units).
template <typename T>
__device__ __forceinline__ float masked_log2(const Args<T>& a, int64_t moff, int64_t i, int64_t j,
                                             float v) {
  if (j >= a.lk || (a.causal && j > i)) return -INFINITY;
  if ((a.bmask || a.amask) && i < a.lq) {
    const int64_t mo = moff + i * a.ml.sq + j * a.ml.sk;
    if (a.bmask) return a.bmask[mo] ? v : -INFINITY;
    return v + static_cast<float>(to_acc(a.amask[mo])) * 1.4426950408889634f;
  }
  return v;
}

// A split of the keys over several blocks (flash decoding), for attentions of few query rows over
// many keys (a decode step over its cache): block x of `splits` takes keys [x·chunk, (x+1)·chunk)
// and writes its rows' unnormalized output (f32), running max (log2 units) and sum at
// ((b·splits + x)·lq + i); combine_kernel merges the splits.
struct Split {
  float *o, *m, *l;
  int64_t chunk;  // keys per split, a multiple of kTcKeys
  int splits;
};

// Flash attention on tensor cores (mma.sync m16n8k16): a block of 4 warps owns 64 query rows of
// one batch entry, each warp 16 of them, and streams over tiles of 64 keys and values, staged
// with asynchronous copies one tile ahead. The scores, probabilities and output accumulator stay
// in registers: S's accumulator fragments, rounded to T, are P's A fragments for O += P V. With
// kSplit the block takes one split of the keys.
template <typename T, int D, bool kSplit> __global__ void __launch_bounds__(kTcWarps * 32)
    forward_tc_kernel(Args<T> a, T* out, int64_t row_blocks, Split sp) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using L = TcLayout<D>;
  constexpr int kLd = L::ld, kN = kTcKeys / 8, kDn = D / 8, kDk = D / 16;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* qs = reinterpret_cast<T*>(smem_raw + L::q);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
  const int64_t blk = kSplit ? blockIdx.x / sp.splits : blockIdx.x;
  const int split = kSplit ? static_cast<int>(blockIdx.x % sp.splits) : 0;
  const int64_t b = blk / row_blocks, i0 = (blk % row_blocks) * kTcRows;
  const int64_t moff = (a.bmask || a.amask) ? a.ml.batch_offset(b) : 0;
  int64_t k0 = 0, kend = a.causal ? min(a.lk, i0 + kTcRows) : a.lk;
  if constexpr (kSplit) {
    k0 = split * sp.chunk;
    kend = min(kend, k0 + sp.chunk);
  }
  int tiles = kend > k0 ? static_cast<int>((kend - k0 + kTcKeys - 1) / kTcKeys) : 0;
  if constexpr (kSplit) {
    // a keep-mask that hides every key of the split from every row (the cache columns past a
    // sequence's length): nothing to read
    if (tiles > 0 && a.bmask) {
      const int64_t n = kend - k0, rows = min(int64_t{kTcRows}, a.lq - i0);
      bool any = false;
      for (int64_t t = threadIdx.x; t < rows * n && !any; t += blockDim.x) {
        const int64_t i = i0 + t / n, j = k0 + t % n;
        any = (!a.causal || j <= i) && a.bmask[moff + i * a.ml.sq + j * a.ml.sk];
      }
      if (!__syncthreads_or(any)) tiles = 0;
    }
  }
  auto ks = [&](int st) { return reinterpret_cast<T*>(smem_raw + L::k + st * L::stage); };
  auto vs = [&](int st) { return reinterpret_cast<T*>(smem_raw + L::v + st * L::stage); };
  stage_rows<T, D>(qs, a.q, b, a.lq, i0, kTcRows);
  if (tiles > 0) {
    stage_rows<T, D>(ks(0), a.k, b, a.lk, k0, kTcKeys);
    stage_rows<T, D>(vs(0), a.v, b, a.lk, k0, kTcKeys);
  }
  cp_async_commit();
  const float kLog2e = 1.4426950408889634f;
  const float scale = static_cast<float>(a.scale) * kLog2e;  // scores in log2 units
  const int64_t row[2] = {i0 + warp * 16 + g, i0 + warp * 16 + g + 8};
  float o[kDn][4];
#pragma unroll
  for (int n = 0; n < kDn; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  unsigned fq[kDk][4];
  for (int j = 0; j < tiles; ++j) {
    const int st = j & 1;
    if (j + 1 < tiles) {
      stage_rows<T, D>(ks(st ^ 1), a.k, b, a.lk, k0 + (j + 1) * int64_t{kTcKeys}, kTcKeys);
      stage_rows<T, D>(vs(st ^ 1), a.v, b, a.lk, k0 + (j + 1) * int64_t{kTcKeys}, kTcKeys);
    }
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    if (j == 0) {
#pragma unroll
      for (int kk = 0; kk < kDk; ++kk)
        ldmatrix_x4(fq[kk], qs + (warp * 16 + lane % 16) * kLd + kk * 16 + (lane / 16) * 8);
    }
    // S = Q Kᵀ: n-tiles of 8 keys; one ldmatrix.x4 gives b0, b1 of two n-tiles
    float s[kN][4];
#pragma unroll
    for (int n = 0; n < kN; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
    const T* kt = ks(st);
#pragma unroll
    for (int kk = 0; kk < kDk; ++kk) {
#pragma unroll
      for (int n = 0; n < kN; n += 2) {
        unsigned bk[4];
        const int mtx = lane / 8;
        ldmatrix_x4(bk, kt + (n * 8 + (mtx / 2) * 8 + lane % 8) * kLd + kk * 16 + (mtx % 2) * 8);
        mma16816<T>(s[n], fq[kk], bk[0], bk[1]);
        mma16816<T>(s[n + 1], fq[kk], bk[2], bk[3]);
      }
    }
    // scale, masks, online softmax (each row's values lie in the 4 lanes of a quad)
    const int64_t j0 = k0 + j * int64_t{kTcKeys};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t i = row[h];
      float mx = -INFINITY;
#pragma unroll
      for (int n = 0; n < kN; ++n) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int64_t jj = j0 + n * 8 + 2 * t4 + e;
          const float v = masked_log2(a, moff, i, jj, s[n][2 * h + e] * scale);
          s[n][2 * h + e] = v;
          mx = fmaxf(mx, v);
        }
      }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float mn = fmaxf(m[h], mx);
      const float base = mn == -INFINITY ? 0.f : mn;  // a row that sees no key yet: p = 0
      const float alpha = exp2f(m[h] - base);         // exp2(-inf) = 0 for the first keys
      m[h] = mn;
      float sum = 0.f;
#pragma unroll
      for (int n = 0; n < kN; ++n) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float p = exp2f(s[n][2 * h + e] - base);
          s[n][2 * h + e] = p;
          sum += p;
        }
      }
      l[h] = l[h] * alpha + sum;  // the lane's part of the row sum; summed over the quad at the end
#pragma unroll
      for (int n = 0; n < kDn; ++n) o[n][2 * h] *= alpha, o[n][2 * h + 1] *= alpha;
    }
    // O += P V: k-chunks of 16 keys; P's A fragment from two n-tiles of S
    const T* vt = vs(st);
#pragma unroll
    for (int kk = 0; kk < kN / 2; ++kk) {
      const unsigned pa[4] = {pack2<T>(s[2 * kk][0], s[2 * kk][1]),
                              pack2<T>(s[2 * kk][2], s[2 * kk][3]),
                              pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                              pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int n = 0; n < kDn; n += 2) {
        unsigned bv[4];
        const int mtx = lane / 8;
        ldmatrix_x4_trans(bv, vt + (kk * 16 + (mtx % 2) * 8 + lane % 8) * kLd + n * 8 +
                                  (mtx / 2) * 8);
        mma16816<T>(o[n], pa, bv[0], bv[1]);
        mma16816<T>(o[n + 1], pa, bv[2], bv[3]);
      }
    }
    __syncthreads();  // the stage is consumed before the next copies overwrite it
  }
  cp_async_wait<0>();
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float sum = l[h];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    const int64_t i = row[h];
    if (i >= a.lq) continue;
    if constexpr (kSplit) {
      const int64_t r = (b * sp.splits + split) * a.lq + i;
      if (t4 == 0) sp.m[r] = m[h], sp.l[r] = sum;
      float* po = sp.o + r * D + 2 * t4;
#pragma unroll
      for (int n = 0; n < kDn; ++n)
        *reinterpret_cast<float2*>(po + n * 8) = make_float2(o[n][2 * h], o[n][2 * h + 1]);
      continue;
    }
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
    T* dst = out + (b * a.lq + i) * D + 2 * t4;
#pragma unroll
    for (int n = 0; n < kDn; ++n)
      *reinterpret_cast<unsigned*>(dst + n * 8) =
          pack2<T>(o[n][2 * h] * inv, o[n][2 * h + 1] * inv);
  }
#endif
}

// Merges the splits of forward_tc_kernel<T, D, true>: a warp per query row, D / 32 dims per lane.
// A row that saw no key in any split is zeros, as without the split.
template <typename T, int D>
__global__ void combine_kernel(Split sp, T* out, int64_t rows, int64_t lq) {
  const int64_t r = blockIdx.x * int64_t{kTcWarps} + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;
  const int64_t b = r / lq, i = r % lq;
  auto at = [&](int x) { return (b * sp.splits + x) * lq + i; };
  float mx = -INFINITY;
  for (int x = 0; x < sp.splits; ++x) mx = fmaxf(mx, sp.m[at(x)]);
  float acc[D / 32] = {}, sum = 0.f;
  if (mx != -INFINITY) {
    for (int x = 0; x < sp.splits; ++x) {
      const float w = exp2f(sp.m[at(x)] - mx);  // 0 for a split that saw no key
      if (w == 0.f) continue;
      sum += w * sp.l[at(x)];
      const float* po = sp.o + at(x) * D;
#pragma unroll
      for (int c = 0; c < D / 32; ++c) acc[c] += w * po[c * 32 + lane];
    }
  }
  const float inv = sum > 0.f ? 1.f / sum : 0.f;
#pragma unroll
  for (int c = 0; c < D / 32; ++c) out[r * D + c * 32 + lane] = from_acc<T>(acc[c] * inv);
}

// The split over keys for `blocks` blocks of query rows over lk keys: none (splits 0) unless the
// blocks leave most of the GPU idle and the keys are many; then about two blocks per SM, of at
// least two key tiles each.
Split split_of(int64_t blocks, int64_t lk, int sms) {
  Split sp{};
  if (blocks >= sms || lk < 4 * kTcKeys) return sp;
  const int64_t want = (2 * sms + blocks - 1) / blocks;
  const int64_t per = (lk + want - 1) / want;
  sp.chunk = std::max<int64_t>(2 * kTcKeys, (per + kTcKeys - 1) / kTcKeys * kTcKeys);
  const int64_t n = (lk + sp.chunk - 1) / sp.chunk;
  sp.splits = n >= 2 ? static_cast<int>(n) : 0;
  return sp;
}

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Whether the tensor-core kernel takes this attention: 16-bit inputs, equal head dims of 32, 64
// or 128.
template <typename T> bool tensor_core_forward(const Args<T>& a) {
  if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bf16_t>)
    return a.e == a.ev && (a.e == 32 || a.e == 64 || a.e == 128) && aligned16(a.q) &&
           aligned16(a.k) && aligned16(a.v);
  else
    return false;
}

// ---- forward, f32, register tiles ----
//
// A block of 256 threads (a 16 x 16 grid: ty, tx) owns 64 query rows of one batch entry and
// streams over tiles of 64 keys and values in shared memory (rows of D + 4 floats: 16-byte
// copies, and the float4 reads below hit distinct banks). Thread (ty, tx) computes the scores of
// rows ty + 16 r and keys tx + 16 c (r, c < 4): each float4 of a query row it loads serves four
// keys and each of a key row four queries; then the online softmax of its rows (a row's 64
// scores lie in the 16 lanes of one half warp) and, through the tile's probabilities in shared
// memory, O += P V for its rows and the output columns D / 16 of them (float4s of V, 4 tx
// apart). Each S or PV product is 16 FMAs a thread for two loads of 16 bytes.
constexpr int kF32Rows = 64, kF32Keys = 64, kF32Threads = 256;

template <int D> struct F32Layout {
  static constexpr int ld = D + 4, ldp = kF32Keys + 16;  // floats a row (P: half warps apart)
  static constexpr int q = 0, k = q + kF32Rows * ld, v = k + kF32Keys * ld,
                       p = v + kF32Keys * ld, floats = p + kF32Rows * ldp;
  static constexpr size_t bytes = sizeof(float) * floats;
};

// Rows [r0, r0 + n) of the (rows, D) f32 matrix x of batch entry b into dst (row stride D + 4)
// by 16-byte asynchronous copies; rows past `rows` become zeros. Whole block.
template <int D>
__device__ inline void stage_f32_rows(float* dst, const float* x, int64_t b, int64_t rows,
                                      int64_t r0, int n) {
  for (int t = threadIdx.x; t < n * (D / 4); t += blockDim.x) {
    const int r = t / (D / 4), c = (t % (D / 4)) * 4;
    const bool in = r0 + r < rows;
    cp_async16(dst + r * (D + 4) + c, x + (b * rows + (in ? r0 + r : 0)) * D + c, in ? 16 : 0);
  }
}

template <int D>
__global__ void __launch_bounds__(kF32Threads)
    forward_f32_kernel(Args<float> a, float* out, int64_t row_blocks) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using L = F32Layout<D>;
  constexpr int kLd = L::ld, kLdp = L::ldp;
  constexpr int kCols = D / 16, kVec = kCols < 4 ? kCols : 4, kGroups = kCols / kVec;
  static_assert(kCols % kVec == 0 && (kVec == 2 || kVec == 4), "head dim");
  extern __shared__ __align__(16) float f32_smem[];
  float *qs = f32_smem + L::q, *ks = f32_smem + L::k, *vs = f32_smem + L::v,
        *ps = f32_smem + L::p;
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int64_t b = blockIdx.x / row_blocks, i0 = (blockIdx.x % row_blocks) * kF32Rows;
  const int64_t moff = (a.bmask || a.amask) ? a.ml.batch_offset(b) : 0;
  const int64_t kend = a.causal ? min(a.lk, i0 + kF32Rows) : a.lk;
  const float kLog2e = 1.4426950408889634f;
  const float scale = static_cast<float>(a.scale) * kLog2e;  // scores in log2 units
  stage_f32_rows<D>(qs, a.q, b, a.lq, i0, kF32Rows);
  float o[4][kCols], m[4], l[4];
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    m[r] = -INFINITY, l[r] = 0.f;
#pragma unroll
    for (int c = 0; c < kCols; ++c) o[r][c] = 0.f;
  }
  for (int64_t j0 = 0; j0 < kend; j0 += kF32Keys) {
    stage_f32_rows<D>(ks, a.k, b, a.lk, j0, kF32Keys);
    stage_f32_rows<D>(vs, a.v, b, a.lk, j0, kF32Keys);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    float s[4][4] = {};
#pragma unroll 4
    for (int d = 0; d < D; d += 4) {
      float4 qv[4], kv[4];
#pragma unroll
      for (int r = 0; r < 4; ++r)
        qv[r] = *reinterpret_cast<const float4*>(qs + (ty + 16 * r) * kLd + d);
#pragma unroll
      for (int c = 0; c < 4; ++c)
        kv[c] = *reinterpret_cast<const float4*>(ks + (tx + 16 * c) * kLd + d);
#pragma unroll
      for (int r = 0; r < 4; ++r)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          s[r][c] = fmaf(qv[r].x, kv[c].x, s[r][c]);
          s[r][c] = fmaf(qv[r].y, kv[c].y, s[r][c]);
          s[r][c] = fmaf(qv[r].z, kv[c].z, s[r][c]);
          s[r][c] = fmaf(qv[r].w, kv[c].w, s[r][c]);
        }
    }
    // scale, masks, online softmax; the probabilities to shared memory
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int64_t i = i0 + ty + 16 * r;
      float mx = -INFINITY;
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int64_t j = j0 + tx + 16 * c;
        const float v = masked_log2(a, moff, i, j, s[r][c] * scale);
        s[r][c] = v;
        mx = fmaxf(mx, v);
      }
#pragma unroll
      for (int x = 1; x < 16; x <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, x));
      const float mn = fmaxf(m[r], mx);
      const float base = mn == -INFINITY ? 0.f : mn;  // a row that sees no key yet: p = 0
      const float alpha = exp2f(m[r] - base);         // exp2(-inf) = 0 for the first keys
      m[r] = mn;
      float sum = 0.f;
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const float p = exp2f(s[r][c] - base);
        ps[(ty + 16 * r) * kLdp + tx + 16 * c] = p;
        sum += p;
      }
      l[r] = l[r] * alpha + sum;  // this thread's part of the row sum (summed at the end)
#pragma unroll
      for (int c = 0; c < kCols; ++c) o[r][c] *= alpha;
    }
    __syncthreads();
    // O += P V
#pragma unroll 2
    for (int j = 0; j < kF32Keys; j += 4) {
      float4 pv[4];
#pragma unroll
      for (int r = 0; r < 4; ++r)
        pv[r] = *reinterpret_cast<const float4*>(ps + (ty + 16 * r) * kLdp + j);
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {
        float vv[kCols];
#pragma unroll
        for (int g = 0; g < kGroups; ++g) {
          const float* src = vs + (j + jj) * kLd + g * 16 * kVec + kVec * tx;
          if constexpr (kVec == 4) {
            const float4 w = *reinterpret_cast<const float4*>(src);
            vv[g * 4] = w.x, vv[g * 4 + 1] = w.y, vv[g * 4 + 2] = w.z, vv[g * 4 + 3] = w.w;
          } else {
            const float2 w = *reinterpret_cast<const float2*>(src);
            vv[g * 2] = w.x, vv[g * 2 + 1] = w.y;
          }
        }
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const float p = jj == 0 ? pv[r].x : jj == 1 ? pv[r].y : jj == 2 ? pv[r].z : pv[r].w;
#pragma unroll
          for (int c = 0; c < kCols; ++c) o[r][c] = fmaf(p, vv[c], o[r][c]);
        }
      }
    }
    __syncthreads();  // the tile is consumed before the next copies overwrite it
  }
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    float sum = l[r];
#pragma unroll
    for (int x = 1; x < 16; x <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, x);
    const int64_t i = i0 + ty + 16 * r;
    if (i >= a.lq) continue;
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
#pragma unroll
    for (int g = 0; g < kGroups; ++g) {
      float* dst = out + (b * a.lq + i) * D + g * 16 * kVec + kVec * tx;
      if constexpr (kVec == 4)
        *reinterpret_cast<float4*>(dst) =
            make_float4(o[r][g * 4] * inv, o[r][g * 4 + 1] * inv, o[r][g * 4 + 2] * inv,
                        o[r][g * 4 + 3] * inv);
      else
        *reinterpret_cast<float2*>(dst) = make_float2(o[r][g * 2] * inv, o[r][g * 2 + 1] * inv);
    }
  }
#endif
}

// Whether the f32 register-tile kernel takes this attention: equal head dims of 32, 64 or 128,
// 16-byte aligned operands.
inline bool f32_tiled_forward(const Args<float>& a) {
  return a.e == a.ev && (a.e == 32 || a.e == 64 || a.e == 128) && aligned16(a.q) &&
         aligned16(a.k) && aligned16(a.v);
}

template <typename T> void forward(KernelContext& ctx) {
  using C = std::conditional_t<std::is_same_v<T, double>, double, float>;
  Args<T> a = args_of<T>(ctx, 0);
  T* out = ctx.out(0).ptr<T>();
  if (a.batch * a.lq * a.ev == 0) return;
  if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bf16_t>) {
    if (tensor_core_forward(a)) {
      const int64_t blocks = (a.lq + kTcRows - 1) / kTcRows;
      Split sp = split_of(a.batch * blocks, a.lk, split_sms(ctx));
      if (sp.splits > 0) {
        const size_t parts = static_cast<size_t>(a.batch * sp.splits * a.lq);
        sp.o = static_cast<float*>(ctx.scratch(parts * a.e * sizeof(float)));
        sp.m = static_cast<float*>(ctx.scratch(parts * sizeof(float)));
        sp.l = static_cast<float*>(ctx.scratch(parts * sizeof(float)));
      }
      auto launch = [&](auto kernel, auto combine, size_t smem) {
        allow_smem(kernel, smem);
        const unsigned grid = static_cast<unsigned>(a.batch * blocks * std::max(sp.splits, 1));
        kernel<<<grid, kTcWarps * 32, smem, stream_of(ctx)>>>(a, out, blocks, sp);
        check_launch(ctx.op_name());
        if (sp.splits == 0) return;
        const int64_t rows = a.batch * a.lq;
        combine<<<static_cast<unsigned>((rows + kTcWarps - 1) / kTcWarps), kTcWarps * 32, 0,
                  stream_of(ctx)>>>(sp, out, rows, a.lq);
        check_launch(ctx.op_name());
      };
      auto run = [&](auto d) {
        constexpr int kD = decltype(d)::value;
        if (sp.splits > 0)
          launch(forward_tc_kernel<T, kD, true>, combine_kernel<T, kD>, TcLayout<kD>::bytes);
        else launch(forward_tc_kernel<T, kD, false>, combine_kernel<T, kD>, TcLayout<kD>::bytes);
      };
      if (a.e == 32) run(std::integral_constant<int, 32>{});
      else if (a.e == 64) run(std::integral_constant<int, 64>{});
      else run(std::integral_constant<int, 128>{});
      return;
    }
  }
  if constexpr (std::is_same_v<T, float>) {
    if (f32_tiled_forward(a) && ctx.choices().attention_f32_tiles) {
      const int64_t blocks = (a.lq + kF32Rows - 1) / kF32Rows;
      auto launch = [&](auto kernel, size_t smem) {
        allow_smem(kernel, smem);
        kernel<<<static_cast<unsigned>(a.batch * blocks), kF32Threads, smem, stream_of(ctx)>>>(
            a, out, blocks);
        check_launch(ctx.op_name());
      };
      if (a.e == 32) launch(forward_f32_kernel<32>, F32Layout<32>::bytes);
      else if (a.e == 64) launch(forward_f32_kernel<64>, F32Layout<64>::bytes);
      else launch(forward_f32_kernel<128>, F32Layout<128>::bytes);
      return;
    }
  }
  const int64_t row_blocks = (a.lq + kWarps - 1) / kWarps;
  const int64_t slice = 32 * kMaxChunks;
  for (int64_t d0 = 0; d0 < a.ev; d0 += slice) {
    const int dn = static_cast<int>(std::min<int64_t>(slice, a.ev - d0));
    size_t smem = 0;
    a.tile = pick_tile(ctx, [&](int t) {
      return sizeof(C) * (kWarps * padded(a.e) + t * padded(a.e) + t * dn + kWarps * t);
    }, smem);
    with_chunks<Chunks>(dn, [&](auto ch) {
      constexpr int kc = decltype(ch)::value;
      launch_with_smem(forward_kernel<T, C, kc>, smem,
                       static_cast<unsigned>(a.batch * row_blocks), stream_of(ctx),
                       ctx.op_name(), a, out, d0, dn, row_blocks);
    });
  }
}

void scaled_dot_product_attention(KernelContext& ctx) {
  dispatch_float(ctx.in(0).dtype, ctx.op_name(), [&](auto t) { forward<decltype(t)>(ctx); });
}

}  // namespace

void register_attention_kernels() {
  const DTypeSet floats{f32, f16, bf16, f64};
  register_kernel(OpId::ScaledDotProductAttention, Backend::cuda,
                  {scaled_dot_product_attention, floats, 0, false});
  register_kernel(OpId::ScaledDotProductAttentionGrad, Backend::cuda,
                  {scaled_dot_product_attention_grad, floats, 1, false});
}

}  // namespace kiln::cuda
