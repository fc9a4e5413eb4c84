// Launchers shared by the elementwise CPU kernel files (elementwise*.cpp): each runs one functor
// of src/ops/elementwise_math.h (the math the CUDA and fused kernels run too) over a kernel's
// inputs, with numpy broadcasting for the binary ones.
#pragma once

#include <type_traits>

#include "backends/cpu/cpu_common.h"
#include "ops/elementwise_math.h"

namespace kiln::cpu {

/// out = Op<T>(a, b) in the dtype of input 0 (bool excluded), broadcasting.
template <template <class> class Op> void binary_op(KernelContext& ctx) {
  dispatch(ctx.in(0).dtype, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    if constexpr (!std::is_same_v<T, bool>)
      binary_map<T, T, T>(ctx, ctx.in(0), ctx.in(1), ctx.out(0), Op<T>{});
  });
}

/// out (bool) = Op<T>(a, b) for inputs of any dtype, broadcasting.
template <template <class> class Op> void compare_op(KernelContext& ctx) {
  dispatch(ctx.in(0).dtype, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    binary_map<T, T, bool>(ctx, ctx.in(0), ctx.in(1), ctx.out(0), Op<T>{});
  });
}

/// out = Op<T>(a, b) for integer dtypes, broadcasting.
template <template <class> class Op> void integer_op(KernelContext& ctx) {
  dispatch(ctx.in(0).dtype, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>)
      binary_map<T, T, T>(ctx, ctx.in(0), ctx.in(1), ctx.out(0), Op<T>{});
  });
}

/// out[i] = f(in[i]) with f = Op<T>{params...} in the dtype of input 0 (bool excluded).
template <template <class> class Op, typename... P> void unary_op(KernelContext& ctx, P... params) {
  dispatch(ctx.in(0).dtype, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    if constexpr (!std::is_same_v<T, bool>)
      unary_map(ctx, ctx.in(0).ptr<T>(), ctx.out(0).ptr<T>(), ctx.in(0).numel(),
                Op<T>{static_cast<T>(params)...});
  });
}

/// Same for float-only math (f32, f64), so integer instantiations are never built.
template <template <class> class Op, typename... P> void float_op(KernelContext& ctx, P... params) {
  dispatch_float(ctx.in(0).dtype, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    unary_map(ctx, ctx.in(0).ptr<T>(), ctx.out(0).ptr<T>(), ctx.in(0).numel(),
              Op<T>{static_cast<T>(params)...});
  });
}

/// out = sigmoid(in) or tanh(in) over f32 data through the C library's vector functions (as the
/// ops' kernels run them; in parallel over chunks of 16,384); false where it has none.
bool sigmoid_f32_vectorized(const KernelContext& ctx, const float* in, float* out, int64_t n);
bool tanh_f32_vectorized(const KernelContext& ctx, const float* in, float* out, int64_t n);
/// Registers the unary math and activation kernels (elementwise_unary.cpp).
void register_elementwise_unary_kernels();

}  // namespace kiln::cpu
