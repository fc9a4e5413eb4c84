// CUDA kernels of the elementwise family: one functor per op over the launchers of
// elementwise.cuh. Semantics (integer wrap-around, floor division, NaN handling, cast rules) are
// those of src/backends/cpu/elementwise*.cpp; f16/bf16 compute in f32, as the CPU kernels do.
#include <cmath>
#include <limits>
#include <type_traits>

#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/elementwise.cuh"
#include "backends/cuda/kernels.h"

namespace kiln::cuda {

namespace {
template <typename A> constexpr bool kFloat = std::is_floating_point_v<A>;

// Float math in the precision of A (float for f32/f16/bf16, double for f64).
#define KILN_EW_MATH1(name)                                       \
  template <typename A> __device__ inline A m_##name(A x) {       \
    if constexpr (std::is_same_v<A, float>) return ::name##f(x);  \
    else return ::name(x);                                        \
  }
KILN_EW_MATH1(exp)
KILN_EW_MATH1(log)
KILN_EW_MATH1(log1p)
KILN_EW_MATH1(expm1)
KILN_EW_MATH1(sqrt)
KILN_EW_MATH1(sin)
KILN_EW_MATH1(cos)
KILN_EW_MATH1(tanh)
KILN_EW_MATH1(erf)
KILN_EW_MATH1(erfc)
KILN_EW_MATH1(floor)
KILN_EW_MATH1(ceil)
KILN_EW_MATH1(rint)
KILN_EW_MATH1(fabs)
#undef KILN_EW_MATH1
#define KILN_EW_MATH2(name)                                          \
  template <typename A> __device__ inline A m_##name(A x, A y) {     \
    if constexpr (std::is_same_v<A, float>) return ::name##f(x, y);  \
    else return ::name(x, y);                                        \
  }
KILN_EW_MATH2(pow)
KILN_EW_MATH2(fmod)
KILN_EW_MATH2(copysign)
#undef KILN_EW_MATH2

// ---- integer helpers (as src/backends/cpu/elementwise.h) ----

// -x with two's complement wrap-around.
template <typename T> __device__ inline T wrap_neg(T x) {
  using U = std::make_unsigned_t<T>;
  return static_cast<T>(U(0) - static_cast<U>(x));
}
// Unsigned arithmetic at least int wide, so overflow wraps.
template <typename T>
using WideU = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;
template <typename T> __device__ inline T wrap_add(T a, T b) {
  return static_cast<T>(static_cast<WideU<T>>(a) + static_cast<WideU<T>>(b));
}
template <typename T> __device__ inline T wrap_sub(T a, T b) {
  return static_cast<T>(static_cast<WideU<T>>(a) - static_cast<WideU<T>>(b));
}
template <typename T> __device__ inline T wrap_mul(T a, T b) {
  return static_cast<T>(static_cast<WideU<T>>(a) * static_cast<WideU<T>>(b));
}
// numpy floor_divide; x / 0 = 0, and MIN / -1 wraps.
template <typename T> __device__ inline T floor_div(T a, T b) {
  if (b == 0) return 0;
  if constexpr (std::is_signed_v<T>) {
    if (b == -1) return wrap_neg(a);
    const T q = static_cast<T>(a / b);
    return (a % b != 0 && ((a < 0) != (b < 0))) ? static_cast<T>(q - 1) : q;
  } else {
    return static_cast<T>(a / b);
  }
}
// numpy mod: the divisor's sign; x mod 0 = 0.
template <typename T> __device__ inline T int_mod(T a, T b) {
  if (b == 0) return 0;
  if constexpr (std::is_signed_v<T>) {
    if (b == -1) return 0;
    const T r = static_cast<T>(a % b);
    return (r != 0 && ((r < 0) != (b < 0))) ? static_cast<T>(r + b) : r;
  } else {
    return static_cast<T>(a % b);
  }
}
// npy_divmod's remainder: the divisor's sign, a zero result takes b's sign.
template <typename A> __device__ inline A float_mod(A a, A b) {
  A r = m_fmod(a, b);
  if (r != 0) {
    if ((r < 0) != (b < 0)) r += b;
  } else {
    r = m_copysign(A(0), b);
  }
  return r;
}
// Power by squaring in 64-bit unsigned arithmetic (wraps); negative exponents truncate.
template <typename T> __device__ inline T int_pow(T base, T e) {
  if constexpr (std::is_signed_v<T>) {
    if (e < 0) return base == 1 ? 1 : base == -1 ? ((e & 1) ? -1 : 1) : 0;
  }
  uint64_t r = 1, b = static_cast<uint64_t>(base), n = static_cast<uint64_t>(e);
  for (; n; n >>= 1, b *= b)
    if (n & 1) r *= b;
  return static_cast<T>(r);
}

// ---- functors on the arithmetic type A (float for half types) ----

template <typename A> struct AddF {
  __device__ A operator()(A a, A b) const {
    if constexpr (kFloat<A>) return a + b;
    else return wrap_add(a, b);
  }
};
template <typename A> struct SubF {
  __device__ A operator()(A a, A b) const {
    if constexpr (kFloat<A>) return a - b;
    else return wrap_sub(a, b);
  }
};
template <typename A> struct MulF {
  __device__ A operator()(A a, A b) const {
    if constexpr (kFloat<A>) return a * b;
    else return wrap_mul(a, b);
  }
};
template <typename A> struct DivF {
  __device__ A operator()(A a, A b) const {
    if constexpr (kFloat<A>) return a / b;
    else return floor_div(a, b);
  }
};
template <typename A> struct ModF {
  __device__ A operator()(A a, A b) const {
    if constexpr (kFloat<A>) return float_mod(a, b);
    else return int_mod(a, b);
  }
};
template <typename A> struct PowF {
  __device__ A operator()(A a, A b) const {
    if constexpr (kFloat<A>) return m_pow(a, b);
    else return int_pow(a, b);
  }
};
// a != a is true only for NaN, which then propagates.
template <typename A> struct MaximumF {
  __device__ A operator()(A a, A b) const { return (a > b || a != a) ? a : b; }
};
template <typename A> struct MinimumF {
  __device__ A operator()(A a, A b) const { return (a < b || a != a) ? a : b; }
};

template <typename A> struct EqualF {
  __device__ bool operator()(A a, A b) const { return a == b; }
};
template <typename A> struct NotEqualF {
  __device__ bool operator()(A a, A b) const { return a != b; }
};
template <typename A> struct LessF {
  __device__ bool operator()(A a, A b) const { return a < b; }
};
template <typename A> struct LessEqualF {
  __device__ bool operator()(A a, A b) const { return a <= b; }
};
template <typename A> struct GreaterF {
  __device__ bool operator()(A a, A b) const { return a > b; }
};
template <typename A> struct GreaterEqualF {
  __device__ bool operator()(A a, A b) const { return a >= b; }
};

struct AndF {
  __device__ bool operator()(bool a, bool b) const { return a && b; }
};
struct OrF {
  __device__ bool operator()(bool a, bool b) const { return a || b; }
};
struct XorF {
  __device__ bool operator()(bool a, bool b) const { return a != b; }
};
struct NotF {
  __device__ bool operator()(bool x) const { return !x; }
};

template <typename A> struct NegF {
  __device__ A operator()(A x) const {
    if constexpr (kFloat<A>) return -x;
    else return wrap_neg(x);
  }
};
template <typename A> struct AbsF {
  __device__ A operator()(A x) const {
    if constexpr (kFloat<A>) return m_fabs(x);
    else if constexpr (std::is_signed_v<A>) return x < 0 ? wrap_neg(x) : x;
    else return x;
  }
};
// sign(0) = 0 and sign(NaN) = NaN.
template <typename A> struct SignF {
  __device__ A operator()(A x) const {
    if constexpr (kFloat<A>) {
      if (x != x) return x;
    }
    if constexpr (std::is_unsigned_v<A>) return static_cast<A>(x != 0);
    else return static_cast<A>((A(0) < x) - (x < A(0)));
  }
};
// NaN passes through.
template <typename A> struct ReluF {
  __device__ A operator()(A x) const {
    if constexpr (std::is_unsigned_v<A>) return x;
    else return x < A(0) ? A(0) : x;
  }
};
// Rounding is the identity on integers; round is half to even.
template <typename A> struct FloorF {
  __device__ A operator()(A x) const {
    if constexpr (kFloat<A>) return m_floor(x);
    else return x;
  }
};
template <typename A> struct CeilF {
  __device__ A operator()(A x) const {
    if constexpr (kFloat<A>) return m_ceil(x);
    else return x;
  }
};
template <typename A> struct RoundF {
  __device__ A operator()(A x) const {
    if constexpr (kFloat<A>) return m_rint(x);
    else return x;
  }
};
// NaN passes through: both comparisons are false.
template <typename A> struct ClipF {
  A lo, hi;
  __device__ A operator()(A x) const { return x < lo ? lo : (x > hi ? hi : x); }
};

template <typename A> struct ExpF {
  __device__ A operator()(A x) const { return m_exp(x); }
};
template <typename A> struct LogF {
  __device__ A operator()(A x) const { return m_log(x); }
};
template <typename A> struct Log1pF {
  __device__ A operator()(A x) const { return m_log1p(x); }
};
template <typename A> struct Expm1F {
  __device__ A operator()(A x) const { return m_expm1(x); }
};
template <typename A> struct SqrtF {
  __device__ A operator()(A x) const { return m_sqrt(x); }
};
template <typename A> struct RsqrtF {
  __device__ A operator()(A x) const { return A(1) / m_sqrt(x); }
};
template <typename A> struct ReciprocalF {
  __device__ A operator()(A x) const { return A(1) / x; }
};
template <typename A> struct SinF {
  __device__ A operator()(A x) const { return m_sin(x); }
};
template <typename A> struct CosF {
  __device__ A operator()(A x) const { return m_cos(x); }
};
template <typename A> struct TanhF {
  __device__ A operator()(A x) const { return m_tanh(x); }
};
template <typename A> struct ErfF {
  __device__ A operator()(A x) const { return m_erf(x); }
};
template <typename A> struct SigmoidF {
  __device__ A operator()(A x) const { return A(1) / (A(1) + m_exp(-x)); }
};
template <typename A> struct SiluF {
  __device__ A operator()(A x) const { return x / (A(1) + m_exp(-x)); }
};
template <typename A> struct LeakyReluF {
  A alpha;
  __device__ A operator()(A x) const { return x > 0 ? x : alpha * x; }
};
template <typename A> struct EluF {
  A alpha;
  __device__ A operator()(A x) const { return x > 0 ? x : alpha * m_expm1(x); }
};
// Constants of Klambauer et al., "Self-Normalizing Neural Networks".
constexpr double kSeluAlpha = 1.6732632423543772848170429916717;
constexpr double kSeluScale = 1.0507009873554804934193349852946;
template <typename A> struct SeluF {
  __device__ A operator()(A x) const {
    return static_cast<A>(kSeluScale) * (x > 0 ? x : static_cast<A>(kSeluAlpha) * m_expm1(x));
  }
};
template <typename A> struct GeluF {
  __device__ A operator()(A x) const {
    // Φ(x) as erfc(-x/√2) / 2: 1 + erf(x/√2) cancels for negative x (4 digits lost near -3)
    return A(0.5) * x * m_erfc(-x * static_cast<A>(0.7071067811865476));
  }
};
template <typename A> struct GeluTanhF {
  __device__ A operator()(A x) const {
    const A k = static_cast<A>(0.7978845608028654);  // sqrt(2 / pi)
    return A(0.5) * x * (A(1) + m_tanh(k * (x + A(0.044715) * x * x * x)));
  }
};
template <typename A> struct SoftplusF {
  A beta, threshold;
  __device__ A operator()(A x) const {
    const A bx = beta * x;
    return bx > threshold ? x : m_log1p(m_exp(bx)) / beta;
  }
};
template <typename A> struct SoftshrinkF {
  A lambda;
  __device__ A operator()(A x) const {
    return x > lambda ? x - lambda : (x < -lambda ? x + lambda : A(0));
  }
};
template <typename A> struct HardshrinkF {
  A lambda;
  __device__ A operator()(A x) const { return (x > lambda || x < -lambda) ? x : A(0); }
};
// min/max written as std::min/std::max evaluate them, so NaN propagates the same way.
template <typename A> struct HardswishF {
  __device__ A operator()(A x) const {
    A m = x + A(3);
    m = m < A(0) ? A(0) : m;
    m = A(6) < m ? A(6) : m;
    return x * m / A(6);
  }
};
template <typename A> struct HardsigmoidF {
  A alpha, beta;
  __device__ A operator()(A x) const {
    const A v = alpha * x + beta;
    return v < A(0) ? A(0) : (v > A(1) ? A(1) : v);  // NaN passes through
  }
};

template <typename A> struct IsNanF {
  __device__ bool operator()(A x) const { return x != x; }
};
template <typename A> struct IsInfF {
  __device__ bool operator()(A x) const {
    return x == std::numeric_limits<A>::infinity() || x == -std::numeric_limits<A>::infinity();
  }
};

template <typename S, typename D> struct CastF {
  __device__ D operator()(S v) const { return ew::convert_value<S, D>(v); }
};

using ew::Acc1;
using ew::Acc2;
using ew::unary_float;

[[noreturn]] void bad_dtype(const KernelContext& ctx, DType t) {
  fail<UnsupportedError>("[{}] cuda kernel got dtype {}", ctx.op_name(), name(t));
}

// out = Op(a, b) in the dtype of the inputs (bool excluded).
template <template <typename> class Op> void binary_same(KernelContext& ctx) {
  const DType dt = ctx.in(0).dtype;
  dispatch(dt, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    if constexpr (std::is_same_v<T, bool>) {
      bad_dtype(ctx, dt);
    } else {
      using F = Op<acc_t<T>>;
      ew::launch_binary<T, T, T>(ctx.in(0), ctx.in(1), ctx.out(0), Acc2<T, F>{F{}}, stream_of(ctx),
                                 ctx.op_name());
    }
  });
}

// out (bool) = Op(a, b) for inputs of any dtype.
template <template <typename> class Op> void compare(KernelContext& ctx) {
  dispatch(ctx.in(0).dtype, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    using F = Op<acc_t<T>>;
    ew::launch_binary<T, T, bool>(ctx.in(0), ctx.in(1), ctx.out(0), Acc2<bool, F>{F{}},
                                  stream_of(ctx), ctx.op_name());
  });
}

template <typename F> void logical(KernelContext& ctx) {
  ew::launch_binary<bool, bool, bool>(ctx.in(0), ctx.in(1), ctx.out(0), F{}, stream_of(ctx),
                                      ctx.op_name());
}

// out = Op(x) for numeric dtypes (bool excluded; u8 too with kSigned, for the ops registered on
// kSignedTypes); `params` initialize Op's members in order.
template <template <typename> class Op, bool kSigned = false, typename... P>
void unary_same(KernelContext& ctx, P... params) {
  const DType dt = ctx.in(0).dtype;
  dispatch(dt, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    if constexpr (std::is_same_v<T, bool> || (kSigned && std::is_unsigned_v<T>)) {
      bad_dtype(ctx, dt);
    } else {
      using A = acc_t<T>;
      ew::launch_unary<T, T>(ctx.in(0), ctx.out(0), Acc1<T, Op<A>>{Op<A>{static_cast<A>(params)...}},
                             stream_of(ctx), ctx.op_name());
    }
  });
}

void add(KernelContext& ctx) { binary_same<AddF>(ctx); }
void sub(KernelContext& ctx) { binary_same<SubF>(ctx); }
void mul(KernelContext& ctx) { binary_same<MulF>(ctx); }
void div(KernelContext& ctx) { binary_same<DivF>(ctx); }
void pow(KernelContext& ctx) { binary_same<PowF>(ctx); }
void maximum(KernelContext& ctx) { binary_same<MaximumF>(ctx); }
void minimum(KernelContext& ctx) { binary_same<MinimumF>(ctx); }
void mod(KernelContext& ctx) { binary_same<ModF>(ctx); }

void equal(KernelContext& ctx) { compare<EqualF>(ctx); }
void not_equal(KernelContext& ctx) { compare<NotEqualF>(ctx); }
void less(KernelContext& ctx) { compare<LessF>(ctx); }
void less_equal(KernelContext& ctx) { compare<LessEqualF>(ctx); }
void greater(KernelContext& ctx) { compare<GreaterF>(ctx); }
void greater_equal(KernelContext& ctx) { compare<GreaterEqualF>(ctx); }

void logical_and(KernelContext& ctx) { logical<AndF>(ctx); }
void logical_or(KernelContext& ctx) { logical<OrF>(ctx); }
void logical_xor(KernelContext& ctx) { logical<XorF>(ctx); }
void logical_not(KernelContext& ctx) {
  ew::launch_unary<bool, bool>(ctx.in(0), ctx.out(0), NotF{}, stream_of(ctx), ctx.op_name());
}

// where only moves bytes, so it runs on an unsigned type of the element's size.
void where(KernelContext& ctx) {
  const TensorView &c = ctx.in(0), &x = ctx.in(1), &y = ctx.in(2), &o = ctx.out(0);
  cudaStream_t s = stream_of(ctx);
  switch (size_of(o.dtype)) {
    case 1: ew::launch_where<uint8_t>(c, x, y, o, s, "where"); return;
    case 2: ew::launch_where<uint16_t>(c, x, y, o, s, "where"); return;
    case 4: ew::launch_where<uint32_t>(c, x, y, o, s, "where"); return;
    case 8: ew::launch_where<uint64_t>(c, x, y, o, s, "where"); return;
    default: bad_dtype(ctx, o.dtype);
  }
}

void cast(KernelContext& ctx) {
  const TensorView &i = ctx.in(0), &o = ctx.out(0);
  const int64_t n = i.numel();
  if (n == 0) return;
  cudaStream_t s = stream_of(ctx);
  if (i.dtype == o.dtype) {
    if (i.data != o.data)
      KILN_CUDA_CHECK(cudaMemcpyAsync(o.data, i.data, static_cast<size_t>(n) * size_of(i.dtype),
                                      cudaMemcpyDeviceToDevice, s));
    return;
  }
  dispatch(i.dtype, "cast", [&](auto st) {
    using S = decltype(st);
    dispatch(o.dtype, "cast", [&](auto dt) {
      using D = decltype(dt);
      if constexpr (!std::is_same_v<S, D>) ew::launch_unary<S, D>(i, o, CastF<S, D>{}, s, "cast");
    });
  });
}

// Integers are never NaN or infinite.
template <template <typename> class Op> void classify(KernelContext& ctx) {
  const TensorView &i = ctx.in(0), &o = ctx.out(0);
  dispatch(i.dtype, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    if constexpr (std::is_floating_point_v<acc_t<T>>) {
      using F = Op<acc_t<T>>;
      ew::launch_unary<T, bool>(i, o, Acc1<bool, F>{F{}}, stream_of(ctx), ctx.op_name());
    } else if (o.numel() > 0) {
      KILN_CUDA_CHECK(cudaMemsetAsync(o.data, 0, static_cast<size_t>(o.numel()), stream_of(ctx)));
    }
  });
}
void isnan(KernelContext& ctx) { classify<IsNanF>(ctx); }
void isinf(KernelContext& ctx) { classify<IsInfF>(ctx); }

void neg(KernelContext& ctx) { unary_same<NegF, true>(ctx); }
void abs(KernelContext& ctx) { unary_same<AbsF>(ctx); }
void sign(KernelContext& ctx) { unary_same<SignF>(ctx); }
void relu(KernelContext& ctx) { unary_same<ReluF, true>(ctx); }
void floor(KernelContext& ctx) { unary_same<FloorF>(ctx); }
void ceil(KernelContext& ctx) { unary_same<CeilF>(ctx); }
void round(KernelContext& ctx) { unary_same<RoundF>(ctx); }

// Bounds of clip in T: integers take the nearest in-range values inside [lo, hi].
template <typename T> T clip_bound(double v, bool upper) {
  if constexpr (std::is_floating_point_v<acc_t<T>>) {
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
void clip(KernelContext& ctx) {
  const double lo = ctx.attrs().f("min"), hi = ctx.attrs().f("max");
  const DType dt = ctx.in(0).dtype;
  dispatch(dt, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    using A = acc_t<T>;
    if constexpr (std::is_same_v<T, bool>) {
      bad_dtype(ctx, dt);
    } else {
      const ClipF<A> f{clip_bound<A>(lo, false), clip_bound<A>(hi, true)};
      ew::launch_unary<T, T>(ctx.in(0), ctx.out(0), Acc1<T, ClipF<A>>{f}, stream_of(ctx), "clip");
    }
  });
}

void exp(KernelContext& ctx) { unary_float<ExpF>(ctx); }
void log(KernelContext& ctx) { unary_float<LogF>(ctx); }
void log1p(KernelContext& ctx) { unary_float<Log1pF>(ctx); }
void expm1(KernelContext& ctx) { unary_float<Expm1F>(ctx); }
void sqrt(KernelContext& ctx) { unary_float<SqrtF>(ctx); }
void rsqrt(KernelContext& ctx) { unary_float<RsqrtF>(ctx); }
void reciprocal(KernelContext& ctx) { unary_float<ReciprocalF>(ctx); }
void sin(KernelContext& ctx) { unary_float<SinF>(ctx); }
void cos(KernelContext& ctx) { unary_float<CosF>(ctx); }
void tanh(KernelContext& ctx) { unary_float<TanhF>(ctx); }
void erf(KernelContext& ctx) { unary_float<ErfF>(ctx); }
void sigmoid(KernelContext& ctx) { unary_float<SigmoidF>(ctx); }
void silu(KernelContext& ctx) { unary_float<SiluF>(ctx); }
void leaky_relu(KernelContext& ctx) { unary_float<LeakyReluF>(ctx, ctx.attrs().f("alpha")); }
void elu(KernelContext& ctx) { unary_float<EluF>(ctx, ctx.attrs().f("alpha")); }
void selu(KernelContext& ctx) { unary_float<SeluF>(ctx); }
void gelu(KernelContext& ctx) {
  if (ctx.attrs().str("approximate") == "tanh") unary_float<GeluTanhF>(ctx);
  else unary_float<GeluF>(ctx);
}
void softplus(KernelContext& ctx) {
  unary_float<SoftplusF>(ctx, ctx.attrs().f("beta"), ctx.attrs().f("threshold"));
}
void softshrink(KernelContext& ctx) { unary_float<SoftshrinkF>(ctx, ctx.attrs().f("lambda")); }
void hardshrink(KernelContext& ctx) { unary_float<HardshrinkF>(ctx, ctx.attrs().f("lambda")); }
void hardswish(KernelContext& ctx) { unary_float<HardswishF>(ctx); }
void hardsigmoid(KernelContext& ctx) {
  unary_float<HardsigmoidF>(ctx, ctx.attrs().f("alpha"), ctx.attrs().f("beta"));
}
}  // namespace

void register_elementwise_kernels() {
  const auto reg = [](OpId op, KernelFn fn, DTypeSet types, int dtype_input = 0) {
    register_kernel(op, Backend::cuda, {fn, types, dtype_input, false});
  };
  reg(OpId::Add, add, kNumericTypes);
  reg(OpId::Sub, sub, kNumericTypes);
  reg(OpId::Mul, mul, kNumericTypes);
  reg(OpId::Div, div, kNumericTypes);
  reg(OpId::Pow, pow, kNumericTypes);
  reg(OpId::Maximum, maximum, kNumericTypes);
  reg(OpId::Minimum, minimum, kNumericTypes);
  reg(OpId::Mod, mod, kNumericTypes);
  reg(OpId::Equal, equal, kAllTypes);
  reg(OpId::NotEqual, not_equal, kAllTypes);
  reg(OpId::Less, less, kAllTypes);
  reg(OpId::LessEqual, less_equal, kAllTypes);
  reg(OpId::Greater, greater, kAllTypes);
  reg(OpId::GreaterEqual, greater_equal, kAllTypes);
  reg(OpId::LogicalAnd, logical_and, DTypeSet{boolean});
  reg(OpId::LogicalOr, logical_or, DTypeSet{boolean});
  reg(OpId::LogicalXor, logical_xor, DTypeSet{boolean});
  reg(OpId::LogicalNot, logical_not, DTypeSet{boolean});
  reg(OpId::Where, where, kAllTypes, 1);
  reg(OpId::Cast, cast, kAllTypes);
  reg(OpId::IsNan, isnan, kNumericTypes);
  reg(OpId::IsInf, isinf, kNumericTypes);

  reg(OpId::Neg, neg, kSignedTypes);
  reg(OpId::Abs, abs, kNumericTypes);
  reg(OpId::Sign, sign, kNumericTypes);
  reg(OpId::Relu, relu, kSignedTypes);
  reg(OpId::Floor, floor, kNumericTypes);
  reg(OpId::Ceil, ceil, kNumericTypes);
  reg(OpId::Round, round, kNumericTypes);
  reg(OpId::Clip, clip, kNumericTypes);
  reg(OpId::Exp, exp, kFloatTypes);
  reg(OpId::Log, log, kFloatTypes);
  reg(OpId::Log1p, log1p, kFloatTypes);
  reg(OpId::Expm1, expm1, kFloatTypes);
  reg(OpId::Sqrt, sqrt, kFloatTypes);
  reg(OpId::Rsqrt, rsqrt, kFloatTypes);
  reg(OpId::Reciprocal, reciprocal, kFloatTypes);
  reg(OpId::Sin, sin, kFloatTypes);
  reg(OpId::Cos, cos, kFloatTypes);
  reg(OpId::Tanh, tanh, kFloatTypes);
  reg(OpId::Erf, erf, kFloatTypes);
  reg(OpId::Sigmoid, sigmoid, kFloatTypes);
  reg(OpId::Silu, silu, kFloatTypes);
  reg(OpId::LeakyRelu, leaky_relu, kFloatTypes);
  reg(OpId::Elu, elu, kFloatTypes);
  reg(OpId::Selu, selu, kFloatTypes);
  reg(OpId::Gelu, gelu, kFloatTypes);
  reg(OpId::Softplus, softplus, kFloatTypes);
  reg(OpId::Softshrink, softshrink, kFloatTypes);
  reg(OpId::Hardshrink, hardshrink, kFloatTypes);
  reg(OpId::Hardswish, hardswish, kFloatTypes);
  reg(OpId::Hardsigmoid, hardsigmoid, kFloatTypes);
}

}  // namespace kiln::cuda
