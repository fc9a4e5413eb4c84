// CUDA kernels of the N-d indexing ops: gather_nd, scatter_nd and assign_scatter_nd. An index
// tuple (m components) addresses a slice of `slice` elements. Out-of-range components cannot throw
// from the device: gather_nd writes zeros there, scatter_nd writes nothing, and both report the
// component in the step's error slot (ErrorKind::index_tuple); the runtime throws ValueError after
// the run. scatter_nd applies repeated tuples in index order (as the CPU does): the tuples' targets
// are radix-sorted stably, and one thread per (target, slice element) combines its run in order.
#include <algorithm>
#include <cub/device/device_radix_sort.cuh>
#include <string>

#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/kernels.h"
#include "ops/transform_params.h"

namespace kiln::cuda {

// Defined in transform_index.cu.
const int64_t* indices_as_i64(KernelContext& ctx, const TensorView& idx);
void register_transform_nd_kernels();

namespace {

#define KILN_GRID_LOOP(i, n)                                                 \
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < (n); \
       i += int64_t{gridDim.x} * blockDim.x)

/// x seen as (batch, indexed dims..., slice), passed by value to kernels.
struct TupleGeometry {
  int64_t tuples = 0;  // index tuples per batch
  int64_t block = 1;   // slices per batch
  int64_t slice = 1;   // elements per slice
  int m = 0;
  int64_t dims[kMaxRank] = {}, strides[kMaxRank] = {};  // per component, strides in slices

  // Slice offset of tuple t, or -1 after reporting its first bad component.
  __device__ int64_t resolve(const int64_t* ids, int64_t t, int64_t* err) const {
    int64_t off = t / (tuples > 0 ? tuples : 1) * block;
    for (int k = 0; k < m; ++k) {
      int64_t j = ids[t * m + k];
      if (j < 0) j += dims[k];
      if (j < 0 || j >= dims[k]) {
        report_bad_value(err, t * m + k, ids[t * m + k]);
        return -1;
      }
      off += j * strides[k];
    }
    return off;
  }
};

TupleGeometry tuple_geometry(const Shape& x, const Shape& idx, int64_t b, const char* op) {
  TupleGeometry g;
  const int64_t m = idx.back();
  if (m > kMaxRank)
    fail<UnsupportedError>("[{}] cuda kernel takes index tuples of at most {} components, got {}",
                           op, kMaxRank, m);
  g.m = static_cast<int>(m);
  int64_t batch = 1;
  for (int64_t d = 0; d < b; ++d) batch *= x[d];
  for (size_t d = static_cast<size_t>(b + m); d < x.size(); ++d) g.slice *= x[d];
  for (int64_t k = m - 1; k >= 0; --k) {
    g.dims[k] = x[b + k];
    g.strides[k] = g.block;
    g.block *= x[b + k];
  }
  g.tuples = batch > 0 ? numel(idx) / m / batch : 0;
  return g;
}

template <typename U>
__global__ void gather_nd_kernel(const U* __restrict__ x, const int64_t* __restrict__ ids,
                                 U* __restrict__ out, TupleGeometry g, int64_t total,
                                 int64_t* err) {
  KILN_GRID_LOOP(i, total) {
    const int64_t t = i / g.slice, j = i - t * g.slice;
    // only the slice's first element reports, so a bad tuple is reported once
    const int64_t off = g.resolve(ids, t, j == 0 ? err : nullptr);
    out[i] = off < 0 ? U{} : x[off * g.slice + j];
  }
}

/// Calls f(U{}) with an unsigned type of one element of `bytes` bytes.
template <typename F> void dispatch_elem(size_t bytes, F&& f) {
  switch (bytes) {
    case 1: f(uint8_t{}); return;
    case 2: f(uint16_t{}); return;
    case 4: f(uint32_t{}); return;
    case 8: f(uint64_t{}); return;
    default: fail<UnsupportedError>("[gather_nd] cuda kernel got element size {}", bytes);
  }
}

void gather_nd(KernelContext& ctx) {
  const TensorView &x = ctx.in(0), &idx = ctx.in(1), &out = ctx.out(0);
  const int64_t total = out.numel();
  if (total == 0) return;
  const int64_t b = params_of<GatherNdParams>(ctx).batch_dims;
  const TupleGeometry g = tuple_geometry(x.shape, idx.shape, b, "gather_nd");
  const int64_t* ids = indices_as_i64(ctx, idx);
  describe_errors(ctx, ErrorKind::index_tuple, b, g.m);
  dispatch_elem(size_of(x.dtype), [&](auto u) {
    using U = decltype(u);
    gather_nd_kernel<U><<<blocks_for(total), kThreads, 0, stream_of(ctx)>>>(
        x.ptr<U>(), ids, out.ptr<U>(), g, total, ctx.error_slot());
  });
  check_launch("gather_nd");
}

// ---- scatter_nd

// Key of each tuple: its target slice, or `none` (slices in x) for a bad tuple, which sorts last
// and is skipped.
__global__ void scatter_nd_keys_kernel(const int64_t* __restrict__ ids,
                                       uint64_t* __restrict__ keys, int64_t* __restrict__ values,
                                       TupleGeometry g, uint64_t none, int64_t* err) {
  KILN_GRID_LOOP(t, g.tuples) {
    const int64_t off = g.resolve(ids, t, err);
    keys[t] = off < 0 ? none : static_cast<uint64_t>(off);
    values[t] = t;
  }
}

enum class Reduce { none, add, mul, max, min };

template <Reduce R, typename A> __device__ inline A combine(A a, A b) {
  if constexpr (R == Reduce::add) return static_cast<A>(a + b);
  else if constexpr (R == Reduce::mul) return static_cast<A>(a * b);
  else if constexpr (R == Reduce::max) return b > a ? b : a;
  else return b < a ? b : a;
}

// One thread per (start of a run of equal keys, slice element): combines the target element with
// its updates in index order, in float for half types, or keeps the last update.
// Nothing is written once an index was reported out of range (`err`, this step's error slot):
// assign_scatter_nd's variable stays as it was.
template <typename T, Reduce R> __global__ void scatter_nd_apply_kernel(
    const uint64_t* __restrict__ keys, const int64_t* __restrict__ order, const T* __restrict__ upd,
    T* __restrict__ out, int64_t tuples, int64_t slice, uint64_t none, const int64_t* err) {
  if (err && static_cast<uint64_t>(err[0]) != ~uint64_t{0}) return;
  KILN_GRID_LOOP(i, tuples * slice) {
    const int64_t r = i / slice, j = i - r * slice;
    const uint64_t key = keys[r];
    if (key == none || (r > 0 && keys[r - 1] == key)) continue;
    T* dst = out + static_cast<int64_t>(key) * slice + j;
    int64_t e = r;
    if constexpr (R == Reduce::none) {
      while (e + 1 < tuples && keys[e + 1] == key) ++e;
      *dst = upd[order[e] * slice + j];
    } else {
      acc_t<T> acc = to_acc(*dst);
      for (; e < tuples && keys[e] == key; ++e)
        acc = combine<R>(acc, to_acc(upd[order[e] * slice + j]));
      *dst = from_acc<T>(acc);
    }
  }
}

int bits_for(uint64_t v) {
  int b = 0;
  while (b < 64 && (v >> b) != 0) ++b;
  return b;
}

void scatter_nd(KernelContext& ctx) {
  const TensorView &x = ctx.in(0), &idx = ctx.in(1), &upd = ctx.in(2), &out = ctx.out(0);
  const cudaStream_t s = stream_of(ctx);
  const ScatterParams::Reduction r = params_of<ScatterParams>(ctx).reduction;
  using Reduction = ScatterParams::Reduction;
  const size_t bytes = static_cast<size_t>(x.numel()) * size_of(x.dtype);
  if (out.data != x.data && bytes > 0)
    KILN_CUDA_CHECK(cudaMemcpyAsync(out.data, x.data, bytes, cudaMemcpyDeviceToDevice, s));
  const TupleGeometry g = tuple_geometry(x.shape, idx.shape, 0, "scatter_nd");
  const int64_t n = g.tuples;
  if (n == 0 || g.slice == 0) return;
  const uint64_t none = static_cast<uint64_t>(g.block);
  const int64_t* ids = indices_as_i64(ctx, idx);
  describe_errors(ctx, ErrorKind::index_tuple, 0, g.m);
  // stable key/value radix sort of the targets (double buffers of 2n each)
  auto* k = static_cast<uint64_t*>(ctx.scratch(2 * static_cast<size_t>(n) * sizeof(uint64_t)));
  auto* v = static_cast<int64_t*>(ctx.scratch(2 * static_cast<size_t>(n) * sizeof(int64_t)));
  cub::DoubleBuffer<uint64_t> keys(k, k + n);
  cub::DoubleBuffer<int64_t> values(v, v + n);
  scatter_nd_keys_kernel<<<blocks_for(n), kThreads, 0, s>>>(ids, keys.Current(), values.Current(),
                                                             g, none, ctx.error_slot());
  check_launch("scatter_nd");
  const int end_bit = bits_for(none);
  if (n > 1 && end_bit > 0) {
    size_t temp_bytes = 0;
    KILN_CUDA_CHECK(
        cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys, values, n, 0, end_bit, s));
    void* temp = ctx.scratch(std::max<size_t>(temp_bytes, 1));
    KILN_CUDA_CHECK(
        cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys, values, n, 0, end_bit, s));
  }
  const int64_t total = n * g.slice;
  dispatch(x.dtype, "scatter_nd", [&](auto t) {
    using T = decltype(t);
    auto run = [&](auto kernel) {
      kernel<<<blocks_for(total), kThreads, 0, s>>>(keys.Current(), values.Current(), upd.ptr<T>(),
                                                    out.ptr<T>(), n, g.slice, none,
                                                    ctx.error_slot());
    };
    if (r == Reduction::add) run(scatter_nd_apply_kernel<T, Reduce::add>);
    else if (r == Reduction::mul) run(scatter_nd_apply_kernel<T, Reduce::mul>);
    else if (r == Reduction::max) run(scatter_nd_apply_kernel<T, Reduce::max>);
    else if (r == Reduction::min) run(scatter_nd_apply_kernel<T, Reduce::min>);
    else run(scatter_nd_apply_kernel<T, Reduce::none>);
  });
  check_launch("scatter_nd");
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
  const size_t bytes = static_cast<size_t>(var.numel()) * size_of(var.dtype);
  if (bytes > 0)
    KILN_CUDA_CHECK(
        cudaMemcpyAsync(out.data, var.data, bytes, cudaMemcpyDeviceToDevice, stream_of(ctx)));
}
}  // namespace
#undef KILN_GRID_LOOP

void register_transform_nd_kernels() {
  // both report out-of-range index components (KernelContext::error_slot)
  register_kernel(OpId::GatherNd, Backend::cuda,
                  {gather_nd, kAllTypes, 0, /*half_via_f32=*/false, /*reports_errors=*/true});
  register_kernel(OpId::ScatterNd, Backend::cuda,
                  {scatter_nd, kAllTypes, 0, /*half_via_f32=*/false, /*reports_errors=*/true});
  register_kernel(
      OpId::AssignScatterNd, Backend::cuda,
      {assign_scatter_nd, kAllTypes, 0, /*half_via_f32=*/false, /*reports_errors=*/true});
}

}  // namespace kiln::cuda
