// CPU kernels of the unary elementwise ops that are more than their record's kernel: gelu (two
// forms), clip (integer bounds), tanh, exp, erf, sigmoid and silu, with the f32 activations run
// through the C library's vector functions where it has them (the same expressions as
// src/ops/elementwise_math.h, the function within a few ulp of the scalar one).
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
#include "ops/elementwise_params.h"
#include "ops/elementwise_records.h"

namespace kiln::cpu {

namespace {

using F32Map = bool (*)(const KernelContext&, const float*, float*, int64_t);

// gelu's erfc argument is held to [-9, 9]: the library's vector erfcf takes a scalar path per
// element beyond about 10 (15 times slower), where erfc is 2 or below 4e-37 (the gelu of an x
// below -12.7 comes out below 3e-36 in magnitude instead of smaller still).
constexpr float kErfcBound = 9.f;

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
FloatX4 vector_erff() {
  static const FloatX4 f = libmvec_function<FloatX4>("_ZGVbN4v_erff");
  return f;
}
FloatX4 vector_tanhf() {
  static const FloatX4 f = libmvec_function<FloatX4>("_ZGVbN4v_tanhf");
  return f;
}
FloatX4 vector_expf() {
  static const FloatX4 f = libmvec_function<FloatX4>("_ZGVbN4v_expf");
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
  const __m512 half = _mm512_set1_ps(0.5f), k = _mm512_set1_ps(-0.7071067811865476f),
               lo = _mm512_set1_ps(-kErfcBound), hi = _mm512_set1_ps(kErfcBound);
  map_by16(in, out, n, [&](__m512 x) {
    // (the masked forms: GCC 12 warns of the unmasked ones' undefined source)
    const __m512 u = _mm512_mul_ps(x, k), all = _mm512_set1_ps(0.f);
    const __mmask16 every = 0xFFFF;
    const __m512 z = _mm512_mask_min_ps(all, every, _mm512_mask_max_ps(all, every, u, lo), hi);
    return _mm512_mul_ps(_mm512_mul_ps(half, x), erfc16(z));
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
// out = f(in): the library function itself (tanh, exp)
void apply(const float* in, float* out, int64_t n, FloatX16 f) { map_by16(in, out, n, f); }
// 1 / (1 + exp(-x)) and x / (1 + exp(-x))
void sigmoid(const float* in, float* out, int64_t n, FloatX16 exp16) {
  const __m512 one = _mm512_set1_ps(1.f), zero = _mm512_setzero_ps();
  map_by16(in, out, n, [&](__m512 x) {
    return _mm512_div_ps(one, _mm512_add_ps(one, exp16(_mm512_sub_ps(zero, x))));
  });
}
void silu(const float* in, float* out, int64_t n, FloatX16 exp16) {
  const __m512 one = _mm512_set1_ps(1.f), zero = _mm512_setzero_ps();
  map_by16(in, out, n, [&](__m512 x) {
    return _mm512_div_ps(x, _mm512_add_ps(one, exp16(_mm512_sub_ps(zero, x))));
  });
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
wide::FloatX16 wide_erff() {
  static const wide::FloatX16 f = wide_function("_ZGVeN16v_erff");
  return f;
}
wide::FloatX16 wide_tanhf() {
  static const wide::FloatX16 f = wide_function("_ZGVeN16v_tanhf");
  return f;
}
wide::FloatX16 wide_expf() {
  static const wide::FloatX16 f = wide_function("_ZGVeN16v_expf");
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
  const __m128 half = _mm_set1_ps(0.5f), k = _mm_set1_ps(-0.7071067811865476f),
               lo = _mm_set1_ps(-kErfcBound), hi = _mm_set1_ps(kErfcBound);
  map_f32_by4(ctx, in, out, n, [&](__m128 x) {
    const __m128 z = _mm_min_ps(_mm_max_ps(_mm_mul_ps(x, k), lo), hi);
    return _mm_mul_ps(_mm_mul_ps(half, x), erfc4(z));
  });
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
// out = f(in) through the library's sixteen-wide variant of f (from `wide16`, where the kernels
// may use AVX-512) or its four-wide one (`narrow4`); false where it has neither.
#ifdef KILN_VECTOR_MATH_512
using Wide16 = wide::FloatX16 (*)();
#else
using Wide16 = void*;
#endif
bool library_f32_vector(const KernelContext& ctx, const float* in, float* out, int64_t n,
                        [[maybe_unused]] Wide16 wide16, FloatX4 (*narrow4)()) {
#ifdef KILN_VECTOR_MATH_512
  if (const auto f = wide16()) return by16(ctx, in, out, n, wide::apply, f), true;
#endif
  const FloatX4 f4 = narrow4();
  if (!f4) return false;
  map_f32_by4(ctx, in, out, n, f4);
  return true;
}
#ifdef KILN_VECTOR_MATH_512
constexpr Wide16 kWideTanh = wide_tanhf, kWideExp = wide_expf, kWideErf = wide_erff;
#else
constexpr Wide16 kWideTanh = nullptr, kWideExp = nullptr, kWideErf = nullptr;
#endif
// (GELU written out, x / 2 · (1 + erf(x / √2)), as exporters of BERT and ViT leave it)
bool erf_f32_vector(const KernelContext& ctx, const float* in, float* out, int64_t n) {
  return library_f32_vector(ctx, in, out, n, kWideErf, vector_erff);
}
bool tanh_f32_vector(const KernelContext& ctx, const float* in, float* out, int64_t n) {
  return library_f32_vector(ctx, in, out, n, kWideTanh, vector_tanhf);
}
bool exp_f32_vector(const KernelContext& ctx, const float* in, float* out, int64_t n) {
  return library_f32_vector(ctx, in, out, n, kWideExp, vector_expf);
}
// sigmoid (silu false) or silu: 1 / (1 + exp(-x)), x / (1 + exp(-x))
template <bool kSilu>
bool sigmoid_f32_vector(const KernelContext& ctx, const float* in, float* out, int64_t n) {
#ifdef KILN_VECTOR_MATH_512
  if (const auto f = wide_expf())
    return by16(ctx, in, out, n, kSilu ? wide::silu : wide::sigmoid, f), true;
#endif
  const FloatX4 exp4 = vector_expf();
  if (!exp4) return false;
  const __m128 one = _mm_set1_ps(1.f), zero = _mm_setzero_ps();
  map_f32_by4(ctx, in, out, n, [&](__m128 x) {
    return _mm_div_ps(kSilu ? x : one, _mm_add_ps(one, exp4(_mm_sub_ps(zero, x))));
  });
  return true;
}
#else
constexpr F32Map gelu_f32_vector = nullptr, gelu_tanh_f32_vector = nullptr,
                 tanh_f32_vector = nullptr, exp_f32_vector = nullptr, erf_f32_vector = nullptr;
template <bool> constexpr F32Map sigmoid_f32_vector = nullptr;
#endif
// Runs one of the above on an f32 op (false: not f32, or no vector function).
bool f32_vector(KernelContext& ctx, F32Map f) {
  return f && ctx.in(0).dtype == DType::f32 &&
         f(ctx, ctx.in(0).ptr<float>(), ctx.out(0).ptr<float>(), ctx.in(0).numel());
}

// NaN passes through: both comparisons are false.
void clip(KernelContext& ctx) {
  const math::ClipParams bounds = params_of<math::ClipParams>(ctx);
  const double lo = bounds.lo, hi = bounds.hi;
  dispatch(ctx.in(0).dtype, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    if constexpr (!std::is_same_v<T, bool>) {
      const math::Clip<T> f{math::clip_bound<T>(lo, false), math::clip_bound<T>(hi, true)};
      unary_map(ctx, ctx.in(0).ptr<T>(), ctx.out(0).ptr<T>(), ctx.in(0).numel(), f);
    }
  });
}
void tanh(KernelContext& ctx) {
  if (f32_vector(ctx, tanh_f32_vector)) return;
  float_op<math::Tanh>(ctx);
}
void erf(KernelContext& ctx) {
  if (f32_vector(ctx, erf_f32_vector)) return;
  float_op<math::Erf>(ctx);
}
void exp(KernelContext& ctx) {
  if (f32_vector(ctx, exp_f32_vector)) return;
  float_op<math::Exp>(ctx);
}
void sigmoid(KernelContext& ctx) {
  if (f32_vector(ctx, sigmoid_f32_vector<false>)) return;
  float_op<math::Sigmoid>(ctx);
}
void silu(KernelContext& ctx) {
  if (f32_vector(ctx, sigmoid_f32_vector<true>)) return;
  float_op<math::Silu>(ctx);
}
void gelu(KernelContext& ctx) {
  if (params_of<GeluParams>(ctx).tanh) {
    if (f32_vector(ctx, gelu_tanh_f32_vector)) return;
    float_op<math::GeluTanh>(ctx);
  } else {
    if (f32_vector(ctx, gelu_f32_vector)) return;
    float_op<math::Gelu>(ctx);
  }
}
// pow: the record's math, except the exponents models write most, 2 and 3 (GELU's x³ written out
// in ONNX), as products: std::pow costs tens of ns an element. a * a is pow(a, 2) exactly,
// a * a * a within an ulp of pow(a, 3).
template <class T> struct PowSmall {
  T operator()(T a, T b) const {
    if (b == T(2)) return a * a;
    if (b == T(3)) return a * a * a;
    return math::Pow<T>{}(a, b);
  }
};
// Where every exponent is 2 or 3 (one value, or an array of one value: a fused program's
// constant arrives filled to the chunk's length) and the base has the output's shape: the
// products in a loop without a branch per element, which vectorizes.
template <class T> bool pow_by_products(const KernelContext& ctx) {
  const TensorView &a = ctx.in(0), &b = ctx.in(1), &o = ctx.out(0);
  const int64_t nb = b.numel();
  if (a.shape != o.shape || nb == 0 || (nb != 1 && b.shape != o.shape)) return false;
  const T* pb = b.ptr<T>();
  const T e = pb[0];
  if (e != T(2) && e != T(3)) return false;
  int64_t others = 0;  // (a count, not an early exit: the scan vectorizes)
  for (int64_t i = 1; i < nb; ++i) others += pb[i] != e;
  if (others) return false;
  if (e == T(2)) unary_map(ctx, a.ptr<T>(), o.ptr<T>(), o.numel(), [](T x) { return x * x; });
  else unary_map(ctx, a.ptr<T>(), o.ptr<T>(), o.numel(), [](T x) { return x * x * x; });
  return true;
}

void pow(KernelContext& ctx) {
  dispatch(ctx.in(0).dtype, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    if constexpr (std::is_floating_point_v<T>)
      if (pow_by_products<T>(ctx)) return;
    if constexpr (std::is_floating_point_v<T>)
      binary_map<T, T, T>(ctx, ctx.in(0), ctx.in(1), ctx.out(0), PowSmall<T>{});
    else if constexpr (!std::is_same_v<T, bool>)
      binary_map<T, T, T>(ctx, ctx.in(0), ctx.in(1), ctx.out(0), math::Pow<T>{});
  });
}
}  // namespace

#ifdef KILN_VECTOR_MATH
bool sigmoid_f32_vectorized(const KernelContext& ctx, const float* in, float* out, int64_t n) {
  return sigmoid_f32_vector<false>(ctx, in, out, n);
}
bool tanh_f32_vectorized(const KernelContext& ctx, const float* in, float* out, int64_t n) {
  return tanh_f32_vector(ctx, in, out, n);
}
#else
bool sigmoid_f32_vectorized(const KernelContext&, const float*, float*, int64_t) { return false; }
bool tanh_f32_vectorized(const KernelContext&, const float*, float*, int64_t) { return false; }
#endif

void register_elementwise_unary_kernels() {
  constexpr DTypeSet kF{f32, f64};
  register_kernel(OpId::Tanh, Backend::cpu, {tanh, kF});  // the record's kernel, vectorized
  register_kernel(OpId::Exp, Backend::cpu, {exp, kF});
  register_kernel(OpId::Erf, Backend::cpu, {erf, kF});
  register_kernel(OpId::Sigmoid, Backend::cpu, {sigmoid, kF});
  register_kernel(OpId::Silu, Backend::cpu, {silu, kF});
  register_kernel(OpId::Gelu, Backend::cpu, {gelu, kF});
  register_kernel(OpId::Clip, Backend::cpu, {clip, kNumericTypes});
  register_kernel(OpId::Pow, Backend::cpu, {pow, kNumericTypes});
}

}  // namespace kiln::cpu
