// The implicit-GEMM int8 convolution of quantized_conv on tensor cores (channels_last, groups 1)
// with its requantize epilogue fused, and quantized_matmul through it (quant_gemm.h).
#include <algorithm>
#include <climits>
#include <cstdint>
#include <type_traits>

#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/mma_util.cuh"
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
// bytes of K at an aligned address, copied without bounds checks), i8 weights whose zero points
// are all 0 (zero_w_zp): out[m, o] for output pixels m = (n, oh, ow) and
// channels o is
//   sum over (kh, kw, c) of x[n, ih, iw, c] w'[o, kh, kw, c] - zx wsum[o]
// (w' the (O, kh, kw, C) weights; padded positions read zx, so they add zx w - zx w = 0). A
// block computes a BM x BN tile of (pixels, channels), each warp 64 x 32 of it, with mma.sync
// m16n8k32 (s8 or u8 x, s8 w, s32 sums); the A rows are gathered from x straight into shared
// memory (cp.async, 16 bytes at a time: one (kh, kw) and 16 channels), 64 bytes of K a stage,
// three or four stages in flight. When zx is not 0 the block sums its weight rows from the same
// stages. No im2col matrix and no i32 product in memory.
//
// The epilogue is in f32: (sum - zx wsum) (exact, in integers) times sx sw / sy, plus bias / sy
// and the residual / sy, relu, rounding half to even, plus zy, saturated. Against the op's
// double-precision definition that differs only where a value lies within f32 rounding of a
// half-way point: 1 LSB at most (the acceptance's bound for fused int8 kernels). An int8
// residual (quantized_residual) is copied into shared memory at the start, beside the first
// stage. The sums pass through shared memory (where a second group of warps splitting K adds its
// own); each thread then requantizes four channels of a row at a time and stores them as one
// word (a warp writes whole rows).

constexpr int kIgK = 64, kIgStages = 4;
constexpr int kIgLd = kIgK + 16;  // bytes per shared row: 8 ldmatrix rows hit distinct banks

// KG groups of warps split each stage's K (KG 2: one k32 step each) and add up at the end: twice
// the warps for a tile, for layers with few tiles (a 14 x 14 or 7 x 7 stage of a ResNet). S
// stages in the pipeline.
template <int BM, int BN, int KG = 1, int S = kIgStages> struct IgTile {
  static constexpr int kWarpsN = BN / 32, kWarps = (BM / 64) * kWarpsN;
  static constexpr int kThreads = kWarps * KG * 32;
  static_assert(KG == 1 || KG == 2, "one or two k groups");
  static constexpr int kStageBytes = (BM + BN) * kIgLd, kPipeBytes = S * kStageBytes;
  static constexpr int kLdTile = BN + 16;  // the residual tile: bytes per row
  // per channel: a word (the first four: the block's scalars of the epilogue), then (corr,
  // mult, add) of the epilogue; the residual tile
  static constexpr int kSumsAt = kPipeBytes, kResAt = kSumsAt + BN * 16;
  static constexpr size_t smem(bool res_tile) {
    return static_cast<size_t>(kResAt) + (res_tile ? BM * kLdTile : 0);
  }
};

// c (16x8, s32) += a (16x32, A = s8 or u8) * b (32x8, s8); fragments as in the PTX ISA's
// m16n8k32 layouts (a0 row g bytes 4t.., a1 row g+8, a2 row g bytes 16+4t.., a3 row g+8 ...).
template <typename A> __device__ __forceinline__ void ig_mma(int (&c)[4], const unsigned (&a)[4],
                                                             unsigned b0, unsigned b1) {
  // (not volatile: registers only, so the compiler may interleave the products with the next
  // step's ldmatrix loads)
  if constexpr (std::is_same_v<A, uint8_t>)
    asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, "
        "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  else
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, "
        "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Float tricks that keep the epilogue off the conversion units (a quarter of the rate of the
// arithmetic ones): 2^23 + 2^22 added to a float in [-2^22, 2^22] rounds it half to even into the
// low bits of the sum's encoding; a byte placed in the mantissa of 2^23 reads as 2^23 + byte.
constexpr float kIgRound = 12582912.f;  // 1.5 * 2^23
constexpr float kIgTwo23 = 8388608.f;

// u, already plus the output zero point and clamped to [lo, hi] of Y (relu: to at least the zero
// point), rounded half to even; its low byte is the output's two's complement.
__device__ __forceinline__ uint32_t ig_round_bits(float u) { return __float_as_uint(u + kIgRound); }

// Byte e of `bytes` as the float 2^23 + byte.
template <int E> __device__ __forceinline__ float ig_byte_float(uint32_t bytes) {
  return __uint_as_float(__byte_perm(bytes, 0x4B000000u, 0x7440u | E));
}

// GELU in f32 (quant_math::activate's formulas): exact, v erfc(-v / sqrt 2) / 2, or the tanh form.
__device__ __forceinline__ float ig_gelu(float v, bool tanh_form) {
  if (tanh_form) return 0.5f * v * (1.f + tanhf(0.7978845608f * fmaf(0.044715f * v * v, v, v)));
  return 0.5f * v * erfcf(v * -0.7071067812f);
}

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
  constexpr int kT = T::kThreads, kChunks = kIgK / 16, kRowStep = kT / kChunks;
  constexpr int kAPer = BM / kRowStep, kBPer = BN / kRowStep;
  static_assert(BM % kRowStep == 0 && BN % kRowStep == 0 && kT >= BN, "tile shape");
  extern __shared__ __align__(128) unsigned char ig_raw[];
  int32_t* sums_s = reinterpret_cast<int32_t*>(ig_raw + T::kSumsAt);  // the per-channel words
  unsigned char* res_s = ig_raw + T::kResAt;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int Mi = static_cast<int>(g.N * g.OH * g.OW), Ki = static_cast<int>(g.kp);
  const int O = static_cast<int>(g.O);
  const int m0 = blockIdx.x * BM, o0 = blockIdx.y * BN;
  // this thread's A and B rows (kRowStep apart) and 16-byte chunk within a row; 32-bit index
  // math (the host checks the sizes), the window position advanced stage by stage
  const int chunk = tid % kChunks, row0 = tid / kChunks;
  const int H = static_cast<int>(g.H), W = static_cast<int>(g.W), C = static_cast<int>(g.C);
  const int KW = static_cast<int>(g.KW), dh = static_cast<int>(g.dh), dw = static_cast<int>(g.dw);
  const int OW = static_cast<int>(g.OW), OHW = static_cast<int>(g.OH * g.OW);
  int abase[kAPer], aih[kAPer], aiw[kAPer];  // the pixel's image offset (n H W C), window origin
#pragma unroll
  for (int i = 0; i < kAPer; ++i) {
    const int m = m0 + row0 + kRowStep * i;
    const int mm = m < Mi ? m : 0;
    const int n = mm / OHW, p = mm - n * OHW, oh = p / OW, ow = p - oh * OW;
    // (kRows: the window origin's byte in the padded copy, its first row at oh sh)
    abase[i] = kRows ? static_cast<int>(((n * g.ph + oh * g.sh) * g.pw + ow * g.sw) * g.pc)
                     : n * H * W * C;
    aih[i] = m < Mi ? oh * static_cast<int>(g.sh) - static_cast<int>(g.pt) : INT_MIN / 2;
    aiw[i] = ow * static_cast<int>(g.sw) - static_cast<int>(g.pl);
  }
  const int8_t* wrow[kBPer];
  bool bok[kBPer];
#pragma unroll
  for (int i = 0; i < kBPer; ++i) {
    const int o = o0 + row0 + kRowStep * i;
    bok[i] = o < O;
    wrow[i] = w + static_cast<int64_t>(bok[i] ? o : 0) * Ki + chunk * 16;
  }
  // (all above is index math: it overlaps the previous kernel's last blocks, launched as it is
  // by launch_after_previous; from here on the kernel reads the tensors)
  wait_for_previous_grids();
  // the quantized residual tile, in the first stage's group of copies
  if (res_tile) {
    const auto* rd = static_cast<const unsigned char*>(res.data);
    for (int q = tid; q < BM * (BN / 16); q += kT) {
      const int r = q / (BN / 16), c = (q % (BN / 16)) * 16;
      const bool ok = m0 + r < Mi && o0 + c < O;
      cp_async16(res_s + r * T::kLdTile + c,
                 rd + (ok ? static_cast<int64_t>(m0 + r) * O + o0 + c : 0), ok ? 16 : 0);
    }
  }
  // the zero point repeated: what a padded position holds
  const int32_t zxv = zx[0];
  const uint32_t zb = static_cast<uint8_t>(zxv);
  const uint4 pad =
      make_uint4(zb * 0x01010101u, zb * 0x01010101u, zb * 0x01010101u, zb * 0x01010101u);
  int lkh = 0, lkw = 0, lc = 0, lk0 = 0;  // the next stage to load: window (kh, kw), channel
  // kRows: a window row is 32 bytes of K (its pixels' pc channels), two rows a stage; this
  // thread copies bytes [16 (chunk % 2), + 16) of row kh + chunk / 2, in pieces as aligned as
  // the window origins (pc sw bytes apart)
  const int row_bytes = static_cast<int>(g.dh * g.pw * g.pc);
  const int piece = static_cast<int>(g.sw * g.pc % 16 == 0 ? 16 : g.sw * g.pc % 8 == 0 ? 8 : 4);
  auto load_stage = [&](int st) {
    unsigned char* as = ig_raw + st * T::kStageBytes;
    unsigned char* bs = as + BM * kIgLd;
    if constexpr (kRows) {
#pragma unroll
      for (int i = 0; i < kAPer; ++i) {
        unsigned char* dst = as + (row0 + kRowStep * i) * kIgLd + chunk * 16;
        const A* src = x + abase[i] + (lkh + chunk / 2) * row_bytes + (chunk % 2) * 16;
        if (piece == 16) {
          cp_async_ca<16>(dst, src);
        } else if (piece == 8) {
          cp_async_ca<8>(dst, src);
          cp_async_ca<8>(dst + 8, src + 8);
        } else {
#pragma unroll
          for (int j = 0; j < 16; j += 4) cp_async_ca<4>(dst + j, src + j);
        }
      }
    }
#pragma unroll
    for (int i = 0; i < kAPer && !kRows; ++i) {
      unsigned char* dst = as + (row0 + kRowStep * i) * kIgLd + chunk * 16;
      const int ih = aih[i] + lkh * dh, iw = aiw[i] + lkw * dw;
      if (ih >= 0 && ih < H && iw >= 0 && iw < W)  // (through L1: neighbouring windows overlap)
        cp_async_ca<16>(dst, x + abase[i] + (ih * W + iw) * C + lc + chunk * 16);
      else *reinterpret_cast<uint4*>(dst) = pad;
    }
#pragma unroll
    for (int i = 0; i < kBPer; ++i)
      cp_async16(bs + (row0 + kRowStep * i) * kIgLd + chunk * 16, wrow[i] + lk0, bok[i] ? 16 : 0);
    lk0 += kIgK;
    if constexpr (kRows) {
      lkh += 2;
    } else {
      lc += kIgK;
      if (lc == C) {
        lc = 0;
        if (++lkw == KW) lkw = 0, ++lkh;
      }
    }
  };
  const int ktiles = Ki / kIgK;
#pragma unroll
  for (int s = 0; s < S - 1; ++s) {
    if (s < ktiles) load_stage(s);
    cp_async_commit();
  }
  // the warp's tile and k group
  const int kgroup = KG == 1 ? 0 : warp / T::kWarps, wtile = warp % T::kWarps;
  const int wm = (wtile / T::kWarpsN) * 64, wn = (wtile % T::kWarpsN) * 32;
  const bool want_sums = zxv != 0 && tid < BN;  // this thread sums weight row tid
  int wsum = 0;
  // The epilogue's constants, made while the first stages load (their reads' latency hidden
  // behind the copies; none held in registers through the main loop) into shared memory beside
  // the stages: per channel, what the sum loses (minus the i32 bias here; zx wsum is added after
  // the loop), the scale and the bias in output units (plus zy: relu, then round half to even,
  // then + zy, saturated, is the clamp of the sum plus zy to [lo or zy, hi], rounded; zy is an
  // integer); and the block's scalars: the clamp's low end, 1 / sy, and the residual's scale in
  // output units and its zero point as a float encoding (a residual byte b, i8 ones flipped to
  // b + 128, is (2^23 + b - (2^23 + zr [+ 128])) * sr / sy).
  const bool res_i8 = res.kind == quant_math::Residual::kI8;
  uint32_t* corr_s = reinterpret_cast<uint32_t*>(sums_s + BN);
  float* mult_s = reinterpret_cast<float*>(sums_s + 2 * BN);
  float* add_s = reinterpret_cast<float*>(sums_s + 3 * BN);
  float* scalars_s = reinterpret_cast<float*>(sums_s);
  {
    const float syf = sy[0], zyf = static_cast<float>(zy[0]);
    if (tid < BN) {
      const int o = o0 + tid < O ? o0 + tid : O - 1;
      corr_s[tid] = 0u - static_cast<uint32_t>(ibias ? ibias[o] : 0);
      mult_s[tid] =
          static_cast<float>(static_cast<double>(sx[0]) * sw[g.per_channel_scale ? o : 0] / syf);
      add_s[tid] = (bias ? static_cast<float>(static_cast<double>(bias[o]) / syf) : 0.f) + zyf;
    }
    if (tid == 0) {
      const float inv_sy = 1.f / syf;
      scalars_s[0] = g.relu ? fmaxf(zyf, static_cast<float>(quant_math::Range<Y>::lo))
                            : static_cast<float>(quant_math::Range<Y>::lo);
      scalars_s[1] = inv_sy;
      scalars_s[2] = res_tile ? *res.scale * inv_sy : 0.f;
      scalars_s[3] =
          kIgTwo23 + (!res_tile ? 0.f
                      : res_i8  ? static_cast<float>(*static_cast<const int8_t*>(res.zp)) + 128.f
                                : static_cast<float>(*static_cast<const uint8_t*>(res.zp)));
    }
  }
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
    if (want_sums) {
#pragma unroll
      for (int j = 0; j < kIgK / 16; ++j) {
        const uint4 v = *reinterpret_cast<const uint4*>(bs + tid * kIgLd + 16 * j);
        wsum = __dp4a(static_cast<int>(v.x), 0x01010101, wsum);
        wsum = __dp4a(static_cast<int>(v.y), 0x01010101, wsum);
        wsum = __dp4a(static_cast<int>(v.z), 0x01010101, wsum);
        wsum = __dp4a(static_cast<int>(v.w), 0x01010101, wsum);
      }
    }
#pragma unroll
    for (int kk = 0; kk < kIgK / 32 / KG; ++kk) {
      const int ks = kk * KG + kgroup;
      unsigned a[4][4], b[4][2];
#pragma unroll
      for (int mi = 0; mi < 4; ++mi)
        ldmatrix_x4(a[mi], as + (wm + mi * 16 + lane % 16) * kIgLd + ks * 32 + (lane / 16) * 16);
#pragma unroll
      for (int nj = 0; nj < 4; nj += 2) {
        unsigned r[4];
        const int mtx = lane / 8;
        ldmatrix_x4(
            r, bs + (wn + nj * 8 + (mtx / 2) * 8 + lane % 8) * kIgLd + ks * 32 + (mtx % 2) * 16);
        b[nj][0] = r[0], b[nj][1] = r[1], b[nj + 1][0] = r[2], b[nj + 1][1] = r[3];
      }
#pragma unroll
      for (int mi = 0; mi < 4; ++mi)
#pragma unroll
        for (int nj = 0; nj < 4; ++nj) ig_mma<A>(acc[mi][nj], a[mi], b[nj][0], b[nj][1]);
    }
  }
  allow_next_grid();  // the rest is the epilogue
  cp_async_wait<0>();
  if (want_sums) corr_s[tid] += static_cast<uint32_t>(zxv) * static_cast<uint32_t>(wsum);
  __syncthreads();  // the stages are free: the sums go there; the residual tile is in
  // the i32 sums through shared memory (rows of BN + 8 words: 64-bit stores of a half warp and
  // 128-bit loads of a quarter hit distinct banks); a second k group adds its own in place
  constexpr int kLdAcc = BN + 8;
  static_assert(BM * kLdAcc * 4 <= T::kPipeBytes, "the sums fit in the stages");
  int* acc_s = reinterpret_cast<int*>(ig_raw);
  const int g4 = lane / 4, t4 = lane % 4;
#pragma unroll
  for (int group = 0; group < KG; ++group) {
    if (kgroup == group) {
#pragma unroll
      for (int mi = 0; mi < 4; ++mi)
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int nj = 0; nj < 4; ++nj) {
            const int r = wm + mi * 16 + g4 + 8 * h, col = wn + nj * 8 + 2 * t4;
            int2* at = reinterpret_cast<int2*>(acc_s + r * kLdAcc + col);
            int2 v = make_int2(acc[mi][nj][2 * h], acc[mi][nj][2 * h + 1]);
            if (group > 0) v.x += at->x, v.y += at->y;
            *at = v;
          }
    }
    __syncthreads();
  }
  // then four channels a thread (fixed: their constants read once), rows kT / (BN / 4) apart,
  // two rows an iteration (two independent chains; a loop small enough for the instruction
  // cache): the requantize in f32, the residual's four bytes, four bytes stored (a warp writes
  // whole rows)
  const float lo = scalars_s[0], inv_sy = scalars_s[1], rs = scalars_s[2], rz = scalars_s[3];
  const float hi = static_cast<float>(quant_math::Range<Y>::hi);
  constexpr int kQuads = BN / 4, kRowsPer = kT / kQuads;
  static_assert(BM % (2 * kRowsPer) == 0, "two rows an iteration");
  const int c = (tid % kQuads) * 4, o = o0 + c;
  uint32_t corr[4];
  float mult[4], add[4];
#pragma unroll
  for (int j = 0; j < 4; ++j)
    corr[j] = corr_s[c + j], mult[j] = mult_s[c + j], add[j] = add_s[c + j];
  const uint32_t flip = res_i8 ? 0x80808080u : 0u;
  const bool vec = O % 4 == 0 && reinterpret_cast<uintptr_t>(out) % 4 == 0 && o + 4 <= O;
  const int rows = o < O ? min(BM, Mi - m0) : 0;  // the tile's rows inside the output
  // (one loop per kind of residual, so that no row branches on it: kRes 0 none, 1 the int8 tile,
  // 2 read element by element; each row's output address one add from the last)
  // (kGelu: GELU of the real value, (u - zy) sy, back in output units)
  auto requantize_rows = [&](auto kind, auto gelu) {
    constexpr int kRes = decltype(kind)::value;
    constexpr bool kGelu = decltype(gelu)::value;
    const float syf = kGelu ? sy[0] : 0.f, zyf = kGelu ? static_cast<float>(zy[0]) : 0.f;
    const bool tanh_form = g.act == quant_math::kGeluTanh;
    const int64_t row_step = static_cast<int64_t>(O) * kRowsPer;
    auto requantize_row = [&](int r, Y* dst) {
      if (r >= rows) return;
      const int4 v = *reinterpret_cast<const int4*>(acc_s + r * kLdAcc + c);
      const int vs[4] = {v.x, v.y, v.z, v.w};
      // the bias (and zy), plus the residual
      float base[4] = {add[0], add[1], add[2], add[3]};
      if constexpr (kRes == 1) {
        const uint32_t four = *reinterpret_cast<const uint32_t*>(res_s + r * T::kLdTile + c) ^ flip;
        base[0] = fmaf(ig_byte_float<0>(four) - rz, rs, add[0]);
        base[1] = fmaf(ig_byte_float<1>(four) - rz, rs, add[1]);
        base[2] = fmaf(ig_byte_float<2>(four) - rz, rs, add[2]);
        base[3] = fmaf(ig_byte_float<3>(four) - rz, rs, add[3]);
      } else if constexpr (kRes == 2) {
        const int64_t at = static_cast<int64_t>(m0 + r) * O + o;
#pragma unroll
        for (int j = 0; j < 4; ++j)
          if (o + j < O) base[j] = fmaf(static_cast<float>(res.at(at + j)), inv_sy, add[j]);
      }
      uint32_t bits[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int32_t t = static_cast<int32_t>(static_cast<uint32_t>(vs[j]) - corr[j]);
        float u = fmaf(static_cast<float>(t), mult[j], base[j]);
        if constexpr (kGelu) u = fmaf(ig_gelu((u - zyf) * syf, tanh_form), inv_sy, zyf);
        bits[j] = ig_round_bits(fminf(fmaxf(u, lo), hi));
      }
      const uint32_t word = __byte_perm(__byte_perm(bits[0], bits[1], 0x0040u),
                                        __byte_perm(bits[2], bits[3], 0x0040u), 0x5410u);
      if (vec) {
        *reinterpret_cast<uint32_t*>(dst) = word;
      } else {
        for (int j = 0; j < 4 && o + j < O; ++j) dst[j] = static_cast<Y>((word >> (8 * j)) & 0xffu);
      }
    };
    const int r0 = tid / kQuads;
    Y* dst = out + static_cast<int64_t>(m0 + r0) * O + o;
#pragma unroll 1
    for (int r = r0; r < BM; r += 2 * kRowsPer, dst += 2 * row_step) {
      requantize_row(r, dst);
      requantize_row(r + kRowsPer, dst + row_step);
    }
  };
  using Plain = std::false_type;
  using Gelu = std::true_type;
  const bool gelu = quant_math::is_gelu(g.act);
  if (res_tile) requantize_rows(std::integral_constant<int, 1>{}, Plain{});
  else if (res.kind != quant_math::Residual::kNone && gelu)
    requantize_rows(std::integral_constant<int, 2>{}, Gelu{});
  else if (res.kind != quant_math::Residual::kNone)
    requantize_rows(std::integral_constant<int, 2>{}, Plain{});
  else if (gelu) requantize_rows(std::integral_constant<int, 0>{}, Gelu{});
  else requantize_rows(std::integral_constant<int, 0>{}, Plain{});
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
        !ctx.attrs().b("zero_w_zp", false) || !ctx.choices().qconv_implicit_gemm ||
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
              ctx.attrs().b("relu", false),
              ctx.in(4).numel() != 1,
              ctx.in(5).numel() != 1,
              true,
              true};
  g.act = epilogue_activation(ctx);
  g.gemm = true;
  int next = 8;
  const float* bias = ctx.attrs().b("has_bias", false) ? ctx.in(next++).ptr<float>() : nullptr;
  const quant_math::Residual res = residual_input(ctx, next);
  const int8_t* w_oc = nullptr;
  if (!transpose_w) {  // (what conv_igemm checks first, before the weights are transposed)
    if (!ctx.attrs().b("zero_w_zp", false) || !ctx.choices().qconv_implicit_gemm ||
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
