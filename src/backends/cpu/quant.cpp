// CPU kernels of quantize, dequantize and fake_quantize (src/ops/quant.cpp): rows of x along
// the quantization axis in parallel, each row with one scale (per tensor, per channel) or one
// per block (per group). Arithmetic follows numpy step for step, so results are bit-exact.
// quantized_matmul: exact i32 products (oneDNN's int8 matmul where the CPU has VNNI, with the
// zero points applied as row and column sums; else int16 dot products the compiler vectorizes),
// then the epilogue in double: scale, bias, residual, relu or GELU, requantize. quantized_conv
// lives in quant_conv.cpp; the rounding of all of them in backends/quant_math.h (shared with
// CUDA).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "backends/cpu/cpu_common.h"
#include "backends/cpu/dnnl_util.h"
#include "backends/cpu/kernels.h"
#include "backends/cpu/quant_kernels.h"
#include "backends/quant_dispatch.h"
#include "backends/quant_math.h"

namespace kiln::cpu {

namespace du = dnnl_util;

namespace {

// Where element (o, a, j) of x split around the axis finds its scale: x is (outer, len, inner);
// per tensor one scale, per channel scale[a], per group scale[(o * blocks + a / block) * inner +
// j].
struct ScaleLayout {
  AxisSplit x;
  int64_t block = 0, blocks = 1;
  bool per_tensor = true;
  ScaleLayout(const KernelContext& ctx) {
    const TensorView &tx = ctx.in(0), &ts = ctx.in(1);
    const QuantizeParams p = params_of<QuantizeParams>(ctx);
    per_tensor = ts.numel() == 1;
    x = tx.rank() == 0 ? AxisSplit{} : split_at(tx.shape, p.axis);
    block = p.block_size;
    if (block > 0) blocks = (x.len + block - 1) / block;
  }
  // Calls row(first element, scale index of its first element, scale index step along the row)
  // for every row of `inner` elements, in parallel.
  template <typename F>
  void rows(const KernelContext& ctx, F&& row) const {
    const int64_t n = x.outer * x.len;
    ctx.parallel_for(n, std::max<int64_t>(1, 16384 / std::max<int64_t>(x.inner, 1)),
                     [&](int64_t r0, int64_t r1) {
                       for (int64_t r = r0; r < r1; ++r) {
                         const int64_t o = r / x.len, a = r % x.len;
                         if (per_tensor)
                           row(r * x.inner, int64_t{0}, int64_t{0});
                         else if (block == 0)
                           row(r * x.inner, a, int64_t{0});
                         else
                           row(r * x.inner, (o * blocks + a / block) * x.inner, int64_t{1});
                       }
                     });
  }
};

using quant_math::dequantize_one;
using quant_math::quantize_one;
using quant_math::requantize;

template <typename F>
void dispatch_quant(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::i8:
      f(int8_t{});
      return;
    case DType::u8:
      f(uint8_t{});
      return;
    case DType::i16:
      f(int16_t{});
      return;
    case DType::u16:
      f(uint16_t{});
      return;
    case DType::i32:
      f(int32_t{});
      return;
    default:
      fail<UnsupportedError>("[{}] cpu kernel got quantized dtype {}", op, name(t));
  }
}

// quantize_one, for f32 data and 8-bit results without a call to rintf (a library call where
// the baseline x86-64 has no rounding instruction); quantize16_f32 below is the same steps in
// vector lanes: x / s clamped to +-2^22 (beyond, both saturate alike; NaN becomes -2^22 and so
// the low end, as in quantize_one), rounded half to even by adding and subtracting 1.5 * 2^23 (an
// even integer: ties go where rint takes them), plus zp, saturated.
template <typename T, typename Q>
inline Q quantize_fast(T x, T s, Q zp) {
  if constexpr (std::is_same_v<T, float> && sizeof(Q) == 1) {
    constexpr float kBig = 4194304.f, kRound = 12582912.f;
    const float v = std::min(kBig, std::max(-kBig, x / s));  // (max(-kBig, NaN) is -kBig)
    const float r = ((v + kRound) - kRound) + static_cast<float>(zp);
    constexpr float lo = static_cast<float>(quant_math::Range<Q>::lo),
                    hi = static_cast<float>(quant_math::Range<Q>::hi);
    return static_cast<Q>(static_cast<int32_t>(std::min(hi, std::max(lo, r))));
  } else {
    return quantize_one<T, Q>(x, s, zp);
  }
}

#ifdef __SSE2__
// Sixteen f32 to 8-bit values, quantize_fast's steps four lanes at a time (the compiler does not
// vectorize the scalar form): max_ps returns its second operand for a NaN, so a NaN quotient
// becomes -2^22 as in the scalar code; adds round half to even (the default mode) as there.
template <typename Q>
inline void quantize16_f32(const float* x, float s, Q zp, Q* out) {
  constexpr float lo = static_cast<float>(quant_math::Range<Q>::lo),
                  hi = static_cast<float>(quant_math::Range<Q>::hi);
  const __m128 vs = _mm_set1_ps(s), big = _mm_set1_ps(4194304.f), nbig = _mm_set1_ps(-4194304.f),
               rnd = _mm_set1_ps(12582912.f), z = _mm_set1_ps(static_cast<float>(zp)),
               vlo = _mm_set1_ps(lo), vhi = _mm_set1_ps(hi);
  __m128i w[4];
  for (int i = 0; i < 4; ++i) {
    __m128 v = _mm_div_ps(_mm_loadu_ps(x + 4 * i), vs);
    v = _mm_min_ps(_mm_max_ps(v, nbig), big);
    v = _mm_add_ps(_mm_sub_ps(_mm_add_ps(v, rnd), rnd), z);
    w[i] = _mm_cvttps_epi32(_mm_min_ps(_mm_max_ps(v, vlo), vhi));
  }
  const __m128i a = _mm_packs_epi32(w[0], w[1]), b = _mm_packs_epi32(w[2], w[3]);
  const __m128i bytes =
      std::is_same_v<Q, uint8_t> ? _mm_packus_epi16(a, b) : _mm_packs_epi16(a, b);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), bytes);
}
#endif

// Calls body(first, end, scale index) over runs of x that share one scale and zero point, in
// parallel: the whole tensor at once per tensor, a row at a time per channel; per group, body is
// called element by element.
template <typename F>
void same_scale_runs(const KernelContext& ctx, const ScaleLayout& l, int64_t n, F&& body) {
  if (l.per_tensor) {
    ctx.parallel_for(n, 16384, [&](int64_t b, int64_t e) { body(b, e, int64_t{0}); });
    return;
  }
  const int64_t inner = l.x.inner;
  l.rows(ctx, [&](int64_t base, int64_t si, int64_t step) {
    if (step == 0) {
      body(base, base + inner, si);
    } else {
      for (int64_t j = 0; j < inner; ++j) body(base + j, base + j + 1, si + j * step);
    }
  });
}

// quantize (out in Q) and fake_quantize (out in T, the dequantized value).
template <typename T, typename Q, bool kFake>
void quantize_impl(KernelContext& ctx) {
  const ScaleLayout l(ctx);
  const T* x = ctx.in(0).ptr<T>();
  const T* s = ctx.in(1).ptr<T>();
  const Q* zp = ctx.in(2).ptr<Q>();
  auto* out = ctx.out(0).ptr<std::conditional_t<kFake, T, Q>>();
  same_scale_runs(ctx, l, ctx.in(0).numel(), [&](int64_t b, int64_t e, int64_t k) {
    const T sk = s[k];
    const Q zk = zp[k];
#ifdef __SSE2__
    if constexpr (!kFake && std::is_same_v<T, float> && sizeof(Q) == 1)
      for (; b + 16 <= e; b += 16) quantize16_f32(x + b, sk, zk, out + b);
#endif
    for (int64_t i = b; i < e; ++i) {
      const Q q = quantize_fast<T, Q>(x[i], sk, zk);
      if constexpr (kFake)
        out[i] = dequantize_one<Q, T>(q, zk, sk);
      else
        out[i] = q;
    }
  });
}

template <bool kFake>
void quantize_kernel(KernelContext& ctx) {
  dispatch_float(ctx.in(0).dtype, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    dispatch_quant(ctx.in(2).dtype, ctx.op_name(), [&](auto q) {
      using Q = decltype(q);
      if constexpr (std::is_same_v<Q, int32_t>)
        fail<UnsupportedError>("[{}] cannot quantize to i32", ctx.op_name());
      else
        quantize_impl<T, Q, kFake>(ctx);
    });
  });
}

void quantize(KernelContext& ctx) { quantize_kernel<false>(ctx); }
void fake_quantize(KernelContext& ctx) { quantize_kernel<true>(ctx); }

void dequantize(KernelContext& ctx) {
  dispatch_float(ctx.in(1).dtype, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    dispatch_quant(ctx.in(0).dtype, ctx.op_name(), [&](auto qt) {
      using Q = decltype(qt);
      const ScaleLayout l(ctx);
      const Q* q = ctx.in(0).ptr<Q>();
      const T* s = ctx.in(1).ptr<T>();
      const Q* zp = ctx.in(2).ptr<Q>();
      T* out = ctx.out(0).ptr<T>();
      same_scale_runs(ctx, l, ctx.in(0).numel(), [&](int64_t b, int64_t e, int64_t k) {
        const T sk = s[k];
        const Q zk = zp[k];
        for (int64_t i = b; i < e; ++i) out[i] = dequantize_one<Q, T>(q[i], zk, sk);
      });
    });
  });
}

// acc = a @ w (raw integers, no zero points) through oneDNN, into `acc` (m x n).
template <typename A>
void raw_product_dnnl(KernelContext& ctx, int64_t m, int64_t k, int64_t n, bool tw, int32_t* acc) {
  using dt = dnnl::memory::data_type;
  using tag = dnnl::memory::format_tag;
  const dt at = std::is_same_v<A, uint8_t> ? dt::u8 : dt::s8;
  const du::Dims key{static_cast<int64_t>(ctx.op()), m, k, n, tw, static_cast<int64_t>(at)};
  auto p = du::cached(ctx.op_name(), key, [&] {
    const dnnl::memory::desc s({m, k}, at, tag::ab), w({k, n}, dt::s8, tw ? tag::ba : tag::ab),
        o({m, n}, dt::s32, tag::ab);
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(s, w, o), du::attr(), du::engine());
    return du::CachedPrimitive{
        dnnl::matmul(pd),
        {du::make_arg(DNNL_ARG_SRC, s, s), du::make_arg(DNNL_ARG_WEIGHTS, w, w),
         du::make_arg(DNNL_ARG_DST, o, o, true)},
        pd.scratchpad_desc()};
  });
  du::execute(ctx.op_name(), *p, {ctx.in(0).data, ctx.in(3).data, acc});
}

// Sums of the (k, n) weights' columns (w - zw is w: the fused path takes zero weight zero points)
// that x's zero point multiplies.
template <typename W>
std::vector<int32_t> weight_column_sums(const KernelContext& ctx, const W* pw, int64_t k,
                                        int64_t n, bool tw_t) {
  std::vector<int32_t> colsum(static_cast<size_t>(n), 0);
  ctx.parallel_for(n, std::max<int64_t>(1, 16384 / std::max<int64_t>(k, 1)),
                   [&](int64_t j0, int64_t j1) {
                     for (int64_t j = j0; j < j1; ++j) {
                       int32_t sum = 0;
                       if (tw_t)  // row j of (N, K), contiguous
                         for (int64_t i = 0; i < k; ++i) sum += pw[j * k + i];
                       else
                         for (int64_t i = 0; i < k; ++i) sum += pw[i * n + j];
                       colsum[j] = sum;
                     }
                   });
  return colsum;
}

// The whole op as one oneDNN int8 matmul, its epilogue in f32 inside (as the NHWC convolution's,
// quant_conv.cpp): y = act(oscale[j] (acc + b'[j]) [+ residual]) post + zy, rounded half to
// even and saturated into Y, with b' = bias / mult - za colsum(w) in the integer sum's units and
// oscale = mult / sy (or mult, then post = 1 / sy after the residual and a GELU, which want the
// real values; relu commutes with the positive scale). Within 1 LSB of the exact epilogue. For
// i8 weights with zero points 0; false where oneDNN cannot take the scales.
template <typename A, typename Y>
bool matmul_dnnl_fused(KernelContext& ctx, int64_t m, int64_t k, int64_t n, bool tw_t,
                       const std::vector<double>& mult, const float* bias, const float* res,
                       int act, float sy, int32_t za, int32_t zy) {
  using dt = dnnl::memory::data_type;
  using tag = dnnl::memory::format_tag;
  if (!(sy > 0 && std::isfinite(sy))) return false;
  for (double v : mult)
    if (!(v != 0 && std::isfinite(v))) return false;
  const bool real = res || quant_math::is_gelu(act);
  std::vector<float> oscale(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) oscale[j] = static_cast<float>(real ? mult[j] : mult[j] / sy);
  const float post = real ? static_cast<float>(1.0 / sy) : 1.0f;
  const dt at = std::is_same_v<A, uint8_t> ? dt::u8 : dt::s8;
  const dt yt = std::is_same_v<Y, uint8_t> ? dt::u8 : dt::s8;
  du::Dims key{static_cast<int64_t>(ctx.op()), 1, m, k, n, tw_t, static_cast<int64_t>(at),
               static_cast<int64_t>(yt), res != nullptr, act, zy};
  uint32_t bits = 0;
  for (float f : oscale) {
    std::memcpy(&bits, &f, 4);
    key.push_back(bits);
  }
  std::memcpy(&bits, &post, 4);
  key.push_back(bits);
  auto p = du::cached(ctx.op_name(), key, [&] {
    const dnnl::memory::desc a_md({m, k}, at, tag::ab),
        w_md({k, n}, dt::s8, tw_t ? tag::ba : tag::ab), b_md({1, n}, dt::f32, tag::ab),
        y_md({m, n}, yt, tag::ab), r_md({m, n}, dt::f32, tag::ab);
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    attr.set_output_scales(1 << 1, oscale);
    dnnl::post_ops ops;
    if (res) ops.append_binary(dnnl::algorithm::binary_add, r_md);
    append_activation(ops, act);
    if (post != 1.0f || zy != 0)
      ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_linear, post, static_cast<float>(zy));
    attr.set_post_ops(ops);
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, w_md, b_md, y_md), attr,
                                    du::engine());
    std::vector<du::Arg> args{du::make_arg(DNNL_ARG_SRC, a_md, a_md),
                              du::make_arg(DNNL_ARG_WEIGHTS, w_md, w_md),
                              du::make_arg(DNNL_ARG_BIAS, b_md, b_md),
                              du::make_arg(DNNL_ARG_DST, y_md, y_md, true)};
    if (res)
      args.push_back(
          du::make_arg(DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1, r_md, r_md));
    return du::CachedPrimitive{dnnl::matmul(pd), std::move(args), pd.scratchpad_desc()};
  });
  std::vector<int32_t> colsum;
  if (za != 0) colsum = weight_column_sums(ctx, ctx.in(3).ptr<int8_t>(), k, n, tw_t);
  auto* b = static_cast<float*>(ctx.scratch(static_cast<size_t>(n) * sizeof(float)));
  for (int64_t j = 0; j < n; ++j)
    b[j] = static_cast<float>((bias ? bias[j] / mult[j] : 0.0) -
                              (za != 0 ? static_cast<double>(za) * colsum[j] : 0.0));
  std::vector<void*> buffers{ctx.in(0).data, ctx.in(3).data, b, ctx.out(0).data};
  if (res) buffers.push_back(const_cast<float*>(res));
  du::execute(ctx.op_name(), *p, buffers);
  return true;
}

template <typename A, typename W, typename Y>
void quantized_matmul_impl(KernelContext& ctx) {
  const TensorView &ta = ctx.in(0), &tw = ctx.in(3);
  const QuantizedMatmulParams p = params_of<QuantizedMatmulParams>(ctx);
  const bool tw_t = p.transpose_w;
  const int64_t k = ta.shape.back(), n = tw_t ? tw.shape[0] : tw.shape[1];
  const int64_t m = k == 0 ? ctx.out(0).numel() / std::max<int64_t>(n, 1) : ta.numel() / k;
  const float sa = *ctx.in(1).ptr<float>(), sy = *ctx.in(6).ptr<float>();
  const int32_t za = *ctx.in(2).ptr<A>();
  const int32_t zy = *ctx.in(7).ptr<Y>();
  const float* sw = ctx.in(4).ptr<float>();
  const W* zw = ctx.in(5).ptr<W>();
  const bool per_channel = ctx.in(4).numel() != 1 || n == 1;
  int next = 8;
  const float* bias = p.has_bias ? ctx.in(next++).ptr<float>() : nullptr;
  const float* res = p.has_residual ? ctx.in(next).ptr<float>() : nullptr;
  const int act = epilogue_activation(p);
  const A* pa = ta.ptr<A>();
  const W* pw = tw.ptr<W>();
  auto w_at = [&](int64_t i, int64_t j) { return int32_t{pw[tw_t ? j * k + i : i * n + j]}; };
  std::vector<double> mult(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j)
    mult[j] = static_cast<double>(sa) * static_cast<double>(sw[per_channel ? j : 0]);
  Y* out = ctx.out(0).ptr<Y>();
  auto finish = [&](int64_t r, int64_t j, int32_t acc) {
    out[r * n + j] =
        requantize<Y>(acc, mult[j], bias ? bias[j] : 0.0, res ? res[r * n + j] : 0.0, act, sy, zy);
  };
  if constexpr (std::is_same_v<W, int8_t>) {
    if (dnnl_int8_exact() && m * n * k >= (1 << 15)) {
      const bool need_rowsum =
          std::any_of(zw, zw + (per_channel ? n : 1), [](W z) { return z != 0; });
      if (!need_rowsum && k > 0 &&
          matmul_dnnl_fused<A, Y>(ctx, m, k, n, tw_t, mult, bias, res, act, sy, za, zy))
        return;
      // (a - za)(w - zw) = a w - za colsum(w) - zw rowsum(a) + k za zw, all exact in i32
      int32_t* acc = static_cast<int32_t*>(ctx.scratch(static_cast<size_t>(m * n) * 4));
      raw_product_dnnl<A>(ctx, m, k, n, tw_t, acc);
      // the sums only where a zero point multiplies them (none for symmetric data)
      std::vector<int32_t> colsum(static_cast<size_t>(n), 0);
      if (za != 0) colsum = weight_column_sums(ctx, pw, k, n, tw_t);
      ctx.parallel_for(m, std::max<int64_t>(1, 16384 / std::max<int64_t>(n + k, 1)),
                       [&](int64_t r0, int64_t r1) {
                         for (int64_t r = r0; r < r1; ++r) {
                           int32_t rowsum = 0;
                           if (need_rowsum)
                             for (int64_t i = 0; i < k; ++i) rowsum += pa[r * k + i];
                           for (int64_t j = 0; j < n; ++j) {
                             const int32_t z = zw[per_channel ? j : 0];
                             finish(r, j,
                                    acc[r * n + j] - za * colsum[j] - z * rowsum +
                                        static_cast<int32_t>(k) * za * z);
                           }
                         }
                       });
      return;
    }
  }
  // w - zw as (N, K) int16 rows: exact i32 dot products the compiler vectorizes
  std::vector<int16_t> wt(static_cast<size_t>(n * k));
  for (int64_t j = 0; j < n; ++j)
    for (int64_t i = 0; i < k; ++i)
      wt[j * k + i] = static_cast<int16_t>(w_at(i, j) - zw[per_channel ? j : 0]);
  ctx.parallel_for(m, std::max<int64_t>(1, 4096 / std::max<int64_t>(n * k, 1)),
                   [&](int64_t r0, int64_t r1) {
                     std::vector<int16_t> row(static_cast<size_t>(k));
                     for (int64_t r = r0; r < r1; ++r) {
                       for (int64_t i = 0; i < k; ++i)
                         row[i] = static_cast<int16_t>(int32_t{pa[r * k + i]} - za);
                       for (int64_t j = 0; j < n; ++j) {
                         const int16_t* wr = wt.data() + j * k;
                         int32_t acc = 0;
                         for (int64_t i = 0; i < k; ++i) acc += int32_t{row[i]} * int32_t{wr[i]};
                         finish(r, j, acc);
                       }
                     }
                   });
}

void quantized_matmul(KernelContext& ctx) {
  with_int8_types(ctx, "cpu", [&](auto a, auto w, auto y) {
    quantized_matmul_impl<decltype(a), decltype(w), decltype(y)>(ctx);
  });
}

// Each weight dequantized into scratch exactly as dequantize does, then the f32 linear the unfused
// graph runs: the same bits.
template <typename W>
void quantized_weight_linear_impl(KernelContext& ctx) {
  const TensorView &x = ctx.in(0), &w = ctx.in(1);
  const int64_t n = w.shape[0], k = w.shape[1];
  const int64_t m = ctx.out(0).numel() / std::max<int64_t>(n, 1);
  const float* bias =
      params_of<QuantizedWeightLinearParams>(ctx).has_bias ? ctx.in(4).ptr<float>() : nullptr;
  float* y = ctx.out(0).ptr<float>();
  if (ctx.out(0).numel() == 0) return;
  if (k == 0) {
    for (int64_t i = 0; i < m * n; ++i) y[i] = bias ? bias[i % n] : 0.0f;
    return;
  }
  const float* sw = ctx.in(2).ptr<float>();
  const W* zw = ctx.in(3).ptr<W>();
  const bool per_channel = ctx.in(2).numel() != 1;
  const W* pw = w.ptr<W>();
  float* wf = static_cast<float*>(ctx.scratch(static_cast<size_t>(n * k) * sizeof(float)));
  ctx.parallel_for(n, std::max<int64_t>(1, 16384 / k), [&](int64_t j0, int64_t j1) {
    for (int64_t j = j0; j < j1; ++j) {
      const int64_t c = per_channel ? j : 0;
      for (int64_t i = 0; i < k; ++i)
        wf[j * k + i] = quant_math::dequantize_one(pw[j * k + i], zw[c], sw[c]);
    }
  });
  linear_f32(ctx, x.data, wf, bias, y, m, k, n);
}

void quantized_weight_linear(KernelContext& ctx) {
  dispatch_quant(ctx.in(1).dtype, ctx.op_name(),
                 [&](auto w) { quantized_weight_linear_impl<decltype(w)>(ctx); });
}

// A thread range of outputs, each its window's dequantized values summed in f32 in window order
// and divided by their count (the float pool's arithmetic); NCHW, or NHWC (cl: layout
// channels_last).
template <typename Q, bool cl> void dequantize_adaptive_avg_pool_impl(KernelContext& ctx) {
  const TensorView &q = ctx.in(0), &y = ctx.out(0);
  const int64_t C = q.shape[cl ? 3 : 1], H = q.shape[cl ? 1 : 2], W = q.shape[cl ? 2 : 3];
  const int64_t OH = y.shape[cl ? 1 : 2], OW = y.shape[cl ? 2 : 3];
  const int64_t sc = cl ? 1 : H * W, sh = cl ? W * C : W, sw = cl ? C : 1;
  const float s = *ctx.in(1).ptr<float>();
  const Q zp = *ctx.in(2).ptr<Q>();
  const Q* pq = q.ptr<Q>();
  float* out = y.ptr<float>();
  ctx.parallel_for(y.numel(), 64, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      int64_t c, oh, ow, n;
      if constexpr (cl) {
        c = i % C, ow = i / C % OW, oh = i / (C * OW) % OH, n = i / (C * OW * OH);
      } else {
        ow = i % OW, oh = i / OW % OH, c = i / (OW * OH) % C, n = i / (OW * OH * C);
      }
      const int64_t h0 = oh * H / OH, h1 = ((oh + 1) * H + OH - 1) / OH;
      const int64_t w0 = ow * W / OW, w1 = ((ow + 1) * W + OW - 1) / OW;
      const Q* base = pq + n * C * H * W + c * sc;
      float sum = 0.0f;
      for (int64_t h = h0; h < h1; ++h)
        for (int64_t w = w0; w < w1; ++w) sum += dequantize_one(base[h * sh + w * sw], zp, s);
      out[i] = sum / static_cast<float>((h1 - h0) * (w1 - w0));
    }
  });
}

template <bool NHWC> void dequantize_adaptive_avg_pool_in(KernelContext& ctx) {
  if (ctx.out(0).numel() == 0) return;
  if (ctx.in(0).dtype == DType::i8) dequantize_adaptive_avg_pool_impl<int8_t, NHWC>(ctx);
  else dequantize_adaptive_avg_pool_impl<uint8_t, NHWC>(ctx);
}
void dequantize_adaptive_avg_pool(KernelContext& ctx) {
  dequantize_adaptive_avg_pool_in<false>(ctx);
}
void dequantize_adaptive_avg_pool_channels_last(KernelContext& ctx) {
  dequantize_adaptive_avg_pool_in<true>(ctx);
}

}  // namespace

bool dnnl_int8_exact() {
  static const bool ok = [] {
    const int isa = static_cast<int>(dnnl::get_effective_cpu_isa());
    auto has = [&](int want) { return (isa & want) == want; };
    return has(dnnl_cpu_isa_avx512_core_vnni) || has(dnnl_cpu_isa_avx2_vnni);
  }();
  return ok;
}

void register_quant_kernels() {
  register_kernel(OpId::Quantize, Backend::cpu, {quantize, kFloatTypes, 0, true});
  register_kernel(OpId::Dequantize, Backend::cpu, {dequantize, kFloatTypes, 1, true});
  register_kernel(OpId::FakeQuantize, Backend::cpu, {fake_quantize, kFloatTypes, 0, true});
  register_kernel(OpId::QuantizedMatmul, Backend::cpu,
                  {quantized_matmul, DTypeSet{i8, u8}, 0, false});
  // (looked up on x's zero point: with quantize_x, x is f32)
  register_kernel(OpId::QuantizedConv, Backend::cpu, {quantized_conv, DTypeSet{i8, u8}, 2, false});
  register_kernel(OpId::QuantizedConv, Backend::cpu, Layout::channels_last,
                  {quantized_conv_channels_last, DTypeSet{i8, u8}, 2, false});
  register_kernel(OpId::QuantizedWeightLinear, Backend::cpu,
                  {quantized_weight_linear, DTypeSet{f32}, 0, false});
  register_kernel(OpId::DequantizeAdaptiveAvgPool, Backend::cpu,
                  {dequantize_adaptive_avg_pool, DTypeSet{i8, u8}, 0, false});
  register_kernel(OpId::DequantizeAdaptiveAvgPool, Backend::cpu, Layout::channels_last,
                  {dequantize_adaptive_avg_pool_channels_last, DTypeSet{i8, u8}, 0, false});
}

}  // namespace kiln::cpu
