// CPU kernels of the unary elementwise ops: sign/rounding ops (all numeric dtypes), float math
// (trigonometric and hyperbolic included) and activations (f32/f64; f16/bf16 arrive as f32).
// Attribute keys: src/ops/elementwise.cpp.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#if defined(__x86_64__) && defined(__GLIBC__)
#include <dlfcn.h>
#include <xmmintrin.h>
#define KILN_VECTOR_MATH 1
#if defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>
#define KILN_VECTOR_MATH_512 1
#endif
#endif

#include "backends/cpu/elementwise.h"
#include "backends/cpu/kernels.h"

namespace kiln::cpu {

namespace {

using F32Map = bool (*)(const KernelContext&, const float*, float*, int64_t);

#ifdef KILN_VECTOR_MATH
// Four floats at once through one of the C library's vector functions (glibc 2.35+, libmvec,
// SSE ABI; within 4 ulp, the CPU's best variant picked by glibc), found at run time so that kiln
// still loads with an older C library; null where there is none.
using FloatX4 = __m128 (*)(__m128);
template <typename F> F libmvec_function(const char* symbol) {
  static void* const lib = dlopen("libmvec.so.1", RTLD_NOW | RTLD_LOCAL);  // (kept open)
  return lib ? reinterpret_cast<F>(dlsym(lib, symbol)) : nullptr;
}
FloatX4 vector_erfcf() {
  static const FloatX4 f = libmvec_function<FloatX4>("_ZGVbN4v_erfcf");
  return f;
}
FloatX4 vector_tanhf() {
  static const FloatX4 f = libmvec_function<FloatX4>("_ZGVbN4v_tanhf");
  return f;
}

// out[i] = f(in[i]) over f32 data in parallel, four elements at a time through vec, the last
// (fewer than four) padded to four: every element goes through vec, so that a result does not
// depend on where the element falls in the tensor or in a chunk of the fused kernel.
template <typename V> void map_f32_by4(const KernelContext& ctx, const float* in, float* out,
                                       int64_t n, V&& vec) {
  ctx.parallel_for(n, 16384, [&](int64_t b, int64_t e) {
    int64_t i = b;
    for (; i + 4 <= e; i += 4) _mm_storeu_ps(out + i, vec(_mm_loadu_ps(in + i)));
    if (i == e) return;
    float tail[4] = {};
    std::memcpy(tail, in + i, static_cast<size_t>(e - i) * sizeof(float));
    _mm_storeu_ps(tail, vec(_mm_loadu_ps(tail)));
    std::memcpy(out + i, tail, static_cast<size_t>(e - i) * sizeof(float));
  });
}

#ifdef KILN_VECTOR_MATH_512
// The same, sixteen at a time through the AVX-512 variants (compiled for AVX-512 under the
// pragma, and used only where cpu_isa() is avx512); the last fewer than sixteen go through the
// function too, masked.
#pragma GCC push_options
#pragma GCC target("avx512f")
namespace wide {
using FloatX16 = __m512 (*)(__m512);
template <typename V> void map_by16(const float* in, float* out, int64_t n, V&& vec) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(out + i, vec(_mm512_loadu_ps(in + i)));
  if (i == n) return;
  const auto m = static_cast<__mmask16>((1u << (n - i)) - 1);
  _mm512_mask_storeu_ps(out + i, m, vec(_mm512_maskz_loadu_ps(m, in + i)));
}
void gelu(const float* in, float* out, int64_t n, FloatX16 erfc16) {
  const __m512 half = _mm512_set1_ps(0.5f), k = _mm512_set1_ps(-0.7071067811865476f);
  map_by16(in, out, n, [&](__m512 x) {
    return _mm512_mul_ps(_mm512_mul_ps(half, x), erfc16(_mm512_mul_ps(x, k)));
  });
}
void gelu_tanh(const float* in, float* out, int64_t n, FloatX16 tanh16) {
  const __m512 half = _mm512_set1_ps(0.5f), one = _mm512_set1_ps(1.f),
               c = _mm512_set1_ps(0.7978845608028654f), cube = _mm512_set1_ps(0.044715f);
  map_by16(in, out, n, [&](__m512 x) {
    const __m512 x3 = _mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(cube, x), x), x);
    const __m512 t = tanh16(_mm512_mul_ps(c, _mm512_add_ps(x, x3)));
    return _mm512_mul_ps(_mm512_mul_ps(half, x), _mm512_add_ps(one, t));
  });
}
void tanh(const float* in, float* out, int64_t n, FloatX16 tanh16) {
  map_by16(in, out, n, tanh16);
}
}  // namespace wide
#pragma GCC pop_options
// The AVX-512 variant of a libmvec function where the kernels may use AVX-512; null otherwise.
wide::FloatX16 wide_function(const char* symbol) {
  return cpu_isa() == CpuIsa::avx512 ? libmvec_function<wide::FloatX16>(symbol) : nullptr;
}
wide::FloatX16 wide_erfcf() {
  static const wide::FloatX16 f = wide_function("_ZGVeN16v_erfcf");
  return f;
}
wide::FloatX16 wide_tanhf() {
  static const wide::FloatX16 f = wide_function("_ZGVeN16v_tanhf");
  return f;
}
// Runs map(in + b, out + b, e - b, f) over chunks in parallel.
template <typename M, typename F>
void by16(const KernelContext& ctx, const float* in, float* out, int64_t n, M map, F f) {
  ctx.parallel_for(n, 16384, [&](int64_t b, int64_t e) { map(in + b, out + b, e - b, f); });
}
#endif

// The f32 activations below sixteen (AVX-512) or four elements at a time where the C library has
// the vector function: the same expressions as the scalar kernels', the function within a few
// ulp of it. False where there is none (the scalar kernel runs).
bool gelu_f32_vector(const KernelContext& ctx, const float* in, float* out, int64_t n) {
#ifdef KILN_VECTOR_MATH_512
  if (const auto f = wide_erfcf()) return by16(ctx, in, out, n, wide::gelu, f), true;
#endif
  const FloatX4 erfc4 = vector_erfcf();
  if (!erfc4) return false;
  const __m128 half = _mm_set1_ps(0.5f), k = _mm_set1_ps(-0.7071067811865476f);
  map_f32_by4(
      ctx, in, out, n,
      [&](__m128 x) { return _mm_mul_ps(_mm_mul_ps(half, x), erfc4(_mm_mul_ps(x, k))); });
  return true;
}
bool gelu_tanh_f32_vector(const KernelContext& ctx, const float* in, float* out, int64_t n) {
#ifdef KILN_VECTOR_MATH_512
  if (const auto f = wide_tanhf()) return by16(ctx, in, out, n, wide::gelu_tanh, f), true;
#endif
  const FloatX4 tanh4 = vector_tanhf();
  if (!tanh4) return false;
  constexpr float kc = 0.7978845608028654f, kcube = 0.044715f;  // sqrt(2 / pi)
  const __m128 half = _mm_set1_ps(0.5f), one = _mm_set1_ps(1.f), c = _mm_set1_ps(kc),
               cube = _mm_set1_ps(kcube);
  map_f32_by4(
      ctx, in, out, n,
      [&](__m128 x) {
        const __m128 x3 = _mm_mul_ps(_mm_mul_ps(_mm_mul_ps(cube, x), x), x);
        const __m128 t = tanh4(_mm_mul_ps(c, _mm_add_ps(x, x3)));
        return _mm_mul_ps(_mm_mul_ps(half, x), _mm_add_ps(one, t));
      });
  return true;
}
bool tanh_f32_vector(const KernelContext& ctx, const float* in, float* out, int64_t n) {
#ifdef KILN_VECTOR_MATH_512
  if (const auto f = wide_tanhf()) return by16(ctx, in, out, n, wide::tanh, f), true;
#endif
  const FloatX4 tanh4 = vector_tanhf();
  if (!tanh4) return false;
  map_f32_by4(ctx, in, out, n, tanh4);
  return true;
}
#else
constexpr F32Map gelu_f32_vector = nullptr, gelu_tanh_f32_vector = nullptr,
                 tanh_f32_vector = nullptr;
#endif
// Runs one of the above on an f32 op (false: not f32, or no vector function).
bool f32_vector(KernelContext& ctx, F32Map f) {
  return f && ctx.in(0).dtype == DType::f32 &&
         f(ctx, ctx.in(0).ptr<float>(), ctx.out(0).ptr<float>(), ctx.in(0).numel());
}

void neg(KernelContext& ctx) {
  unary_same(ctx, [](auto x) {
    if constexpr (kFloat<decltype(x)>) return -x;
    else return wrap_neg(x);
  });
}
void abs(KernelContext& ctx) {
  unary_same(ctx, [](auto x) {
    using T = decltype(x);
    if constexpr (kFloat<T>) return std::fabs(x);
    else if constexpr (std::is_signed_v<T>) return x < 0 ? wrap_neg(x) : x;
    else return x;
  });
}
// sign(0) = 0 and sign(NaN) = NaN, as numpy.
void sign(KernelContext& ctx) {
  unary_same(ctx, [](auto x) {
    using T = decltype(x);
    if constexpr (kFloat<T>) {
      if (x != x) return x;
    }
    return static_cast<T>((T(0) < x) - (x < T(0)));
  });
}
// NaN passes through (NaN < 0 is false), as in PyTorch.
void relu(KernelContext& ctx) {
  unary_same(ctx, [](auto x) { return x < decltype(x)(0) ? decltype(x)(0) : x; });
}

// Rounding is the identity on integers.
template <typename F> void rounding(KernelContext& ctx, F f) {
  unary_same(ctx, [&](auto x) {
    if constexpr (kFloat<decltype(x)>) return f(x);
    else return x;
  });
}
void floor(KernelContext& ctx) { rounding(ctx, [](auto x) { return std::floor(x); }); }
void ceil(KernelContext& ctx) { rounding(ctx, [](auto x) { return std::ceil(x); }); }
// nearbyint in the default rounding mode rounds half to even.
void round(KernelContext& ctx) { rounding(ctx, [](auto x) { return std::nearbyint(x); }); }

// Bounds of clip in T: integers take the nearest in-range values inside [lo, hi].
template <typename T> T clip_bound(double v, bool upper) {
  if constexpr (kFloat<T>) {
    return static_cast<T>(v);
  } else {
    constexpr double kMin = static_cast<double>(std::numeric_limits<T>::min());
    constexpr double kMax = static_cast<double>(std::numeric_limits<T>::max());
    const double r = upper ? std::floor(v) : std::ceil(v);
    if (r <= kMin) return std::numeric_limits<T>::min();
    if (r >= kMax) return std::numeric_limits<T>::max();
    return static_cast<T>(r);
  }
}
// NaN passes through: both comparisons are false.
void clip(KernelContext& ctx) {
  const double lo = ctx.attrs().f("min"), hi = ctx.attrs().f("max");
  dispatch(ctx.in(0).dtype, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    if constexpr (!std::is_same_v<T, bool>) {
      const T l = clip_bound<T>(lo, false), h = clip_bound<T>(hi, true);
      unary_map(ctx, ctx.in(0).ptr<T>(), ctx.out(0).ptr<T>(), ctx.in(0).numel(),
                [=](T x) { return x < l ? l : (x > h ? h : x); });
    }
  });
}

void exp(KernelContext& ctx) { unary_float(ctx, [](auto x) { return std::exp(x); }); }
void log(KernelContext& ctx) { unary_float(ctx, [](auto x) { return std::log(x); }); }
void log1p(KernelContext& ctx) { unary_float(ctx, [](auto x) { return std::log1p(x); }); }
void expm1(KernelContext& ctx) { unary_float(ctx, [](auto x) { return std::expm1(x); }); }
void sqrt(KernelContext& ctx) { unary_float(ctx, [](auto x) { return std::sqrt(x); }); }
void rsqrt(KernelContext& ctx) {
  unary_float(ctx, [](auto x) { return decltype(x)(1) / std::sqrt(x); });
}
void reciprocal(KernelContext& ctx) {
  unary_float(ctx, [](auto x) { return decltype(x)(1) / x; });
}
void sin(KernelContext& ctx) { unary_float(ctx, [](auto x) { return std::sin(x); }); }
void cos(KernelContext& ctx) { unary_float(ctx, [](auto x) { return std::cos(x); }); }
void tanh(KernelContext& ctx) {
  if (f32_vector(ctx, tanh_f32_vector)) return;
  unary_float(ctx, [](auto x) { return std::tanh(x); });
}
void erf(KernelContext& ctx) { unary_float(ctx, [](auto x) { return std::erf(x); }); }
void tan(KernelContext& ctx) { unary_float(ctx, [](auto x) { return std::tan(x); }); }
void asin(KernelContext& ctx) { unary_float(ctx, [](auto x) { return std::asin(x); }); }
void acos(KernelContext& ctx) { unary_float(ctx, [](auto x) { return std::acos(x); }); }
void atan(KernelContext& ctx) { unary_float(ctx, [](auto x) { return std::atan(x); }); }
void sinh(KernelContext& ctx) { unary_float(ctx, [](auto x) { return std::sinh(x); }); }
void cosh(KernelContext& ctx) { unary_float(ctx, [](auto x) { return std::cosh(x); }); }
void asinh(KernelContext& ctx) { unary_float(ctx, [](auto x) { return std::asinh(x); }); }
void acosh(KernelContext& ctx) { unary_float(ctx, [](auto x) { return std::acosh(x); }); }
void atanh(KernelContext& ctx) { unary_float(ctx, [](auto x) { return std::atanh(x); }); }
void sigmoid(KernelContext& ctx) {
  unary_float(ctx, [](auto x) { return decltype(x)(1) / (decltype(x)(1) + std::exp(-x)); });
}
void silu(KernelContext& ctx) {
  unary_float(ctx, [](auto x) { return x / (decltype(x)(1) + std::exp(-x)); });
}

void leaky_relu(KernelContext& ctx) {
  const double alpha = ctx.attrs().f("alpha");
  unary_float(ctx, [=](auto x) { return x > 0 ? x : static_cast<decltype(x)>(alpha) * x; });
}
void elu(KernelContext& ctx) {
  const double alpha = ctx.attrs().f("alpha");
  unary_float(ctx, [=](auto x) {
    return x > 0 ? x : static_cast<decltype(x)>(alpha) * std::expm1(x);
  });
}
// Constants of Klambauer et al., "Self-Normalizing Neural Networks".
constexpr double kSeluAlpha = 1.6732632423543772848170429916717;
constexpr double kSeluScale = 1.0507009873554804934193349852946;
void selu(KernelContext& ctx) {
  unary_float(ctx, [](auto x) {
    using T = decltype(x);
    return static_cast<T>(kSeluScale) * (x > 0 ? x : static_cast<T>(kSeluAlpha) * std::expm1(x));
  });
}
void gelu(KernelContext& ctx) {
  if (ctx.attrs().str("approximate") == "tanh") {
    if (f32_vector(ctx, gelu_tanh_f32_vector)) return;
    unary_float(ctx, [](auto x) {
      using T = decltype(x);
      const T k = static_cast<T>(0.7978845608028654);  // sqrt(2 / pi)
      return T(0.5) * x * (T(1) + std::tanh(k * (x + T(0.044715) * x * x * x)));
    });
  } else {
    if (f32_vector(ctx, gelu_f32_vector)) return;
    unary_float(ctx, [](auto x) {
      using T = decltype(x);
      // Φ(x) as erfc(-x/√2) / 2: 1 + erf(x/√2) cancels for negative x (4 digits lost near -3)
      return T(0.5) * x * std::erfc(-x * static_cast<T>(0.7071067811865476));
    });
  }
}
void softplus(KernelContext& ctx) {
  const double beta = ctx.attrs().f("beta"), threshold = ctx.attrs().f("threshold");
  unary_float(ctx, [=](auto x) {
    using T = decltype(x);
    const T bx = static_cast<T>(beta) * x;
    return bx > static_cast<T>(threshold) ? x : std::log1p(std::exp(bx)) / static_cast<T>(beta);
  });
}
void softshrink(KernelContext& ctx) {
  const double lambda = ctx.attrs().f("lambda");
  unary_float(ctx, [=](auto x) {
    using T = decltype(x);
    const T l = static_cast<T>(lambda);
    return x > l ? x - l : (x < -l ? x + l : T(0));
  });
}
void hardshrink(KernelContext& ctx) {
  const double lambda = ctx.attrs().f("lambda");
  unary_float(ctx, [=](auto x) {
    using T = decltype(x);
    return (x > static_cast<T>(lambda) || x < -static_cast<T>(lambda)) ? x : T(0);
  });
}
void hardswish(KernelContext& ctx) {
  unary_float(ctx, [](auto x) {
    using T = decltype(x);
    return x * std::min(std::max(x + T(3), T(0)), T(6)) / T(6);
  });
}
void hardsigmoid(KernelContext& ctx) {
  const double alpha = ctx.attrs().f("alpha"), beta = ctx.attrs().f("beta");
  unary_float(ctx, [=](auto x) {
    using T = decltype(x);
    const T v = static_cast<T>(alpha) * x + static_cast<T>(beta);
    return v < T(0) ? T(0) : (v > T(1) ? T(1) : v);  // NaN passes through
  });
}
}  // namespace

void register_elementwise_unary_kernels() {
  constexpr DTypeSet kF{f32, f64};
  register_kernel(OpId::Neg, Backend::cpu, {neg, kSignedTypes});
  register_kernel(OpId::Abs, Backend::cpu, {abs, kNumericTypes});
  register_kernel(OpId::Sign, Backend::cpu, {sign, kNumericTypes});
  register_kernel(OpId::Relu, Backend::cpu, {relu, kSignedTypes});
  register_kernel(OpId::Floor, Backend::cpu, {floor, kNumericTypes});
  register_kernel(OpId::Ceil, Backend::cpu, {ceil, kNumericTypes});
  register_kernel(OpId::Round, Backend::cpu, {round, kNumericTypes});
  register_kernel(OpId::Clip, Backend::cpu, {clip, kNumericTypes});
  register_kernel(OpId::Exp, Backend::cpu, {exp, kF});
  register_kernel(OpId::Log, Backend::cpu, {log, kF});
  register_kernel(OpId::Log1p, Backend::cpu, {log1p, kF});
  register_kernel(OpId::Expm1, Backend::cpu, {expm1, kF});
  register_kernel(OpId::Sqrt, Backend::cpu, {sqrt, kF});
  register_kernel(OpId::Rsqrt, Backend::cpu, {rsqrt, kF});
  register_kernel(OpId::Reciprocal, Backend::cpu, {reciprocal, kF});
  register_kernel(OpId::Sin, Backend::cpu, {sin, kF});
  register_kernel(OpId::Cos, Backend::cpu, {cos, kF});
  register_kernel(OpId::Tanh, Backend::cpu, {tanh, kF});
  register_kernel(OpId::Erf, Backend::cpu, {erf, kF});
  register_kernel(OpId::Tan, Backend::cpu, {tan, kF});
  register_kernel(OpId::Asin, Backend::cpu, {asin, kF});
  register_kernel(OpId::Acos, Backend::cpu, {acos, kF});
  register_kernel(OpId::Atan, Backend::cpu, {atan, kF});
  register_kernel(OpId::Sinh, Backend::cpu, {sinh, kF});
  register_kernel(OpId::Cosh, Backend::cpu, {cosh, kF});
  register_kernel(OpId::Asinh, Backend::cpu, {asinh, kF});
  register_kernel(OpId::Acosh, Backend::cpu, {acosh, kF});
  register_kernel(OpId::Atanh, Backend::cpu, {atanh, kF});
  register_kernel(OpId::Sigmoid, Backend::cpu, {sigmoid, kF});
  register_kernel(OpId::Silu, Backend::cpu, {silu, kF});
  register_kernel(OpId::LeakyRelu, Backend::cpu, {leaky_relu, kF});
  register_kernel(OpId::Elu, Backend::cpu, {elu, kF});
  register_kernel(OpId::Selu, Backend::cpu, {selu, kF});
  register_kernel(OpId::Gelu, Backend::cpu, {gelu, kF});
  register_kernel(OpId::Softplus, Backend::cpu, {softplus, kF});
  register_kernel(OpId::Softshrink, Backend::cpu, {softshrink, kF});
  register_kernel(OpId::Hardshrink, Backend::cpu, {hardshrink, kF});
  register_kernel(OpId::Hardswish, Backend::cpu, {hardswish, kF});
  register_kernel(OpId::Hardsigmoid, Backend::cpu, {hardsigmoid, kF});
}

}  // namespace kiln::cpu
