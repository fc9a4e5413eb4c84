// CPU kernels of Full and Arange.
#include "backends/cpu/cpu_common.h"
#include "backends/cpu/kernels.h"
#include "ops/core_params.h"

namespace kiln::cpu {

namespace {
void full(KernelContext& ctx) {
  const TensorView& o = ctx.out(0);
  const double v = params_of<FullParams>(ctx).value;
  dispatch(o.dtype, "full", [&](auto t) {
    using T = decltype(t);
    T* p = o.ptr<T>();
    const T tv = static_cast<T>(v);
    ctx.parallel_for(o.numel(), 65536, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) p[i] = tv;
    });
  });
}

void arange(KernelContext& ctx) {
  const TensorView& o = ctx.out(0);
  const ArangeParams range = params_of<ArangeParams>(ctx);
  const double start = range.start, step = range.step;
  dispatch(o.dtype, "arange", [&](auto t) {
    using T = decltype(t);
    T* p = o.ptr<T>();
    // integers: the value truncated to int64, then wrapped to T (as numpy's integer arange)
    for (int64_t i = 0; i < o.numel(); ++i) {
      const double v = start + static_cast<double>(i) * step;
      if constexpr (std::is_integral_v<T>) p[i] = static_cast<T>(static_cast<int64_t>(v));
      else p[i] = static_cast<T>(v);
    }
  });
}
// Input 0 is the variable's own storage; output 0 is the same bytes unless the new value is
// also returned (then a separate output array).
void assign(KernelContext& ctx) {
  const TensorView &var = ctx.in(0), &val = ctx.in(1), &out = ctx.out(0);
  const size_t bytes = static_cast<size_t>(var.numel()) * size_of(var.dtype);
  if (var.data != val.data) std::memmove(var.data, val.data, bytes);
  if (out.data != var.data) std::memcpy(out.data, var.data, bytes);
}
}  // namespace

void register_core_kernels() {
  register_kernel(OpId::Full, Backend::cpu, {full, kAllTypes, -1});
  register_kernel(OpId::Arange, Backend::cpu, {arange, kNumericTypes, -1});
  register_kernel(OpId::Assign, Backend::cpu, {assign, kAllTypes, 0, false});
}

}  // namespace kiln::cpu
