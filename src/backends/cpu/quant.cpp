// CPU kernels of quantize, dequantize and fake_quantize (src/ops/quant.cpp): rows of x along
// the quantization axis in parallel, each row with one scale (per tensor, per channel) or one
// per block (per group). Arithmetic follows numpy step for step, so results are bit-exact.
#include <algorithm>
#include <cmath>
#include <limits>

#include "backends/cpu/cpu_common.h"
#include "backends/cpu/kernels.h"

namespace kiln::cpu {

namespace {

// Where element (o, a, j) of x split around the axis finds its scale: x is (outer, len, inner);
// per tensor one scale, per channel scale[a], per group scale[(o * blocks + a / block) * inner + j].
struct ScaleLayout {
  AxisSplit x;
  int64_t block = 0, blocks = 1;
  bool per_tensor = true;
  ScaleLayout(const KernelContext& ctx) {
    const TensorView &tx = ctx.in(0), &ts = ctx.in(1);
    per_tensor = ts.numel() == 1;
    const int64_t axis = ctx.attrs().i("axis");
    x = tx.rank() == 0 ? AxisSplit{} : split_at(tx.shape, axis);
    block = ctx.attrs().i("block_size");
    if (block > 0) blocks = (x.len + block - 1) / block;
  }
  // Calls row(first element, scale index of its first element, scale index step along the row)
  // for every row of `inner` elements, in parallel.
  template <typename F> void rows(const KernelContext& ctx, F&& row) const {
    const int64_t n = x.outer * x.len;
    ctx.parallel_for(n, std::max<int64_t>(1, 16384 / std::max<int64_t>(x.inner, 1)),
                     [&](int64_t r0, int64_t r1) {
                       for (int64_t r = r0; r < r1; ++r) {
                         const int64_t o = r / x.len, a = r % x.len;
                         if (per_tensor) row(r * x.inner, int64_t{0}, int64_t{0});
                         else if (block == 0) row(r * x.inner, a, int64_t{0});
                         else row(r * x.inner, (o * blocks + a / block) * x.inner, int64_t{1});
                       }
                     });
  }
};

template <typename Q> constexpr double kLo = static_cast<double>(std::numeric_limits<Q>::min());
template <typename Q> constexpr double kHi = static_cast<double>(std::numeric_limits<Q>::max());

// round_half_even(x / s) + zp, saturated (NaN -> the low end), as numpy computes it.
template <typename T, typename Q> inline Q quantize_one(T x, T s, Q zp) {
  const double r = static_cast<double>(std::nearbyint(x / s)) + static_cast<double>(zp);
  if (std::isnan(r)) return std::numeric_limits<Q>::min();
  return static_cast<Q>(std::clamp(r, kLo<Q>, kHi<Q>));
}

// (q - zp) * s: in f32 for 8/16-bit data; i32 data as f32 then f64 (the ONNX reference's steps).
template <typename Q, typename T> inline T dequantize_one(Q q, Q zp, T s) {
  if constexpr (std::is_same_v<Q, int32_t>) {
    const double d = static_cast<double>(static_cast<float>(q)) - static_cast<double>(zp);
    return static_cast<T>(d * static_cast<double>(s));
  } else {
    return static_cast<T>(static_cast<T>(static_cast<float>(q) - static_cast<float>(zp)) * s);
  }
}

template <typename F> void dispatch_quant(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::i8: f(int8_t{}); return;
    case DType::u8: f(uint8_t{}); return;
    case DType::i16: f(int16_t{}); return;
    case DType::i32: f(int32_t{}); return;
    default: fail<UnsupportedError>("[{}] cpu kernel got quantized dtype {}", op, name(t));
  }
}

// quantize (out in Q) and fake_quantize (out in T, the dequantized value).
template <typename T, typename Q, bool kFake> void quantize_impl(KernelContext& ctx) {
  const ScaleLayout l(ctx);
  const T* x = ctx.in(0).ptr<T>();
  const T* s = ctx.in(1).ptr<T>();
  const Q* zp = ctx.in(2).ptr<Q>();
  auto* out = ctx.out(0).ptr<std::conditional_t<kFake, T, Q>>();
  const int64_t inner = l.x.inner;
  l.rows(ctx, [&](int64_t base, int64_t si, int64_t step) {
    for (int64_t j = 0; j < inner; ++j) {
      const int64_t k = si + j * step;
      const Q q = quantize_one<T, Q>(x[base + j], s[k], zp[k]);
      if constexpr (kFake) out[base + j] = dequantize_one<Q, T>(q, zp[k], s[k]);
      else out[base + j] = q;
    }
  });
}

template <bool kFake> void quantize_kernel(KernelContext& ctx) {
  dispatch_float(ctx.in(0).dtype, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    dispatch_quant(ctx.in(2).dtype, ctx.op_name(), [&](auto q) {
      using Q = decltype(q);
      if constexpr (std::is_same_v<Q, int32_t>)
        fail<UnsupportedError>("[{}] cannot quantize to i32", ctx.op_name());
      else quantize_impl<T, Q, kFake>(ctx);
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
      const int64_t inner = l.x.inner;
      l.rows(ctx, [&](int64_t base, int64_t si, int64_t step) {
        for (int64_t j = 0; j < inner; ++j) {
          const int64_t k = si + j * step;
          out[base + j] = dequantize_one<Q, T>(q[base + j], zp[k], s[k]);
        }
      });
    });
  });
}

}  // namespace

void register_quant_kernels() {
  register_kernel(OpId::Quantize, Backend::cpu, {quantize, kFloatTypes, 0, true});
  register_kernel(OpId::Dequantize, Backend::cpu, {dequantize, kFloatTypes, 1, true});
  register_kernel(OpId::FakeQuantize, Backend::cpu, {fake_quantize, kFloatTypes, 0, true});
}

}  // namespace kiln::cpu
