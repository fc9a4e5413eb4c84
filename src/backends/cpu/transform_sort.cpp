// CPU kernels of the transform family's sorting ops: topk, sort, argsort. They compare values, so
// they dispatch on the dtype (f16/bf16 run as f32). NaN orders above every number.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "backends/cpu/kernels.h"
#include "backends/cpu/transform_common.h"
#include "ops/transform_params.h"

namespace kiln::cpu {

namespace {
template <typename T>
bool less(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    if (std::isnan(a)) return false;
    if (std::isnan(b)) return true;
  }
  return a < b;
}

// Fills order with the positions of line sorted stably (descending keeps equal values in index
// order); when k < line size only the first k entries are sorted.
template <typename T>
void order_line(const std::vector<T>& line, bool descending, int64_t k,
                std::vector<int64_t>& order) {
  auto before = [&](int64_t i, int64_t j) {
    return descending ? less(line[j], line[i]) : less(line[i], line[j]);
  };
  std::iota(order.begin(), order.end(), int64_t{0});
  if (k >= static_cast<int64_t>(order.size())) {
    std::stable_sort(order.begin(), order.end(), before);
    return;
  }
  // partial_sort is not stable: break ties by position
  std::partial_sort(order.begin(), order.begin() + k, order.end(),
                    [&](int64_t i, int64_t j) { return before(i, j) || (!before(j, i) && i < j); });
}

// Orders each line of x along `axis` in parallel and calls emit(line_index, values, order).
template <typename T, typename Emit>
void sort_lines(const KernelContext& ctx, const TensorView& x, int axis, bool descending, int64_t k,
                Emit&& emit) {
  const AxisView v(x.shape, axis);
  const T* xp = x.ptr<T>();
  const int64_t grain = std::max<int64_t>(1, 4096 / std::max<int64_t>(v.n, 1));
  ctx.parallel_for(v.outer * v.inner, grain, [&](int64_t b, int64_t e) {
    std::vector<T> line(v.n);
    std::vector<int64_t> order(v.n);
    for (int64_t l = b; l < e; ++l) {
      const int64_t base = l / v.inner * v.n * v.inner + l % v.inner;
      for (int64_t j = 0; j < v.n; ++j) line[j] = xp[base + j * v.inner];
      order_line(line, descending, k, order);
      emit(l, line, order);
    }
  });
}

// Offset of element j of line l in a tensor of (outer, n, inner).
inline int64_t line_offset(int64_t l, int64_t j, int64_t n, int64_t inner) {
  return (l / inner * n + j) * inner + l % inner;
}

void sort(KernelContext& ctx) {
  const TensorView &x = ctx.in(0), &out = ctx.out(0);
  const SortParams p = params_of<SortParams>(ctx);
  const int axis = static_cast<int>(p.axis);
  const AxisView v(x.shape, axis);
  dispatch(x.dtype, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    T* op = out.ptr<T>();
    sort_lines<T>(ctx, x, axis, p.descending, v.n,
                  [&](int64_t l, const std::vector<T>& line, const std::vector<int64_t>& order) {
                    for (int64_t j = 0; j < v.n; ++j)
                      op[line_offset(l, j, v.n, v.inner)] = line[order[j]];
                  });
  });
}

void argsort(KernelContext& ctx) {
  const TensorView &x = ctx.in(0), &out = ctx.out(0);
  const SortParams p = params_of<SortParams>(ctx);
  const int axis = static_cast<int>(p.axis);
  const AxisView v(x.shape, axis);
  int64_t* op = out.ptr<int64_t>();
  dispatch(x.dtype, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    sort_lines<T>(ctx, x, axis, p.descending, v.n,
                  [&](int64_t l, const std::vector<T>&, const std::vector<int64_t>& order) {
                    for (int64_t j = 0; j < v.n; ++j)
                      op[line_offset(l, j, v.n, v.inner)] = order[j];
                  });
  });
}

void topk(KernelContext& ctx) {
  const TensorView &x = ctx.in(0), &values = ctx.out(0), &indices = ctx.out(1);
  const SortParams p = params_of<SortParams>(ctx);
  const int axis = static_cast<int>(p.axis);
  const int64_t k = p.k;
  const AxisView v(x.shape, axis);
  int64_t* ip = indices.ptr<int64_t>();
  dispatch(x.dtype, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    T* vp = values.ptr<T>();
    sort_lines<T>(ctx, x, axis, p.descending, k,
                  [&](int64_t l, const std::vector<T>& line, const std::vector<int64_t>& order) {
                    for (int64_t j = 0; j < k; ++j) {
                      const int64_t o = line_offset(l, j, k, v.inner);
                      vp[o] = line[order[j]];
                      ip[o] = order[j];
                    }
                  });
  });
}
}  // namespace

void register_transform_sort_kernels() {
  register_kernel(OpId::Topk, Backend::cpu, {topk, kAllTypes});
  register_kernel(OpId::Sort, Backend::cpu, {sort, kAllTypes});
  register_kernel(OpId::Argsort, Backend::cpu, {argsort, kAllTypes});
}

}  // namespace kiln::cpu
