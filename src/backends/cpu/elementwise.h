// Helpers shared by the elementwise CPU kernel files (elementwise*.cpp).
#pragma once

#include <type_traits>

#include "backends/cpu/cpu_common.h"

namespace kiln::cpu {

/// Whether a kernel's element type is a float (f32, f64); otherwise it is an integer or bool.
template <typename T> constexpr bool kFloat = std::is_floating_point_v<T>;

/// -x for integers with two's complement wrap-around (no UB on the minimum value).
template <typename T> T wrap_neg(T x) {
  using U = std::make_unsigned_t<T>;
  return static_cast<T>(U(0) - static_cast<U>(x));
}

/// op(a, b) for integers in unsigned arithmetic (at least int wide), so overflow wraps like numpy
/// instead of being undefined.
template <typename T, typename Op> T wrapping(T a, T b, Op op) {
  using U = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;
  return static_cast<T>(op(static_cast<U>(a), static_cast<U>(b)));
}

/// out = f(a, b) of the dtype of input 0 (bool excluded) with broadcasting.
template <typename F> void binary_same(KernelContext& ctx, F f) {
  dispatch(ctx.in(0).dtype, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    if constexpr (!std::is_same_v<T, bool>)
      binary_map<T, T, T>(ctx, ctx.in(0), ctx.in(1), ctx.out(0),
                          [&](T a, T b) { return static_cast<T>(f(a, b)); });
  });
}

/// out[i] = f(in[i]) of the dtype of input 0 (bool excluded).
template <typename F> void unary_same(KernelContext& ctx, F f) {
  dispatch(ctx.in(0).dtype, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    if constexpr (!std::is_same_v<T, bool>)
      unary_map(ctx, ctx.in(0).ptr<T>(), ctx.out(0).ptr<T>(), ctx.in(0).numel(),
                [&](T x) { return static_cast<T>(f(x)); });
  });
}

/// Same for float-only math, so integer instantiations are never built.
template <typename F> void unary_float(KernelContext& ctx, F f) {
  dispatch_float(ctx.in(0).dtype, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    unary_map(ctx, ctx.in(0).ptr<T>(), ctx.out(0).ptr<T>(), ctx.in(0).numel(),
              [&](T x) { return static_cast<T>(f(x)); });
  });
}

/// Registers the unary math and activation kernels (elementwise_unary.cpp).
void register_elementwise_unary_kernels();

}  // namespace kiln::cpu
