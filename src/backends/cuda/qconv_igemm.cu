// The implicit-GEMM int8 convolution of quantized_conv on tensor cores (channels_last, groups 1)
// with its requantize epilogue fused, and quantized_matmul through it (quant_gemm.h).
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/mma_util.cuh"
#include "backends/cuda/qconv_igemm_stages.cuh"
#include "backends/cuda/qconv_internal.cuh"
#include "backends/cuda/quant_gemm.h"
#include "backends/quant_dispatch.h"
#include "backends/quant_math.h"

namespace kiln::cuda {

namespace {

using namespace qconv_detail;

// (O, C, kh, kw) i8 weights as rows of the implicit GEMM's kRows mode: (O, KH rounded up to even,
// 32) with w[o, c, kh, kw] at [o, kh, kw pc + c], zeros elsewhere (g.kp = the row). Element i of
// `count`, from `first`, a thread each (a grid stride of `stride`).
__device__ void weights_rows_i8(const int8_t* __restrict__ w, int8_t* __restrict__ out,
                                const QConvArgs& g, int64_t first, int64_t stride) {
  const int64_t total = g.O * g.kp;
  for (int64_t i = first; i < total; i += stride) {
    const int64_t o = i / g.kp, r = i % g.kp, kh = r / 32, p = r % 32;
    const int64_t kw = p / g.pc, c = p % g.pc;
    out[i] = kh < g.KH && kw < g.KW && c < g.C ? w[g.w_at(o, c, kh, kw)] : int8_t{0};
  }
}

// What the kRows mode reads, in one launch: NHWC x as (N, ph, pw, pc), the image at (pt, pl), x's
// zero point elsewhere (padding, channels past C, what the last window rows read past the image),
// 32-bit index math (the host checks the size); blocks from x_blocks on write the weight rows
// (weights_rows_i8). Four words a thread. X = A: x is NHWC int8, four consecutive words (one
// 16-byte store; the loads of a word's pixel are independent). X = float: x is f32 NCHW
// (quantize_x), quantized here with (sx, zx) as quantize does; words 32 apart.
template <typename A, typename X>
__global__ void rows_operands_i8(const X* __restrict__ x, const float* __restrict__ sx,
                                 const A* __restrict__ zx, A* __restrict__ out,
                                 const int8_t* __restrict__ w, int8_t* __restrict__ w_out,
                                 QConvArgs g, int x_blocks) {
  if (static_cast<int>(blockIdx.x) >= x_blocks) {
    const int64_t b = blockIdx.x - x_blocks, blocks = gridDim.x - x_blocks;
    return weights_rows_i8(w, w_out, g, b * blockDim.x + threadIdx.x, blocks * blockDim.x);
  }
  constexpr bool kFloat = std::is_same_v<X, float>;
  const int shift = g.pc == 4 ? 0 : g.pc == 8 ? 1 : g.pc == 16 ? 2 : 3;  // log2(words a pixel)
  const int ph = static_cast<int>(g.ph), row_words = static_cast<int>(g.pw) << shift;
  const int total = static_cast<int>(g.N) * ph * row_words;
  const int tid = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  const A za = zx[0];
  const uint32_t zb = static_cast<uint8_t>(za);
  const int C = static_cast<int>(g.C), H = static_cast<int>(g.H), W = static_cast<int>(g.W);
  const int pt = static_cast<int>(g.pt), pl = static_cast<int>(g.pl);
  // word f's image, padded row, column (in words), and whether its pixel lies in the image
  auto locate = [&](int f, int& n, int& r, int& col, bool& in) {
    const int row = f / row_words;
    col = f - row * row_words;
    n = row / ph;
    r = row - n * ph;
    const int ih = r - pt, iw = (col >> shift) - pl;
    in = ih >= 0 && ih < H && iw >= 0 && iw < W;
  };
  if constexpr (kFloat) {
    // words lane, lane + 32, ... of the warp's 128: every load of a warp reads 32 consecutive
    // pixels of a channel, twelve loads a thread in flight for a 3-channel image
    const int f_base = (tid / 32) * 128 + tid % 32;
    if (f_base >= total) return;
    const float s = sx[0];
    float v[4][4];
    bool take[4][4];
    int n, r, col;
    bool in;
    locate(f_base, n, r, col, in);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (j > 0) {  // (32 words on)
        for (col += 32; col >= row_words; col -= row_words)
          if (++r == ph) r = 0, ++n;
        const int ih = r - pt, iw = (col >> shift) - pl;
        in = ih >= 0 && ih < H && iw >= 0 && iw < W;
      }
      in = in && f_base + 32 * j < total;
      const int q = col & ((1 << shift) - 1);
      const float* px = x + (in ? (n * C * H + r - pt) * W + (col >> shift) - pl : 0);
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        const int c = 4 * q + b;
        take[j][b] = in && c < C;
        v[j][b] = take[j][b] ? px[c * H * W] : 0.f;
      }
    }
    auto* o = reinterpret_cast<uint32_t*>(out);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      uint32_t word = 0;
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        const uint32_t byte =
            take[j][b] ? static_cast<uint8_t>(quant_math::quantize_one(v[j][b], s, za)) : zb;
        word |= byte << (8 * b);
      }
      if (f_base + 32 * j < total) o[f_base + 32 * j] = word;
    }
  } else {
    const int f0 = 4 * tid;  // the first of this thread's words
    if (f0 >= total) return;
    int n, r, col;
    bool in;
    locate(f0, n, r, col, in);
    uint32_t word[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int ih = r - pt, iw = (col >> shift) - pl, q = col & ((1 << shift) - 1);
      in = ih >= 0 && ih < H && iw >= 0 && iw < W;
      const X* px = x + (in ? ((n * H + ih) * W + iw) * C : 0);
      uint32_t v = 0;
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        const int c = 4 * q + b;
        v |= (in && c < C ? static_cast<uint8_t>(px[c]) : zb) << (8 * b);
      }
      word[j] = v;
      if (++col == row_words) {
        col = 0;
        if (++r == ph) r = 0, ++n;
      }
    }
    auto* o = reinterpret_cast<uint32_t*>(out) + f0;
    if (f0 + 4 <= total) {
      *reinterpret_cast<uint4*>(o) = make_uint4(word[0], word[1], word[2], word[3]);
    } else {
      for (int j = 0; f0 + j < total; ++j) o[j] = word[j];
    }
  }
}

// ---- NHWC implicit GEMM on int8 tensor cores, the epilogue fused ----
//
// For channels_last convs with groups 1, C a multiple of 64 (or kRows: window rows of at most 32
// bytes once C is padded to pc = 4, 8, 16 or 32, a stem's 7 x 3 as 7 x 4; they are read from a
// copy of x with that many channels and its padding written out, so each (pixel, kh) row is 32
// bytes of K at an aligned address, copied without bounds checks) and i8 weights whose zero
// points are all 0 (zero_w_zp). For output pixel m = (n, oh, ow) and channel o, with
// k = (kh, kw, c) over K = KH KW C and x~[m, k] the value of x under the window (zx where the
// window leaves the image, so that a padded position adds (zx - zx) w = 0):
//   y[m, o] = sat_Y(round_half_even(act(v) / sy) + zy)   (act: none, relu or GELU)
//   v = sx sw[o] (sum_k (x~[m, k] - zx)(w[o, k] - zw) + ibias[o]) + bias[o] + sr (r[m, o] - zr)
// The zero points expand as
//   sum_k (x~ - zx)(w - zw) = sum_k x~ w - zw sum_k x~ - zx sum_k w + K zx zw
// and with zw = 0 two terms are left, acc[m, o] - zx wsum[o]:
//   acc[m, o] = sum_k x~[m, k] w[o, k]   the main loop's products, i32 (IgGather, ig_mma)
//   wsum[o]   = sum_k w[o, k]            summed from the same stages when zx != 0
//                                        (ig_weight_row_sum; no sum of x~ is needed)
// The per-channel constants, made while the first stages load (ig_epilogue_constants), fold in
// the rest:
//   corr[o] = zx wsum[o] - ibias[o]      (-ibias before the loop, + zx wsum after it)
//   mult[o] = sx sw[o] / sy,   add[o] = bias[o] / sy + zy
//   y[m, o] = round(clamp((acc[m, o] - corr[o]) mult[o] + add[o] + (r - zr) sr / sy, lo, hi))
// in f32 (IgRequantize), lo = Ymin or, with relu, max(zy, Ymin); the i32 part is exact. Against
// the op's double-precision definition that differs only where a value lies within f32 rounding
// of a half-way point: 1 LSB at most (the acceptance's bound for fused int8 kernels).
//
// A block computes a BM x BN tile of (pixels, channels), each warp 64 x 32 of it, with mma.sync
// m16n8k32 (s8 or u8 x, s8 w, s32 sums); the A rows are gathered from x straight into shared
// memory (cp.async, 16 bytes at a time: one (kh, kw) and 16 channels), 64 bytes of K a stage,
// three or four stages in flight. No im2col matrix and no i32 product in memory. An int8
// residual (quantized_residual) is copied into shared memory at the start, beside the first
// stage. The sums pass through shared memory (where a second group of warps splitting K adds its
// own); each thread then requantizes four channels of a row at a time and stores them as one
// word (a warp writes whole rows).
template <typename A, typename Y, int BM, int BN, int KG, bool kRows, int S>
__global__ void __launch_bounds__(IgTile<BM, BN, KG, S>::kThreads,
                                  512 / IgTile<BM, BN, KG, S>::kThreads)
    qconv_igemm(const A* __restrict__ x, const int8_t* __restrict__ w, const float* __restrict__ sx,
                const A* __restrict__ zx, const float* __restrict__ sw,
                const float* __restrict__ sy, const Y* __restrict__ zy,
                const float* __restrict__ bias, const int32_t* __restrict__ ibias,
                quant_math::Residual res, bool res_tile, Y* __restrict__ out, QConvArgs g) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using T = IgTile<BM, BN, KG, S>;
  static_assert(BM % T::kRowStep == 0 && BN % T::kRowStep == 0 && T::kThreads >= BN, "tile shape");
  const IgBlock b = ig_block<T>(g);
  // the gather's index math: it overlaps the previous kernel's last blocks (launched by
  // launch_after_previous); the tensors are read from the wait on
  IgARows<T> arows;
  IgBRows<T> brows;
  IgCursor cursor;
  IgGather<A, T, kRows> gather(x, w, g, b, arows, brows, cursor);
  wait_for_previous_grids();
  unsigned char* res_s = ig_raw + T::kResAt;
  if (res_tile) ig_copy_residual_tile<T>(res_s, res, b);
  const int32_t zxv = zx[0];
  gather.start(static_cast<uint8_t>(zxv), g);
  auto load_stage = [&](int st) { gather.load_stage(st); };  // (a lambda: see the stages' note)
  // the first S - 1 stages in flight, then the epilogue's constants beside them
  const int ktiles = b.Ki / kIgK;
#pragma unroll
  for (int s = 0; s < S - 1; ++s) {
    if (s < ktiles) load_stage(s);
    cp_async_commit();
  }
  const IgWarp wp = ig_warp<T>(b);
  const bool want_sums = zxv != 0 && b.tid < BN;  // this thread sums weight row tid
  int wsum = 0;
  const bool res_i8 = res.kind == quant_math::Residual::kI8;
  const IgConsts k = IgConsts::at<T>();
  ig_epilogue_constants<Y, T>(k, b, g, sx, sw, sy, zy, bias, ibias, res, res_tile, res_i8);
  // the main loop: stage kt in, stage kt + S - 1 on its way; acc += A B over stage kt's K (the
  // warp's 64 x 32, its k group's k32 steps), wsum += its B row
  int acc[4][4][4] = {};
  for (int kt = 0; kt < ktiles; ++kt) {
    cp_async_wait<S - 2>();
    __syncthreads();
    {
      const int next = kt + S - 1;
      if (next < ktiles) load_stage(next % S);
      cp_async_commit();
    }
    const unsigned char* as = ig_raw + (kt % S) * T::kStageBytes;
    const unsigned char* bs = as + BM * kIgLd;
    if (want_sums) ig_weight_row_sum(bs + b.tid * kIgLd, wsum);
#pragma unroll
    for (int kk = 0; kk < kIgK / 32 / KG; ++kk) {
      unsigned fa[4][4], fb[4][2];
      ig_load_fragments<T>(fa, fb, as, bs, wp, b.lane, kk * KG + wp.kgroup);
#pragma unroll
      for (int mi = 0; mi < 4; ++mi)
#pragma unroll
        for (int nj = 0; nj < 4; ++nj) ig_mma<A>(acc[mi][nj], fa[mi], fb[nj][0], fb[nj][1]);
    }
  }
  allow_next_grid();  // the rest is the epilogue
  cp_async_wait<0>();
  if (want_sums) k.corr[b.tid] += static_cast<uint32_t>(zxv) * static_cast<uint32_t>(wsum);
  __syncthreads();  // the stages are free: the sums go there; the residual tile is in
  int* acc_s = reinterpret_cast<int*>(ig_raw);
  ig_sums_to_shared<T>(acc_s, acc, wp, b.lane);
  IgFour four;
  const IgRequantize<Y, T> rq(k, four, acc_s, res_s, b, g, sy, zy, res_i8, out);
  const bool gelu = quant_math::is_gelu(g.act);
  if (res_tile) rq.template store_rows<1, false>(res);
  else if (res.kind != quant_math::Residual::kNone && gelu) rq.template store_rows<2, true>(res);
  else if (res.kind != quant_math::Residual::kNone) rq.template store_rows<2, false>(res);
  else if (gelu) rq.template store_rows<0, true>(res);
  else rq.template store_rows<0, false>(res);
#endif
}

template <typename A, typename Y, int BM, int BN, int KG = 1, bool kRows = false, int S = kIgStages>
void launch_igemm(KernelContext& ctx, const QConvArgs& g, const A* x, const int8_t* w8,
                  const float* bias, const int32_t* ibias, const quant_math::Residual& res,
                  bool res_tile) {
  using T = IgTile<BM, BN, KG, S>;
  auto kernel = qconv_igemm<A, Y, BM, BN, KG, kRows, S>;
  const size_t smem = T::smem(res_tile);
  allow_smem(kernel, smem);
  const int64_t M = g.N * g.OH * g.OW;
  const dim3 grid(static_cast<unsigned>((M + BM - 1) / BM),
                  static_cast<unsigned>((g.O + BN - 1) / BN));
  launch_after_previous(ctx.choices().programmatic_launch, kernel, grid, dim3(T::kThreads), smem,
                        stream_of(ctx), x, w8, ctx.in(1).ptr<float>(), ctx.in(2).ptr<A>(),
                        ctx.in(4).ptr<float>(), ctx.in(6).ptr<float>(), ctx.in(7).ptr<Y>(), bias,
                        ibias, res, res_tile, ctx.out(0).ptr<Y>(), g);
  check_launch(ctx.op_name());
}

}  // namespace

namespace qconv_detail {

// (xf: quantize_x's f32 NCHW x, taken in the rows mode only; w_oc: (O, C) weights to read
// instead of input 3, a 1x1 window only)
template <typename A, typename W, typename Y>
bool conv_igemm(KernelContext& ctx, QConvArgs g, const float* bias, const int32_t* ibias,
                const quant_math::Residual& res, const float* xf, const int8_t* w_oc) {
  if constexpr (!std::is_same_v<W, int8_t>) {
    return false;
  } else {
    const TensorView& tx = ctx.in(0);
    // C a multiple of 64; or (kRows) a window row of at most 32 bytes with C padded to pc (a
    // stem's 7 x 3: 7 x 4), read from a padded copy of x
    const bool rows = g.C % kIgK != 0;
    if (rows) {
      g.pc = g.C <= 4 ? 4 : g.C <= 8 ? 8 : g.C <= 16 ? 16 : g.C <= 32 ? 32 : 64;  // (64: none)
      g.ph = (g.OH - 1) * g.sh + ((g.KH + 1) / 2 * 2 - 1) * g.dh + 1;
      g.pw = (g.OW - 1) * g.sw + 32 / g.pc;
    }
    if (!g.cl || g.G != 1 || (rows && (g.KW * g.pc > 32 || g.dw != 1)) ||
        !params_of<QuantEpilogueParams>(ctx).zero_w_zp || !ctx.choices().qconv_implicit_gemm ||
        (!rows && (xf || pointer_alignment(tx.data) < 16)))
      return false;
    const int64_t M = g.N * g.OH * g.OW;
    const int64_t K = rows ? (g.KH + 1) / 2 * 64 : g.C * g.KH * g.KW;
    // 32-bit index math in the kernel
    if (tx.numel() + kIgK > INT32_MAX || M + 128 > INT32_MAX || g.O * K > INT32_MAX ||
        (g.O + 63) / 64 > 65535 || (rows && g.N * g.ph * g.pw * g.pc > INT32_MAX))
      return false;
    cudaStream_t st = stream_of(ctx);
    const TensorView& tw = ctx.in(3);
    // (O, kh, kw, C) weights (kRows: (O, kh, 32) rows); a 1x1 conv's (O, C, 1, 1) are that
    // already
    const int8_t* w8 = w_oc ? w_oc : tw.ptr<int8_t>();
    const A* x = tx.ptr<A>();
    g.kp = K;
    if (w_oc) {
      if (rows || g.KH * g.KW != 1 || pointer_alignment(w_oc) < 16) return false;
    } else if (rows) {
      // the padded copy of x and the weight rows, one launch
      auto* wbuf = static_cast<int8_t*>(ctx.scratch(static_cast<size_t>(g.O * K)));
      const int64_t pixels = g.N * g.ph * g.pw;
      auto* xp = static_cast<A*>(ctx.scratch(static_cast<size_t>(pixels * g.pc)));
      const int64_t words = pixels * g.pc / 4;  // (four a thread: rows_operands_i8)
      const int x_blocks = static_cast<int>((words + 4 * kThreads - 1) / (4 * kThreads));
      const int64_t w_blocks = std::min<int64_t>((g.O * K + kThreads - 1) / kThreads, 64);
      const unsigned grid = static_cast<unsigned>(x_blocks + w_blocks);
      if (xf)
        rows_operands_i8<A, float><<<grid, kThreads, 0, st>>>(xf, ctx.in(1).ptr<float>(),
                                                              ctx.in(2).ptr<A>(), xp,
                                                              tw.ptr<int8_t>(), wbuf, g, x_blocks);
      else
        rows_operands_i8<A, A><<<grid, kThreads, 0, st>>>(x, nullptr, ctx.in(2).ptr<A>(), xp,
                                                          tw.ptr<int8_t>(), wbuf, g, x_blocks);
      w8 = wbuf;
      x = xp;
    } else if ((g.KH * g.KW > 1 && !g.ohwi) || pointer_alignment(w8) < 16) {
      auto* buf = static_cast<int8_t*>(ctx.scratch(static_cast<size_t>(g.O * K)));
      weights_khwc_i8<W><<<blocks_for(g.O * K), kThreads, 0, st>>>(tw.ptr<W>(), buf, g, 0);
      w8 = buf;
    }
    // an int8 residual goes through shared memory in 16-byte copies (not before a GELU, whose
    // epilogue reads the residual element by element)
    const bool gelu = quant_math::is_gelu(g.act);
    const bool res_tile =
        (res.kind == quant_math::Residual::kU8 || res.kind == quant_math::Residual::kI8) &&
        g.O % 16 == 0 && pointer_alignment(res.data) >= 16 && !gelu;
    const int64_t sms = sm_count(ctx.device());
    // (128 x 64 blocks with three stages: four an SM, as many as their registers allow)
    if (rows) {
      launch_igemm<A, Y, 128, 64, 1, true, 3>(ctx, g, x, w8, bias, ibias, res, res_tile);
      return true;
    }
    auto blocks = [&](int64_t bm, int64_t bn) { return (M + bm - 1) / bm * ((g.O + bn - 1) / bn); };
    // The largest tile that still gives every SM a block; between split-K 128 x 64 tiles and
    // 64 x 64 ones (a 14 x 14 or 7 x 7 stage of a ResNet), the one that leaves the busiest SM the
    // least output (blocks an SM, rounded up, times the tile): 196 blocks of 128 x 64 on 132 SMs
    // give some SMs two while others idle after one; 392 of 64 x 64 give each at most three, half
    // the size (a 3x3 256 -> 256 layer at 14 x 14 and batch 32: 27 -> 24 us on the H200)
    auto busiest = [&](int64_t bm, int64_t bn) {
      return (blocks(bm, bn) + sms - 1) / sms * bm * bn;
    };
    // (quantized_matmul's products with fewer than two waves of 128 x 128 blocks: 128 x 64 ones,
    // four an SM; BERT-base's K = 768 or 3072, N = 768 products on the H200: 20 -> 19 us and
    // 68 -> 60 us, where its N = 3072 one is faster in 128 x 128 blocks, 78 against 84 us)
    if (g.O >= 128 && blocks(128, 128) >= sms && !(g.gemm && blocks(128, 128) < 2 * sms))
      launch_igemm<A, Y, 128, 128>(ctx, g, x, w8, bias, ibias, res, res_tile);
    else if (blocks(128, 64) >= 2 * sms)
      launch_igemm<A, Y, 128, 64, 1, false, 3>(ctx, g, x, w8, bias, ibias, res, res_tile);
    else if (blocks(128, 64) >= sms && busiest(128, 64) <= busiest(64, 64))
      launch_igemm<A, Y, 128, 64, 2>(ctx, g, x, w8, bias, ibias, res, res_tile);
    else launch_igemm<A, Y, 64, 64, 2>(ctx, g, x, w8, bias, ibias, res, res_tile);
    return true;
  }
}

// The instantiations quantized_conv takes (with_int8_types: x, weights and output i8 or u8).
#define KILN_CONV_IGEMM(A, W, Y)                                                             \
  template bool conv_igemm<A, W, Y>(KernelContext&, QConvArgs, const float*, const int32_t*, \
                                    const quant_math::Residual&, const float*, const int8_t*)
KILN_CONV_IGEMM(int8_t, int8_t, int8_t);
KILN_CONV_IGEMM(int8_t, int8_t, uint8_t);
KILN_CONV_IGEMM(int8_t, uint8_t, int8_t);
KILN_CONV_IGEMM(int8_t, uint8_t, uint8_t);
KILN_CONV_IGEMM(uint8_t, int8_t, int8_t);
KILN_CONV_IGEMM(uint8_t, int8_t, uint8_t);
KILN_CONV_IGEMM(uint8_t, uint8_t, int8_t);
KILN_CONV_IGEMM(uint8_t, uint8_t, uint8_t);
#undef KILN_CONV_IGEMM

}  // namespace qconv_detail

namespace {

// dst (N, K) = src (K, N)ᵀ, int8: quantized_matmul's (K, N) weights for the implicit GEMM.
__global__ void transpose_i8(const int8_t* __restrict__ src, int8_t* __restrict__ dst, int64_t k,
                             int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < k * n;
       i += int64_t{blockDim.x} * gridDim.x) {
    const int64_t r = i / k, c = i % k;  // dst's row (of N) and column (of K)
    dst[i] = src[c * n + r];
  }
}

}  // namespace

bool quantized_matmul_igemm(KernelContext& ctx, int64_t m, int64_t n, int64_t k, bool transpose_w) {
  const TensorView& tw = ctx.in(3);
  if (tw.dtype != DType::i8 || m <= 0 || n <= 0 || k % kIgK != 0 || ctx.in(4).numel() == 0)
    return false;
  const QuantEpilogueParams ep = params_of<QuantEpilogueParams>(ctx);
  // a 1x1 NHWC convolution over m pixels: C = k, O = n
  QConvArgs g{m,
              k,
              1,
              1,
              n,
              1,
              1,
              1,
              1,
              1,
              1,
              1,
              1,
              1,
              0,
              0,
              ep.relu,
              ctx.in(4).numel() != 1,
              ctx.in(5).numel() != 1,
              true,
              true};
  g.act = epilogue_activation(ep);
  g.gemm = true;
  int next = 8;
  const float* bias = ep.has_bias ? ctx.in(next++).ptr<float>() : nullptr;
  const quant_math::Residual res = residual_input(ctx, next, ep);
  const int8_t* w_oc = nullptr;
  if (!transpose_w) {  // (what conv_igemm checks first, before the weights are transposed)
    if (!ep.zero_w_zp || !ctx.choices().qconv_implicit_gemm ||
        pointer_alignment(ctx.in(0).data) < 16)
      return false;
    auto* buf = static_cast<int8_t*>(ctx.scratch(static_cast<size_t>(n * k)));
    transpose_i8<<<blocks_for(n * k), kThreads, 0, stream_of(ctx)>>>(tw.ptr<int8_t>(), buf, k, n);
    check_launch(ctx.op_name());
    w_oc = buf;
  }
  bool done = false;
  with_int8_types(ctx, "cuda", [&](auto at, auto wt, auto yt) {
    done = conv_igemm<decltype(at), decltype(wt), decltype(yt)>(ctx, g, bias, nullptr, res, nullptr,
                                                                w_oc);
  });
  return done;
}

}  // namespace kiln::cuda
