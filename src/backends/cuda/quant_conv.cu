// CUDA kernel of quantized_conv. Exact kernel: one thread per output element, the i32 sum of
// (x - x_zp)(w - w_zp) over its window (padded positions hold x_zp, i.e. the real value 0) plus
// an i32 bias, then the epilogue the CPU kernel runs (backends/quant_math.h), so results agree
// bit for bit. Fast path (groups 1, shapes cuBLASLt's int8 product takes, quant_gemm.h): im2col
// into i8 rows (u8 shifted by 128, pads holding the shifted zero point), the int8 GEMM against
// the (O, C kh kw) weights, and one epilogue applying the zero points through row sums; the same
// integers, so the same results. Layout channels_last (quantized_conv_channels_last): x,
// residual and output NHWC. Attr quantize_x: x is f32 NCHW, quantized by the rows mode's padded
// copy (or into an int8 copy). The implicit GEMM on int8 tensor cores (channels_last, groups 1)
// is in qconv_igemm.cu.
#include <climits>
#include <cstdlib>
#include <type_traits>

#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/kernels.h"
#include "backends/cuda/mma_util.cuh"
#include "backends/cuda/qconv_internal.cuh"
#include "backends/cuda/quant_gemm.h"
#include "backends/quant_dispatch.h"
#include "backends/quant_math.h"

namespace kiln::cuda {

namespace {

using namespace qconv_detail;

template <typename A, typename W, typename Y>
__global__ void quantized_conv_kernel(const A* __restrict__ x, const float* __restrict__ sx,
                                      const A* __restrict__ zx, const W* __restrict__ w,
                                      const float* __restrict__ sw, const W* __restrict__ zw,
                                      const float* __restrict__ sy, const Y* __restrict__ zy,
                                      const float* __restrict__ bias,
                                      const int32_t* __restrict__ ibias,
                                      quant_math::Residual res, Y* __restrict__ out,
                                      QConvArgs g) {
  const int64_t total = g.N * g.O * g.OH * g.OW;
  const int64_t cg = g.C / g.G, og = g.O / g.G;
  for (int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; t < total;
       t += int64_t{blockDim.x} * gridDim.x) {
    int64_t n, o, p;
    g.decode(t, n, o, p);
    const int64_t ow = p % g.OW, oh = p / g.OW;
    const int64_t c0 = (o / og) * cg;
    const int32_t x0 = zx[0], w0 = zw[g.per_channel_zp ? o : 0];
    int32_t acc = 0;
    for (int64_t c = 0; c < cg; ++c) {
      for (int64_t kh = 0; kh < g.KH; ++kh) {
        const int64_t ih = oh * g.sh - g.pt + kh * g.dh;
        if (ih < 0 || ih >= g.H) continue;
        for (int64_t kw = 0; kw < g.KW; ++kw) {
          const int64_t iw = ow * g.sw - g.pl + kw * g.dw;
          if (iw < 0 || iw >= g.W) continue;
          acc += (int32_t{x[g.x_at(n, c0 + c, ih, iw)]} - x0) *
                 (int32_t{w[g.w_at(o, c, kh, kw)]} - w0);
        }
      }
    }
    if (ibias) acc += ibias[o];
    const double mult =
        static_cast<double>(sx[0]) * static_cast<double>(sw[g.per_channel_scale ? o : 0]);
    out[t] = quant_math::requantize<Y>(acc, mult, bias ? bias[o] : 0.0, res.at(t), g.act,
                                       static_cast<double>(sy[0]), zy[0]);
  }
}

// ---- groups == 1 through cuBLASLt: im2col into i8 rows, raw (M = N OH OW, O) = col · wᵀ ----

// col[r, (c, kh, kw)] = x - shift at the window's pixel, x_zp - shift where it pads (so that
// every window is full and (x - x_zp) is 0 there), r = (n, oh, ow).
template <typename A>
__global__ void im2col_i8(const A* __restrict__ x, const A* __restrict__ zx,
                          int8_t* __restrict__ col, QConvArgs g, int32_t shift) {
  const int64_t k = g.C * g.KH * g.KW, rows = g.N * g.OH * g.OW, total = rows * k;
  const int32_t pad = int32_t{zx[0]} - shift;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{blockDim.x} * gridDim.x) {
    const int64_t r = i / k, j = i % k;
    const int64_t kw = j % g.KW, kh = (j / g.KW) % g.KH, c = j / (g.KW * g.KH);
    const int64_t ow = r % g.OW, oh = (r / g.OW) % g.OH, n = r / (g.OW * g.OH);
    const int64_t ih = oh * g.sh - g.pt + kh * g.dh, iw = ow * g.sw - g.pl + kw * g.dw;
    const bool in = ih >= 0 && ih < g.H && iw >= 0 && iw < g.W;
    col[i] =
        static_cast<int8_t>(in ? int32_t{x[g.x_at(n, c, ih, iw)]} - shift : pad);
  }
}

// NHWC x: col[r, (kh, kw, c)] (rows of g.kp, zeros after C kh kw), so that each (r, kh, kw)
// takes C contiguous bytes: a thread moves 16 of them (when C is a multiple of 16 and x 16-byte
// aligned), else one byte per thread. u8 is shifted to i8 by flipping the top bit (v - 128).
template <typename A>
__global__ void im2col_nhwc_i8x16(const A* __restrict__ x, const A* __restrict__ zx,
                                  int8_t* __restrict__ col, QConvArgs g) {
  constexpr bool kFlip = std::is_same_v<A, uint8_t>;
  const int64_t segs = g.C / 16;
  const int64_t total = g.N * g.OH * g.OW * g.KH * g.KW * segs;
  const uint8_t pad = static_cast<uint8_t>(int32_t{zx[0]} - (kFlip ? 128 : 0));
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{blockDim.x} * gridDim.x) {
    const int64_t seg = i % segs, rest = i / segs;
    const int64_t kw = rest % g.KW, kh = (rest / g.KW) % g.KH, r = rest / (g.KW * g.KH);
    const int64_t ow = r % g.OW, oh = (r / g.OW) % g.OH, n = r / (g.OW * g.OH);
    const int64_t ih = oh * g.sh - g.pt + kh * g.dh, iw = ow * g.sw - g.pl + kw * g.dw;
    uint4 v;
    if (ih >= 0 && ih < g.H && iw >= 0 && iw < g.W) {
      v = *reinterpret_cast<const uint4*>(x + ((n * g.H + ih) * g.W + iw) * g.C + seg * 16);
      if (kFlip) v.x ^= 0x80808080u, v.y ^= 0x80808080u, v.z ^= 0x80808080u, v.w ^= 0x80808080u;
    } else {
      const uint32_t p4 = pad * 0x01010101u;
      v = make_uint4(p4, p4, p4, p4);
    }
    *reinterpret_cast<uint4*>(col + r * g.kp + (kh * g.KW + kw) * g.C + seg * 16) = v;
  }
}

template <typename A>
__global__ void im2col_nhwc_i8(const A* __restrict__ x, const A* __restrict__ zx,
                               int8_t* __restrict__ col, QConvArgs g) {
  constexpr int32_t kShift = std::is_same_v<A, uint8_t> ? 128 : 0;
  const int64_t k = g.C * g.KH * g.KW, total = g.N * g.OH * g.OW * g.kp;
  const int32_t pad = int32_t{zx[0]} - kShift;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{blockDim.x} * gridDim.x) {
    const int64_t j = i % g.kp, r = i / g.kp;
    int32_t v = 0;  // the padding columns after k
    if (j < k) {
      const int64_t c = j % g.C, kw = (j / g.C) % g.KW, kh = j / (g.C * g.KW);
      const int64_t ow = r % g.OW, oh = (r / g.OW) % g.OH, n = r / (g.OW * g.OH);
      const int64_t ih = oh * g.sh - g.pt + kh * g.dh, iw = ow * g.sw - g.pl + kw * g.dw;
      v = ih >= 0 && ih < g.H && iw >= 0 && iw < g.W
              ? int32_t{x[((n * g.H + ih) * g.W + iw) * g.C + c]} - kShift
              : pad;
    }
    col[i] = static_cast<int8_t>(v);
  }
}

// quantize_x where the rows mode does not apply: f32 NCHW x quantized as quantize does into the
// int8 x of the plain op (NHWC with channels_last), an element a thread.
template <typename A>
__global__ void quantize_conv_input(const float* __restrict__ x, const float* __restrict__ sx,
                                    const A* __restrict__ zx, A* __restrict__ out, int64_t C,
                                    int64_t HW, int64_t total, bool nhwc) {
  const float s = sx[0];
  const A z = zx[0];
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{blockDim.x} * gridDim.x) {
    const int64_t c = (i / HW) % C, p = i % HW, n = i / (C * HW);
    out[nhwc ? (n * HW + p) * C + c : i] = quant_math::quantize_one(x[i], s, z);
  }
}

// u8 weights shifted to i8 (v - 128) as they are (conv_lt's unpermuted weights)
template <typename W>
__global__ void shift_i8(const W* __restrict__ w, int8_t* __restrict__ out, int64_t n,
                         int32_t shift) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{blockDim.x} * gridDim.x)
    out[i] = static_cast<int8_t>(int32_t{w[i]} - shift);
}

// With shifted x', w' and zero points: sum (x' - zx')(w' - zw') over a full window
//   = raw - zx' wsum[o] - zw' colsum[r] + K zx' zw', modulo 2^32 (the exact sum fits).
template <typename A, typename W, typename Y>
__global__ void qconv_gemm_epilogue(
    const int32_t* __restrict__ raw, const int32_t* __restrict__ col_sums,
    const int32_t* __restrict__ w_sums, const float* __restrict__ sx, const A* __restrict__ zx,
    const float* __restrict__ sw, const W* __restrict__ zw, const float* __restrict__ sy,
    const Y* __restrict__ zy, const float* __restrict__ bias, const int32_t* __restrict__ ibias,
    quant_math::Residual res, Y* __restrict__ out, QConvArgs g, int32_t shift_x,
    int32_t shift_w, bool raw_om) {
  const int64_t plane = g.OH * g.OW, total = g.N * g.O * plane, k = g.C * g.KH * g.KW;
  const int32_t zx_s = int32_t{zx[0]} - shift_x;
  for (int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; t < total;
       t += int64_t{blockDim.x} * gridDim.x) {
    int64_t n, o, p;
    g.decode(t, n, o, p);
    const int64_t r = n * plane + p;
    const int32_t zw_s = int32_t{zw[g.per_channel_zp ? o : 0]} - shift_w;
    const uint32_t u =
        static_cast<uint32_t>(raw[raw_om ? o * g.N * plane + r : r * g.O + o]) -
        static_cast<uint32_t>(zx_s) * static_cast<uint32_t>(w_sums[o]) -
        static_cast<uint32_t>(zw_s) * (col_sums ? static_cast<uint32_t>(col_sums[r]) : 0u) +
        static_cast<uint32_t>(k) * static_cast<uint32_t>(zx_s) * static_cast<uint32_t>(zw_s);
    int32_t acc = static_cast<int32_t>(u);
    if (ibias) acc += ibias[o];
    const double mult =
        static_cast<double>(sx[0]) * static_cast<double>(sw[g.per_channel_scale ? o : 0]);
    out[t] = quant_math::requantize<Y>(acc, mult, bias ? bias[o] : 0.0, res.at(t), g.act,
                                       static_cast<double>(sy[0]), zy[0]);
  }
}

// The same for an NHWC output from raw (M, O), four channels a thread (O a multiple of 4, 32-bit
// indices): int4 loads of raw, float4 (or 4 bytes, quantized) of the residual, one 4-byte store.
template <typename A, typename W, typename Y>
__global__ void qconv_gemm_epilogue_nhwc4(
    const int32_t* __restrict__ raw, const int32_t* __restrict__ col_sums,
    const int32_t* __restrict__ w_sums, const float* __restrict__ sx, const A* __restrict__ zx,
    const float* __restrict__ sw, const W* __restrict__ zw, const float* __restrict__ sy,
    const Y* __restrict__ zy, const float* __restrict__ bias, const int32_t* __restrict__ ibias,
    quant_math::Residual res, Y* __restrict__ out, QConvArgs g, int32_t shift_x,
    int32_t shift_w, uint32_t quads) {
  const uint32_t k = static_cast<uint32_t>(g.C * g.KH * g.KW), O = static_cast<uint32_t>(g.O);
  const int32_t zx_s = int32_t{zx[0]} - shift_x;
  const double sxd = sx[0], syd = sy[0];
  const int32_t zyv = zy[0];
  for (uint32_t q = blockIdx.x * blockDim.x + threadIdx.x; q < quads; q += blockDim.x * gridDim.x) {
    const uint32_t t = q * 4, r = t / O, o0 = t - r * O;
    const int4 raw4 = reinterpret_cast<const int4*>(raw)[q];
    const int32_t raws[4] = {raw4.x, raw4.y, raw4.z, raw4.w};
    double rs[4] = {0, 0, 0, 0};
    if (res.kind == quant_math::Residual::kF32) {
      const float4 r4 = reinterpret_cast<const float4*>(res.data)[q];
      rs[0] = r4.x, rs[1] = r4.y, rs[2] = r4.z, rs[3] = r4.w;
    } else if (res.kind != quant_math::Residual::kNone) {  // four bytes, dequantized one by one
      const uint32_t word = reinterpret_cast<const uint32_t*>(res.data)[q];
      const float scale = *res.scale;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t byte = (word >> (8 * j)) & 0xffu;
        rs[j] = res.kind == quant_math::Residual::kU8
                    ? quant_math::dequantize_one(static_cast<uint8_t>(byte),
                                                 *static_cast<const uint8_t*>(res.zp), scale)
                    : quant_math::dequantize_one(static_cast<int8_t>(static_cast<uint8_t>(byte)),
                                                 *static_cast<const int8_t*>(res.zp), scale);
      }
    }
    const uint32_t cs = col_sums ? static_cast<uint32_t>(col_sums[r]) : 0u;  // (zw' = 0 else)
    union {
      Y v[4];
      uint32_t word;
    } y;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t o = o0 + j;
      const int32_t zw_s = int32_t{zw[g.per_channel_zp ? o : 0]} - shift_w;
      const uint32_t u = static_cast<uint32_t>(raws[j]) -
                         static_cast<uint32_t>(zx_s) * static_cast<uint32_t>(w_sums[o]) -
                         static_cast<uint32_t>(zw_s) * cs +
                         k * static_cast<uint32_t>(zx_s) * static_cast<uint32_t>(zw_s);
      int32_t acc = static_cast<int32_t>(u);
      if (ibias) acc += ibias[o];
      const double mult = sxd * static_cast<double>(sw[g.per_channel_scale ? o : 0]);
      y.v[j] = quant_math::requantize<Y>(acc, mult, bias ? bias[o] : 0.0, rs[j], g.act, syd, zyv);
    }
    reinterpret_cast<uint32_t*>(out)[q] = y.word;
  }
}

// The im2col matrix must stay reasonable in scratch.
constexpr int64_t kMaxColBytes = int64_t{256} << 20;

template <typename A, typename W, typename Y>
bool conv_lt(KernelContext& ctx, QConvArgs g, const float* bias, const int32_t* ibias,
             const quant_math::Residual& res, bool zero_w_zp) {
  const int64_t m = g.N * g.OH * g.OW, n = g.O;
  // the GEMM's K: NHWC rows are padded with zeros to a length cuBLASLt takes (a zero column adds
  // nothing to any sum, and the epilogue's K zx' zw' term counts the real window)
  g.kp = g.C * g.KH * g.KW;
  if (g.cl && g.kp % 4 != 0) g.kp = (g.kp + 15) / 16 * 16;
  const int64_t k = g.kp;
  if (g.G != 1 || m * k > kMaxColBytes) return false;
  const TensorView& tw = ctx.in(3);
  constexpr int32_t shift_x = std::is_same_v<A, uint8_t> ? 128 : 0;
  constexpr int32_t shift_w = std::is_same_v<W, uint8_t> ? 128 : 0;
  const A* x = ctx.in(0).ptr<A>();
  // NHWC i8 x of a 1x1 stride-1 conv is already the (M, C) matrix; NHWC rows of a larger window
  // (or padded ones) want (O, kh, kw, C) weights, padded alike
  const bool padded = k != g.C * g.KH * g.KW;
  const bool col_direct = g.cl && shift_x == 0 && g.KH == 1 && g.KW == 1 && g.sh == 1 &&
                          g.sw == 1 && g.OH == g.H && g.OW == g.W && !padded;
  // (O, kh, kw, C) weights as given (weights_ohwi) unless padded
  const bool khwc = g.cl && (g.KH * g.KW > 1 || padded) && !(g.ohwi && !padded);
  if (g.ohwi && !g.cl) return false;  // (NCHW rows want (O, C, kh, kw): the exact kernel)
  const bool w_direct = shift_w == 0 && !khwc;
  const uint32_t align_w = w_direct ? pointer_alignment(tw.data) : 256u;
  const uint32_t align_col = col_direct ? pointer_alignment(x) : 256u;
  // raw as (O, M) where cuBLASLt takes the operands that way round: the epilogue then reads it in
  // the NCHW output's order (coalesced); else (and for an NHWC output) as (M, O)
  const bool raw_om = !g.cl && int8_gemm_fits(n, m, k) &&
                      int8_gemm_available(ctx.device(), n, m, k, align_w, align_col);
  if (!raw_om && (!int8_gemm_fits(m, n, k) ||
                  !int8_gemm_available(ctx.device(), m, n, k, align_col, align_w)))
    return false;
  cudaStream_t st = stream_of(ctx);
  const int8_t* col = reinterpret_cast<const int8_t*>(x);
  if (!col_direct) {
    auto* buf = static_cast<int8_t*>(ctx.scratch(static_cast<size_t>(m * k)));
    const A* zx = ctx.in(2).ptr<A>();
    if (!g.cl)
      im2col_i8<A><<<blocks_for(m * k), kThreads, 0, st>>>(x, zx, buf, g, shift_x);
    else if (g.C % 16 == 0 && pointer_alignment(x) >= 16)
      im2col_nhwc_i8x16<A><<<blocks_for(m * k / 16), kThreads, 0, st>>>(x, zx, buf, g);
    else
      im2col_nhwc_i8<A><<<blocks_for(m * k), kThreads, 0, st>>>(x, zx, buf, g);
    col = buf;
  }
  const int8_t* w8 = static_cast<const int8_t*>(tw.data);
  if (!w_direct) {
    auto* buf = static_cast<int8_t*>(ctx.scratch(static_cast<size_t>(n * k)));
    if (khwc)
      weights_khwc_i8<W><<<blocks_for(n * k), kThreads, 0, st>>>(tw.ptr<W>(), buf, g, shift_w);
    else if constexpr (shift_w != 0)  // (i8 weights reach here only when permuted: khwc)
      shift_i8<W><<<blocks_for(n * k), kThreads, 0, st>>>(tw.ptr<W>(), buf, n * k, shift_w);
    w8 = buf;
  }
  auto* sums = static_cast<int32_t*>(ctx.scratch(static_cast<size_t>(m + n) * 4));
  // the window sums of x count only through a weight zero point: none for i8 weights whose zero
  // points are all 0 (symmetric quantization, as post-training quantization makes them)
  const bool col_sums = shift_w != 0 || !zero_w_zp;
  if (col_sums) int8_row_sums(col, m, k, sums, st);
  int8_row_sums(w8, n, k, sums + m, st);
  check_launch(ctx.op_name());
  auto* raw = static_cast<int32_t*>(ctx.scratch(static_cast<size_t>(m * n) * 4));
  if (raw_om)
    int8_gemm(ctx, w8, col, raw, n, m, k, align_w, align_col);
  else
    int8_gemm(ctx, col, w8, raw, m, n, k, align_col, align_w);
  Y* out = ctx.out(0).ptr<Y>();
  const int64_t total = ctx.out(0).numel();
  const int32_t* cols = col_sums ? sums : nullptr;
  if (g.cl && n % 4 == 0 && total / 4 <= UINT32_MAX && pointer_alignment(out) >= 4 &&
      pointer_alignment(res.data) >= static_cast<uint32_t>(4 * res.element_bytes()))
    qconv_gemm_epilogue_nhwc4<A, W, Y><<<blocks_for(total / 4), kThreads, 0, st>>>(
        raw, cols, sums + m, ctx.in(1).ptr<float>(), ctx.in(2).ptr<A>(), ctx.in(4).ptr<float>(),
        ctx.in(5).ptr<W>(), ctx.in(6).ptr<float>(), ctx.in(7).ptr<Y>(), bias, ibias, res, out, g,
        shift_x, shift_w, static_cast<uint32_t>(total / 4));
  else
    qconv_gemm_epilogue<A, W, Y><<<blocks_for(total), kThreads, 0, st>>>(
        raw, cols, sums + m, ctx.in(1).ptr<float>(), ctx.in(2).ptr<A>(), ctx.in(4).ptr<float>(),
        ctx.in(5).ptr<W>(), ctx.in(6).ptr<float>(), ctx.in(7).ptr<Y>(), bias, ibias, res, out, g,
        shift_x, shift_w, raw_om);
  check_launch(ctx.op_name());
  return true;
}

// quantize_x where the implicit GEMM's rows mode does not take it: x quantized into an int8 copy
// (NHWC in layout channels_last), then `kernel`, the op's kernel for the layout, on it without
// quantize_x.
template <typename A>
void conv_of_float(KernelContext& ctx, bool cl, void (*kernel)(KernelContext&)) {
  const TensorView& x = ctx.in(0);
  const Shape& s = x.shape;
  auto* q = static_cast<A*>(ctx.scratch(static_cast<size_t>(x.numel())));
  quantize_conv_input<A><<<blocks_for(x.numel()), kThreads, 0, stream_of(ctx)>>>(
      x.ptr<float>(), ctx.in(1).ptr<float>(), ctx.in(2).ptr<A>(), q, s[1], s[2] * s[3],
      x.numel(), cl);
  check_launch(ctx.op_name());
  conv_on_quantized_x(ctx, q, cl, kernel);
}

// The kernel of layout plain (cl false) or channels_last (cl true).
template <bool cl> void quantized_conv_in(KernelContext& ctx) {
  const TensorView &tx = ctx.in(0), &tw = ctx.in(3), &ty = ctx.out(0);
  if (ty.numel() == 0) return;
  const QuantizedConvParams prm = params_of<QuantizedConvParams>(ctx);
  const int64_t *s = prm.stride, *d = prm.dilation, *p = prm.pads;
  const bool ohwi = prm.weights_ohwi;
  // quantize_x: x is f32 NCHW whatever the output's layout
  const bool quantize_x = prm.quantize_x, x_cl = cl && !quantize_x;
  QConvArgs g{tx.shape[0],
              tx.shape[x_cl ? 3 : 1],
              tx.shape[x_cl ? 1 : 2],
              tx.shape[x_cl ? 2 : 3],
              tw.shape[0],
              tw.shape[ohwi ? 1 : 2],
              tw.shape[ohwi ? 2 : 3],
              ty.shape[cl ? 1 : 2],
              ty.shape[cl ? 2 : 3],
              prm.groups,
              s[0],
              s[1],
              d[0],
              d[1],
              p[0],
              p[1],
              prm.relu,
              ctx.in(4).numel() != 1,
              ctx.in(5).numel() != 1,
              cl,
              ohwi};
  int next = 8;
  const float* bias = nullptr;
  const int32_t* ibias = nullptr;  // adds to the integer sum
  if (prm.has_bias) {
    const TensorView& b = ctx.in(next++);
    if (b.dtype == DType::i32)
      ibias = b.ptr<int32_t>();
    else
      bias = b.ptr<float>();
  }
  const quant_math::Residual res = residual_input(ctx, next, prm);
  g.act = epilogue_activation(prm);
  // (with quantize_x, x is f32 and its zero point has the data's dtype)
  const DType data = quantize_x ? ctx.in(2).dtype : tx.dtype;
  with_int8_types(ctx, data, "cuda", [&](auto at, auto wt, auto yt) {
    using A = decltype(at);
    using W = decltype(wt);
    using Y = decltype(yt);
    if (quantize_x) {
      if (!conv_igemm<A, W, Y>(ctx, g, bias, ibias, res, tx.ptr<float>()))
        conv_of_float<A>(ctx, cl, quantized_conv_in<cl>);
      return;
    }
    if (conv_igemm<A, W, Y>(ctx, g, bias, ibias, res)) return;
    if (conv_lt<A, W, Y>(ctx, g, bias, ibias, res, prm.zero_w_zp)) return;
    quantized_conv_kernel<A, W, Y><<<blocks_for(ty.numel()), kThreads, 0, stream_of(ctx)>>>(
        tx.ptr<A>(), ctx.in(1).ptr<float>(), ctx.in(2).ptr<A>(), tw.ptr<W>(),
        ctx.in(4).ptr<float>(), ctx.in(5).ptr<W>(), ctx.in(6).ptr<float>(), ctx.in(7).ptr<Y>(),
        bias, ibias, res, ty.ptr<Y>(), g);
    check_launch(ctx.op_name());
  });
}

}  // namespace

void quantized_conv(KernelContext& ctx) { quantized_conv_in<false>(ctx); }
void quantized_conv_channels_last(KernelContext& ctx) { quantized_conv_in<true>(ctx); }

}  // namespace kiln::cuda
