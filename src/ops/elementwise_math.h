// The math of every elementwise op, written once: one functor per op over the arithmetic type A
// (float for f32/f16/bf16, double for f64, the integer types as they are, bool for logic).
// The CPU kernels compile it with the host compiler, the CUDA kernels with nvcc, and the fused
// elementwise kernels embed this file's text in the source they give NVRTC (the embedded copy is
// generated at build time from this file), so the three can never drift apart. The file is
// self-contained for that reason: no standard headers outside the host-only block at the end.
//
// Semantics (numpy's unless noted): integer arithmetic wraps; integer division floors and x / 0
// is 0; mod takes the divisor's sign and x mod 0 is 0; pow to a negative integer exponent
// truncates; maximum/minimum propagate NaN; relu and the clamping activations pass NaN through;
// shifts by amounts outside [0, bits) give 0 (-1 for a right shift of a negative value).
// In device code float add/sub/mul round with __f*_rn so that a fused chain never contracts one
// op's multiply into the next op's add: a fused node gives what the unfused kernels give.
#pragma once

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define KILN_MATH_FN __host__ __device__ inline
#else
#define KILN_MATH_FN inline
#endif

#ifndef __CUDACC_RTC__
#include <math.h>

#include <cmath>
#include <limits>
#endif

namespace kiln::math {

// ---- type traits (by size and signedness, so int64_t and long long agree) ----

template <class T> struct IsFloat { static constexpr bool value = false; };
template <> struct IsFloat<float> { static constexpr bool value = true; };
template <> struct IsFloat<double> { static constexpr bool value = true; };
template <class T> inline constexpr bool kFloat = IsFloat<T>::value;
template <class T> inline constexpr bool kSigned = T(-1) < T(0);

template <bool C, class A, class B> struct Pick { using type = A; };
template <class A, class B> struct Pick<false, A, B> { using type = B; };
/// Unsigned arithmetic at least int wide, so integer overflow wraps instead of being undefined.
template <class T> using WideU = typename Pick<(sizeof(T) <= 4), unsigned, unsigned long long>::type;

template <class A> KILN_MATH_FN A max_finite() {
  if constexpr (sizeof(A) == 4) return A(3.4028234663852886e38);
  else return A(1.7976931348623157e308);
}

// ---- float math in the precision of A ----

#define KILN_MATH1(name)                                                \
  KILN_MATH_FN float m_##name(float x) { return ::name##f(x); }       \
  KILN_MATH_FN double m_##name(double x) { return ::name(x); }
KILN_MATH1(exp) KILN_MATH1(log) KILN_MATH1(log1p) KILN_MATH1(expm1) KILN_MATH1(sqrt)
KILN_MATH1(sin) KILN_MATH1(cos) KILN_MATH1(tan) KILN_MATH1(tanh) KILN_MATH1(erf) KILN_MATH1(erfc)
KILN_MATH1(floor) KILN_MATH1(ceil) KILN_MATH1(rint) KILN_MATH1(fabs) KILN_MATH1(asin)
KILN_MATH1(acos) KILN_MATH1(atan) KILN_MATH1(sinh) KILN_MATH1(cosh) KILN_MATH1(asinh)
KILN_MATH1(acosh) KILN_MATH1(atanh)
#undef KILN_MATH1
#define KILN_MATH2(name)                                                          \
  KILN_MATH_FN float m_##name(float x, float y) { return ::name##f(x, y); }     \
  KILN_MATH_FN double m_##name(double x, double y) { return ::name(x, y); }
KILN_MATH2(pow) KILN_MATH2(fmod) KILN_MATH2(copysign)
#undef KILN_MATH2

// Correctly rounded, never contracted with a neighbouring multiply on the device.
#ifdef __CUDA_ARCH__
KILN_MATH_FN float add_rn(float a, float b) { return __fadd_rn(a, b); }
KILN_MATH_FN double add_rn(double a, double b) { return __dadd_rn(a, b); }
KILN_MATH_FN float sub_rn(float a, float b) { return __fsub_rn(a, b); }
KILN_MATH_FN double sub_rn(double a, double b) { return __dsub_rn(a, b); }
KILN_MATH_FN float mul_rn(float a, float b) { return __fmul_rn(a, b); }
KILN_MATH_FN double mul_rn(double a, double b) { return __dmul_rn(a, b); }
#else
template <class A> KILN_MATH_FN A add_rn(A a, A b) { return a + b; }
template <class A> KILN_MATH_FN A sub_rn(A a, A b) { return a - b; }
template <class A> KILN_MATH_FN A mul_rn(A a, A b) { return a * b; }
#endif

// ---- integer helpers ----

/// -x with two's complement wrap-around (no UB on the minimum value).
template <class T> KILN_MATH_FN T wrap_neg(T x) {
  T r = static_cast<T>(WideU<T>(0) - static_cast<WideU<T>>(x));
#ifdef __CUDA_ARCH__
  // ptxas (CUDA 13.0, sm_90) folds a negated operand into a three-way integer min or max
  // (VIMNMX3, 32-bit and 16x2) and drops the negation: min(min(-x, x), y) became min(x, x, y), in
  // nvcc's and NVRTC's code alike. An opaque register copy keeps the negation an instruction of
  // its own (abs too, which negates through here).
  if constexpr (sizeof(T) <= 4) {
    int w = r;
    asm volatile("" : "+r"(w));
    r = static_cast<T>(w);
  }
#endif
  return r;
}
template <class T> KILN_MATH_FN T floor_div(T a, T b) {
  if (b == 0) return 0;
  if constexpr (kSigned<T>) {
    if (b == -1) return wrap_neg(a);  // MIN / -1 wraps instead of trapping
    const T q = static_cast<T>(a / b);
    return (a % b != 0 && ((a < 0) != (b < 0))) ? static_cast<T>(q - 1) : q;
  } else {
    return static_cast<T>(a / b);
  }
}
template <class T> KILN_MATH_FN T int_mod(T a, T b) {
  if (b == 0) return 0;
  if constexpr (kSigned<T>) {
    if (b == -1) return 0;
    const T r = static_cast<T>(a % b);
    return (r != 0 && ((r < 0) != (b < 0))) ? static_cast<T>(r + b) : r;
  } else {
    return static_cast<T>(a % b);
  }
}
/// npy_divmod's remainder: the divisor's sign; a zero result takes b's sign.
template <class A> KILN_MATH_FN A float_mod(A a, A b) {
  A r = m_fmod(a, b);
  if (r != 0) {
    if ((r < 0) != (b < 0)) r += b;
  } else {
    r = m_copysign(A(0), b);
  }
  return r;
}
/// Power by squaring in 64-bit unsigned arithmetic (wraps); negative exponents truncate.
template <class T> KILN_MATH_FN T int_pow(T base, T e) {
  if constexpr (kSigned<T>) {
    if (e < 0) return base == 1 ? 1 : base == -1 ? ((e & 1) ? -1 : 1) : 0;
  }
  unsigned long long r = 1, b = static_cast<unsigned long long>(base),
                     n = static_cast<unsigned long long>(e);
  for (; n; n >>= 1, b *= b)
    if (n & 1) r *= b;
  return static_cast<T>(r);
}

// ---- binary ops on one dtype ----

template <class A> struct Add {
  KILN_MATH_FN A operator()(A a, A b) const {
    if constexpr (kFloat<A>) return add_rn(a, b);
    else return static_cast<A>(static_cast<WideU<A>>(a) + static_cast<WideU<A>>(b));
  }
};
template <class A> struct Sub {
  KILN_MATH_FN A operator()(A a, A b) const {
    if constexpr (kFloat<A>) return sub_rn(a, b);
    else return static_cast<A>(static_cast<WideU<A>>(a) - static_cast<WideU<A>>(b));
  }
};
template <class A> struct Mul {
  KILN_MATH_FN A operator()(A a, A b) const {
    if constexpr (kFloat<A>) return mul_rn(a, b);
    else return static_cast<A>(static_cast<WideU<A>>(a) * static_cast<WideU<A>>(b));
  }
};
template <class A> struct Div {
  KILN_MATH_FN A operator()(A a, A b) const {
    if constexpr (kFloat<A>) return a / b;
    else return floor_div(a, b);
  }
};
template <class A> struct Mod {
  KILN_MATH_FN A operator()(A a, A b) const {
    if constexpr (kFloat<A>) return float_mod(a, b);
    else return int_mod(a, b);
  }
};
template <class A> struct Pow {
  KILN_MATH_FN A operator()(A a, A b) const {
    if constexpr (kFloat<A>) return m_pow(a, b);
    else return int_pow(a, b);
  }
};
// a != a is true only for NaN, which then propagates.
template <class A> struct Maximum {
  KILN_MATH_FN A operator()(A a, A b) const { return (a > b || a != a) ? a : b; }
};
template <class A> struct Minimum {
  KILN_MATH_FN A operator()(A a, A b) const { return (a < b || a != a) ? a : b; }
};

// ---- comparisons (any dtype) and logic (bool) ----

template <class A> struct Equal {
  KILN_MATH_FN bool operator()(A a, A b) const { return a == b; }
};
template <class A> struct NotEqual {
  KILN_MATH_FN bool operator()(A a, A b) const { return a != b; }
};
template <class A> struct Less {
  KILN_MATH_FN bool operator()(A a, A b) const { return a < b; }
};
template <class A> struct LessEqual {
  KILN_MATH_FN bool operator()(A a, A b) const { return a <= b; }
};
template <class A> struct Greater {
  KILN_MATH_FN bool operator()(A a, A b) const { return a > b; }
};
template <class A> struct GreaterEqual {
  KILN_MATH_FN bool operator()(A a, A b) const { return a >= b; }
};
template <class A> struct LogicalAnd {
  KILN_MATH_FN bool operator()(bool a, bool b) const { return a && b; }
};
template <class A> struct LogicalOr {
  KILN_MATH_FN bool operator()(bool a, bool b) const { return a || b; }
};
template <class A> struct LogicalXor {
  KILN_MATH_FN bool operator()(bool a, bool b) const { return a != b; }
};
template <class A> struct LogicalNot {
  KILN_MATH_FN bool operator()(bool x) const { return !x; }
};
// Integers are never NaN or infinite.
template <class A> struct IsNan {
  KILN_MATH_FN bool operator()(A x) const {
    if constexpr (kFloat<A>) return x != x;
    else return false;
  }
};
template <class A> struct IsInf {
  KILN_MATH_FN bool operator()(A x) const {
    if constexpr (kFloat<A>) return m_fabs(x) > max_finite<A>();
    else return false;
  }
};

// ---- bitwise (integer dtypes) ----

template <class T> struct BitwiseAnd {
  KILN_MATH_FN T operator()(T a, T b) const { return static_cast<T>(a & b); }
};
template <class T> struct BitwiseOr {
  KILN_MATH_FN T operator()(T a, T b) const { return static_cast<T>(a | b); }
};
template <class T> struct BitwiseXor {
  KILN_MATH_FN T operator()(T a, T b) const { return static_cast<T>(a ^ b); }
};
template <class T> struct BitwiseNot {
  KILN_MATH_FN T operator()(T x) const { return static_cast<T>(~x); }
};
// The amount compares as unsigned, so negative amounts are out of range too. Left shifts wrap.
template <class T> struct ShiftLeft {
  KILN_MATH_FN T operator()(T a, T b) const {
    if (static_cast<unsigned long long>(b) >= sizeof(T) * 8) return 0;
    return static_cast<T>(static_cast<WideU<T>>(a) << b);
  }
};
template <class T> struct ShiftRight {
  KILN_MATH_FN T operator()(T a, T b) const {
    if (static_cast<unsigned long long>(b) >= sizeof(T) * 8) {
      if constexpr (kSigned<T>) return a < 0 ? T(-1) : T(0);
      else return 0;
    }
    return static_cast<T>(a >> b);  // arithmetic for signed T
  }
};

// ---- unary ops on numeric dtypes ----

template <class A> struct Neg {
  KILN_MATH_FN A operator()(A x) const {
    if constexpr (kFloat<A>) return -x;
    else return wrap_neg(x);
  }
};
template <class A> struct Abs {
  KILN_MATH_FN A operator()(A x) const {
    if constexpr (kFloat<A>) return m_fabs(x);
    else if constexpr (kSigned<A>) return x < 0 ? wrap_neg(x) : x;
    else return x;
  }
};
// sign(0) = 0 and sign(NaN) = NaN.
template <class A> struct Sign {
  KILN_MATH_FN A operator()(A x) const {
    if constexpr (kFloat<A>) {
      if (x != x) return x;
    }
    if constexpr (!kSigned<A>) return static_cast<A>(x != 0);
    else return static_cast<A>((A(0) < x) - (x < A(0)));
  }
};
// NaN passes through.
template <class A> struct Relu {
  KILN_MATH_FN A operator()(A x) const {
    if constexpr (!kSigned<A>) return x;
    else return x < A(0) ? A(0) : x;
  }
};
// Rounding is the identity on integers; round is half to even.
template <class A> struct Floor {
  KILN_MATH_FN A operator()(A x) const {
    if constexpr (kFloat<A>) return m_floor(x);
    else return x;
  }
};
template <class A> struct Ceil {
  KILN_MATH_FN A operator()(A x) const {
    if constexpr (kFloat<A>) return m_ceil(x);
    else return x;
  }
};
template <class A> struct Round {
  KILN_MATH_FN A operator()(A x) const {
    if constexpr (kFloat<A>) return m_rint(x);
    else return x;
  }
};
// Bounds come from clip_bound (below); NaN passes through: both comparisons are false.
template <class A> struct Clip {
  A lo, hi;
  KILN_MATH_FN A operator()(A x) const { return x < lo ? lo : (x > hi ? hi : x); }
};

// ---- float math and activations (A is float or double) ----

#define KILN_MATH_UNARY(Name, expr)                  \
  template <class A> struct Name {                   \
    KILN_MATH_FN A operator()(A x) const { return expr; } \
  };
KILN_MATH_UNARY(Exp, m_exp(x))
KILN_MATH_UNARY(Log, m_log(x))
KILN_MATH_UNARY(Log1p, m_log1p(x))
KILN_MATH_UNARY(Expm1, m_expm1(x))
KILN_MATH_UNARY(Sqrt, m_sqrt(x))
KILN_MATH_UNARY(Rsqrt, A(1) / m_sqrt(x))
KILN_MATH_UNARY(Reciprocal, A(1) / x)
KILN_MATH_UNARY(Sin, m_sin(x))
KILN_MATH_UNARY(Cos, m_cos(x))
KILN_MATH_UNARY(Tan, m_tan(x))
KILN_MATH_UNARY(Tanh, m_tanh(x))
KILN_MATH_UNARY(Erf, m_erf(x))
KILN_MATH_UNARY(Asin, m_asin(x))
KILN_MATH_UNARY(Acos, m_acos(x))
KILN_MATH_UNARY(Atan, m_atan(x))
KILN_MATH_UNARY(Sinh, m_sinh(x))
KILN_MATH_UNARY(Cosh, m_cosh(x))
KILN_MATH_UNARY(Asinh, m_asinh(x))
KILN_MATH_UNARY(Acosh, m_acosh(x))
KILN_MATH_UNARY(Atanh, m_atanh(x))
KILN_MATH_UNARY(Sigmoid, A(1) / (A(1) + m_exp(-x)))
KILN_MATH_UNARY(Silu, x / (A(1) + m_exp(-x)))
// x tanh(softplus(x)), softplus linear above 20 (PyTorch's threshold).
KILN_MATH_UNARY(Mish, x * m_tanh(x > A(20) ? x : m_log1p(m_exp(x))))
// Constants of Klambauer et al., "Self-Normalizing Neural Networks".
KILN_MATH_UNARY(Selu, A(1.0507009873554804934193349852946) *
                          (x > 0 ? x : A(1.6732632423543772848170429916717) * m_expm1(x)))
// Φ(x) as erfc(-x/√2) / 2: 1 + erf(x/√2) cancels for negative x (4 digits lost near -3).
KILN_MATH_UNARY(Gelu, A(0.5) * x * m_erfc(-x * A(0.7071067811865476)))
// k = sqrt(2 / pi)
KILN_MATH_UNARY(GeluTanh,
                A(0.5) * x * (A(1) + m_tanh(A(0.7978845608028654) * (x + A(0.044715) * x * x * x))))
#undef KILN_MATH_UNARY

// x relu6(x + 3) / 6, the clamps written so that NaN propagates.
template <class A> struct Hardswish {
  KILN_MATH_FN A operator()(A x) const {
    A m = x + A(3);
    m = m < A(0) ? A(0) : m;
    m = A(6) < m ? A(6) : m;
    return x * m / A(6);
  }
};

template <class A> struct LeakyRelu {
  A alpha;
  KILN_MATH_FN A operator()(A x) const { return x > 0 ? x : alpha * x; }
};
template <class A> struct Elu {
  A alpha;
  KILN_MATH_FN A operator()(A x) const { return x > 0 ? x : alpha * m_expm1(x); }
};
template <class A> struct Softplus {
  A beta, threshold;
  KILN_MATH_FN A operator()(A x) const {
    const A bx = beta * x;
    return bx > threshold ? x : m_log1p(m_exp(bx)) / beta;
  }
};
template <class A> struct Softshrink {
  A lambda;
  KILN_MATH_FN A operator()(A x) const {
    return x > lambda ? x - lambda : (x < -lambda ? x + lambda : A(0));
  }
};
template <class A> struct Hardshrink {
  A lambda;
  KILN_MATH_FN A operator()(A x) const { return (x > lambda || x < -lambda) ? x : A(0); }
};
// NaN passes through.
template <class A> struct Hardsigmoid {
  A alpha, beta;
  KILN_MATH_FN A operator()(A x) const {
    const A v = alpha * x + beta;
    return v < A(0) ? A(0) : (v > A(1) ? A(1) : v);
  }
};

#ifndef __CUDACC_RTC__
/// A bound of clip in T: integers take the nearest in-range value inside [lo, hi] (host code).
template <class T> T clip_bound(double v, bool upper) {
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
#endif

}  // namespace kiln::math
