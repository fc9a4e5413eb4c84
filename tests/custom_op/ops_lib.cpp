// A test op library (tests/custom_op/test_custom_op.cpp loads it at run time):
//   test.softshrink(x; lambda=0.5): x - lambda above lambda, x + lambda below -lambda, else 0.
//   test.mix(x, z; a=1, b=2, power=2): y0 = a x + b z, y1 = x^power z (x, z of one shape).
// CPU kernels here; CUDA kernels in ops_lib_cuda.cu when built with CUDA.
#include <cmath>

#include "kiln/custom_op.h"
#include "kiln/kiln.h"

namespace {

using kiln::KernelContext;
using kiln::Stream;
using kiln::Tensor;

template <typename T>
void softshrink_loop(KernelContext& ctx) {
  const T* x = ctx.in(0).ptr<T>();
  T* y = ctx.out(0).ptr<T>();
  const T l = static_cast<T>(ctx.attrs().f("lambda"));
  ctx.parallel_for(ctx.in(0).numel(), 4096, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) y[i] = x[i] > l ? x[i] - l : x[i] < -l ? x[i] + l : T(0);
  });
}

void softshrink_cpu(KernelContext& ctx, Stream&) {
  if (ctx.in(0).dtype == kiln::f64)
    softshrink_loop<double>(ctx);
  else
    softshrink_loop<float>(ctx);
}

void mix_cpu(KernelContext& ctx, Stream&) {
  const float* x = ctx.in(0).ptr<float>();
  const float* z = ctx.in(1).ptr<float>();
  float* y0 = ctx.out(0).ptr<float>();
  float* y1 = ctx.out(1).ptr<float>();
  const float a = static_cast<float>(ctx.attrs().f("a")),
              b = static_cast<float>(ctx.attrs().f("b"));
  const int64_t p = ctx.attrs().i("power");
  for (int64_t i = 0; i < ctx.in(0).numel(); ++i) {
    y0[i] = a * x[i] + b * z[i];
    float xp = 1;
    for (int64_t k = 0; k < p; ++k) xp *= x[i];
    y1[i] = xp * z[i];
  }
}

std::vector<std::optional<Tensor>> softshrink_grad(const kiln::CustomGradContext& c) {
  const Tensor& x = c.inputs[0];
  const Tensor l = kiln::scalar_like(x, c.attrs.f("lambda"));
  const Tensor g = c.cotangent_or_zeros(0);
  return {kiln::where(kiln::greater(kiln::abs(x), l), g, kiln::scalar_like(g, 0))};
}

std::vector<std::optional<Tensor>> mix_grad(const kiln::CustomGradContext& c) {
  const Tensor &x = c.inputs[0], &z = c.inputs[1];
  const double a = c.attrs.f("a"), b = c.attrs.f("b");
  const int64_t p = c.attrs.i("power");
  const Tensor g0 = c.cotangent_or_zeros(0), g1 = c.cotangent_or_zeros(1);
  Tensor xp = kiln::scalar_like(x, 1), xp1 = kiln::scalar_like(x, p == 0 ? 0 : 1);
  for (int64_t k = 0; k < p; ++k) xp = xp * x;
  for (int64_t k = 0; k + 1 < p; ++k) xp1 = xp1 * x;
  const Tensor dx = g0 * kiln::scalar_like(x, a) + g1 * kiln::scalar_like(x, double(p)) * xp1 * z;
  const Tensor dz = g0 * kiln::scalar_like(z, b) + g1 * xp;
  return {dx, dz};
}

std::vector<kiln::Shape> mix_shape(const kiln::CustomShapeContext& c) {
  if (c.inputs[0] != c.inputs[1])
    throw kiln::ShapeError("[" + c.op + "] x " + kiln::to_string(c.inputs[0]) + " and z " +
                           kiln::to_string(c.inputs[1]) + " must have one shape");
  if (c.attrs.i("power") < 0 || c.attrs.i("power") > 8)
    throw kiln::ValueError("[" + c.op + "] power must be in [0, 8]");
  return {c.inputs[0], c.inputs[0]};
}

}  // namespace

#ifdef KILN_TEST_OPS_CUDA
void softshrink_cuda(KernelContext& ctx, Stream& stream);  // ops_lib_cuda.cu
void mix_cuda(KernelContext& ctx, Stream& stream);
#endif

KILN_OP_LIBRARY(r) {
  kiln::CustomOpDef s;
  s.name = "test.softshrink";
  s.inputs = {{"x", {kiln::f32, kiln::f64}}};
  s.outputs = {{"y", kiln::f32, 0}};
  s.attrs = {{"lambda", 0.5}};
  s.gradient = softshrink_grad;
  r.register_op(s);
  r.register_kernel("test.softshrink", kiln::Backend::cpu, softshrink_cpu);

  kiln::CustomOpDef m;
  m.name = "test.mix";
  m.inputs = {{"x", {kiln::f32}}, {"z", {kiln::f32}}};
  m.outputs = {{"y0", kiln::f32}, {"y1", kiln::f32}};
  m.attrs = {{"a", 1.0}, {"b", 2.0}, {"power", int64_t{2}}};
  m.shape = mix_shape;
  m.gradient = mix_grad;
  r.register_op(m);
  r.register_kernel("test.mix", kiln::Backend::cpu, mix_cpu);
#ifdef KILN_TEST_OPS_CUDA
  r.register_kernel("test.softshrink", kiln::Backend::cuda, softshrink_cuda);
  r.register_kernel("test.mix", kiln::Backend::cuda, mix_cuda);
#endif
}
