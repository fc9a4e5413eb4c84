// The stages of qconv_igemm (qconv_igemm.cu), the int8 implicit-GEMM convolution on tensor cores:
// the tile and its shared memory, the gather of the operands into the pipeline, the fragments and
// products of the main loop, the epilogue's constants, the k groups' sums, and the requantize and
// store. Each states its algebra; qconv_igemm.cu states the whole. Included by qconv_igemm.cu only.
//
// How the kernel is split into these pieces is part of its speed: nvcc schedules the whole kernel
// (and allocates its registers) by how it is split, and the shapes here give, instruction for
// instruction, the code of the single-function kernel that was measured: the gather's rows and
// cursor in objects of their own, its load_stage called through a lambda, the assumption in
// ig_epilogue_constants, the products' loop left in the kernel, IgRequantize holding references
// to the kernel's sy, zy and out. A change to them is checked against the previous build with
// cuobjdump -sass, kernel by kernel.
#pragma once

#include <climits>
#include <cstdint>
#include <type_traits>

#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/mma_util.cuh"
#include "backends/cuda/qconv_internal.cuh"
#include "backends/quant_math.h"

namespace kiln::cuda::qconv_detail {

constexpr int kIgK = 64, kIgStages = 4;
constexpr int kIgLd = kIgK + 16;  // bytes per shared row: 8 ldmatrix rows hit distinct banks

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

// A block's BM x BN tile of (pixels, channels), each warp 64 x 32 of it. KG groups of warps split
// each stage's K (KG 2: one k32 step each) and add up at the end: twice the warps for a tile, for
// layers with few tiles (a 14 x 14 or 7 x 7 stage of a ResNet). S stages in the pipeline.
template <int BM, int BN, int KG = 1, int S = kIgStages> struct IgTile {
  static constexpr int kBM = BM, kBN = BN, kKG = KG, kS = S;
  static constexpr int kWarpsN = BN / 32, kWarps = (BM / 64) * kWarpsN;
  static constexpr int kThreads = kWarps * KG * 32;
  static_assert(KG == 1 || KG == 2, "one or two k groups");
  // shared memory: S stages of BM A rows then BN B rows; per channel a word (the first four: the
  // block's scalars of the epilogue), then (corr, mult, add) of the epilogue; the residual tile
  static constexpr int kStageBytes = (BM + BN) * kIgLd, kPipeBytes = S * kStageBytes;
  static constexpr int kLdTile = BN + 16;  // the residual tile: bytes per row
  static constexpr int kSumsAt = kPipeBytes, kResAt = kSumsAt + BN * 16;
  static constexpr size_t smem(bool res_tile) {
    return static_cast<size_t>(kResAt) + (res_tile ? BM * kLdTile : 0);
  }
  // the gather: 16-byte chunks of a stage's rows, each thread's rows kRowStep apart
  static constexpr int kChunks = kIgK / 16, kRowStep = kThreads / kChunks;
  static constexpr int kAPer = BM / kRowStep, kBPer = BN / kRowStep;
  // the i32 sums in the stages once the loop is done: rows of BN + 8 words (64-bit stores of a
  // half warp and 128-bit loads of a quarter hit distinct banks)
  static constexpr int kLdAcc = BN + 8;
  // the requantize: four channels a thread, rows kRowsPer apart
  static constexpr int kQuads = BN / 4, kRowsPer = kThreads / kQuads;
};

// The dynamic shared memory of qconv_igemm, laid out by IgTile.
extern __shared__ __align__(128) unsigned char ig_raw[];

// The block's tile of the GEMM, output pixels m0 + [0, BM) by channels o0 + [0, BN), the GEMM's
// M x K x O in 32-bit index math (the host checks the sizes), and the thread's place.
struct IgBlock {
  int tid, warp, lane;
  int Mi, Ki, O;
  int m0, o0;
};
template <typename T> __device__ __forceinline__ IgBlock ig_block(const QConvArgs& g) {
  IgBlock b;
  b.tid = threadIdx.x, b.warp = b.tid / 32, b.lane = b.tid % 32;
  b.Mi = static_cast<int>(g.N * g.OH * g.OW), b.Ki = static_cast<int>(g.kp);
  b.O = static_cast<int>(g.O);
  b.m0 = blockIdx.x * T::kBM, b.o0 = blockIdx.y * T::kBN;
  return b;
}

// A thread's rows of the stages, fixed through the loop. A rows: the output pixel's image offset
// n H W C (kRows: its window origin's byte in the padded copy) and window origin
// (oh sh - pt, ow sw - pl), its row INT_MIN / 2 past M. B rows: where the thread's chunk of
// weight row o starts; whether o < O.
template <typename T> struct IgARows { int abase[T::kAPer], aih[T::kAPer], aiw[T::kAPer]; };
template <typename T> struct IgBRows {
  const int8_t* wrow[T::kBPer];
  bool bok[T::kBPer];
};
// The next stage to load: window position (kh, kw), channel c, and k0, its offset in K.
struct IgCursor {
  int kh = 0, kw = 0, c = 0, k0 = 0;
};

// The producer of the pipeline. Stage s (K from k0 = 64 s) holds, in rows of kIgLd bytes,
//   A[i, j] = x~[m0 + i, k0 + j]   the im2col rows of the output pixels m = (n, oh, ow):
//     x~[m, (kh, kw, c)] = x[n, oh sh - pt + kh dh, ow sw - pl + kw dw, c]  inside the image,
//                          zx                                                outside it
//   B[i, j] = w[o0 + i, k0 + j]    the (O, kh, kw, C) weights as rows, 0 for o >= O
// (kRows: x~ is read from the padded copy, whose rows hold zx wherever the window leaves the
// image). A thread copies 16 bytes (one (kh, kw) and 16 channels) of rows row0 + kRowStep i of
// each. The constructor is index math only: it may run before the previous grid has finished.
template <typename A, typename T, bool kRows> struct IgGather {
  static constexpr int kAPer = T::kAPer, kBPer = T::kBPer, kRowStep = T::kRowStep;
  const A* x;
  IgARows<T>& ar;
  IgBRows<T>& br;
  IgCursor& at;
  int chunk, row0;  // this thread's 16-byte chunk within a row and its first row
  int H, W, C, KW, dh, dw;
  uint32_t pad;  // zx in every byte: what a padded position holds
  // kRows: a window row is 32 bytes of K (its pixels' pc channels), two rows a stage; this
  // thread copies bytes [16 (chunk % 2), + 16) of row kh + chunk / 2, in pieces as aligned as
  // the window origins (pc sw bytes apart)
  int row_bytes, piece;

  __device__ __forceinline__ IgGather(const A* x_, const int8_t* w, const QConvArgs& g,
                                      const IgBlock& b, IgARows<T>& arows, IgBRows<T>& brows,
                                      IgCursor& cursor)
      : x(x_), ar(arows), br(brows), at(cursor) {
    chunk = b.tid % T::kChunks, row0 = b.tid / T::kChunks;
    H = static_cast<int>(g.H), W = static_cast<int>(g.W), C = static_cast<int>(g.C);
    KW = static_cast<int>(g.KW), dh = static_cast<int>(g.dh), dw = static_cast<int>(g.dw);
    const int OW = static_cast<int>(g.OW), OHW = static_cast<int>(g.OH * g.OW);
#pragma unroll
    for (int i = 0; i < kAPer; ++i) {
      const int m = b.m0 + row0 + kRowStep * i;
      const int mm = m < b.Mi ? m : 0;
      const int n = mm / OHW, p = mm - n * OHW, oh = p / OW, ow = p - oh * OW;
      // (kRows: the window origin's byte in the padded copy, its first row at oh sh)
      ar.abase[i] = kRows ? static_cast<int>(((n * g.ph + oh * g.sh) * g.pw + ow * g.sw) * g.pc)
                          : n * H * W * C;
      ar.aih[i] = m < b.Mi ? oh * static_cast<int>(g.sh) - static_cast<int>(g.pt) : INT_MIN / 2;
      ar.aiw[i] = ow * static_cast<int>(g.sw) - static_cast<int>(g.pl);
    }
#pragma unroll
    for (int i = 0; i < kBPer; ++i) {
      const int o = b.o0 + row0 + kRowStep * i;
      br.bok[i] = o < b.O;
      br.wrow[i] = w + static_cast<int64_t>(br.bok[i] ? o : 0) * b.Ki + chunk * 16;
    }
  }

  // Once x's zero point is read (zb, its byte): the padding word, and the rows mode's strides.
  __device__ __forceinline__ void start(uint32_t zb, const QConvArgs& g) {
    pad = zb * 0x01010101u;
    row_bytes = static_cast<int>(g.dh * g.pw * g.pc);
    piece = static_cast<int>(g.sw * g.pc % 16 == 0 ? 16 : g.sw * g.pc % 8 == 0 ? 8 : 4);
  }

  // The next stage's copies into pipeline slot st, then the cursor 64 on in K (the next channels
  // of the window position, or its next position; kRows: two window rows on).
  __device__ void load_stage(int st) const {
    unsigned char* as = ig_raw + st * T::kStageBytes;
    unsigned char* bs = as + T::kBM * kIgLd;
    // A: cp.async through L1 (neighbouring windows overlap), the pad word where the window
    // leaves the image
    if constexpr (kRows) {
#pragma unroll
      for (int i = 0; i < kAPer; ++i) {
        unsigned char* dst = as + (row0 + kRowStep * i) * kIgLd + chunk * 16;
        const A* src = x + ar.abase[i] + (at.kh + chunk / 2) * row_bytes + (chunk % 2) * 16;
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
      const int ih = ar.aih[i] + at.kh * dh, iw = ar.aiw[i] + at.kw * dw;
      if (ih >= 0 && ih < H && iw >= 0 && iw < W)
        cp_async_ca<16>(dst, x + ar.abase[i] + (ih * W + iw) * C + at.c + chunk * 16);
      else *reinterpret_cast<uint4*>(dst) = make_uint4(pad, pad, pad, pad);
    }
    // B: cp.async through L2, zeros for rows past O
#pragma unroll
    for (int i = 0; i < kBPer; ++i)
      cp_async16(bs + (row0 + kRowStep * i) * kIgLd + chunk * 16, br.wrow[i] + at.k0,
                 br.bok[i] ? 16 : 0);
    at.k0 += kIgK;
    if constexpr (kRows) {
      at.kh += 2;
    } else {
      at.c += kIgK;
      if (at.c == C) {
        at.c = 0;
        if (++at.kw == KW) at.kw = 0, ++at.kh;
      }
    }
  }
};

// The quantized residual tile, r[m0 + i, o0 + j] into shared rows of kLdTile bytes (in the first
// stage's group of copies), zeros outside the output.
template <typename T>
__device__ __forceinline__ void ig_copy_residual_tile(unsigned char* res_s,
                                                      const quant_math::Residual& res,
                                                      const IgBlock& b) {
  constexpr int BM = T::kBM, BN = T::kBN;
  const auto* rd = static_cast<const unsigned char*>(res.data);
  for (int q = b.tid; q < BM * (BN / 16); q += T::kThreads) {
    const int r = q / (BN / 16), c = (q % (BN / 16)) * 16;
    const bool ok = b.m0 + r < b.Mi && b.o0 + c < b.O;
    cp_async16(res_s + r * T::kLdTile + c,
               rd + (ok ? static_cast<int64_t>(b.m0 + r) * b.O + b.o0 + c : 0), ok ? 16 : 0);
  }
}

// The epilogue's constants in shared memory, beside the stages: the block's scalars in the first
// four words, then a word per channel of each of corr, mult and add.
struct IgConsts {
  float* scalars;  // lo, 1 / sy, rs, rz
  uint32_t* corr;
  float* mult;
  float* add;
  template <typename T> __device__ __forceinline__ static IgConsts at() {
    int32_t* sums_s = reinterpret_cast<int32_t*>(ig_raw + T::kSumsAt);
    return {reinterpret_cast<float*>(sums_s), reinterpret_cast<uint32_t*>(sums_s + T::kBN),
            reinterpret_cast<float*>(sums_s + 2 * T::kBN),
            reinterpret_cast<float*>(sums_s + 3 * T::kBN)};
  }
};

// Per channel o = o0 + tid (a thread each), in the terms of the clamp (relu, then round half to
// even, then + zy, saturated, is round(clamp(u, lo, hi)) with u already plus zy; zy is an
// integer):
//   corr[o] = -ibias[o]              (mod 2^32; zx wsum[o] is added once the loop has summed w)
//   mult[o] = sx sw[o] / sy          (in double, then f32)
//   add[o]  = bias[o] / sy + zy
// and the block's scalars (thread 0):
//   lo = relu ? max(zy, Ymin) : Ymin,   1 / sy,   rs = sr / sy,   rz = 2^23 + zr (+ 128 for i8)
// (a residual byte b, i8 ones flipped to b + 128, is (2^23 + b - rz) rs in output units). Made
// while the first stages load: their reads' latency hides behind the copies, and none is held in
// registers through the main loop.
template <typename Y, typename T> __device__ __forceinline__ void ig_epilogue_constants(
    const IgConsts& k, const IgBlock& b, const QConvArgs& g, const float* sx, const float* sw,
    const float* sy, const Y* zy, const float* bias, const int32_t* ibias,
    const quant_math::Residual& res, bool res_tile, bool res_i8) {
  const float syf = sy[0], zyf = static_cast<float>(zy[0]);
  if (b.tid < T::kBN) {
    const int o = b.o0 + b.tid < b.O ? b.o0 + b.tid : b.O - 1;
    const int32_t ib = ibias ? ibias[o] : 0;
    __builtin_assume(ibias || ib == 0);  // (true: it keeps the negation after the cases meet)
    k.corr[b.tid] = 0u - static_cast<uint32_t>(ib);
    k.mult[b.tid] =
        static_cast<float>(static_cast<double>(sx[0]) * sw[g.per_channel_scale ? o : 0] / syf);
    k.add[b.tid] = (bias ? static_cast<float>(static_cast<double>(bias[o]) / syf) : 0.f) + zyf;
  }
  if (b.tid == 0) {
    const float inv_sy = 1.f / syf;
    k.scalars[0] = g.relu ? fmaxf(zyf, static_cast<float>(quant_math::Range<Y>::lo))
                          : static_cast<float>(quant_math::Range<Y>::lo);
    k.scalars[1] = inv_sy;
    k.scalars[2] = res_tile ? *res.scale * inv_sy : 0.f;
    k.scalars[3] =
        kIgTwo23 + (!res_tile ? 0.f
                    : res_i8  ? static_cast<float>(*static_cast<const int8_t*>(res.zp)) + 128.f
                              : static_cast<float>(*static_cast<const uint8_t*>(res.zp)));
  }
}

// wsum[o] += sum_k B[o, k] over a stage's 64 bytes of row o (dp4a against bytes of 1).
__device__ __forceinline__ void ig_weight_row_sum(const unsigned char* row, int& wsum) {
#pragma unroll
  for (int j = 0; j < kIgK / 16; ++j) {
    const uint4 v = *reinterpret_cast<const uint4*>(row + 16 * j);
    wsum = __dp4a(static_cast<int>(v.x), 0x01010101, wsum);
    wsum = __dp4a(static_cast<int>(v.y), 0x01010101, wsum);
    wsum = __dp4a(static_cast<int>(v.z), 0x01010101, wsum);
    wsum = __dp4a(static_cast<int>(v.w), 0x01010101, wsum);
  }
}

// The warp's 64 x 32 of the block's tile, at (wm, wn), and its k group.
struct IgWarp {
  int kgroup, wm, wn;
};
template <typename T> __device__ __forceinline__ IgWarp ig_warp(const IgBlock& b) {
  const int kgroup = T::kKG == 1 ? 0 : b.warp / T::kWarps, wtile = b.warp % T::kWarps;
  return {kgroup, (wtile / T::kWarpsN) * 64, (wtile % T::kWarpsN) * 32};
}

// The fragments of k32 step ks of a stage for the warp's 64 x 32, as ldmatrix reads them for
// mma.sync m16n8k32: a[mi] of A rows wm + 16 mi .. + 15, b[nj] of B rows (the product's
// columns) wn + 8 nj .. + 7.
template <typename T>
__device__ __forceinline__ void ig_load_fragments(unsigned (&a)[4][4], unsigned (&b)[4][2],
                                                  const unsigned char* as, const unsigned char* bs,
                                                  const IgWarp& wp, int lane, int ks) {
#pragma unroll
  for (int mi = 0; mi < 4; ++mi)
    ldmatrix_x4(a[mi], as + (wp.wm + mi * 16 + lane % 16) * kIgLd + ks * 32 + (lane / 16) * 16);
#pragma unroll
  for (int nj = 0; nj < 4; nj += 2) {
    unsigned r[4];
    const int mtx = lane / 8;
    ldmatrix_x4(
        r, bs + (wp.wn + nj * 8 + (mtx / 2) * 8 + lane % 8) * kIgLd + ks * 32 + (mtx % 2) * 16);
    b[nj][0] = r[0], b[nj][1] = r[1], b[nj + 1][0] = r[2], b[nj + 1][1] = r[3];
  }
}

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

// The block's sums into the stages (free once the loop is done), rows of kLdAcc words:
//   acc_s[m, o] = acc[m, o] of k group 0 + acc[m, o] of k group 1 (KG 2: added in place)
// ending in a barrier, after which acc_s holds the whole of sum_k A[m, k] B[o, k].
template <typename T>
__device__ __forceinline__ void ig_sums_to_shared(int* acc_s, const int (&acc)[4][4][4],
                                                  const IgWarp& wp, int lane) {
  constexpr int kLdAcc = T::kLdAcc;
  static_assert(T::kBM * kLdAcc * 4 <= T::kPipeBytes, "the sums fit in the stages");
  const int g4 = lane / 4, t4 = lane % 4;
#pragma unroll
  for (int group = 0; group < T::kKG; ++group) {
    if (wp.kgroup == group) {
#pragma unroll
      for (int mi = 0; mi < 4; ++mi)
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int nj = 0; nj < 4; ++nj) {
            const int r = wp.wm + mi * 16 + g4 + 8 * h, col = wp.wn + nj * 8 + 2 * t4;
            int2* at = reinterpret_cast<int2*>(acc_s + r * kLdAcc + col);
            int2 v = make_int2(acc[mi][nj][2 * h], acc[mi][nj][2 * h + 1]);
            if (group > 0) v.x += at->x, v.y += at->y;
            *at = v;
          }
    }
    __syncthreads();
  }
}

// A thread's four channels' constants, read once from shared memory (IgRequantize's).
struct IgFour {
  uint32_t corr[4];
  float mult[4], add[4];
};

// The requantize and store of the tile, from the sums in the stages and the constants beside
// them. A thread takes four channels o .. o + 3 (c .. c + 3 of the tile) of rows kRowsPer apart,
// two rows an iteration (two independent chains; a loop small enough for the instruction cache),
// and stores each row's four bytes as one word (a warp writes whole rows). For a sum
// S = acc_s[m, o]:
//   t = S - corr[o]             = sum_k (x~ - zx) w + ibias    (i32, exact mod 2^32)
//   u = t mult[o] + base[o]     (f32 fma), the bias, zy and the residual in output units:
//     base[o] = add[o]                        no residual (kRes 0)
//             = (2^23 + b - rz) rs + add[o]   the int8 tile's byte b (kRes 1): (r - zr) sr / sy
//             = r~[m, o] / sy + add[o]        r~ the dequantized residual (kRes 2)
//   kGelu: u = gelu((u - zy) sy) / sy + zy    (GELU of the real value, back in output units)
//   y = round_half_even(clamp(u, lo, hi))     (the low byte of the encoding of u + 1.5 2^23)
// One loop per kind of residual and activation (store_rows), so that no row branches on them;
// each row's output address one add from the last.
template <typename Y, typename T> struct IgRequantize {
  static constexpr int BM = T::kBM, kLdAcc = T::kLdAcc, kQuads = T::kQuads;
  static constexpr int kRowsPer = T::kRowsPer;
  static_assert(BM % (2 * kRowsPer) == 0, "two rows an iteration");
  const IgFour& f;
  const int* acc_s;
  const unsigned char* res_s;
  int tid, O, m0;
  const QConvArgs& g;
  const float* __restrict__ const& sy;  // (references to the kernel's parameters)
  const Y* __restrict__ const& zy;
  Y* __restrict__ const& out;
  float lo, inv_sy, rs, rz, hi;  // the clamp's ends, 1 / sy, the residual's scale and zero point
  int c, o;                      // the thread's first channel in the tile and in the output
  uint32_t flip;                 // i8 residual bytes b to b + 128
  bool vec;                      // the four bytes as one 32-bit store
  int rows;                      // the tile's rows inside the output (none past O)

  __device__ __forceinline__ IgRequantize(const IgConsts& k, IgFour& four, const int* acc_s_,
                                          const unsigned char* res_s_, const IgBlock& b,
                                          const QConvArgs& g_, const float* __restrict__ const& sy_,
                                          const Y* __restrict__ const& zy_, bool res_i8,
                                          Y* __restrict__ const& out_)
      : f(four),
        acc_s(acc_s_),
        res_s(res_s_),
        tid(b.tid),
        O(b.O),
        m0(b.m0),
        g(g_),
        sy(sy_),
        zy(zy_),
        out(out_) {
    lo = k.scalars[0], inv_sy = k.scalars[1], rs = k.scalars[2], rz = k.scalars[3];
    hi = static_cast<float>(quant_math::Range<Y>::hi);
    c = (tid % kQuads) * 4, o = b.o0 + c;
#pragma unroll
    for (int j = 0; j < 4; ++j)
      four.corr[j] = k.corr[c + j], four.mult[j] = k.mult[c + j], four.add[j] = k.add[c + j];
    flip = res_i8 ? 0x80808080u : 0u;
    vec = O % 4 == 0 && reinterpret_cast<uintptr_t>(out) % 4 == 0 && o + 4 <= O;
    rows = o < O ? min(BM, b.Mi - m0) : 0;
  }

  // The rows of the tile for one kind of residual (kRes 0 none, 1 the int8 tile, 2 read element
  // by element) and activation.
  template <int kRes, bool kGelu>
  __device__ void store_rows(const quant_math::Residual& res) const {
    const float syf = kGelu ? sy[0] : 0.f, zyf = kGelu ? static_cast<float>(zy[0]) : 0.f;
    const bool tanh_form = g.act == quant_math::kGeluTanh;
    const int64_t row_step = static_cast<int64_t>(O) * kRowsPer;
    const uint32_t(&corr)[4] = f.corr;
    const float(&mult)[4] = f.mult;
    const float(&add)[4] = f.add;
    auto requantize_row = [&](int r, Y* dst) {
      if (r >= rows) return;
      const int4 v = *reinterpret_cast<const int4*>(acc_s + r * kLdAcc + c);
      const int vs[4] = {v.x, v.y, v.z, v.w};
      // base: the bias (and zy), plus the residual
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
  }
};

}  // namespace kiln::cuda::qconv_detail
