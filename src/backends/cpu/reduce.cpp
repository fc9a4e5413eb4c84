// CPU kernels of the reduce family. A reduction views its input as groups of merged dims, kept
// or reduced, and walks them with strides (no transposed copy). Floats accumulate in double,
// integers in uint64 (wrapping like the input type would).
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>

#include "backends/cpu/cpu_common.h"
#include "backends/cpu/kernels.h"
#include "backends/geometry.h"
#include "ops/reduce_params.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>
#endif

namespace kiln::cpu {

namespace {

// ---- the shape of a reduction ----


int64_t offset_of(int64_t i, const Shape& sizes, const std::vector<int64_t>& strides) {
  int64_t off = 0;
  for (size_t d = sizes.size(); d-- > 0;) {
    off += (i % sizes[d]) * strides[d];
    i /= sizes[d];
  }
  return off;
}

// Calls f(offset, len) for the runs (along the innermost reduced group) that cover reduced
// elements [r0, r1), counted in row-major order over the reduced groups.
template <typename F> void for_runs(const ReducePlan& p, int64_t r0, int64_t r1, F&& f) {
  const Shape& sizes = p.outer_sizes;
  const std::vector<int64_t>& strides = p.outer_strides;
  int64_t k = r0 % p.run, q = r0 / p.run, off = 0;
  std::vector<int64_t> idx(sizes.size());  // odometer over the other reduced groups
  for (size_t d = sizes.size(); d-- > 0;) {
    idx[d] = q % sizes[d];
    q /= sizes[d];
    off += idx[d] * strides[d];
  }
  while (r0 < r1) {
    const int64_t len = std::min(p.run - k, r1 - r0);
    f(off + k * p.run_stride, len);
    r0 += len;
    k = 0;
    for (size_t d = sizes.size(); d-- > 0;) {
      off += strides[d];
      if (++idx[d] < sizes[d]) break;
      off -= sizes[d] * strides[d];
      idx[d] = 0;
    }
  }
}

constexpr int64_t kLaneBlock = 1024;  // kept lanes one task reduces side by side

// How a reduction is cut into tasks: rows x lane blocks x splits of the reduced elements.
struct ReduceTasks {
  int64_t blocks = 1, splits = 1;
  int64_t count() const { return blocks * splits; }  // per row
};
// Few outputs over a long reduction: split the reduction so that all threads get work. The
// cut depends only on the shape, so results do not depend on the thread count.
ReduceTasks cut_tasks(const ReducePlan& p) {
  ReduceTasks t;
  t.blocks = (p.lanes + kLaneBlock - 1) / kLaneBlock;
  const int64_t units = p.rows * t.blocks;
  if (units < 64 && units * p.count * std::min(p.lanes, kLaneBlock) >= (int64_t{1} << 17))
    t.splits = std::clamp<int64_t>(p.count / 1024, 1, (64 + units - 1) / units);
  return t;
}

// ---- the reduction driver ----

// max and min's rule: x replaces the running value where it is larger (smaller) or NaN, so a NaN
// anywhere gives NaN.
template <bool kMax, typename T> bool takes(T x, T a) {
  const bool take = kMax ? x > a : x < a;
  if constexpr (std::is_floating_point_v<T>) return take || std::isnan(x);
  return take;
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define KILN_REDUCE_AVX512 1
#pragma GCC push_options
#pragma GCC target("avx512f")
// The largest (kMax) or smallest of a and s[0, n) on AVX-512, sixteen lanes in each of four
// registers by the same rule, the lanes merged in order (a full max over 4,096 f32 took 4.8 µs a
// run through the scalar loop, a sum 2.0). Which NaN, and which zero of a tie of -0 and +0, may
// differ from the scalar loop's; the values are equal.
template <bool kMax> inline __m512 extreme_step(__m512 r, __m512 v) {
  const __mmask16 beats =
      kMax ? _mm512_cmp_ps_mask(v, r, _CMP_GT_OQ) : _mm512_cmp_ps_mask(v, r, _CMP_LT_OQ);
  return _mm512_mask_blend_ps(beats | _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), r, v);
}
template <bool kMax> float extreme_f32x16(const float* s, int64_t n, float a) {
  __m512 acc[4];
  for (__m512& r : acc) r = _mm512_set1_ps(a);
  int64_t k = 0;
  for (; k + 64 <= n; k += 64)
    for (int u = 0; u < 4; ++u)
      acc[u] = extreme_step<kMax>(acc[u], _mm512_loadu_ps(s + k + 16 * u));
  for (; k + 16 <= n; k += 16) acc[0] = extreme_step<kMax>(acc[0], _mm512_loadu_ps(s + k));
  alignas(64) float lanes[64];
  for (int u = 0; u < 4; ++u) _mm512_store_ps(lanes + 16 * u, acc[u]);
  for (float l : lanes)
    if (takes<kMax>(l, a)) a = l;
  for (; k < n; ++k)
    if (takes<kMax>(s[k], a)) a = s[k];
  return a;
}
#pragma GCC pop_options
#endif

// Adds reduced elements [r0, r1) of the row starting at x into acc[0..width) (lanes j of x).
template <typename T, typename Op>
void reduce_range(const ReducePlan& p, const Op& op, const T* x, int64_t r0, int64_t r1,
                  typename Op::Acc* acc, int64_t width) {
  using Acc = typename Op::Acc;
  for_runs(p, r0, r1, [&](int64_t off, int64_t len) {
    const T* s = x + off;
    if (p.lanes > 1) {
      for (int64_t k = 0; k < len; ++k, s += p.run_stride)
        for (int64_t j = 0; j < width; ++j) op.add(acc[j], s[j]);
      return;
    }
#ifdef KILN_REDUCE_AVX512
    if constexpr (std::is_same_v<T, float> && requires { Op::kIsMax; })
      if (len >= 64 && cpu_isa() == CpuIsa::avx512) {
        acc[0] = extreme_f32x16<Op::kIsMax>(s, len, acc[0]);
        return;
      }
#endif
    // eight independent accumulators hide the latency of the add chain
    Acc part[8];
    std::fill(part, part + 8, op.init());
    int64_t k = 0;
    for (; k + 8 <= len; k += 8)
      for (int u = 0; u < 8; ++u) op.add(part[u], s[k + u]);
    for (; k < len; ++k) op.add(part[0], s[k]);
    for (int u = 0; u < 8; ++u) op.merge(acc[0], part[u]);
  });
}

template <typename T, typename Op> void reduce_with(KernelContext& ctx, const Op& op) {
  using Acc = typename Op::Acc;
  const T* x = ctx.in(0).ptr<T>();
  T* y = ctx.out(0).ptr<T>();
  ReduceParams spare;
  const ReducePlan p = plan_reduce(ctx.in(0).shape, params_of(ctx, spare).axes);
  if (p.count == 0) {
    std::fill(y, y + ctx.out(0).numel(), op.finish(op.init(), 0));
    return;
  }
  const ReduceTasks cut = cut_tasks(p);
  const int64_t block = std::min(p.lanes, kLaneBlock), splits = cut.splits;
  std::vector<Acc> partial(splits > 1 ? static_cast<size_t>(p.rows * cut.count() * block) : 0);
  const int64_t work = std::max<int64_t>(1, p.count / splits * block);
  ctx.parallel_for(p.rows * cut.count(), std::max<int64_t>(1, 32768 / work),
                   [&](int64_t t0, int64_t t1) {
    std::unique_ptr<Acc[]> acc(new Acc[block]);  // not a vector: Acc may be bool
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t row = t / cut.count(), j0 = t / splits % cut.blocks * block, s = t % splits;
      const int64_t width = std::min(block, p.lanes - j0);
      std::fill(acc.get(), acc.get() + width, op.init());
      reduce_range(p, op, x + offset_of(row, p.row_sizes, p.row_strides) + j0,
                   p.count * s / splits, p.count * (s + 1) / splits, acc.get(), width);
      if (splits > 1) {
        std::copy(acc.get(), acc.get() + width, partial.begin() + t * block);
        continue;
      }
      for (int64_t j = 0; j < width; ++j) y[row * p.lanes + j0 + j] = op.finish(acc[j], p.count);
    }
  });
  if (splits == 1) return;
  // merge the partial results of each output in split order
  for (int64_t unit = 0; unit < p.rows * cut.blocks; ++unit) {
    const int64_t j0 = unit % cut.blocks * block, width = std::min(block, p.lanes - j0);
    for (int64_t j = 0; j < width; ++j) {
      Acc a = partial[unit * splits * block + j];
      for (int64_t s = 1; s < splits; ++s) op.merge(a, partial[(unit * splits + s) * block + j]);
      y[unit / cut.blocks * p.lanes + j0 + j] = op.finish(a, p.count);
    }
  }
}

// ---- reduction ops: init, add one element, merge two partials, finish ----

template <typename T>
using WideAcc = std::conditional_t<std::is_floating_point_v<T>, double, uint64_t>;

template <typename T> struct SumOp {
  using Acc = WideAcc<T>;
  Acc init() const { return 0; }
  void add(Acc& a, T x) const { a += static_cast<Acc>(x); }
  void merge(Acc& a, Acc b) const { a += b; }
  T finish(Acc a, int64_t) const { return static_cast<T>(a); }
};
template <typename T> struct ProdOp {
  using Acc = WideAcc<T>;
  Acc init() const { return 1; }
  void add(Acc& a, T x) const { a *= static_cast<Acc>(x); }
  void merge(Acc& a, Acc b) const { a *= b; }
  T finish(Acc a, int64_t) const { return static_cast<T>(a); }
};
template <typename T> struct MeanOp : SumOp<T> {
  T finish(double a, int64_t n) const { return static_cast<T>(a / static_cast<double>(n)); }
};
template <typename T> struct NormL1Op : SumOp<T> {
  void add(double& a, T x) const { a += std::abs(static_cast<double>(x)); }
};
template <typename T> struct NormL2Op : SumOp<T> {
  void add(double& a, T x) const { a += static_cast<double>(x) * static_cast<double>(x); }
  T finish(double a, int64_t) const { return static_cast<T>(std::sqrt(a)); }
};

// Max (kMax) or min; NaN wins, as in numpy and PyTorch.
template <typename T, bool kMax> struct ExtremeOp {
  using Acc = T;
  static constexpr bool kIsMax = kMax;
  Acc init() const {
    if constexpr (std::is_floating_point_v<T>)
      return kMax ? -std::numeric_limits<T>::infinity() : std::numeric_limits<T>::infinity();
    else
      return kMax ? std::numeric_limits<T>::lowest() : std::numeric_limits<T>::max();
  }
  void add(Acc& a, T x) const { a = takes<kMax>(x, a) ? x : a; }
  void merge(Acc& a, Acc b) const { add(a, b); }
  T finish(Acc a, int64_t) const { return a; }
};

// Welford's running mean and sum of squared deviations; partials merge with Chan's formula.
struct Moments {
  double n = 0, mean = 0, m2 = 0;
};
template <typename T> struct VarianceOp {
  using Acc = Moments;
  int64_t correction = 0;
  Acc init() const { return {}; }
  void add(Acc& a, T x) const {
    a.n += 1;
    const double d = static_cast<double>(x) - a.mean;
    a.mean += d / a.n;
    a.m2 += d * (static_cast<double>(x) - a.mean);
  }
  void merge(Acc& a, const Acc& b) const {
    if (b.n == 0) return;
    if (a.n == 0) {
      a = b;
      return;
    }
    const double n = a.n + b.n, d = b.mean - a.mean;
    a.mean += d * b.n / n;
    a.m2 += b.m2 + d * d * a.n * b.n / n;
    a.n = n;
  }
  T finish(const Acc& a, int64_t n) const {
    return static_cast<T>(a.m2 / static_cast<double>(std::max<int64_t>(n - correction, 0)));
  }
};

// Running maximum m and sum s of exp(x - m).
struct ExpSum {
  double m = -std::numeric_limits<double>::infinity(), s = 0;
};
template <typename T> struct LogsumexpOp {
  using Acc = ExpSum;
  Acc init() const { return {}; }
  void add(Acc& a, T x) const { merge(a, {static_cast<double>(x), 1.0}); }
  void merge(Acc& a, const Acc& b) const {
    if (b.m > a.m) {
      a.s = a.s * std::exp(a.m - b.m) + b.s;
      a.m = b.m;
    } else if (b.m == a.m) {
      a.s += b.s;  // also covers infinities, where m - m is NaN
    } else if (b.m < a.m) {
      a.s += b.s * std::exp(b.m - a.m);
    } else if (b.s != 0) {
      a.m = std::numeric_limits<double>::quiet_NaN();  // b.m is NaN
    }
  }
  T finish(const Acc& a, int64_t) const { return static_cast<T>(a.m + std::log(a.s)); }
};

template <template <typename> class Op> void reduce_any(KernelContext& ctx) {
  dispatch(ctx.in(0).dtype, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    if constexpr (!std::is_same_v<T, bool>) reduce_with<T>(ctx, Op<T>{});
  });
}
template <template <typename> class Op> void reduce_float(KernelContext& ctx) {
  dispatch_float(ctx.in(0).dtype, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    reduce_with<T>(ctx, Op<T>{});
  });
}
template <bool kMax> void reduce_extreme(KernelContext& ctx) {
  dispatch(ctx.in(0).dtype, ctx.op_name(),
           [&](auto t) { reduce_with<decltype(t)>(ctx, ExtremeOp<decltype(t), kMax>{}); });
}

void sum(KernelContext& ctx) { reduce_any<SumOp>(ctx); }
void prod(KernelContext& ctx) { reduce_any<ProdOp>(ctx); }
void mean(KernelContext& ctx) { reduce_float<MeanOp>(ctx); }
void norm_l1(KernelContext& ctx) { reduce_float<NormL1Op>(ctx); }
void norm_l2(KernelContext& ctx) { reduce_float<NormL2Op>(ctx); }
void logsumexp(KernelContext& ctx) { reduce_float<LogsumexpOp>(ctx); }
void max(KernelContext& ctx) { reduce_extreme<true>(ctx); }
void min(KernelContext& ctx) { reduce_extreme<false>(ctx); }
void variance(KernelContext& ctx) {
  ReduceParams spare;
  dispatch_float(ctx.in(0).dtype, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    reduce_with<T>(ctx, VarianceOp<T>{.correction = params_of(ctx, spare).correction});
  });
}

// ---- single-axis ops over an (outer, n, inner) view ----

struct AxisView {
  int64_t outer = 1, n = 1, inner = 1;
};
AxisView axis_view(const Shape& s, int64_t axis) {
  AxisView v;
  for (int64_t d = 0; d < static_cast<int64_t>(s.size()); ++d) {
    if (d < axis) v.outer *= s[d];
    else if (d == axis) v.n = s[d];
    else v.inner *= s[d];
  }
  return v;
}
constexpr int64_t kColumns = 256;  // inner elements one task carries along the axis
int64_t column_grain(const AxisView& v) {
  return std::max<int64_t>(1, 16384 / std::max<int64_t>(1, v.n * std::min(v.inner, kColumns)));
}

// Whether x replaces the current best (strictly better: the first occurrence wins; NaN wins).
template <bool kMax, typename T> bool better(T x, T best) {
  if constexpr (std::is_floating_point_v<T>) {
    if (std::isnan(best)) return false;
    if (std::isnan(x)) return true;
  }
  return kMax ? x > best : x < best;
}

template <bool kMax> void arg_reduce(KernelContext& ctx) {
  const AxisView v = axis_view(ctx.in(0).shape, params_of<ReduceAxisParams>(ctx).axis);
  int64_t* y = ctx.out(0).ptr<int64_t>();
  const int64_t blocks = (v.inner + kColumns - 1) / kColumns;
  dispatch(ctx.in(0).dtype, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    const T* x = ctx.in(0).ptr<T>();
    if (v.inner == 1) {  // contiguous rows: one plain scan each
      ctx.parallel_for(v.outer, std::max<int64_t>(1, 16384 / v.n), [&](int64_t o0, int64_t o1) {
        for (int64_t o = o0; o < o1; ++o) {
          const T* row = x + o * v.n;
          T best = row[0];
          int64_t where = 0;
          for (int64_t i = 1; i < v.n; ++i) {
            if (!better<kMax>(row[i], best)) continue;
            best = row[i];
            where = i;
          }
          y[o] = where;
        }
      });
      return;
    }
    ctx.parallel_for(v.outer * blocks, column_grain(v), [&](int64_t t0, int64_t t1) {
      T best[kColumns];
      for (int64_t task = t0; task < t1; ++task) {
        const int64_t o = task / blocks, c0 = task % blocks * kColumns;
        const int64_t w = std::min(kColumns, v.inner - c0);
        const T* base = x + o * v.n * v.inner + c0;
        int64_t* arg = y + o * v.inner + c0;
        std::copy(base, base + w, best);
        std::fill(arg, arg + w, 0);
        for (int64_t i = 1; i < v.n; ++i) {
          const T* row = base + i * v.inner;
          for (int64_t j = 0; j < w; ++j) {
            if (!better<kMax>(row[j], best[j])) continue;
            best[j] = row[j];
            arg[j] = i;
          }
        }
      }
    });
  });
}
void argmax(KernelContext& ctx) { arg_reduce<true>(ctx); }
void argmin(KernelContext& ctx) { arg_reduce<false>(ctx); }

void cumsum(KernelContext& ctx) {
  const ReduceAxisParams a = params_of<ReduceAxisParams>(ctx);
  const AxisView v = axis_view(ctx.in(0).shape, a.axis);
  const bool exclusive = a.exclusive, reverse = a.reverse;
  const int64_t blocks = (v.inner + kColumns - 1) / kColumns;
  dispatch(ctx.in(0).dtype, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    using Acc = WideAcc<T>;
    const T* x = ctx.in(0).ptr<T>();
    T* y = ctx.out(0).ptr<T>();
    if (v.inner == 1) {  // contiguous rows: one plain scan each
      ctx.parallel_for(v.outer, std::max<int64_t>(1, 16384 / v.n), [&](int64_t o0, int64_t o1) {
        for (int64_t o = o0; o < o1; ++o) {
          Acc acc = 0;
          for (int64_t s = 0; s < v.n; ++s) {
            const int64_t i = o * v.n + (reverse ? v.n - 1 - s : s);
            const Acc before = acc;
            acc += static_cast<Acc>(x[i]);
            y[i] = static_cast<T>(exclusive ? before : acc);
          }
        }
      });
      return;
    }
    ctx.parallel_for(v.outer * blocks, column_grain(v), [&](int64_t t0, int64_t t1) {
      Acc acc[kColumns];
      for (int64_t task = t0; task < t1; ++task) {
        const int64_t o = task / blocks, c0 = task % blocks * kColumns;
        const int64_t w = std::min(kColumns, v.inner - c0);
        std::fill(acc, acc + w, Acc{0});
        for (int64_t s = 0; s < v.n; ++s) {
          const int64_t off = (o * v.n + (reverse ? v.n - 1 - s : s)) * v.inner + c0;
          for (int64_t j = 0; j < w; ++j) {
            const Acc before = acc[j];
            acc[j] += static_cast<Acc>(x[off + j]);
            y[off + j] = static_cast<T>(exclusive ? before : acc[j]);
          }
        }
      }
    });
  });
}

}  // namespace

void register_reduce_kernels() {
  const DTypeSet numeric = kNumericTypes;
  register_kernel(OpId::Sum, Backend::cpu, {sum, numeric});
  register_kernel(OpId::Prod, Backend::cpu, {prod, numeric});
  register_kernel(OpId::Mean, Backend::cpu, {mean, kFloatTypes});
  register_kernel(OpId::NormL1, Backend::cpu, {norm_l1, kFloatTypes});
  register_kernel(OpId::NormL2, Backend::cpu, {norm_l2, kFloatTypes});
  register_kernel(OpId::Logsumexp, Backend::cpu, {logsumexp, kFloatTypes});
  register_kernel(OpId::Variance, Backend::cpu, {variance, kFloatTypes});
  register_kernel(OpId::Max, Backend::cpu, {max, kAllTypes});
  register_kernel(OpId::Min, Backend::cpu, {min, kAllTypes});
  register_kernel(OpId::Argmax, Backend::cpu, {argmax, kAllTypes});
  register_kernel(OpId::Argmin, Backend::cpu, {argmin, kAllTypes});
  register_kernel(OpId::Cumsum, Backend::cpu, {cumsum, numeric});
}

}  // namespace kiln::cpu
