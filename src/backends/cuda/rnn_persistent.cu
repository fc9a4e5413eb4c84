// Persistent CUDA kernels of the recurrent layers (f32 LSTM, and GRU with linear_before_reset):
// every step of one direction in one cooperative launch, forward and backward (docs/rnn.md).
// rnn.cu calls rnn_persistent / rnn_backward_persistent and runs its per-step kernels where they
// return false.
#include <cooperative_groups.h>

#include <algorithm>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/rnn_persistent.h"
#include "runtime/env.h"

namespace kiln::cuda::rnn_detail {

namespace {

// ---- persistent LSTM and GRU forward (f32)
//
// All T steps of one direction in one cooperative launch: CTA c owns the units [c·U, c·U + U) and
// keeps their rows of R (G·U gate rows, all H columns) and, for an LSTM, their cells in shared
// memory; a step stages h_prev (B x H, written by every CTA the step before) in shared memory,
// forms the CTA's B x G·U recurrent products (4 x 4 register tiles, K split over thread groups
// and summed after), runs the cell of its units (lstm_cell / gru_cell, as the per-step kernels
// do), writes h into the other of two global h buffers, and waits at a grid barrier. This
// replaces two or three launches a step and their gaps (about 20 us a step at batch 64, H 512) by
// one barrier. GRUs need linear_before_reset (r multiplies the h gate's product after it).

namespace cgrp = cooperative_groups;

constexpr int kPersistentThreads = 256;

// Shared-memory layout of the persistent kernel (floats).
struct PersistentLayout {
  int64_t U = 0, L = 0, B4 = 0, Hp = 0, tiles = 0, ks = 1;
  int64_t r_off = 0, h_off = 0, pre_off = 0, c_off = 0, red_off = 0, floats = 0;
  int64_t gates = 4;  // gate rows a unit: LSTM 4, GRU 3
  PersistentLayout(int64_t B, int64_t H, int64_t units, int64_t gate_count) {
    U = units;
    gates = gate_count;
    L = (gates * U + 3) / 4 * 4;  // padded to whole 4-column tiles
    B4 = (B + 3) / 4 * 4;
    Hp = H + 4;  // row stride of the staged h (16-byte aligned, rows off by 4 banks)
    tiles = B4 / 4 * (L / 4);
    ks = std::max<int64_t>(1,
                           std::min<int64_t>(8, kPersistentThreads / std::max<int64_t>(tiles, 1)));
    r_off = 0;
    h_off = r_off + H * L;
    pre_off = h_off + B4 * Hp;
    c_off = pre_off + B * L;
    red_off = c_off + B * U;
    floats = red_off + ks * tiles * 16;
  }
  size_t bytes() const { return static_cast<size_t>(floats) * sizeof(float); }
};

__global__ void __launch_bounds__(kPersistentThreads)
    rnn_persistent_kernel(Geo g, const int64_t* lens, const float* xw, const float* R,
                          const float* P, const float* rbh, float* h_a, float* h_b, float* c,
                          float* y, float* res, PersistentLayout lay) {
  extern __shared__ float4 smem4[];
  float* sm = reinterpret_cast<float*>(smem4);
  const int64_t H = g.H, B = g.B, U = lay.U, L = lay.L, Hp = lay.Hp;
  float* Rs = sm + lay.r_off;     // Rs[k·L + q·U + u] = R[(q·H + j0 + u)·H + k]; 0 past G·U
  float* hs = sm + lay.h_off;     // hs[b·Hp + k] = h_prev[b, k]; rows B..B4 stay 0
  float* pre = sm + lay.pre_off;  // pre[b·L + q·U + u]: the recurrent products
  float* cst = sm + lay.c_off;    // cst[b·U + u]: the units' cells
  float* red = sm + lay.red_off;  // partial products of the K groups
  const int tid = threadIdx.x, nt = blockDim.x;
  const int64_t j0 = blockIdx.x * U, units = min(U, H - j0);
  for (int64_t i = tid; i < H * L; i += nt) {
    const int64_t k = i / L, lc = i % L, q = lc / U, u = lc % U;
    Rs[i] = u < units && q < lay.gates ? R[(q * H + j0 + u) * H + k] : 0.f;
  }
  for (int64_t i = tid; i < lay.B4 * Hp; i += nt) hs[i] = 0.f;
  for (int64_t i = tid; i < B * U; i += nt) {
    const int64_t b = i / U, u = i % U;
    cst[i] = c && u < units ? c[b * H + j0 + u] : 0.f;
  }
  cgrp::grid_group grid = cgrp::this_grid();
  const int64_t tiles = lay.tiles, ks = lay.ks, tiles_b = lay.B4 / 4, H4 = H / 4;
  const int64_t part = tid % ks, groups = nt / ks;  // `groups` tiles at a time, ks threads each
  for (int64_t s = 0; s < g.T; ++s) {
    const float* hp = (s & 1) ? h_b : h_a;
    float* hn = (s & 1) ? h_a : h_b;
    __syncthreads();  // the last step's reads of hs are done
    for (int64_t i = tid; i < B * H4; i += nt) {
      const int64_t b = i / H4, k4 = i % H4;
      // (L2, not L1: other CTAs wrote it, and this CTA may hold an old line of the buffer)
      reinterpret_cast<float4*>(hs + b * Hp)[k4] =
          __ldcg(reinterpret_cast<const float4*>(hp + b * H) + k4);
    }
    __syncthreads();
    for (int64_t tile = tid / ks; tid < groups * ks && tile < tiles; tile += groups) {
      const int64_t b0 = tile % tiles_b * 4, lc0 = tile / tiles_b * 4;
      float acc[4][4] = {};
      for (int64_t k4 = part; k4 < H4; k4 += ks) {
        const int64_t k = 4 * k4;
        float4 hv[4], rv[4];
#pragma unroll
        for (int i = 0; i < 4; ++i)
          hv[i] = *reinterpret_cast<const float4*>(hs + (b0 + i) * Hp + k);
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
          rv[kk] = *reinterpret_cast<const float4*>(Rs + (k + kk) * L + lc0);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float hk[4] = {hv[i].x, hv[i].y, hv[i].z, hv[i].w};
#pragma unroll
          for (int kk = 0; kk < 4; ++kk) {
            acc[i][0] += hk[kk] * rv[kk].x;
            acc[i][1] += hk[kk] * rv[kk].y;
            acc[i][2] += hk[kk] * rv[kk].z;
            acc[i][3] += hk[kk] * rv[kk].w;
          }
        }
      }
      float* out = red + (part * tiles + tile) * 16;
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int cc = 0; cc < 4; ++cc) out[i * 4 + cc] = acc[i][cc];
    }
    __syncthreads();
    for (int64_t o = tid; o < tiles * 16; o += nt) {
      const int64_t t = o / 16, i = o % 16 / 4, cc = o % 4;
      const int64_t b = t % tiles_b * 4 + i, lc = t / tiles_b * 4 + cc;
      if (b >= B) continue;
      float v = 0.f;
      for (int64_t p = 0; p < ks; ++p) v += red[(p * tiles + t) * 16 + o % 16];
      pre[b * L + lc] = v;
    }
    __syncthreads();
    for (int64_t i = tid; i < B * U; i += nt) {
      const int64_t b = i / U, u = i % U, j = j0 + u;
      if (u >= units) continue;
      if (s >= lens[b]) {  // a row that has ended keeps its state
        hn[b * H + j] = hs[b * Hp + j];
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
      float h;
      if (g.cell == 0) {
        float cn;
        h = lstm_cell(g, x, q, P, j, cst[i], &cn, rr);
        cst[i] = cn;
      } else {
        h = gru_cell(g, x, q, rbh, j, hs[b * Hp + j], rr);
      }
      hn[b * H + j] = h;
      y[(g.row(t, b) * g.D + g.d) * H + j] = h;
      if (rr) rr[g.S - H + j] = h;
    }
    grid.sync();
  }
  if (c)
    for (int64_t i = tid; i < B * U; i += nt) {
      const int64_t b = i / U, u = i % U;
      if (u < units) c[b * H + j0 + u] = cst[i];
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
  int64_t U = 0, kc = 0, kcp = 0, outs = 0;
  int64_t rt_off = 0, stage_off = 0, prod_off = 0, floats = 0;
  BackwardLayout(int64_t B, int64_t GH, int64_t units) {
    U = units;
    kc = std::min<int64_t>(GH, 256);  // dgr columns staged at a time
    kcp = kc + 1;                     // (rows off by one bank)
    outs = B * U;
    rt_off = 0;
    stage_off = rt_off + GH * U;
    prod_off = stage_off + B * kcp;
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
  const int64_t H = g.H, B = g.B, GH = g.GH, U = lay.U, kc = lay.kc, kcp = lay.kcp;
  float* Rt = sm + lay.rt_off;        // Rt[k·U + u] = R[k·H + j0 + u]: the units' columns of R
  float* stage = sm + lay.stage_off;  // stage[b·kcp + k]: dgr columns c0 + k
  float* prod = sm + lay.prod_off;    // prod[b·U + u]: this step's dH_prev product
  const int tid = threadIdx.x, nt = blockDim.x;
  const int64_t j0 = blockIdx.x * U, units = min(U, H - j0);
  for (int64_t i = tid; i < GH * U; i += nt) {
    const int64_t k = i / U, u = i % U;
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
    // prod = dgr · R for the units' columns, dgr staged kc columns at a time
    for (int64_t i = tid; i < B * U; i += nt) prod[i] = 0.f;
    for (int64_t c0 = 0; c0 < GH; c0 += kc) {
      const int64_t w = min(kc, GH - c0);
      __syncthreads();  // the last chunk's reads are done
      for (int64_t i = tid; i < B * w; i += nt) {
        const int64_t b = i / w, k = i % w;
        stage[b * kcp + k] = __ldcg(dgr + b * GH + c0 + k);  // (other CTAs wrote it)
      }
      __syncthreads();
      for (int64_t i = tid; i < B * U; i += nt) {
        const int64_t b = i / U, u = i % U;
        const float* st = stage + b * kcp;
        const float* rt = Rt + c0 * U + u;
        float acc = 0.f;
        for (int64_t k = 0; k < w; ++k) acc += st[k] * rt[k * U];
        prod[i] += acc;
      }
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
  if (!cell_ok || !env::rnn_persistent() || g.H % 4 != 0 || g.T == 0 || g.B == 0) return false;
  const CoopDevice d = coop_device(ctx.device());
  if (d.sms == 0) return false;
  // the fewest units a CTA that give one CTA per SM at most
  const int64_t units = (g.H + d.sms - 1) / d.sms;
  const PersistentLayout lay(g.B, g.H, units, g.cell == 0 ? 4 : 3);
  const auto grid = static_cast<unsigned>((g.H + units - 1) / units);
  float* h_b = scratch_of<float>(ctx, g.B * g.H);
  if (!launch_cooperative(ctx, rnn_persistent_kernel, grid, lay.bytes(), d, g, lens, xw, R, P, rbh,
                          h, h_b, g.cell == 0 ? c : nullptr, y, res, lay))
    return false;
  // the last step wrote h_b when T is odd
  if (g.T % 2 == 1)
    KILN_CUDA_CHECK(cudaMemcpyAsync(h, h_b, sizeof(float) * g.B * g.H, cudaMemcpyDeviceToDevice,
                                    stream_of(ctx)));
  return true;
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
  if (!cell_ok || !env::rnn_persistent() || g.T == 0 || g.B == 0 || !hp_all) return false;
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
