// CPU kernels of the transform family's indexing ops: gather, gather_elements, scatter_elements,
// one_hot, coordinate_along_axis, hamming_distance. Out-of-range indices never read or write
// out of bounds; the first one (by position) is reported after the parallel loop.
#include <bit>

#include "backends/cpu/kernels.h"
#include "backends/cpu/transform_common.h"
#include "ops/transform_params.h"

namespace kiln::cpu {

namespace {
// Calls f(T{}) with the C++ type of an integer dtype.
template <typename F> void dispatch_int(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::i8: f(int8_t{}); return;
    case DType::u8: f(uint8_t{}); return;
    case DType::i16: f(int16_t{}); return;
    case DType::i32: f(int32_t{}); return;
    case DType::i64: f(int64_t{}); return;
    case DType::u16:
      f(uint16_t{});
      return;
    case DType::u32:
      f(uint32_t{});
      return;
    case DType::u64:
      f(uint64_t{});
      return;
    default: fail<UnsupportedError>("[{}] expected an integer dtype, got {}", op, name(t));
  }
}

char* bytes(const TensorView& v) { return static_cast<char*>(v.data); }

// Indices as int64, whatever their integer dtype.
std::vector<int64_t> load_indices(const TensorView& idx) {
  std::vector<int64_t> r(static_cast<size_t>(idx.numel()));
  convert(idx.data, idx.dtype, r.data(), i64, idx.numel());
  return r;
}

// Element `pos` of an integer tensor as int64.
int64_t index_at(const TensorView& idx, int64_t pos) {
  int64_t v = 0;
  convert(static_cast<const char*>(idx.data) + pos * size_of(idx.dtype), idx.dtype, &v, i64, 1);
  return v;
}

[[noreturn]] void fail_index(const KernelContext& ctx, const TensorView& x, const TensorView& idx,
                             const FirstBadIndex& bad, int axis) {
  fail<ValueError>("[{}] index {} out of range for axis {} of size {} (x shape {}, indices shape "
                   "{})",
                   ctx.op_name(), index_at(idx, bad.pos()), axis, x.shape[axis], str(x.shape),
                   str(idx.shape));
}

// k wrapped into [0, n) when it is a valid (possibly negative) index, else -1.
inline int64_t wrap(int64_t k, int64_t n) {
  if (k < 0) k += n;
  return k >= 0 && k < n ? k : -1;
}

void gather(KernelContext& ctx) {
  const TensorView &x = ctx.in(0), &idx = ctx.in(1), &out = ctx.out(0);
  const int axis = static_cast<int>(params_of<AxisParams>(ctx).axis);
  const AxisView v(x.shape, axis);
  const int64_t m = idx.numel(), row = v.inner * static_cast<int64_t>(size_of(x.dtype));
  const auto ids = load_indices(idx);
  FirstBadIndex bad;
  ctx.parallel_for(v.outer * m, std::max<int64_t>(1, 65536 / row), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const int64_t k = wrap(ids[r % m], v.n);
      char* dst = bytes(out) + r * row;
      if (k < 0) {
        bad.record(r % m);
        std::memset(dst, 0, row);
      } else {
        std::memcpy(dst, bytes(x) + (r / m * v.n + k) * row, row);
      }
    }
  });
  if (bad.any()) fail_index(ctx, x, idx, bad, axis);
}

// Walks the lines of `idx_shape` along `axis` in parallel: f(idx_base, x_base) gets the offset of
// the line's first index and the offset in x (shape x_shape) of its element at axis coordinate 0.
template <typename F>
void for_each_line(const KernelContext& ctx, const Shape& idx_shape, const Shape& x_shape,
                   int axis, F&& f) {
  const AxisView v(idx_shape, axis);
  const auto xs = contiguous_strides(x_shape);
  const int rank = static_cast<int>(idx_shape.size());
  const int64_t grain = std::max<int64_t>(1, 4096 / std::max<int64_t>(v.n, 1));
  ctx.parallel_for(v.outer * v.inner, grain, [&](int64_t b, int64_t e) {
    for (int64_t l = b; l < e; ++l) {
      int64_t rem = l, xb = 0;
      for (int d = rank - 1; d >= 0; --d) {
        if (d == axis) continue;
        xb += rem % idx_shape[d] * xs[d];
        rem /= idx_shape[d];
      }
      f(l / v.inner * v.n * v.inner + l % v.inner, xb);
    }
  });
}

void gather_elements(KernelContext& ctx) {
  const TensorView &x = ctx.in(0), &idx = ctx.in(1), &out = ctx.out(0);
  const int axis = static_cast<int>(params_of<AxisParams>(ctx).axis);
  const int64_t n = idx.shape[axis], inner = AxisView(idx.shape, axis).inner;
  const int64_t nx = x.shape[axis], stride = contiguous_strides(x.shape)[axis];
  const auto ids = load_indices(idx);
  FirstBadIndex bad;
  dispatch_size(size_of(x.dtype), [&](auto u) {
    using U = decltype(u);
    const U* xp = x.ptr<U>();
    U* op = out.ptr<U>();
    for_each_line(ctx, idx.shape, x.shape, axis, [&](int64_t ib, int64_t xb) {
      for (int64_t k = 0; k < n; ++k) {
        const int64_t pos = ib + k * inner, j = wrap(ids[pos], nx);
        if (j < 0) bad.record(pos);
        op[pos] = j < 0 ? U{} : xp[xb + j * stride];
      }
    });
  });
  if (bad.any()) fail_index(ctx, x, idx, bad, axis);
}

enum class Reduce { none, add, mul, max, min };

template <typename T, Reduce R> T combine(T a, T b) {
  if constexpr (R == Reduce::none) return b;
  else if constexpr (R == Reduce::add) return static_cast<T>(a + b);
  else if constexpr (R == Reduce::mul) return static_cast<T>(a * b);
  else if constexpr (R == Reduce::max) return b > a ? b : a;
  else return b < a ? b : a;
}

// Lines of indices along the axis hit distinct lines of the output, so each line is written by
// one thread, in index order (the last duplicate wins for "none").
template <typename T, Reduce R>
void scatter_typed(const KernelContext& ctx, const std::vector<int64_t>& ids, int axis,
                   FirstBadIndex& bad) {
  const TensorView &idx = ctx.in(1), &upd = ctx.in(2), &out = ctx.out(0);
  const int64_t n = idx.shape[axis], inner = AxisView(idx.shape, axis).inner;
  const int64_t nx = out.shape[axis], stride = contiguous_strides(out.shape)[axis];
  const T* up = upd.ptr<T>();
  T* op = out.ptr<T>();
  for_each_line(ctx, idx.shape, out.shape, axis, [&](int64_t ib, int64_t xb) {
    for (int64_t k = 0; k < n; ++k) {
      const int64_t pos = ib + k * inner, j = wrap(ids[pos], nx);
      if (j < 0) {
        bad.record(pos);
        continue;
      }
      T& t = op[xb + j * stride];
      t = combine<T, R>(t, up[pos]);
    }
  });
}

void scatter_elements(KernelContext& ctx) {
  const TensorView &x = ctx.in(0), &idx = ctx.in(1), &out = ctx.out(0);
  const ScatterParams p = params_of<ScatterParams>(ctx);
  const int axis = static_cast<int>(p.axis);
  using Reduction = ScatterParams::Reduction;
  if (out.data != x.data) std::memcpy(out.data, x.data, x.numel() * size_of(x.dtype));
  const auto ids = load_indices(idx);
  FirstBadIndex bad;
  dispatch(x.dtype, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    if (p.reduction == Reduction::add) scatter_typed<T, Reduce::add>(ctx, ids, axis, bad);
    else if (p.reduction == Reduction::mul) scatter_typed<T, Reduce::mul>(ctx, ids, axis, bad);
    else if (p.reduction == Reduction::max) scatter_typed<T, Reduce::max>(ctx, ids, axis, bad);
    else if (p.reduction == Reduction::min) scatter_typed<T, Reduce::min>(ctx, ids, axis, bad);
    else scatter_typed<T, Reduce::none>(ctx, ids, axis, bad);
  });
  if (bad.any()) fail_index(ctx, x, idx, bad, axis);
}

void one_hot(KernelContext& ctx) {
  const TensorView &idx = ctx.in(0), &out = ctx.out(0);
  const OneHotParams p = params_of<OneHotParams>(ctx);
  const AxisView v(out.shape, static_cast<int>(p.axis));
  const double on = p.on_value, off = p.off_value;
  const auto ids = load_indices(idx);
  dispatch(out.dtype, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    T* op = out.ptr<T>();
    const int64_t block = v.n * v.inner;
    ctx.parallel_for(v.outer, std::max<int64_t>(1, 16384 / block), [&](int64_t b, int64_t e) {
      for (int64_t o = b; o < e; ++o) {
        T* base = op + o * block;
        std::fill(base, base + block, static_cast<T>(off));
        for (int64_t i = 0; i < v.inner; ++i) {
          const int64_t k = ids[o * v.inner + i];
          if (k >= 0 && k < v.n) base[k * v.inner + i] = static_cast<T>(on);
        }
      }
    });
  });
}

void coordinate_along_axis(KernelContext& ctx) {
  const TensorView& out = ctx.out(0);
  const AxisView v(out.shape, static_cast<int>(params_of<AxisParams>(ctx).axis));
  dispatch(out.dtype, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    T* op = out.ptr<T>();
    ctx.parallel_for(v.outer * v.n, std::max<int64_t>(1, 16384 / v.inner),
                     [&](int64_t b, int64_t e) {
                       for (int64_t r = b; r < e; ++r)
                         std::fill(op + r * v.inner, op + (r + 1) * v.inner,
                                   static_cast<T>(r % v.n));
                     });
  });
}

void hamming_distance(KernelContext& ctx) {
  const TensorView &a = ctx.in(0), &b = ctx.in(1), &out = ctx.out(0);
  const int64_t n = a.shape.back();
  const Shape la(a.shape.begin(), a.shape.end() - 1), lb(b.shape.begin(), b.shape.end() - 1);
  dispatch_int(a.dtype, ctx.op_name(), [&](auto ta) {
    using T = decltype(ta);
    using U = std::make_unsigned_t<T>;
    dispatch(out.dtype, ctx.op_name(), [&](auto to) {
      using O = decltype(to);
      const T *pa = a.ptr<T>(), *pb = b.ptr<T>();
      O* po = out.ptr<O>();
      for_each_broadcast<2>(ctx, out.shape, {&la, &lb},
                            [&](int64_t i, const std::array<int64_t, 2>& off) {
                              const T *ra = pa + off[0] * n, *rb = pb + off[1] * n;
                              int64_t c = 0;
                              for (int64_t k = 0; k < n; ++k)
                                c += std::popcount(static_cast<U>(ra[k] ^ rb[k]));
                              po[i] = static_cast<O>(c);
                            });
    });
  });
}
}  // namespace

void register_transform_index_kernels() {
  register_kernel(OpId::Gather, Backend::cpu, {gather, kAllTypes, 0, false});
  register_kernel(OpId::GatherElements, Backend::cpu, {gather_elements, kAllTypes, 0, false});
  register_kernel(OpId::ScatterElements, Backend::cpu, {scatter_elements, kAllTypes, 0});
  register_kernel(OpId::OneHot, Backend::cpu, {one_hot, kAllTypes, -1});
  register_kernel(OpId::CoordinateAlongAxis, Backend::cpu,
                  {coordinate_along_axis, kNumericTypes, -1});
  register_kernel(OpId::HammingDistance, Backend::cpu, {hamming_distance, kIntTypes, 0, false});
}

}  // namespace kiln::cpu
