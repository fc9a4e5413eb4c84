// Op library: my.softshrink(x; lambda=0.5), softshrink as a custom op with a CPU kernel here and
// a CUDA kernel in softshrink_ops.cu (built with CUDA). Its gradient is written with kiln ops.
#include "kiln/custom_op.h"
#include "kiln/kiln.h"

namespace {

template <typename T>
void loop(kiln::KernelContext& ctx) {
  const T* x = ctx.in(0).ptr<T>();
  T* y = ctx.out(0).ptr<T>();
  const T l = static_cast<T>(ctx.attrs().f("lambda"));
  ctx.parallel_for(ctx.in(0).numel(), 1 << 14, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) y[i] = x[i] > l ? x[i] - l : x[i] < -l ? x[i] + l : T(0);
  });
}

void softshrink_cpu(kiln::KernelContext& ctx, kiln::Stream&) {
  if (ctx.in(0).dtype == kiln::f64)
    loop<double>(ctx);
  else
    loop<float>(ctx);
}

// dy/dx is 1 where |x| > lambda, else 0.
std::vector<std::optional<kiln::Tensor>> softshrink_grad(const kiln::CustomGradContext& c) {
  const kiln::Tensor& x = c.inputs[0];
  const kiln::Tensor g = c.cotangent_or_zeros(0);
  return {kiln::where(kiln::greater(kiln::abs(x), kiln::scalar_like(x, c.attrs.f("lambda"))), g,
                      kiln::scalar_like(g, 0))};
}

}  // namespace

#ifdef SOFTSHRINK_CUDA
void softshrink_cuda(kiln::KernelContext& ctx, kiln::Stream& stream);  // softshrink_ops.cu
#endif

KILN_OP_LIBRARY(r) {
  kiln::CustomOpDef d;
  d.name = "my.softshrink";
  d.inputs = {{"x", {kiln::f32, kiln::f64}}};
  d.outputs = {{"y", kiln::f32, /*like_input=*/0}};
  d.attrs = {{"lambda", 0.5}};
  d.gradient = softshrink_grad;
  r.register_op(d);
  r.register_kernel("my.softshrink", kiln::Backend::cpu, softshrink_cpu);
#ifdef SOFTSHRINK_CUDA
  r.register_kernel("my.softshrink", kiln::Backend::cuda, softshrink_cuda);
#endif
}
