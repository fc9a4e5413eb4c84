// CPU kernels of the elementwise family.
#include <cmath>

#include "backends/cpu/cpu_common.h"
#include "backends/cpu/kernels.h"

namespace kiln::cpu {

namespace {
template <typename F> void binary_same(KernelContext& ctx, F f) {
  dispatch(ctx.in(0).dtype, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    if constexpr (!std::is_same_v<T, bool>)
      binary_map<T, T, T>(ctx, ctx.in(0), ctx.in(1), ctx.out(0),
                          [&](T a, T b) { return static_cast<T>(f(a, b)); });
  });
}
template <typename F> void unary_same(KernelContext& ctx, F f) {
  dispatch(ctx.in(0).dtype, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    if constexpr (!std::is_same_v<T, bool>)
      unary_map(ctx, ctx.in(0).ptr<T>(), ctx.out(0).ptr<T>(), ctx.in(0).numel(),
                [&](T x) { return static_cast<T>(f(x)); });
  });
}

void add(KernelContext& ctx) { binary_same(ctx, [](auto a, auto b) { return a + b; }); }
void sub(KernelContext& ctx) { binary_same(ctx, [](auto a, auto b) { return a - b; }); }
void mul(KernelContext& ctx) { binary_same(ctx, [](auto a, auto b) { return a * b; }); }
void neg(KernelContext& ctx) { unary_same(ctx, [](auto x) { return -x; }); }
void exp(KernelContext& ctx) { unary_same(ctx, [](auto x) { return std::exp(x); }); }
void relu(KernelContext& ctx) {
  unary_same(ctx, [](auto x) { return x > decltype(x)(0) ? x : decltype(x)(0); });
}
void cast(KernelContext& ctx) {
  const TensorView &i = ctx.in(0), &o = ctx.out(0);
  ctx.parallel_for(i.numel(), 65536, [&](int64_t b, int64_t e) {
    convert(static_cast<char*>(i.data) + b * size_of(i.dtype), i.dtype,
            static_cast<char*>(o.data) + b * size_of(o.dtype), o.dtype, e - b);
  });
}
}  // namespace

void register_elementwise_kernels() {
  register_kernel(OpId::Add, Backend::cpu, {add, kNumericTypes});
  register_kernel(OpId::Sub, Backend::cpu, {sub, kNumericTypes});
  register_kernel(OpId::Mul, Backend::cpu, {mul, kNumericTypes});
  register_kernel(OpId::Neg, Backend::cpu, {neg, kSignedTypes});
  register_kernel(OpId::Exp, Backend::cpu, {exp, DTypeSet{f32, f64}});
  register_kernel(OpId::Relu, Backend::cpu, {relu, kSignedTypes});
  register_kernel(OpId::Cast, Backend::cpu, {cast, kAllTypes, 0, false});
}

}  // namespace kiln::cpu
