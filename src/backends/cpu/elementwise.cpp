// CPU kernels of the elementwise family: binary arithmetic, comparisons, logic, where, cast,
// isnan/isinf, bitwise ops and shifts. Unary math lives in elementwise_unary.cpp. Integer
// semantics are documented in src/ops/elementwise.cpp.
#include "backends/cpu/elementwise.h"

#include <cmath>
#include <cstdint>
#include <functional>

#include "backends/cpu/kernels.h"

namespace kiln::cpu {

namespace {
// numpy floor_divide for integers; x / 0 = 0, and MIN / -1 wraps instead of trapping.
template <typename T> T floor_div(T a, T b) {
  if (b == 0) return 0;
  if constexpr (std::is_signed_v<T>) {
    if (b == -1) return wrap_neg(a);
    const T q = static_cast<T>(a / b);
    return (a % b != 0 && ((a < 0) != (b < 0))) ? static_cast<T>(q - 1) : q;
  } else {
    return static_cast<T>(a / b);
  }
}

// numpy mod for integers: the divisor's sign; x mod 0 = 0.
template <typename T> T int_mod(T a, T b) {
  if (b == 0) return 0;
  if constexpr (std::is_signed_v<T>) {
    if (b == -1) return 0;
    const T r = static_cast<T>(a % b);
    return (r != 0 && ((r < 0) != (b < 0))) ? static_cast<T>(r + b) : r;
  } else {
    return static_cast<T>(a % b);
  }
}

// numpy mod for floats (npy_divmod): the divisor's sign, a zero result takes b's sign.
template <typename T> T float_mod(T a, T b) {
  T r = std::fmod(a, b);
  if (r != 0) {
    if ((r < 0) != (b < 0)) r += b;
  } else {
    r = std::copysign(T(0), b);
  }
  return r;
}

// Integer power by squaring in 64-bit unsigned arithmetic, so overflow wraps like numpy.
template <typename T> T int_pow(T base, T e) {
  if constexpr (std::is_signed_v<T>) {
    if (e < 0) return base == 1 ? 1 : base == -1 ? ((e & 1) ? -1 : 1) : 0;
  }
  uint64_t r = 1, b = static_cast<uint64_t>(base), n = static_cast<uint64_t>(e);
  for (; n; n >>= 1, b *= b)
    if (n & 1) r *= b;
  return static_cast<T>(r);
}

// a op b for floats; wraps on integer overflow.
template <typename Op> void arithmetic(KernelContext& ctx, Op op) {
  binary_same(ctx, [&](auto a, auto b) {
    if constexpr (kFloat<decltype(a)>) return op(a, b);
    else return wrapping(a, b, op);
  });
}
void add(KernelContext& ctx) { arithmetic(ctx, std::plus<>()); }
void sub(KernelContext& ctx) { arithmetic(ctx, std::minus<>()); }
void mul(KernelContext& ctx) { arithmetic(ctx, std::multiplies<>()); }
void div(KernelContext& ctx) {
  binary_same(ctx, [](auto a, auto b) {
    if constexpr (kFloat<decltype(a)>) return a / b;
    else return floor_div(a, b);
  });
}
void mod(KernelContext& ctx) {
  binary_same(ctx, [](auto a, auto b) {
    if constexpr (kFloat<decltype(a)>) return float_mod(a, b);
    else return int_mod(a, b);
  });
}
void pow(KernelContext& ctx) {
  binary_same(ctx, [](auto a, auto b) {
    if constexpr (kFloat<decltype(a)>) return std::pow(a, b);
    else return int_pow(a, b);
  });
}
// a != a is true only for NaN, which then propagates.
void maximum(KernelContext& ctx) {
  binary_same(ctx, [](auto a, auto b) { return (a > b || a != a) ? a : b; });
}
void minimum(KernelContext& ctx) {
  binary_same(ctx, [](auto a, auto b) { return (a < b || a != a) ? a : b; });
}

// out (bool) = f(a, b) for inputs of any dtype.
template <typename F> void compare(KernelContext& ctx, F f) {
  dispatch(ctx.in(0).dtype, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    binary_map<T, T, bool>(ctx, ctx.in(0), ctx.in(1), ctx.out(0),
                           [&](T a, T b) { return static_cast<bool>(f(a, b)); });
  });
}
void equal(KernelContext& ctx) { compare(ctx, [](auto a, auto b) { return a == b; }); }
void not_equal(KernelContext& ctx) { compare(ctx, [](auto a, auto b) { return a != b; }); }
void less(KernelContext& ctx) { compare(ctx, [](auto a, auto b) { return a < b; }); }
void less_equal(KernelContext& ctx) { compare(ctx, [](auto a, auto b) { return a <= b; }); }
void greater(KernelContext& ctx) { compare(ctx, [](auto a, auto b) { return a > b; }); }
void greater_equal(KernelContext& ctx) { compare(ctx, [](auto a, auto b) { return a >= b; }); }

template <typename F> void logical(KernelContext& ctx, F f) {
  binary_map<bool, bool, bool>(ctx, ctx.in(0), ctx.in(1), ctx.out(0), f);
}
void logical_and(KernelContext& ctx) { logical(ctx, [](bool a, bool b) { return a && b; }); }
void logical_or(KernelContext& ctx) { logical(ctx, [](bool a, bool b) { return a || b; }); }
void logical_xor(KernelContext& ctx) { logical(ctx, [](bool a, bool b) { return a != b; }); }
void logical_not(KernelContext& ctx) {
  unary_map(ctx, ctx.in(0).ptr<bool>(), ctx.out(0).ptr<bool>(), ctx.in(0).numel(),
            [](bool x) { return !x; });
}

// where only moves bytes, so it runs on an unsigned type of the element's size (f16 included).
template <typename T> void where_typed(KernelContext& ctx) {
  const TensorView &c = ctx.in(0), &x = ctx.in(1), &y = ctx.in(2), &o = ctx.out(0);
  const bool* pc = c.ptr<bool>();
  const T *px = x.ptr<T>(), *py = y.ptr<T>();
  T* po = o.ptr<T>();
  if (c.shape == o.shape && x.shape == o.shape && y.shape == o.shape) {
    ctx.parallel_for(o.numel(), 16384, [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i) po[i] = pc[i] ? px[i] : py[i];
    });
    return;
  }
  for_each_broadcast<3>(ctx, o.shape, {&c.shape, &x.shape, &y.shape},
                        [&](int64_t i, const std::array<int64_t, 3>& off) {
                          po[i] = pc[off[0]] ? px[off[1]] : py[off[2]];
                        });
}
void where(KernelContext& ctx) {
  switch (size_of(ctx.out(0).dtype)) {
    case 1: where_typed<uint8_t>(ctx); return;
    case 2: where_typed<uint16_t>(ctx); return;
    case 4: where_typed<uint32_t>(ctx); return;
    case 8: where_typed<uint64_t>(ctx); return;
    default: fail<UnsupportedError>("[where] cpu kernel got dtype {}", name(ctx.out(0).dtype));
  }
}

void cast(KernelContext& ctx) {
  const TensorView &i = ctx.in(0), &o = ctx.out(0);
  ctx.parallel_for(i.numel(), 65536, [&](int64_t b, int64_t e) {
    convert(static_cast<char*>(i.data) + b * size_of(i.dtype), i.dtype,
            static_cast<char*>(o.data) + b * size_of(o.dtype), o.dtype, e - b);
  });
}

// Integers are never NaN or infinite.
template <typename F> void classify(KernelContext& ctx, F f) {
  dispatch(ctx.in(0).dtype, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    unary_map(ctx, ctx.in(0).ptr<T>(), ctx.out(0).ptr<bool>(), ctx.in(0).numel(), [&](T x) {
      if constexpr (kFloat<T>) return static_cast<bool>(f(x));
      else return false;
    });
  });
}
void isnan(KernelContext& ctx) { classify(ctx, [](auto x) { return std::isnan(x); }); }
void isinf(KernelContext& ctx) { classify(ctx, [](auto x) { return std::isinf(x); }); }

// out = f(a, b) for integer dtypes, broadcasting.
template <typename F> void bitwise(KernelContext& ctx, F f) {
  dispatch(ctx.in(0).dtype, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>)
      binary_map<T, T, T>(ctx, ctx.in(0), ctx.in(1), ctx.out(0),
                          [&](T a, T b) { return static_cast<T>(f(a, b)); });
  });
}
void bitwise_and(KernelContext& ctx) { bitwise(ctx, [](auto a, auto b) { return a & b; }); }
void bitwise_or(KernelContext& ctx) { bitwise(ctx, [](auto a, auto b) { return a | b; }); }
void bitwise_xor(KernelContext& ctx) { bitwise(ctx, [](auto a, auto b) { return a ^ b; }); }
void bitwise_not(KernelContext& ctx) {
  dispatch(ctx.in(0).dtype, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>)
      unary_map(ctx, ctx.in(0).ptr<T>(), ctx.out(0).ptr<T>(), ctx.in(0).numel(),
                [](T x) { return static_cast<T>(~x); });
  });
}

// numpy's shifts: the amount is compared as unsigned, so negative amounts are out of range too;
// out of range gives 0, or -1 for a right shift of a negative value. Left shifts wrap.
template <typename T> T shift_left(T a, T b) {
  if (static_cast<uint64_t>(b) >= sizeof(T) * 8) return 0;
  using U = std::make_unsigned_t<T>;
  using W = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, U>;
  return static_cast<T>(static_cast<W>(static_cast<U>(a)) << b);
}
template <typename T> T shift_right(T a, T b) {
  if (static_cast<uint64_t>(b) >= sizeof(T) * 8) {
    if constexpr (std::is_signed_v<T>) return a < 0 ? T(-1) : T(0);
    else return 0;
  }
  return static_cast<T>(a >> b);  // arithmetic for signed T (C++20)
}
void bit_shift(KernelContext& ctx) {
  if (ctx.attrs().b("left")) bitwise(ctx, [](auto a, auto b) { return shift_left(a, b); });
  else bitwise(ctx, [](auto a, auto b) { return shift_right(a, b); });
}
}  // namespace

void register_elementwise_kernels() {
  register_kernel(OpId::Add, Backend::cpu, {add, kNumericTypes});
  register_kernel(OpId::Sub, Backend::cpu, {sub, kNumericTypes});
  register_kernel(OpId::Mul, Backend::cpu, {mul, kNumericTypes});
  register_kernel(OpId::Div, Backend::cpu, {div, kNumericTypes});
  register_kernel(OpId::Pow, Backend::cpu, {pow, kNumericTypes});
  register_kernel(OpId::Maximum, Backend::cpu, {maximum, kNumericTypes});
  register_kernel(OpId::Minimum, Backend::cpu, {minimum, kNumericTypes});
  register_kernel(OpId::Mod, Backend::cpu, {mod, kNumericTypes});
  register_kernel(OpId::Equal, Backend::cpu, {equal, kAllTypes});
  register_kernel(OpId::NotEqual, Backend::cpu, {not_equal, kAllTypes});
  register_kernel(OpId::Less, Backend::cpu, {less, kAllTypes});
  register_kernel(OpId::LessEqual, Backend::cpu, {less_equal, kAllTypes});
  register_kernel(OpId::Greater, Backend::cpu, {greater, kAllTypes});
  register_kernel(OpId::GreaterEqual, Backend::cpu, {greater_equal, kAllTypes});
  register_kernel(OpId::LogicalAnd, Backend::cpu, {logical_and, DTypeSet{boolean}});
  register_kernel(OpId::LogicalOr, Backend::cpu, {logical_or, DTypeSet{boolean}});
  register_kernel(OpId::LogicalXor, Backend::cpu, {logical_xor, DTypeSet{boolean}});
  register_kernel(OpId::LogicalNot, Backend::cpu, {logical_not, DTypeSet{boolean}});
  register_kernel(OpId::Where, Backend::cpu, {where, kAllTypes, 1, false});
  register_kernel(OpId::Cast, Backend::cpu, {cast, kAllTypes, 0, false});
  register_kernel(OpId::IsNan, Backend::cpu, {isnan, kNumericTypes});
  register_kernel(OpId::IsInf, Backend::cpu, {isinf, kNumericTypes});
  register_kernel(OpId::BitwiseAnd, Backend::cpu, {bitwise_and, kIntTypes});
  register_kernel(OpId::BitwiseOr, Backend::cpu, {bitwise_or, kIntTypes});
  register_kernel(OpId::BitwiseXor, Backend::cpu, {bitwise_xor, kIntTypes});
  register_kernel(OpId::BitwiseNot, Backend::cpu, {bitwise_not, kIntTypes});
  register_kernel(OpId::BitShift, Backend::cpu, {bit_shift, kIntTypes});
  register_elementwise_unary_kernels();
}

}  // namespace kiln::cpu
