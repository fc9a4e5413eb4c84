// Persistent CUDA kernels of the recurrent layers (f32 LSTM, and GRU with linear_before_reset):
// every step of one direction in one cooperative launch, forward and backward (docs/rnn.md).
// rnn.cu calls rnn_persistent / rnn_backward_persistent and runs its per-step kernels where they
// return false.
#include <cooperative_groups.h>

#include <algorithm>
#include <climits>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/rnn_persistent.h"
#include "runtime/env.h"

namespace kiln::cuda::rnn_detail {

namespace {

// ---- persistent LSTM and GRU forward (f32)
//
// All T steps of one direction in one cooperative launch: CTA c owns the units [c·U, c·U + U) and
// keeps their rows of R (G·U gate rows, all H columns) and, for an LSTM, their cells in shared
// memory; a step stages h_prev (B x H, written by every CTA the step before, kept transposed) in
// shared memory, forms the CTA's B x G·U recurrent products (4 x 4 register tiles, K split over
// thread groups and summed after), runs the cell of its units (lstm_cell / gru_cell, as the
// per-step kernels do), writes h into the other of two global h buffers, and waits at a grid
// barrier. This replaces two or three launches a step and their gaps by one barrier (12.9 us a
// step at batch 64, H 512 on an H200). GRUs need linear_before_reset (r multiplies the h gate's
// product after it).

namespace cgrp = cooperative_groups;

constexpr int kPersistentThreads = 256;

// Copies 16 bytes from global to shared memory through L2, not L1 (other CTAs wrote the data,
// and this CTA's L1 may hold an old line of it): on sm_80 and later an asynchronous copy, so a
// thread has all of its copies in flight at once (a staging loop of plain loads waits out the L2
// latency at every element); copies_done() waits for the thread's copies.
__device__ __forceinline__ void copy16_from_l2(float* smem, const float* gmem) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const auto s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
#else
  *reinterpret_cast<float4*>(smem) = __ldcg(reinterpret_cast<const float4*>(gmem));
#endif
}
// Closes the thread's batch of copies since the last batch; copies_wait<N>() waits until at most
// N batches are still in flight; copies_done() closes the batch and waits for all.
__device__ __forceinline__ void copies_batch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void copies_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}
__device__ __forceinline__ void copies_done() {
  copies_batch();
  copies_wait<0>();
}

// Shared-memory layout of the persistent kernel (floats).
struct PersistentLayout {
  int64_t U = 0, L = 0, B4 = 0, tiles = 0, ks = 1;
  int64_t r_off = 0, h_off = 0, pre_off = 0, c_off = 0, red_off = 0, floats = 0;
  int64_t gates = 4;  // gate rows a unit: LSTM 4, GRU 3
  PersistentLayout(int64_t B, int64_t H, int64_t units, int64_t gate_count) {
    U = units;
    gates = gate_count;
    L = (gates * U + 3) / 4 * 4;  // padded to whole 4-column tiles
    B4 = (B + 3) / 4 * 4;
    tiles = B4 / 4 * (L / 4);
    // K split in 1, 2, 4 or 8 parts (a power of two: whole parts in the block)
    while (ks < 8 && tiles * ks * 2 <= kPersistentThreads) ks *= 2;
    r_off = 0;
    h_off = r_off + H * L;
    pre_off = h_off + H * B4;
    c_off = pre_off + B * L;
    red_off = c_off + B * U;
    floats = red_off + ks * tiles * 16;
  }
  size_t bytes() const { return static_cast<size_t>(floats) * sizeof(float); }
};

// h_prev lives transposed between steps (hT[k·B4 + b], batch rows padded to B4), in two global
// buffers that the CTAs write in turn: a step's staging is then one contiguous copy, and a
// product tile reads 4 batch rows of one column as one float4, which the lanes of a warp take
// from distinct banks (as they take their 4 gate columns of R).
__global__ void __launch_bounds__(kPersistentThreads)
    rnn_persistent_kernel(Geo g, const int64_t* lens, const float* xw, const float* R,
                          const float* P, const float* rbh, float* h, float* hT_a, float* hT_b,
                          float* c, float* y, float* res, PersistentLayout lay) {
  extern __shared__ float4 smem4[];
  float* sm = reinterpret_cast<float*>(smem4);
  const int H = static_cast<int>(g.H), B = static_cast<int>(g.B), U = static_cast<int>(lay.U);
  const int L = static_cast<int>(lay.L), B4 = static_cast<int>(lay.B4);
  float* Rs = sm + lay.r_off;     // Rs[k·L + q·U + u] = R[(q·H + j0 + u)·H + k]; 0 past G·U
  float* hs = sm + lay.h_off;     // hs[k·B4 + b] = h_prev[b, k]
  float* pre = sm + lay.pre_off;  // pre[b·L + q·U + u]: the recurrent products
  float* cst = sm + lay.c_off;    // cst[b·U + u]: the units' cells
  float* red = sm + lay.red_off;  // red[(part·16 + e)·tiles + tile]: the K parts' products
  const int tid = threadIdx.x, nt = blockDim.x;
  const int j0 = blockIdx.x * U, units = min(U, H - j0);
  for (int i = tid; i < H * L; i += nt) {
    const int k = i / L, lc = i % L, q = lc / U, u = lc % U;
    Rs[i] = u < units && q < lay.gates ? R[(int64_t{q} * H + j0 + u) * H + k] : 0.f;
  }
  for (int i = tid; i < H * B4; i += nt) {  // h0, transposed (and the padding rows 0)
    const int k = i / B4, b = i % B4;
    hs[i] = b < B ? __ldcg(h + int64_t{b} * H + k) : 0.f;
  }
  for (int i = tid; i < units * (B4 - B); i += nt) {  // the padding of the units' columns
    const int64_t o = int64_t{j0 + i / (B4 - B)} * B4 + B + i % (B4 - B);
    hT_a[o] = hT_b[o] = 0.f;
  }
  for (int i = tid; i < B * U; i += nt) {
    const int b = i / U, u = i % U;
    cst[i] = c && u < units ? c[int64_t{b} * H + j0 + u] : 0.f;
  }
  cgrp::grid_group grid = cgrp::this_grid();
  const int tiles = static_cast<int>(lay.tiles), ks = static_cast<int>(lay.ks);
  const int tiles_l = L / 4, groups = nt / ks, kper = (H + ks - 1) / ks;
  for (int64_t s = 0; s < g.T; ++s) {
    float* hn = (s & 1) ? hT_a : hT_b;
    if (s > 0) {
      const float* hp = (s & 1) ? hT_b : hT_a;
      __syncthreads();  // the last step's reads of hs are done
      for (int i = tid; i < H * B4 / 4; i += nt) copy16_from_l2(hs + 4 * i, hp + 4 * i);
      copies_done();
    }
    __syncthreads();
    // the products: lanes take consecutive tiles (4 batch rows x 4 gate columns), the groups of
    // `groups` threads consecutive ranges of K
    for (int t0 = 0; t0 < tiles; t0 += groups) {
      const int tile = t0 + tid % groups, part = tid / groups;
      if (tile >= tiles) continue;
      const int b0 = tile / tiles_l * 4, lc0 = tile % tiles_l * 4;
      float acc[4][4] = {};
      const int k_end = min(H, (part + 1) * kper);
#pragma unroll 4
      for (int k = part * kper; k < k_end; ++k) {
        const float4 hv = *reinterpret_cast<const float4*>(hs + k * B4 + b0);
        const float4 rv = *reinterpret_cast<const float4*>(Rs + k * L + lc0);
        const float hk[4] = {hv.x, hv.y, hv.z, hv.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          acc[i][0] += hk[i] * rv.x;
          acc[i][1] += hk[i] * rv.y;
          acc[i][2] += hk[i] * rv.z;
          acc[i][3] += hk[i] * rv.w;
        }
      }
#pragma unroll
      for (int e = 0; e < 16; ++e) red[(part * 16 + e) * tiles + tile] = acc[e / 4][e % 4];
    }
    __syncthreads();
    for (int o = tid; o < tiles * 16; o += nt) {
      const int t = o % tiles, e = o / tiles;
      const int b = t / tiles_l * 4 + e / 4, lc = t % tiles_l * 4 + e % 4;
      if (b >= B) continue;
      float v = 0.f;
      for (int p = 0; p < ks; ++p) v += red[(p * 16 + e) * tiles + t];
      pre[b * L + lc] = v;
    }
    __syncthreads();
    for (int i = tid; i < B * U; i += nt) {
      const int b = i / U, u = i % U, j = j0 + u;
      if (u >= units) continue;
      const float hprev = hs[j * B4 + b];
      if (s >= lens[b]) {  // a row that has ended keeps its state
        hn[j * B4 + b] = hprev;
        continue;
      }
      const int64_t t = g.time(s, b, lens);
      const float* x = xw + (g.row(t, b) * g.D + g.d) * g.GH;
      const float* pb = pre + b * L + u;
      struct {
        const float* p;
        int64_t H, U;
        __device__ float operator[](int64_t col) const { return p[col / H * U]; }
      } q{pb, H, U};
      float* rr = res ? res + g.res_off(t, b) : nullptr;
      float hv;
      if (g.cell == 0) {
        float cn;
        hv = lstm_cell(g, x, q, P, j, cst[i], &cn, rr);
        cst[i] = cn;
      } else {
        hv = gru_cell(g, x, q, rbh, j, hprev, rr);
      }
      hn[j * B4 + b] = hv;
      y[(g.row(t, b) * g.D + g.d) * H + j] = hv;
      if (rr) rr[g.S - H + j] = hv;
    }
    grid.sync();
  }
  // the last h of the CTA's units (its own writes), and their cells
  const float* last = (g.T & 1) ? hT_b : hT_a;
  for (int i = tid; i < B * U; i += nt) {
    const int b = i / U, u = i % U;
    if (u >= units) continue;
    h[int64_t{b} * H + j0 + u] = last[(j0 + u) * B4 + b];
    if (c) c[int64_t{b} * H + j0 + u] = cst[i];
  }
}

// ---- persistent backward (f32 LSTM without peepholes, GRU with linear_before_reset)
//
// Every step of one direction's backward pass in one cooperative launch, the units split over
// CTAs as in the forward kernel: a step's gate gradients of the CTA's units (grad_cell, from the
// carried dH, dy and the reserve) go to dg, to one of two global dgr buffers (this step's) and,
// for a GRU, to dgr_all; a grid barrier; then the CTA's columns of dH_prev = dgr · R (its units'
// columns of R in shared memory, dgr staged in chunks from L2), kept in shared memory for the next
// step. The products over all steps (dR, dW, dx) and the bias sums stay after it, as before.

struct BackwardLayout {
  int64_t U = 0, Up = 0, kc = 0, kcp = 0, outs = 0;
  int parts = 1;  // threads that split one product's K (a power of two: 1 to 8)
  int64_t rt_off = 0, stage_off = 0, prod_off = 0, floats = 0;
  BackwardLayout(int64_t B, int64_t GH, int64_t units) {
    U = units;
    Up = (U + 3) / 4 * 4;             // Rt's row stride: whole float4s of units
    kc = std::min<int64_t>(GH, 256);  // dgr columns staged at a time
    kcp = kc + 4;                     // (16-byte rows, off by 4 banks)
    outs = B * U;
    const int64_t items = B * (Up / 4);  // (batch row, 4 units) products
    while (parts < 8 && items * parts * 2 <= kPersistentThreads) parts *= 2;
    rt_off = 0;
    stage_off = rt_off + GH * Up;
    prod_off = stage_off + 2 * B * kcp;  // two stage buffers
    floats = prod_off + outs;
  }
  size_t bytes() const { return static_cast<size_t>(floats) * sizeof(float); }
};

__global__ void __launch_bounds__(kPersistentThreads)
    rnn_backward_persistent_kernel(Geo g, const int64_t* lens, const float* res, const float* dy,
                                   const float* h0, const float* c0, const float* R, float* dh,
                                   float* dc, float* dg, float* dgr_a, float* dgr_b, float* dgr_all,
                                   float* hp_all, BackwardLayout lay) {
  extern __shared__ float4 smem4b[];
  float* sm = reinterpret_cast<float*>(smem4b);
  const int64_t H = g.H, B = g.B, GH = g.GH, U = lay.U, Up = lay.Up, kc = lay.kc, kcp = lay.kcp;
  float* Rt = sm + lay.rt_off;        // Rt[k·Up + u] = R[k·H + j0 + u]: the units' columns of R
  float* stage = sm + lay.stage_off;  // stage[b·kcp + k]: dgr columns c0 + k
  float* prod = sm + lay.prod_off;    // prod[b·U + u]: this step's dH_prev product
  const int tid = threadIdx.x, nt = blockDim.x;
  const int64_t j0 = blockIdx.x * U, units = min(U, H - j0);
  for (int64_t i = tid; i < GH * Up; i += nt) {
    const int64_t k = i / Up, u = i % Up;
    Rt[i] = u < units ? R[k * H + j0 + u] : 0.f;
  }
  // each thread's (b, u) pairs keep dh, dc and the direct part of dH_prev in registers: at most
  // kMaxPairs a thread (the host checks B·U against it)
  constexpr int kMaxPairs = 4;
  float dhl[kMaxPairs], dcl[kMaxPairs], dhpl[kMaxPairs];
  for (int r = 0; r < kMaxPairs; ++r) {
    const int64_t i = tid + int64_t{r} * nt, b = i / U, u = i % U;
    const bool mine = i < B * U && u < units;
    dhl[r] = mine ? dh[b * H + j0 + u] : 0.f;
    dcl[r] = mine && dc ? dc[b * H + j0 + u] : 0.f;
    dhpl[r] = 0.f;
  }
  for (int64_t i = tid; i < B * U; i += nt) prod[i] = 0.f;
  cgrp::grid_group grid = cgrp::this_grid();
  for (int64_t s = g.T - 1; s >= 0; --s) {
    float* dgr = (s & 1) ? dgr_b : dgr_a;
    __syncthreads();  // prod of the last step is complete
    for (int r = 0; r < kMaxPairs; ++r) {
      const int64_t i = tid + int64_t{r} * nt, b = i / U, u = i % U, j = j0 + u;
      if (i >= B * U || u >= units) continue;
      float* q = dgr + b * GH;
      if (s >= lens[b]) {
        for (int64_t k = j; k < GH; k += H) q[k] = 0.f;
        continue;
      }
      if (s + 1 < g.T && s + 1 < lens[b]) dhl[r] = dhpl[r] + prod[i];
      const int64_t t = g.time(s, b, lens);
      float hv = 0.f, cv = 0.f;
      if (s == 0) {
        if (h0) hv = h0[(g.d * B + b) * H + j];
        if (c0) cv = c0[(g.d * B + b) * H + j];
      } else {
        const float* pr = res + g.res_off(g.time(s - 1, b, lens), b);
        hv = pr[g.S - H + j];
        if (g.cell == 0) cv = pr[4 * H + j];
      }
      hp_all[g.row(t, b) * H + j] = hv;
      const float* rr = res + g.res_off(t, b);
      float* gg = dg + g.row(t, b) * GH;
      const float dH = dhl[r] + dy[(g.row(t, b) * g.D + g.d) * H + j];
      float rhp = 0.f;
      grad_cell(g, j, dH, hv, cv, rr, static_cast<const float*>(nullptr), gg, q, dcl[r], dhpl[r],
                &rhp);
      if (dgr_all)
        for (int64_t k = j; k < GH; k += H) dgr_all[g.row(t, b) * GH + k] = q[k];
    }
    grid.sync();
    // prod = dgr · R for the units' columns, dgr staged kc columns at a time; a thread forms the
    // products of one batch row and 4 units over every parts-th column of the chunk, and the
    // `parts` neighbouring lanes of a row add theirs up
    for (int64_t i = tid; i < B * U; i += nt) prod[i] = 0.f;
    const int P = lay.parts, part = tid % P, U4 = static_cast<int>(Up / 4);
    const int items = static_cast<int>(B) * U4;
    // chunk ci is staged in stage buffer ci % 2, the next one's copies in flight meanwhile
    const int chunks = static_cast<int>((GH + kc - 1) / kc);
    auto stage_chunk = [&](int ci) {
      const int64_t c0 = ci * kc;
      const int w4 = static_cast<int>(min(kc, GH - c0)) / 4;
      float* buf = stage + (ci & 1) * B * kcp;
      for (int i = tid; i < static_cast<int>(B) * w4; i += nt) {
        const int b = i / w4, k = 4 * (i % w4);
        copy16_from_l2(buf + b * kcp + k, dgr + b * GH + c0 + k);  // (other CTAs wrote it)
      }
      copies_batch();
    };
    stage_chunk(0);
    for (int ci = 0; ci < chunks; ++ci) {
      const int64_t c0 = ci * kc;
      const int w = static_cast<int>(min(kc, GH - c0));
      if (ci + 1 < chunks) {
        stage_chunk(ci + 1);
        copies_wait<1>();
      } else {
        copies_wait<0>();
      }
      __syncthreads();  // chunk ci is in its buffer
      const float* sbuf = stage + (ci & 1) * B * kcp;
      for (int base = 0; base < items; base += nt / P) {  // (the same trips in every lane)
        const int item = base + tid / P;
        float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
        if (item < items) {
          const float* st = sbuf + item / U4 * kcp;
          const float* rt = Rt + c0 * Up + 4 * (item % U4);
          for (int k = part; k < w; k += P) {
            const float sv = st[k];
            const float4 rv = *reinterpret_cast<const float4*>(rt + k * Up);
            acc.x += sv * rv.x;
            acc.y += sv * rv.y;
            acc.z += sv * rv.z;
            acc.w += sv * rv.w;
          }
        }
        for (int o = P / 2; o > 0; o /= 2) {
          acc.x += __shfl_xor_sync(0xffffffffu, acc.x, o);
          acc.y += __shfl_xor_sync(0xffffffffu, acc.y, o);
          acc.z += __shfl_xor_sync(0xffffffffu, acc.z, o);
          acc.w += __shfl_xor_sync(0xffffffffu, acc.w, o);
        }
        if (item >= items || part != 0) continue;
        const int64_t b = item / U4, u0 = 4 * (item % U4);
        const float a[4] = {acc.x, acc.y, acc.z, acc.w};
        for (int cc = 0; cc < 4 && u0 + cc < U; ++cc) prod[b * U + u0 + cc] += a[cc];
      }
      __syncthreads();  // the reads of chunk ci's buffer are done before chunk ci + 2's copies
    }
  }
  __syncthreads();
  for (int r = 0; r < kMaxPairs; ++r) {
    const int64_t i = tid + int64_t{r} * nt, b = i / U, u = i % U;
    if (i >= B * U || u >= units) continue;
    if (0 < lens[b]) dhl[r] = dhpl[r] + prod[i];  // the carry after step 0
    dh[b * H + j0 + u] = dhl[r];
    if (dc) dc[b * H + j0 + u] = dcl[r];
  }
}

// The GPU's SM count and opt-in shared memory per block; sms 0 when it has no cooperative
// launches.
struct CoopDevice {
  int sms = 0, max_smem = 0;
};
CoopDevice coop_device(int dev) {
  CoopDevice d;
  int coop = 0;
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, dev));
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, dev));
  KILN_CUDA_CHECK(
      cudaDeviceGetAttribute(&d.max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  if (!coop) d.sms = 0;
  return d;
}

// Launches `kernel` cooperatively (grid-wide barriers) on the kernel's stream with `smem` bytes of
// dynamic shared memory; false, with nothing enqueued, when `grid` CTAs cannot all be resident.
template <typename... Params, typename... Args>
bool launch_cooperative(KernelContext& ctx, void (*kernel)(Params...), unsigned grid, size_t smem,
                        const CoopDevice& d, Args... args) {
  if (d.sms == 0 || smem > static_cast<size_t>(d.max_smem)) return false;
  KILN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(smem)));
  int per_sm = 0;
  KILN_CUDA_CHECK(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kPersistentThreads, smem));
  if (static_cast<int64_t>(per_sm) * d.sms < grid) return false;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(kPersistentThreads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream_of(ctx);
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeCooperative;
  attr.val.cooperative = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  KILN_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, args...));
  return true;
}

}  // namespace

// Runs every step of direction g.d of an f32 LSTM, or GRU with linear_before_reset, through
// rnn_persistent_kernel: h (B x H, h0 in, the last h out) and c (LSTM, likewise) as the per-step
// path leaves them. False, with nothing enqueued, where the launch cannot be made
// (KILN_RNN_PERSISTENT=0, another cell, H not a multiple of 4, a batch whose staged h does not
// fit in shared memory, a GPU without cooperative launches or with too few SMs for the CTAs); the
// caller then runs the per-step kernels.
bool rnn_persistent(KernelContext& ctx, const Geo& g, const int64_t* lens, const float* xw,
                    const float* R, const float* P, const float* rbh, float* h, float* c, float* y,
                    float* res) {
  const bool cell_ok = g.cell == 0 || (g.cell == 1 && g.lbr);
  if (!cell_ok || !ctx.choices().rnn_persistent_forward || g.H % 4 != 0 || g.T == 0 || g.B == 0)
    return false;
  const CoopDevice d = coop_device(ctx.device());
  if (d.sms == 0) return false;
  // the fewest units a CTA that give one CTA per SM at most
  const int64_t units = (g.H + d.sms - 1) / d.sms;
  const PersistentLayout lay(g.B, g.H, units, g.cell == 0 ? 4 : 3);
  const auto grid = static_cast<unsigned>((g.H + units - 1) / units);
  if (g.H * lay.B4 > INT_MAX / 2) return false;  // (32-bit indices)
  float* hT_a = scratch_of<float>(ctx, g.H * lay.B4);
  float* hT_b = scratch_of<float>(ctx, g.H * lay.B4);
  return launch_cooperative(ctx, rnn_persistent_kernel, grid, lay.bytes(), d, g, lens, xw, R, P,
                            rbh, h, hT_a, hT_b, g.cell == 0 ? c : nullptr, y, res, lay);
}

// Runs every backward step of direction g.d through rnn_backward_persistent_kernel: dh and dc
// (B x H: dhn and dcn in, dh0 and dc0 out), dg, dgr_all (GRU; null for an LSTM, whose dg is it)
// and hp_all filled as the per-step loop fills them. False, with nothing enqueued, where it
// cannot run (as rnn_persistent; also peepholes, or more (batch row, unit) pairs than a CTA
// keeps); the caller then runs the per-step loop.
bool rnn_backward_persistent(KernelContext& ctx, const Geo& g, const int64_t* lens,
                             const float* res, const float* dy, const float* h0, const float* c0,
                             const float* R, const float* P, float* dh, float* dc, float* dg,
                             float* dgr, float* dgr_all, float* hp_all) {
  const bool cell_ok = (g.cell == 0 && !P) || (g.cell == 1 && g.lbr);
  if (!cell_ok || !ctx.choices().rnn_persistent_backward || g.GH % 4 != 0 || g.T == 0 || g.B == 0 ||
      !hp_all)
    return false;
  const CoopDevice d = coop_device(ctx.device());
  if (d.sms == 0) return false;
  const int64_t units = (g.H + d.sms - 1) / d.sms;
  if (g.B * units > 4 * int64_t{kPersistentThreads}) return false;  // kMaxPairs a thread
  const BackwardLayout lay(g.B, g.GH, units);
  const auto grid = static_cast<unsigned>((g.H + units - 1) / units);
  float* dgr_b = scratch_of<float>(ctx, g.B * g.GH);
  return launch_cooperative(ctx, rnn_backward_persistent_kernel, grid, lay.bytes(), d, g, lens, res,
                            dy, h0, c0, R, dh, g.cell == 0 ? dc : nullptr, dg, dgr, dgr_b, dgr_all,
                            hp_all, lay);
}

}  // namespace kiln::cuda::rnn_detail
