// CPU kernels of the N-d indexing ops: gather_nd, scatter_nd and assign_scatter_nd. An index tuple
// (m components) addresses a slice of S elements; out-of-range components never read or write out
// of bounds, and the first one (by position in indices) is reported after the loop.
#include "backends/cpu/kernels.h"
#include "backends/cpu/transform_common.h"
#include "ops/transform_params.h"

namespace kiln::cpu {

namespace {

// x seen as (batch, tuple dims..., slice): the geometry both ops walk.
struct TupleGeometry {
  int64_t batch = 1;   // product of the batch dims
  int64_t tuples = 0;  // index tuples per batch
  int64_t block = 1;   // product of the indexed dims (slices per batch)
  int64_t slice = 1;   // elements per slice
  int64_t first = 0;   // the dim the first component indexes
  int64_t m = 0;       // components per tuple
  std::vector<int64_t> dims, strides;  // per component: dim size, stride in slices
  TupleGeometry(const Shape& x, const Shape& idx, int64_t b) : first(b), m(idx.back()) {
    for (int64_t d = 0; d < b; ++d) batch *= x[d];
    for (int64_t d = b + m; d < static_cast<int64_t>(x.size()); ++d) slice *= x[d];
    dims.assign(x.begin() + b, x.begin() + b + m);
    strides.assign(m, 1);
    for (int64_t k = m - 1; k >= 0; --k) {
      strides[k] = block;
      block *= dims[k];
    }
    tuples = batch > 0 && m > 0 ? numel(idx) / m / batch : 0;
  }
  // Slice offset of tuple t (global over batches), or -1 with `bad` set to the first bad
  // component's position in indices.
  int64_t resolve(const int64_t* ids, int64_t t, int64_t& bad) const {
    int64_t off = t / std::max<int64_t>(tuples, 1) * block;
    for (int64_t k = 0; k < m; ++k) {
      int64_t j = ids[t * m + k];
      if (j < 0) j += dims[k];
      if (j < 0 || j >= dims[k]) {
        bad = t * m + k;
        return -1;
      }
      off += j * strides[k];
    }
    return off;
  }
};

std::vector<int64_t> load_indices(const TensorView& idx) {
  std::vector<int64_t> r(static_cast<size_t>(idx.numel()));
  convert(idx.data, idx.dtype, r.data(), i64, idx.numel());
  return r;
}

[[noreturn]] void fail_tuple(const KernelContext& ctx, const TensorView& x, const TensorView& idx,
                             const std::vector<int64_t>& ids, const TupleGeometry& g,
                             int64_t pos) {
  const int64_t axis = g.first + pos % g.m;
  fail<ValueError>("[{}] index {} out of range for axis {} of size {} (position {} of indices "
                   "shape {}, x shape {})",
                   ctx.op_name(), ids[pos], axis, x.shape[axis], pos, str(idx.shape),
                   str(x.shape));
}

void gather_nd(KernelContext& ctx) {
  const TensorView &x = ctx.in(0), &idx = ctx.in(1), &out = ctx.out(0);
  const TupleGeometry g(x.shape, idx.shape, params_of<GatherNdParams>(ctx).batch_dims);
  const auto ids = load_indices(idx);
  const int64_t row = g.slice * static_cast<int64_t>(size_of(x.dtype));
  const auto* src = static_cast<const char*>(x.data);
  auto* dst = static_cast<char*>(out.data);
  FirstBadIndex bad;
  ctx.parallel_for(g.batch * g.tuples, std::max<int64_t>(1, 65536 / std::max<int64_t>(row, 1)),
                   [&](int64_t b, int64_t e) {
                     for (int64_t t = b; t < e; ++t) {
                       int64_t pos = 0;
                       const int64_t off = g.resolve(ids.data(), t, pos);
                       if (off < 0) {
                         bad.record(pos);
                         std::memset(dst + t * row, 0, row);
                       } else {
                         std::memcpy(dst + t * row, src + off * row, row);
                       }
                     }
                   });
  if (bad.any()) fail_tuple(ctx, x, idx, ids, g, bad.pos());
}

enum class Reduce { none, add, mul, max, min };

template <typename T, Reduce R> T combine(T a, T b) {
  constexpr bool half = std::is_same_v<T, float16_t> || std::is_same_v<T, bfloat16_t>;
  if constexpr (R == Reduce::none) return b;
  else if constexpr (half)  // (assign_scatter_nd's variables: rounded after each update)
    return T(combine<float, R>(static_cast<float>(a), static_cast<float>(b)));
  else if constexpr (R == Reduce::add) return static_cast<T>(a + b);
  else if constexpr (R == Reduce::mul) return static_cast<T>(a * b);
  else if constexpr (R == Reduce::max) return b > a ? b : a;
  else return b < a ? b : a;
}

// Tuples may repeat, so they apply in order; the slice's elements are independent and split
// across threads.
template <typename T, Reduce R>
void scatter_nd_typed(const KernelContext& ctx, const TupleGeometry& g,
                      const std::vector<int64_t>& offsets) {
  const T* up = ctx.in(2).ptr<T>();
  T* op = ctx.out(0).ptr<T>();
  const int64_t n = static_cast<int64_t>(offsets.size()), s = g.slice;
  ctx.parallel_for(s, std::max<int64_t>(1, 16384 / std::max<int64_t>(n, 1)),
                   [&](int64_t b, int64_t e) {
                     for (int64_t t = 0; t < n; ++t) {
                       if (offsets[t] < 0) continue;
                       T* dst = op + offsets[t] * s;
                       const T* src = up + t * s;
                       for (int64_t j = b; j < e; ++j) dst[j] = combine<T, R>(dst[j], src[j]);
                     }
                   });
}

void scatter_nd(KernelContext& ctx) {
  const TensorView &x = ctx.in(0), &idx = ctx.in(1), &out = ctx.out(0);
  const ScatterParams::Reduction r = params_of<ScatterParams>(ctx).reduction;
  using Reduction = ScatterParams::Reduction;
  if (out.data != x.data) std::memcpy(out.data, x.data, x.numel() * size_of(x.dtype));
  const TupleGeometry g(x.shape, idx.shape, 0);
  const auto ids = load_indices(idx);
  std::vector<int64_t> offsets(static_cast<size_t>(g.tuples));
  int64_t first_bad = -1;
  for (int64_t t = 0; t < g.tuples; ++t) {
    int64_t pos = 0;
    offsets[t] = g.resolve(ids.data(), t, pos);
    if (offsets[t] < 0 && first_bad < 0) first_bad = pos;
  }
  // nothing is written when an index is out of range (assign_scatter_nd's variable stays as it was)
  if (first_bad >= 0) fail_tuple(ctx, x, idx, ids, g, first_bad);
  // scatter_nd's halves run as f32 (half_via_f32); assign_scatter_nd writes a variable of
  // any dtype in place
  auto with_halves = [&](DType t, auto&& f) {
    if (t == f16) f(float16_t{});
    else if (t == bf16) f(bfloat16_t{});
    else dispatch(t, ctx.op_name(), f);
  };
  with_halves(x.dtype, [&](auto t) {
    using T = decltype(t);
    if (r == Reduction::add) scatter_nd_typed<T, Reduce::add>(ctx, g, offsets);
    else if (r == Reduction::mul) scatter_nd_typed<T, Reduce::mul>(ctx, g, offsets);
    else if (r == Reduction::max) scatter_nd_typed<T, Reduce::max>(ctx, g, offsets);
    else if (r == Reduction::min) scatter_nd_typed<T, Reduce::min>(ctx, g, offsets);
    else scatter_nd_typed<T, Reduce::none>(ctx, g, offsets);
  });
}

// scatter_nd into the variable's own storage (input 0), then a copy to output 0 when the new value
// is also returned (a separate array then).
void assign_scatter_nd(KernelContext& ctx) {
  const TensorView &var = ctx.in(0), &out = ctx.out(0);
  if (out.data == var.data) return scatter_nd(ctx);
  {
    KernelContext in_place(ctx, ctx.attrs(), {ctx.in(0), ctx.in(1), ctx.in(2)}, {var});
    scatter_nd(in_place);
  }
  std::memcpy(out.data, var.data, static_cast<size_t>(var.numel()) * size_of(var.dtype));
}
}  // namespace

void register_transform_nd_kernels() {
  register_kernel(OpId::GatherNd, Backend::cpu, {gather_nd, kAllTypes, 0, false});
  register_kernel(OpId::ScatterNd, Backend::cpu, {scatter_nd, kAllTypes, 0});
  register_kernel(OpId::AssignScatterNd, Backend::cpu, {assign_scatter_nd, kAllTypes, 0, false});
}

}  // namespace kiln::cpu
