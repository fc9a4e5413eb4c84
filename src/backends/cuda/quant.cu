// CUDA kernels of quantize, dequantize and fake_quantize: one thread per element (grid-stride),
// the same arithmetic as the CPU kernels (src/backends/cpu/quant.cpp), so results agree bit for
// bit. f16/bf16 data runs through f32 (KernelEntry::half_via_f32).
#include <cmath>
#include <limits>

#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/kernels.h"

namespace kiln::cuda {

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
};

ScaleIndex scale_index(const KernelContext& ctx) {
  ScaleIndex s;
  const TensorView &x = ctx.in(0), &sc = ctx.in(1);
  s.per_tensor = sc.numel() == 1;
  if (!s.per_tensor) {
    const AxisSplit sp = split_at(x.shape, ctx.attrs().i("axis"));
    s.len = sp.len;
    s.inner = sp.inner;
    s.block = ctx.attrs().i("block_size");
    if (s.block > 0) s.blocks = (s.len + s.block - 1) / s.block;
  }
  return s;
}

// The range of Q as constants device code can read.
template <typename Q> struct Range;
template <> struct Range<int8_t> { static constexpr double lo = -128, hi = 127; };
template <> struct Range<uint8_t> { static constexpr double lo = 0, hi = 255; };
template <> struct Range<int16_t> { static constexpr double lo = -32768, hi = 32767; };

// round_half_even(x / s) + zp, saturated (NaN -> the low end), in T as the CPU does.
template <typename Q, typename T> __device__ inline Q quantize_one(T x, T s, Q zp) {
  T y;
  if constexpr (std::is_same_v<T, float>) y = rintf(x / s);
  else y = rint(x / s);
  const double r = static_cast<double>(y) + static_cast<double>(zp);
  if (isnan(r)) return static_cast<Q>(Range<Q>::lo);
  return static_cast<Q>(r < Range<Q>::lo ? Range<Q>::lo : (r > Range<Q>::hi ? Range<Q>::hi : r));
}

template <typename Q, typename T> __device__ inline T dequantize_one(Q q, Q zp, T s) {
  if constexpr (std::is_same_v<Q, int32_t>) {
    const double d = static_cast<double>(static_cast<float>(q)) - static_cast<double>(zp);
    return static_cast<T>(d * static_cast<double>(s));
  } else {
    return static_cast<T>(static_cast<T>(static_cast<float>(q) - static_cast<float>(zp)) * s);
  }
}

template <typename T, typename Q, bool kFake, typename O>
__global__ void quantize_kernel(const T* __restrict__ x, const T* __restrict__ s,
                                const Q* __restrict__ zp, O* __restrict__ out, int64_t n,
                                ScaleIndex si) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{blockDim.x} * gridDim.x) {
    const int64_t k = si(i);
    const Q q = quantize_one<Q, T>(x[i], s[k], zp[k]);
    if constexpr (kFake) out[i] = dequantize_one<Q, T>(q, zp[k], s[k]);
    else out[i] = q;
  }
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

template <typename F> void dispatch_quant(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::i8: f(int8_t{}); return;
    case DType::u8: f(uint8_t{}); return;
    case DType::i16: f(int16_t{}); return;
    case DType::i32: f(int32_t{}); return;
    default: fail<UnsupportedError>("[{}] cuda kernel got quantized dtype {}", op, name(t));
  }
}

template <typename F> void dispatch_f32_f64(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::f32: f(float{}); return;
    case DType::f64: f(double{}); return;
    default: fail<UnsupportedError>("[{}] cuda kernel got dtype {}", op, name(t));
  }
}

template <bool kFake> void quantize_any(KernelContext& ctx) {
  const int64_t n = ctx.out(0).numel();
  if (n == 0) return;
  const ScaleIndex si = scale_index(ctx);
  dispatch_f32_f64(ctx.in(0).dtype, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    dispatch_quant(ctx.in(2).dtype, ctx.op_name(), [&](auto qt) {
      using Q = decltype(qt);
      if constexpr (std::is_same_v<Q, int32_t>) {
        fail<UnsupportedError>("[{}] cannot quantize to i32", ctx.op_name());
      } else {
        using O = std::conditional_t<kFake, T, Q>;
        quantize_kernel<T, Q, kFake, O><<<blocks_for(n), kThreads, 0, stream_of(ctx)>>>(
            ctx.in(0).ptr<T>(), ctx.in(1).ptr<T>(), ctx.in(2).ptr<Q>(), ctx.out(0).ptr<O>(), n,
            si);
        check_launch(ctx.op_name());
      }
    });
  });
}

void quantize(KernelContext& ctx) { quantize_any<false>(ctx); }
void fake_quantize(KernelContext& ctx) { quantize_any<true>(ctx); }

void dequantize(KernelContext& ctx) {
  const int64_t n = ctx.out(0).numel();
  if (n == 0) return;
  const ScaleIndex si = scale_index(ctx);
  dispatch_f32_f64(ctx.in(1).dtype, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    dispatch_quant(ctx.in(0).dtype, ctx.op_name(), [&](auto qt) {
      using Q = decltype(qt);
      dequantize_kernel<Q, T><<<blocks_for(n), kThreads, 0, stream_of(ctx)>>>(
          ctx.in(0).ptr<Q>(), ctx.in(1).ptr<T>(), ctx.in(2).ptr<Q>(), ctx.out(0).ptr<T>(), n, si);
      check_launch(ctx.op_name());
    });
  });
}

}  // namespace

void register_quant_kernels() {
  register_kernel(OpId::Quantize, Backend::cuda, {quantize, kFloatTypes, 0, true});
  register_kernel(OpId::Dequantize, Backend::cuda, {dequantize, kFloatTypes, 1, true});
  register_kernel(OpId::FakeQuantize, Backend::cuda, {fake_quantize, kFloatTypes, 0, true});
}

}  // namespace kiln::cuda
