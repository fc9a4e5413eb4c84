// CUDA kernels of quantize, dequantize and fake_quantize: one thread per element (grid-stride),
// or kVec consecutive elements of one scale a thread (f32 with 8-bit data: per tensor, or per
// channel with inner % kVec == 0), the same arithmetic as the CPU kernels
// (src/backends/cpu/quant.cpp), so results agree bit for bit (the rounding lives in
// backends/quant_math.h, shared with the CPU). f16/bf16 data runs through f32
// (KernelEntry::half_via_f32). quantized_matmul: cuBLASLt's int8 product where its
// rules allow (quant_gemm.cu), else one thread per output element, an exact i32 dot product; the
// epilogue in double as on the CPU. quantized_conv: quant_conv.cu; quantized_weight_linear:
// quant_linear.cu.
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <utility>

#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/kernels.h"
#include "backends/cuda/quant_gemm.h"
#include "backends/quant_dispatch.h"
#include "backends/quant_math.h"

namespace kiln::cuda {

void quantized_conv(KernelContext& ctx);                // quant_conv.cu
void quantized_conv_channels_last(KernelContext& ctx);  // quant_conv.cu
void register_quant_linear_kernels();                   // quant_linear.cu: quantized_weight_linear

namespace {

// The scale index of element i of x (outer, len, inner around the axis): one scale per tensor,
// per channel (block 0) or per block of `block` along the axis.
struct ScaleIndex {
  int64_t len = 1, inner = 1, block = 0, blocks = 1;
  bool per_tensor = true;
  __device__ int64_t operator()(int64_t i) const {
    if (per_tensor) return 0;
    const int64_t r = i / inner, a = r % len;
    if (block == 0) return a;
    return ((r / len) * blocks + a / block) * inner + i % inner;
  }
  // The vector path's scale index of elements [i, i + kVec) (per tensor, or per channel with
  // inner % kVec == 0), in 32-bit math.
  __device__ int of_pack(int i) const {
    if (per_tensor) return 0;
    return static_cast<int>(static_cast<uint32_t>(i) / static_cast<uint32_t>(inner) %
                            static_cast<uint32_t>(len));
  }
};

ScaleIndex scale_index(const KernelContext& ctx) {
  ScaleIndex s;
  const TensorView &x = ctx.in(0), &sc = ctx.in(1);
  s.per_tensor = sc.numel() == 1;
  if (!s.per_tensor) {
    const QuantizeParams p = params_of<QuantizeParams>(ctx);
    const AxisSplit sp = split_at(x.shape, p.axis);
    s.len = sp.len;
    s.inner = sp.inner;
    s.block = p.block_size;
    if (s.block > 0) s.blocks = (s.len + s.block - 1) / s.block;
  }
  return s;
}

using quant_math::dequantize_one;
using quant_math::quantize_one;
using quant_math::requantize;

template <typename T, typename Q, bool kFake, typename O>
__global__ void quantize_kernel(const T* __restrict__ x, const T* __restrict__ s,
                                const Q* __restrict__ zp, O* __restrict__ out, int64_t n,
                                ScaleIndex si) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{blockDim.x} * gridDim.x) {
    const int64_t k = si(i);
    const Q q = quantize_one<T, Q>(x[i], s[k], zp[k]);
    if constexpr (kFake)
      out[i] = dequantize_one<Q, T>(q, zp[k], s[k]);
    else
      out[i] = q;
  }
}

// The vector path: kVec consecutive elements a thread, loaded and stored as one access each.
constexpr int kVec = 4;
template <typename T>
struct alignas(sizeof(T) * kVec) Pack {
  T v[kVec];
};

// Whether the vector path takes n elements (f32 with 8-bit data, where the caller checks the
// types): one scale per pack, 32-bit offsets, each buffer aligned to a pack of its elements
// (given with their sizes).
bool takes_vector_path(int64_t n, const ScaleIndex& si,
                       std::initializer_list<std::pair<const void*, size_t>> buffers) {
  bool ok = n < (int64_t{1} << 31) && (si.per_tensor || (si.block == 0 && si.inner % kVec == 0));
  for (const auto& [p, bytes] : buffers)
    ok = ok && reinterpret_cast<uintptr_t>(p) % (bytes * kVec) == 0;
  return ok;
}

// One element of quantize (fake: quantize then dequantize) and of dequantize, for quant_vec_kernel.
template <typename T, typename Q, bool kFake>
struct QuantizeOne {
  using In = T;
  using Out = std::conditional_t<kFake, T, Q>;
  __device__ Out operator()(T v, T s, Q zp) const {
    const Q q = quantize_one<T, Q>(v, s, zp);
    if constexpr (kFake)
      return dequantize_one<Q, T>(q, zp, s);
    else
      return q;
  }
};
template <typename Q, typename T>
struct DequantizeOne {
  using In = Q;
  using Out = T;
  __device__ T operator()(Q v, T s, Q zp) const { return dequantize_one<Q, T>(v, zp, s); }
};

// kVec elements a thread, one scale and one load and store each; the n % kVec elements after the
// last pack (per tensor only) go to the first threads.
template <typename T, typename Q, typename F>
__global__ void quant_vec_kernel(const typename F::In* __restrict__ x, const T* __restrict__ s,
                                 const Q* __restrict__ zp, typename F::Out* __restrict__ out,
                                 int n, ScaleIndex si, F f) {
  using I = typename F::In;
  using O = typename F::Out;
  const int first = blockIdx.x * blockDim.x + threadIdx.x, packs = n / kVec;
  for (int i = first; i < packs; i += gridDim.x * blockDim.x) {
    const int k = si.of_pack(i * kVec);
    const T sk = s[k];
    const Q zk = zp[k];
    const Pack<I> v = reinterpret_cast<const Pack<I>*>(x)[i];
    Pack<O> o;
#pragma unroll
    for (int u = 0; u < kVec; ++u) o.v[u] = f(v.v[u], sk, zk);
    reinterpret_cast<Pack<O>*>(out)[i] = o;
  }
  const int t = packs * kVec + first;
  if (t < n) out[t] = f(x[t], s[0], zp[0]);
}

template <typename Q, typename T>
__global__ void dequantize_kernel(const Q* __restrict__ q, const T* __restrict__ s,
                                  const Q* __restrict__ zp, T* __restrict__ out, int64_t n,
                                  ScaleIndex si) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{blockDim.x} * gridDim.x) {
    const int64_t k = si(i);
    out[i] = dequantize_one<Q, T>(q[i], zp[k], s[k]);
  }
}

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
      fail<UnsupportedError>("[{}] cuda kernel got quantized dtype {}", op, name(t));
  }
}

template <typename F>
void dispatch_f32_f64(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::f32:
      f(float{});
      return;
    case DType::f64:
      f(double{});
      return;
    default:
      fail<UnsupportedError>("[{}] cuda kernel got dtype {}", op, name(t));
  }
}

// Launches the vector path where it applies, else the generic kernel.
template <typename T, typename Q, bool kFake>
void launch_quantize(KernelContext& ctx, int64_t n, const ScaleIndex& si) {
  using O = std::conditional_t<kFake, T, Q>;
  const T* x = ctx.in(0).ptr<T>();
  O* out = ctx.out(0).ptr<O>();
  constexpr bool kF32Bytes = std::is_same_v<T, float> && sizeof(Q) == 1;
  if constexpr (kF32Bytes) {
    if (takes_vector_path(n, si, {{x, sizeof(T)}, {out, sizeof(O)}})) {
      quant_vec_kernel<<<blocks_for(n / kVec + 1), kThreads, 0, stream_of(ctx)>>>(
          x, ctx.in(1).ptr<T>(), ctx.in(2).ptr<Q>(), out, static_cast<int>(n), si,
          QuantizeOne<T, Q, kFake>{});
      return check_launch(ctx.op_name());
    }
  }
  quantize_kernel<T, Q, kFake, O><<<blocks_for(n), kThreads, 0, stream_of(ctx)>>>(
      x, ctx.in(1).ptr<T>(), ctx.in(2).ptr<Q>(), out, n, si);
  check_launch(ctx.op_name());
}

template <bool kFake>
void quantize_any(KernelContext& ctx) {
  const int64_t n = ctx.out(0).numel();
  if (n == 0) return;
  const ScaleIndex si = scale_index(ctx);
  dispatch_f32_f64(ctx.in(0).dtype, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    dispatch_quant(ctx.in(2).dtype, ctx.op_name(), [&](auto qt) {
      using Q = decltype(qt);
      if constexpr (std::is_same_v<Q, int32_t>)
        fail<UnsupportedError>("[{}] cannot quantize to i32", ctx.op_name());
      else
        launch_quantize<T, Q, kFake>(ctx, n, si);
    });
  });
}

void quantize(KernelContext& ctx) { quantize_any<false>(ctx); }
void fake_quantize(KernelContext& ctx) { quantize_any<true>(ctx); }

template <typename Q, typename T>
void launch_dequantize(KernelContext& ctx, int64_t n, const ScaleIndex& si) {
  const Q* q = ctx.in(0).ptr<Q>();
  T* out = ctx.out(0).ptr<T>();
  if constexpr (std::is_same_v<T, float> && sizeof(Q) == 1) {
    if (takes_vector_path(n, si, {{q, sizeof(Q)}, {out, sizeof(T)}})) {
      quant_vec_kernel<<<blocks_for(n / kVec + 1), kThreads, 0, stream_of(ctx)>>>(
          q, ctx.in(1).ptr<T>(), ctx.in(2).ptr<Q>(), out, static_cast<int>(n), si,
          DequantizeOne<Q, T>{});
      return check_launch(ctx.op_name());
    }
  }
  dequantize_kernel<Q, T><<<blocks_for(n), kThreads, 0, stream_of(ctx)>>>(
      q, ctx.in(1).ptr<T>(), ctx.in(2).ptr<Q>(), out, n, si);
  check_launch(ctx.op_name());
}

void dequantize(KernelContext& ctx) {
  const int64_t n = ctx.out(0).numel();
  if (n == 0) return;
  const ScaleIndex si = scale_index(ctx);
  dispatch_f32_f64(ctx.in(1).dtype, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    dispatch_quant(ctx.in(0).dtype, ctx.op_name(),
                   [&](auto qt) { launch_dequantize<decltype(qt), T>(ctx, n, si); });
  });
}

struct QmmArgs {
  int64_t m, n, k;
  bool transpose_w, per_channel;
  int act;  // quant_math::Activation
};

template <typename A, typename W, typename Y>
__global__ void quantized_matmul_kernel(const A* __restrict__ a, const float* __restrict__ sa,
                                        const A* __restrict__ za, const W* __restrict__ w,
                                        const float* __restrict__ sw, const W* __restrict__ zw,
                                        const float* __restrict__ sy, const Y* __restrict__ zy,
                                        const float* __restrict__ bias,
                                        const float* __restrict__ res, Y* __restrict__ out,
                                        QmmArgs g) {
  const int64_t total = g.m * g.n;
  for (int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; t < total;
       t += int64_t{blockDim.x} * gridDim.x) {
    const int64_t r = t / g.n, j = t % g.n, c = g.per_channel ? j : 0;
    const int32_t a0 = za[0], w0 = zw[c];
    int32_t acc = 0;
    for (int64_t i = 0; i < g.k; ++i) {
      const int32_t wv = w[g.transpose_w ? j * g.k + i : i * g.n + j];
      acc += (int32_t{a[r * g.k + i]} - a0) * (wv - w0);
    }
    out[t] = requantize<Y>(acc, static_cast<double>(sa[0]) * static_cast<double>(sw[c]),
                           bias ? bias[j] : 0.0, res ? res[t] : 0.0, g.act,
                           static_cast<double>(sy[0]), zy[0]);
  }
}

void quantized_matmul(KernelContext& ctx) {
  const TensorView &ta = ctx.in(0), &tw = ctx.in(3);
  const QuantizedMatmulParams p = params_of<QuantizedMatmulParams>(ctx);
  QmmArgs g;
  g.transpose_w = p.transpose_w;
  g.act = epilogue_activation(p);
  g.k = ta.shape.back();
  g.n = g.transpose_w ? tw.shape[0] : tw.shape[1];
  g.m = ctx.out(0).numel() / (g.n > 0 ? g.n : 1);
  g.per_channel = ctx.in(4).numel() != 1 || g.n == 1;
  if (ctx.out(0).numel() == 0) return;
  if (quantized_matmul_igemm(ctx, g.m, g.n, g.k, g.transpose_w)) return;
  if (quantized_matmul_lt(ctx, g.m, g.n, g.k, g.transpose_w)) return;
  int next = 8;
  const float* bias = p.has_bias ? ctx.in(next++).ptr<float>() : nullptr;
  const float* res = p.has_residual ? ctx.in(next).ptr<float>() : nullptr;
  with_int8_types(ctx, "cuda", [&](auto at, auto wt, auto yt) {
    using A = decltype(at);
    using W = decltype(wt);
    using Y = decltype(yt);
    quantized_matmul_kernel<A, W, Y><<<blocks_for(g.m * g.n), kThreads, 0, stream_of(ctx)>>>(
        ta.ptr<A>(), ctx.in(1).ptr<float>(), ctx.in(2).ptr<A>(), tw.ptr<W>(),
        ctx.in(4).ptr<float>(), ctx.in(5).ptr<W>(), ctx.in(6).ptr<float>(), ctx.in(7).ptr<Y>(),
        bias, res, ctx.out(0).ptr<Y>(), g);
    check_launch(ctx.op_name());
  });
}

// dequantize_adaptive_avg_pool: a thread an output, its window's taps loaded 8 at a time ahead of
// the sum, each dequantized as dequantize does and summed in f32 in window order, then divided by
// the count (the float NHWC pool's arithmetic); NCHW or NHWC (layout channels_last) through
// strides. Offsets fit 32 bits.
struct DqPoolArgs {
  int n_out, C, H, W, OH, OW;
  int sc, sh, sw;  // strides of a channel, row and column
  bool cl;         // NHWC
};

template <typename Q>
__global__ void dequantize_adaptive_avg_pool_kernel(const Q* __restrict__ q,
                                                    const float* __restrict__ scale,
                                                    const Q* __restrict__ zp, float* __restrict__ y,
                                                    DqPoolArgs g) {
  const float s = scale[0];
  const Q z = zp[0];
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < g.n_out; i += gridDim.x * blockDim.x) {
    int c, oh, ow, n;
    if (g.cl) {
      c = i % g.C, ow = i / g.C % g.OW, oh = i / (g.C * g.OW) % g.OH, n = i / (g.C * g.OW * g.OH);
    } else {
      ow = i % g.OW, oh = i / g.OW % g.OH, c = i / (g.OW * g.OH) % g.C;
      n = i / (g.OW * g.OH * g.C);
    }
    const int h0 = oh * g.H / g.OH, h1 = ((oh + 1) * g.H + g.OH - 1) / g.OH;
    const int w0 = ow * g.W / g.OW, w1 = ((ow + 1) * g.W + g.OW - 1) / g.OW;
    const int taps = (h1 - h0) * (w1 - w0);
    const Q* base = q + n * g.C * g.H * g.W + c * g.sc;
    float sum = 0.0f;
    int h = h0, w = w0;  // the next tap to load, in row-major window order
    for (int t0 = 0; t0 < taps; t0 += 8) {
      Q v[8];
#pragma unroll
      for (int u = 0; u < 8; ++u) {  // loads past the last tap repeat it
        v[u] = base[h * g.sh + w * g.sw];
        if (t0 + u + 1 < taps && ++w == w1) w = w0, ++h;
      }
#pragma unroll
      for (int u = 0; u < 8; ++u)
        if (t0 + u < taps) sum += dequantize_one(v[u], z, s);
    }
    y[i] = sum / static_cast<float>(taps);
  }
}

// NHWC with C % 4 == 0: four channels a thread, a 4-byte load a tap (a warp reads 128 bytes of a
// pixel at once), up to 64 taps in flight (a 7x7 window's all at once: the threads are few), the
// same arithmetic per channel.
template <typename Q, int kAhead = 64>
__global__ void dequantize_adaptive_avg_pool_x4_kernel(const uint32_t* __restrict__ q,
                                                       const float* __restrict__ scale,
                                                       const Q* __restrict__ zp,
                                                       float4* __restrict__ y, DqPoolArgs g) {
  const float s = scale[0];
  const Q z = zp[0];
  const int C4 = g.C / 4, n4 = g.n_out / 4;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += gridDim.x * blockDim.x) {
    const int c4 = i % C4, ow = i / C4 % g.OW, oh = i / (C4 * g.OW) % g.OH;
    const int n = i / (C4 * g.OW * g.OH);
    const int h0 = oh * g.H / g.OH, h1 = ((oh + 1) * g.H + g.OH - 1) / g.OH;
    const int w0 = ow * g.W / g.OW, w1 = ((ow + 1) * g.W + g.OW - 1) / g.OW;
    const int taps = (h1 - h0) * (w1 - w0);
    const uint32_t* base = q + n * C4 * g.H * g.W + c4;
    float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    int h = h0, w = w0;
    for (int t0 = 0; t0 < taps; t0 += kAhead) {
      uint32_t v[kAhead];
#pragma unroll
      for (int u = 0; u < kAhead; ++u) {  // in groups of 8; loads past the last tap repeat it
        if (u % 8 == 0 && t0 + u >= taps) break;
        v[u] = base[(h * g.W + w) * C4];
        if (t0 + u + 1 < taps && ++w == w1) w = w0, ++h;
      }
#pragma unroll
      for (int u = 0; u < kAhead; ++u)
        if (t0 + u < taps)
#pragma unroll
          for (int b = 0; b < 4; ++b)
            sum[b] += dequantize_one(static_cast<Q>(v[u] >> (8 * b)), z, s);
    }
    const float count = static_cast<float>(taps);
    y[i] = make_float4(sum[0] / count, sum[1] / count, sum[2] / count, sum[3] / count);
  }
}

// The kernel of layout plain (NHWC false) or channels_last (NHWC true).
template <bool NHWC> void dequantize_adaptive_avg_pool_in(KernelContext& ctx) {
  const TensorView &tq = ctx.in(0), &ty = ctx.out(0);
  if (ty.numel() == 0) return;
  if (tq.numel() > INT32_MAX)
    fail<UnsupportedError>("[{}] cuda kernel takes fewer than 2^31 elements, got {}", ctx.op_name(),
                           tq.numel());
  DqPoolArgs g;
  g.cl = NHWC;
  auto dim = [](int64_t d) { return static_cast<int>(d); };
  g.n_out = dim(ty.numel());
  g.C = dim(tq.shape[g.cl ? 3 : 1]), g.H = dim(tq.shape[g.cl ? 1 : 2]);
  g.W = dim(tq.shape[g.cl ? 2 : 3]);
  g.OH = dim(ty.shape[g.cl ? 1 : 2]), g.OW = dim(ty.shape[g.cl ? 2 : 3]);
  g.sc = g.cl ? 1 : g.H * g.W, g.sh = g.cl ? g.W * g.C : g.W, g.sw = g.cl ? g.C : 1;
  const bool x4 = g.cl && g.C % 4 == 0 && pointer_alignment(tq.data) >= 4 &&
                  pointer_alignment(ty.data) >= 16;
  auto launch = [&](auto t) {
    using Q = decltype(t);
    if (x4) {
      dequantize_adaptive_avg_pool_x4_kernel<Q>
          <<<blocks_for(g.n_out / 4, 128), 128, 0, stream_of(ctx)>>>(
              tq.ptr<uint32_t>(), ctx.in(1).ptr<float>(), ctx.in(2).ptr<Q>(),
              static_cast<float4*>(ty.data), g);
      return;
    }
    dequantize_adaptive_avg_pool_kernel<Q><<<blocks_for(g.n_out, 128), 128, 0, stream_of(ctx)>>>(
        tq.ptr<Q>(), ctx.in(1).ptr<float>(), ctx.in(2).ptr<Q>(), ty.ptr<float>(), g);
  };
  if (tq.dtype == DType::i8)
    launch(int8_t{});
  else
    launch(uint8_t{});
  check_launch(ctx.op_name());
}
void dequantize_adaptive_avg_pool(KernelContext& ctx) {
  dequantize_adaptive_avg_pool_in<false>(ctx);
}
void dequantize_adaptive_avg_pool_channels_last(KernelContext& ctx) {
  dequantize_adaptive_avg_pool_in<true>(ctx);
}

}  // namespace

void register_quant_kernels() {
  register_kernel(OpId::Quantize, Backend::cuda, {quantize, kFloatTypes, 0, true});
  register_kernel(OpId::Dequantize, Backend::cuda, {dequantize, kFloatTypes, 1, true});
  register_kernel(OpId::FakeQuantize, Backend::cuda, {fake_quantize, kFloatTypes, 0, true});
  register_kernel(OpId::QuantizedMatmul, Backend::cuda,
                  {quantized_matmul, DTypeSet{i8, u8}, 0, false});
  // (looked up on x's zero point: with quantize_x, x is f32)
  register_kernel(OpId::QuantizedConv, Backend::cuda, {quantized_conv, DTypeSet{i8, u8}, 2, false});
  register_kernel(OpId::QuantizedConv, Backend::cuda, Layout::channels_last,
                  {quantized_conv_channels_last, DTypeSet{i8, u8}, 2, false});
  register_kernel(OpId::DequantizeAdaptiveAvgPool, Backend::cuda,
                  {dequantize_adaptive_avg_pool, DTypeSet{i8, u8}, 0, false});
  register_kernel(OpId::DequantizeAdaptiveAvgPool, Backend::cuda, Layout::channels_last,
                  {dequantize_adaptive_avg_pool_channels_last, DTypeSet{i8, u8}, 0, false});
  register_quant_linear_kernels();
}

}  // namespace kiln::cuda
