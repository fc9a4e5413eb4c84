// Cases of custom, custom_impure: an op registered from the program (harness.softsign,
// y = x / (1 + |x|), and its impure twin) with a CPU kernel here and a CUDA kernel in
// cases_custom_op_cuda.cu (built with CUDA). Odd sizes, a strided input, f32 and f64.
#include <fmt/format.h>

#include <cmath>

#include "backend_ops/harness.h"
#include "kiln/custom_op.h"

#ifdef KILN_HARNESS_CUSTOM_CUDA
void harness_softsign_cuda(kiln::KernelContext& ctx, kiln::Stream& stream);
#endif

namespace kiln::harness {
namespace {

template <typename T>
void softsign_loop(KernelContext& c) {
  const T* x = c.in(0).ptr<T>();
  T* y = c.out(0).ptr<T>();
  for (int64_t i = 0; i < c.in(0).numel(); ++i) y[i] = x[i] / (T(1) + std::abs(x[i]));
}

void softsign_cpu(KernelContext& c, Stream&) {
  if (c.in(0).dtype == f64)
    softsign_loop<double>(c);
  else
    softsign_loop<float>(c);
}

std::vector<std::optional<Tensor>> softsign_grad(const CustomGradContext& c) {
  const Tensor d = scalar_like(c.inputs[0], 1) + abs(c.inputs[0]);
  return {c.cotangent_or_zeros(0) / (d * d)};
}

const char* ensure_registered(bool pure) {
  const char* name = pure ? "harness.softsign" : "harness.softsign_impure";
  if (!is_custom_op_registered(name)) {
    CustomOpDef d;
    d.name = name;
    d.inputs = {{"x", {f32, f64}}};
    d.outputs = {{"y", f32, 0}};
    d.gradient = softsign_grad;
    d.pure = pure;
    register_custom_op(d);
    register_custom_kernel(name, Backend::cpu, softsign_cpu);
#ifdef KILN_HARNESS_CUSTOM_CUDA
    register_custom_kernel(name, Backend::cuda, harness_softsign_cuda);
#endif
  }
  return name;
}

const Shape kShapes[] = {{257}, {3, 5, 7}, {0}};

bool build(Case& c, DType t, int i, bool pure) {
  const char* name = ensure_registered(pure);
  Tensor x = c.rand(kShapes[i], t, -3, 3, i == 1 ? Layout::strided : Layout::dense);
  c.outs = {custom_op1(name, {x})};
  c.note(fmt::format("{} shape {}", name, to_string(kShapes[i])));
  return true;
}

const bool kCustom = register_cases(
    {OpId::Custom, 3, [](Case& c, DType t, int i) { return build(c, t, i, true); }, {f32, f64}});
const bool kCustomImpure =
    register_cases({OpId::CustomImpure,
                    3,
                    [](Case& c, DType t, int i) { return build(c, t, i, false); },
                    {f32, f64}});

}  // namespace
}  // namespace kiln::harness
