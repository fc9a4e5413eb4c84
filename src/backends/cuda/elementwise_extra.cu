// CUDA kernels of the trigonometric/hyperbolic elementwise ops and the bitwise ops, over the
// launchers of elementwise.cuh. Semantics are those of src/backends/cpu/elementwise*.cpp
// (numpy's shifts: out-of-range amounts give 0, or -1 for a right shift of a negative value);
// f16/bf16 compute in f32.
#include <cstdint>
#include <type_traits>

#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/elementwise.cuh"
#include "backends/cuda/kernels.h"

namespace kiln::cuda {

namespace {
// Float math in the precision of A (float for f32/f16/bf16, double for f64).
#define KILN_EW_MATH1(name)                                       \
  template <typename A> __device__ inline A m_##name(A x) {       \
    if constexpr (std::is_same_v<A, float>) return ::name##f(x);  \
    else return ::name(x);                                        \
  }
KILN_EW_MATH1(tan)
KILN_EW_MATH1(asin)
KILN_EW_MATH1(acos)
KILN_EW_MATH1(atan)
KILN_EW_MATH1(sinh)
KILN_EW_MATH1(cosh)
KILN_EW_MATH1(asinh)
KILN_EW_MATH1(acosh)
KILN_EW_MATH1(atanh)
#undef KILN_EW_MATH1

// One functor per op, named after it.
#define KILN_EW_UNARY(Name, fn)                               \
  template <typename A> struct Name##F {                      \
    __device__ A operator()(A x) const { return m_##fn(x); }  \
  };                                                          \
  void fn(KernelContext& ctx) { ew::unary_float<Name##F>(ctx); }
KILN_EW_UNARY(Tan, tan)
KILN_EW_UNARY(Asin, asin)
KILN_EW_UNARY(Acos, acos)
KILN_EW_UNARY(Atan, atan)
KILN_EW_UNARY(Sinh, sinh)
KILN_EW_UNARY(Cosh, cosh)
KILN_EW_UNARY(Asinh, asinh)
KILN_EW_UNARY(Acosh, acosh)
KILN_EW_UNARY(Atanh, atanh)
#undef KILN_EW_UNARY

// ---- bitwise (integer element types only) ----

template <typename T> struct BitAndF {
  __device__ T operator()(T a, T b) const { return static_cast<T>(a & b); }
};
template <typename T> struct BitOrF {
  __device__ T operator()(T a, T b) const { return static_cast<T>(a | b); }
};
template <typename T> struct BitXorF {
  __device__ T operator()(T a, T b) const { return static_cast<T>(a ^ b); }
};
template <typename T> struct BitNotF {
  __device__ T operator()(T x) const { return static_cast<T>(~x); }
};
// The amount compares as unsigned, so negative amounts are out of range too. Left shifts wrap.
template <typename T> struct ShiftLeftF {
  __device__ T operator()(T a, T b) const {
    if (static_cast<uint64_t>(b) >= sizeof(T) * 8) return 0;
    using U = std::make_unsigned_t<T>;
    using W = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, U>;
    return static_cast<T>(static_cast<W>(static_cast<U>(a)) << b);
  }
};
template <typename T> struct ShiftRightF {
  __device__ T operator()(T a, T b) const {
    if (static_cast<uint64_t>(b) >= sizeof(T) * 8) {
      if constexpr (std::is_signed_v<T>) return a < 0 ? T(-1) : T(0);
      else return 0;
    }
    return static_cast<T>(a >> b);  // arithmetic for signed T
  }
};

template <typename T> constexpr bool kInt = std::is_integral_v<T> && !std::is_same_v<T, bool>;

[[noreturn]] void bad_dtype(const KernelContext& ctx, DType t) {
  fail<UnsupportedError>("[{}] cuda kernel got dtype {}", ctx.op_name(), name(t));
}

// out = Op(a, b) for integer dtypes, broadcasting.
template <template <typename> class Op> void bitwise(KernelContext& ctx) {
  const DType dt = ctx.in(0).dtype;
  dispatch(dt, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    if constexpr (kInt<T>)
      ew::launch_binary<T, T, T>(ctx.in(0), ctx.in(1), ctx.out(0), Op<T>{}, stream_of(ctx),
                                 ctx.op_name());
    else bad_dtype(ctx, dt);
  });
}
void bitwise_and(KernelContext& ctx) { bitwise<BitAndF>(ctx); }
void bitwise_or(KernelContext& ctx) { bitwise<BitOrF>(ctx); }
void bitwise_xor(KernelContext& ctx) { bitwise<BitXorF>(ctx); }
void bit_shift(KernelContext& ctx) {
  if (ctx.attrs().b("left")) bitwise<ShiftLeftF>(ctx);
  else bitwise<ShiftRightF>(ctx);
}
void bitwise_not(KernelContext& ctx) {
  const DType dt = ctx.in(0).dtype;
  dispatch(dt, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    if constexpr (kInt<T>)
      ew::launch_unary<T, T>(ctx.in(0), ctx.out(0), BitNotF<T>{}, stream_of(ctx), ctx.op_name());
    else bad_dtype(ctx, dt);
  });
}
}  // namespace

void register_elementwise_extra_kernels() {
  const auto reg = [](OpId op, KernelFn fn, DTypeSet types) {
    register_kernel(op, Backend::cuda, {fn, types, 0, false});
  };
  reg(OpId::Tan, tan, kFloatTypes);
  reg(OpId::Asin, asin, kFloatTypes);
  reg(OpId::Acos, acos, kFloatTypes);
  reg(OpId::Atan, atan, kFloatTypes);
  reg(OpId::Sinh, sinh, kFloatTypes);
  reg(OpId::Cosh, cosh, kFloatTypes);
  reg(OpId::Asinh, asinh, kFloatTypes);
  reg(OpId::Acosh, acosh, kFloatTypes);
  reg(OpId::Atanh, atanh, kFloatTypes);
  reg(OpId::BitwiseAnd, bitwise_and, kIntTypes);
  reg(OpId::BitwiseOr, bitwise_or, kIntTypes);
  reg(OpId::BitwiseXor, bitwise_xor, kIntTypes);
  reg(OpId::BitwiseNot, bitwise_not, kIntTypes);
  reg(OpId::BitShift, bit_shift, kIntTypes);
}

}  // namespace kiln::cuda
