// CPU kernels of the core family: full, arange, assign, assign_slice.
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

// Checks every start before writing anything, then copies the update's rows (its last dim, or a
// single element at rank 0) into the variable. Input 0 is the variable's storage; output 0 is the
// same bytes unless the new value is also returned.
void assign_slice(KernelContext& ctx) {
  const TensorView &var = ctx.in(0), &up = ctx.in(1), &st = ctx.in(2), &out = ctx.out(0);
  const int rank = var.rank();
  const int64_t* starts = st.ptr<int64_t>();
  for (int d = 0; d < rank; ++d)
    if (starts[d] < 0 || starts[d] > var.shape[d] - up.shape[d])
      fail<ValueError>("{}", assign_slice_range_error(ctx.attrs().str("variable", ""), var.shape,
                                                      up.shape, d, starts[d]));
  const size_t es = size_of(var.dtype);
  if (up.numel() > 0) {
    std::vector<int64_t> vstride(rank, 1);
    for (int d = rank - 2; d >= 0; --d) vstride[d] = vstride[d + 1] * var.shape[d + 1];
    const int64_t row = rank ? up.shape[rank - 1] : 1, rows = up.numel() / row;
    auto* dst = static_cast<char*>(var.data);
    const auto* src = static_cast<const char*>(up.data);
    ctx.parallel_for(rows, std::max<int64_t>(1, 65536 / row), [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        int64_t off = rank ? starts[rank - 1] : 0, rest = r;
        for (int d = rank - 2; d >= 0; --d) {
          off += (rest % up.shape[d] + starts[d]) * vstride[d];
          rest /= up.shape[d];
        }
        std::memmove(dst + off * es, src + r * row * es, static_cast<size_t>(row) * es);
      }
    });
  }
  if (out.data != var.data) std::memcpy(out.data, var.data, static_cast<size_t>(var.numel()) * es);
}
}  // namespace

void register_core_kernels() {
  register_kernel(OpId::Full, Backend::cpu, {full, kAllTypes, -1});
  register_kernel(OpId::Arange, Backend::cpu, {arange, kNumericTypes, -1});
  register_kernel(OpId::Assign, Backend::cpu, {assign, kAllTypes, 0, false});
  register_kernel(OpId::AssignSlice, Backend::cpu, {assign_slice, kAllTypes, 0, false});
}

}  // namespace kiln::cpu
