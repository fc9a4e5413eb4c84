// CUDA kernels of the transform family that sort: topk, sort, argsort, and scatter_elements (which
// sorts its targets to apply duplicates in index order, as the CPU does). All sorting is one
// stable LSD radix sort (cub::DeviceRadixSort) of 64-bit keys with the flat position as value:
// values map to unsigned keys whose order is the CPU's order (NaN above every number, -0 == +0,
// descending by inverting the key), and the line index sits in the key's high bits, so one
// device-wide sort orders every line at once and ties keep index order.
#include <algorithm>
#include <cub/device/device_radix_sort.cuh>
#include <string>

#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/kernels.h"
#include "ops/transform_params.h"

namespace kiln::cuda {

// Defined in transform_index.cu.
const int64_t* indices_as_i64(KernelContext& ctx, const TensorView& idx);
BroadcastIndex elements_index(const Shape& idx, const Shape& x, int axis, const char* op);
void register_transform_sort_kernels();

namespace {

#define KILN_GRID_LOOP(i, n)                                                      \
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < (n);      \
       i += int64_t{gridDim.x} * blockDim.x)

// Number of bits needed to write v.
int bits_for(uint64_t v) {
  int b = 0;
  while (b < 64 && (v >> b) != 0) ++b;
  return b;
}

/// Scratch buffers of a key/value radix sort, sorted in place (results in keys()/values()).
class RadixSort {
 public:
  RadixSort(KernelContext& ctx, int64_t n) : ctx_(ctx), n_(n) {
    auto* k = static_cast<uint64_t*>(ctx.scratch(2 * static_cast<size_t>(n) * sizeof(uint64_t)));
    auto* v = static_cast<int64_t*>(ctx.scratch(2 * static_cast<size_t>(n) * sizeof(int64_t)));
    keys_ = cub::DoubleBuffer<uint64_t>(k, k + n);
    values_ = cub::DoubleBuffer<int64_t>(v, v + n);
  }
  uint64_t* keys() { return keys_.Current(); }
  int64_t* values() { return values_.Current(); }
  /// Stable sort by bits [0, end_bit) of the keys.
  void sort(int end_bit) {
    if (end_bit <= 0 || n_ <= 1) return;
    const cudaStream_t s = stream_of(ctx_);
    size_t bytes = 0;
    KILN_CUDA_CHECK(
        cub::DeviceRadixSort::SortPairs(nullptr, bytes, keys_, values_, n_, 0, end_bit, s));
    void* temp = ctx_.scratch(std::max<size_t>(bytes, 1));
    KILN_CUDA_CHECK(
        cub::DeviceRadixSort::SortPairs(temp, bytes, keys_, values_, n_, 0, end_bit, s));
  }

 private:
  KernelContext& ctx_;
  int64_t n_;
  cub::DoubleBuffer<uint64_t> keys_;
  cub::DoubleBuffer<int64_t> values_;
};

// ---- topk, sort, argsort

// An unsigned key of sizeof(T) * 8 bits whose order is the CPU's `less`: NaN above every number
// (all NaNs equal), -0 equal to +0.
template <typename T> __device__ inline uint64_t ordered_key(T v) {
  if constexpr (std::is_same_v<T, float>) {
    uint32_t b = __float_as_uint(v);
    if (v != v) return 0xFFFFFFFFull;
    if (b == 0x80000000u) b = 0;
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
  } else if constexpr (std::is_same_v<T, double>) {
    uint64_t b = static_cast<uint64_t>(__double_as_longlong(v));
    const uint64_t sign = uint64_t{1} << 63;
    if (v != v) return ~uint64_t{0};
    if (b == sign) b = 0;
    return (b & sign) ? ~b : (b | sign);
  } else if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bf16_t>) {
    uint32_t b;
    uint32_t inf;
    if constexpr (std::is_same_v<T, half>) {
      b = __half_as_ushort(v);
      inf = 0x7C00u;
    } else {
      b = __bfloat16_as_ushort(v);
      inf = 0x7F80u;
    }
    if ((b & 0x7FFFu) > inf) return 0xFFFFull;
    if (b == 0x8000u) b = 0;
    return (b & 0x8000u) ? (~b & 0xFFFFu) : (b | 0x8000u);
  } else if constexpr (std::is_same_v<T, bool>) {
    return v ? 1 : 0;
  } else if constexpr (std::is_signed_v<T>) {
    using U = std::make_unsigned_t<T>;
    constexpr U sign = static_cast<U>(U{1} << (sizeof(T) * 8 - 1));
    return static_cast<U>(static_cast<U>(v) ^ sign);
  } else {
    return v;
  }
}

// Keys of x's lines laid out line by line (t = line * n + j). key_bits: the ordered key's width;
// line_shift: where the line index goes (64: left out, for a second pass).
template <typename T>
__global__ void line_keys_kernel(const T* __restrict__ x, uint64_t* __restrict__ keys,
                                 int64_t* __restrict__ values, int64_t total, int64_t n,
                                 int64_t inner, int key_bits, int line_shift, bool descending) {
  const uint64_t mask = key_bits == 64 ? ~uint64_t{0} : (uint64_t{1} << key_bits) - 1;
  KILN_GRID_LOOP(t, total) {
    const int64_t l = t / n, j = t - l * n;
    uint64_t k = ordered_key(x[(l / inner * n + j) * inner + l % inner]);
    if (descending) k = ~k & mask;
    if (line_shift < 64) k |= static_cast<uint64_t>(l) << line_shift;
    keys[t] = k;
    values[t] = t;
  }
}

// Second pass when the line index does not fit beside the key: a stable sort by line only.
__global__ void line_only_keys_kernel(uint64_t* __restrict__ keys,
                                      const int64_t* __restrict__ values, int64_t total,
                                      int64_t n) {
  KILN_GRID_LOOP(i, total) keys[i] = static_cast<uint64_t>(values[i] / n);
}

// Writes the first k of each sorted line: values (if given) and positions along the axis (if
// given) into outputs of (outer, k, inner).
template <typename U>
__global__ void emit_sorted_kernel(const U* __restrict__ x, const int64_t* __restrict__ order,
                                   U* __restrict__ vals, int64_t* __restrict__ idx, int64_t total,
                                   int64_t n, int64_t inner, int64_t k) {
  KILN_GRID_LOOP(s, total) {
    const int64_t l = s / n, r = s - l * n;
    if (r >= k) continue;
    const int64_t j = order[s] - l * n, o = l / inner, i = l % inner;
    const int64_t dst = (o * k + r) * inner + i;
    if (vals) vals[dst] = x[(o * n + j) * inner + i];
    if (idx) idx[dst] = j;
  }
}

// Orders every line of x along `axis` (stable; descending keeps ties in index order) and writes
// the first k of each: values to `vals`, positions to `idx` (either may be null).
void sort_lines(KernelContext& ctx, const TensorView& x, int axis, bool descending, int64_t k,
                void* vals, int64_t* idx) {
  const AxisSplit v = split_at(x.shape, axis);
  const int64_t total = x.numel(), lines = v.outer * v.inner;
  if (total == 0 || k == 0) return;
  const cudaStream_t s = stream_of(ctx);
  const int key_bits = static_cast<int>(size_of(x.dtype)) * 8;
  const int line_bits = bits_for(static_cast<uint64_t>(lines - 1));
  const bool one_pass = key_bits + line_bits <= 64;
  RadixSort rs(ctx, total);
  dispatch(x.dtype, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    line_keys_kernel<T><<<blocks_for(total), kThreads, 0, s>>>(
        x.ptr<T>(), rs.keys(), rs.values(), total, v.len, v.inner, key_bits,
        one_pass && line_bits > 0 ? key_bits : 64, descending);
  });
  check_launch(ctx.op_name());
  rs.sort(one_pass ? key_bits + line_bits : key_bits);
  if (!one_pass) {
    line_only_keys_kernel<<<blocks_for(total), kThreads, 0, s>>>(rs.keys(), rs.values(), total,
                                                                 v.len);
    check_launch(ctx.op_name());
    rs.sort(line_bits);
  }
  auto emit = [&](auto u) {
    using U = decltype(u);
    emit_sorted_kernel<U><<<blocks_for(total), kThreads, 0, s>>>(
        x.ptr<U>(), rs.values(), static_cast<U*>(vals), idx, total, v.len, v.inner, k);
  };
  switch (size_of(x.dtype)) {
    case 1: emit(uint8_t{}); break;
    case 2: emit(uint16_t{}); break;
    case 4: emit(uint32_t{}); break;
    default: emit(uint64_t{}); break;
  }
  check_launch(ctx.op_name());
}

void sort(KernelContext& ctx) {
  const SortParams p = params_of<SortParams>(ctx);
  const int axis = static_cast<int>(p.axis);
  sort_lines(ctx, ctx.in(0), axis, p.descending, ctx.in(0).shape[axis], ctx.out(0).data, nullptr);
}

void argsort(KernelContext& ctx) {
  const SortParams p = params_of<SortParams>(ctx);
  const int axis = static_cast<int>(p.axis);
  sort_lines(ctx, ctx.in(0), axis, p.descending, ctx.in(0).shape[axis], nullptr,
             ctx.out(0).ptr<int64_t>());
}

void topk(KernelContext& ctx) {
  const SortParams p = params_of<SortParams>(ctx);
  sort_lines(ctx, ctx.in(0), static_cast<int>(p.axis), p.descending, p.k, ctx.out(0).data,
             ctx.out(1).ptr<int64_t>());
}

// ---- scatter_elements

// Key of each update: the flat offset of its target in out, or `none` (out.numel()) for an
// out-of-range index, which sorts last, is skipped and is reported in the step's error slot
// (the runtime throws ValueError after the run, as the CPU does after its loop).
__global__ void scatter_keys_kernel(const int64_t* __restrict__ ids, uint64_t* __restrict__ keys,
                                    int64_t* __restrict__ values, BroadcastIndex lines,
                                    int64_t total, int64_t nx, int64_t stride, uint64_t none,
                                    int64_t* err) {
  KILN_GRID_LOOP(t, total) {
    int64_t j = ids[t];
    if (j < 0) j += nx;
    const bool bad = j < 0 || j >= nx;
    if (bad) report_bad_value(err, t, ids[t]);
    keys[t] = bad ? none : static_cast<uint64_t>(lines.offset(t) + j * stride);
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

// One thread per run of equal keys (one target): combines the target with its updates in index
// order, in float for half types (as the CPU, which runs them in f32), or keeps the last update.
template <typename T, Reduce R>
__global__ void scatter_apply_kernel(const uint64_t* __restrict__ keys,
                                     const int64_t* __restrict__ order, const T* __restrict__ upd,
                                     T* __restrict__ out, int64_t total, uint64_t none) {
  KILN_GRID_LOOP(i, total) {
    const uint64_t key = keys[i];
    if (key == none || (i > 0 && keys[i - 1] == key)) continue;
    int64_t e = i;
    if constexpr (R == Reduce::none) {
      while (e + 1 < total && keys[e + 1] == key) ++e;
      out[key] = upd[order[e]];
    } else {
      acc_t<T> acc = to_acc(out[key]);
      for (; e < total && keys[e] == key; ++e) acc = combine<R>(acc, to_acc(upd[order[e]]));
      out[key] = from_acc<T>(acc);
    }
  }
}

void scatter_elements(KernelContext& ctx) {
  const TensorView &x = ctx.in(0), &idx = ctx.in(1), &upd = ctx.in(2), &out = ctx.out(0);
  const cudaStream_t s = stream_of(ctx);
  const ScatterParams p = params_of<ScatterParams>(ctx);
  const int axis = static_cast<int>(p.axis);
  using Reduction = ScatterParams::Reduction;
  const size_t bytes = static_cast<size_t>(x.numel()) * size_of(x.dtype);
  if (out.data != x.data && bytes > 0)
    KILN_CUDA_CHECK(cudaMemcpyAsync(out.data, x.data, bytes, cudaMemcpyDeviceToDevice, s));
  const int64_t total = idx.numel();
  if (total == 0) return;
  const BroadcastIndex lines = elements_index(idx.shape, out.shape, axis, "scatter_elements");
  const uint64_t none = static_cast<uint64_t>(out.numel());
  const int64_t* ids = indices_as_i64(ctx, idx);
  describe_errors(ctx, ErrorKind::index_on_axis, axis, out.shape[axis]);
  RadixSort rs(ctx, total);
  scatter_keys_kernel<<<blocks_for(total), kThreads, 0, s>>>(
      ids, rs.keys(), rs.values(), lines, total, out.shape[axis],
      contiguous_strides(out.shape)[axis], none, ctx.error_slot());
  check_launch("scatter_elements");
  rs.sort(bits_for(none));
  dispatch(x.dtype, "scatter_elements", [&](auto t) {
    using T = decltype(t);
    auto run = [&](auto kernel) {
      kernel<<<blocks_for(total), kThreads, 0, s>>>(rs.keys(), rs.values(), upd.ptr<T>(),
                                                    out.ptr<T>(), total, none);
    };
    if (p.reduction == Reduction::add) run(scatter_apply_kernel<T, Reduce::add>);
    else if (p.reduction == Reduction::mul) run(scatter_apply_kernel<T, Reduce::mul>);
    else if (p.reduction == Reduction::max) run(scatter_apply_kernel<T, Reduce::max>);
    else if (p.reduction == Reduction::min) run(scatter_apply_kernel<T, Reduce::min>);
    else run(scatter_apply_kernel<T, Reduce::none>);
  });
  check_launch("scatter_elements");
}
}  // namespace
#undef KILN_GRID_LOOP

void register_transform_sort_kernels() {
  auto reg = [](OpId op, KernelFn fn) {
    register_kernel(op, Backend::cuda, {fn, kAllTypes, 0, /*half_via_f32=*/false});
  };
  reg(OpId::Topk, topk);
  reg(OpId::Sort, sort);
  reg(OpId::Argsort, argsort);
  register_kernel(OpId::ScatterElements, Backend::cuda,
                  {scatter_elements, kAllTypes, 0, /*half_via_f32=*/false, /*reports_errors=*/true});
}

}  // namespace kiln::cuda
