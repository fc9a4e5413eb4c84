// CUDA kernels of the transform family's gather, gather_elements, one_hot, coordinate_along_axis
// and hamming_distance (the layout ops are in transform.cu).
// Out-of-range indices of gather/gather_elements cannot throw from the device: the GPU writes
// zeros there and reports the index in the step's error slot; the runtime throws ValueError
// after the run, as the CPU does after its loop.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/kernels.h"
#include "backends/cuda/transform_internal.h"
#include "kiln/array.h"
#include "ops/transform_params.h"
#include "ops/transform_util.h"

namespace kiln::cuda {

// Shared with transform_sort.cu.
const int64_t* indices_as_i64(KernelContext& ctx, const TensorView& idx);
BroadcastIndex elements_index(const Shape& idx, const Shape& x, int axis, const char* op);

namespace {

using namespace transform_detail;

/// The widest unit in {16, 8, 4, 2, 1} bytes that divides every byte count and address given.
size_t widest_unit(std::initializer_list<int64_t> byte_counts) {
  for (size_t w = 16; w > 1; w /= 2) {
    bool ok = true;
    for (int64_t c : byte_counts) ok = ok && c % static_cast<int64_t>(w) == 0;
    if (ok) return w;
  }
  return 1;
}

// ---- gather, gather_elements

template <typename I>
__global__ void to_i64_kernel(const I* __restrict__ in, int64_t* __restrict__ out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    out[i] = static_cast<int64_t>(in[i]);
}

template <typename U> __global__ void gather_kernel(const U* __restrict__ x,
                                                    const int64_t* __restrict__ ids,
                                                    U* __restrict__ out, int64_t rows, int64_t m,
                                                    int64_t nx, int64_t row_units, int64_t* err) {
  for (int64_t r = blockIdx.y * blockDim.y + threadIdx.y; r < rows;
       r += int64_t{gridDim.y} * blockDim.y) {
    int64_t k = ids[r % m];
    if (k < 0) k += nx;
    const bool bad = k < 0 || k >= nx;  // zeros here, and reported (ValueError after the run)
    if (bad && threadIdx.x == 0 && blockIdx.x == 0) report_bad_value(err, r % m, ids[r % m]);
    const U* s = x + (r / m * nx + (bad ? 0 : k)) * row_units;
    U* d = out + r * row_units;
    for (int64_t j = blockIdx.x * blockDim.x + threadIdx.x; j < row_units;
         j += int64_t{gridDim.x} * blockDim.x)
      d[j] = bad ? U{} : s[j];
  }
}

void gather(KernelContext& ctx) {
  const TensorView &x = ctx.in(0), &idx = ctx.in(1), &out = ctx.out(0);
  if (out.numel() == 0) return;
  const int axis = static_cast<int>(params_of<AxisParams>(ctx).axis);
  const AxisSplit v = split_at(x.shape, axis);
  const int64_t m = idx.numel(), row = v.inner * static_cast<int64_t>(size_of(x.dtype));
  const int64_t* ids = indices_as_i64(ctx, idx);
  describe_errors(ctx, ErrorKind::index_on_axis, axis, v.len);
  const size_t unit = widest_unit({row, addr(x.data), addr(out.data)});
  const int64_t row_units = row / static_cast<int64_t>(unit), rows = v.outer * m;
  const RowGrid g = row_grid(rows, row_units);
  dispatch_unit(unit, [&](auto u) {
    using U = decltype(u);
    gather_kernel<U><<<g.grid, g.block, 0, stream_of(ctx)>>>(x.ptr<U>(), ids, out.ptr<U>(), rows, m,
                                                             v.len, row_units, ctx.error_slot());
  });
  check_launch("gather");
}

template <typename U>
__global__ void gather_elements_kernel(const U* __restrict__ x, const int64_t* __restrict__ ids,
                                       U* __restrict__ out, BroadcastIndex lines, int64_t total,
                                       int64_t nx, int64_t stride, int64_t* err) {
  for (int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; t < total;
       t += int64_t{gridDim.x} * blockDim.x) {
    int64_t j = ids[t];
    if (j < 0) j += nx;
    const bool bad = j < 0 || j >= nx;  // zero here, and reported (ValueError after the run)
    if (bad) report_bad_value(err, t, ids[t]);
    out[t] = bad ? U{} : x[lines.offset(t) + j * stride];
  }
}

void gather_elements(KernelContext& ctx) {
  const TensorView &x = ctx.in(0), &idx = ctx.in(1), &out = ctx.out(0);
  const int64_t total = out.numel();
  if (total == 0) return;
  const int axis = static_cast<int>(params_of<AxisParams>(ctx).axis);
  const BroadcastIndex lines = elements_index(idx.shape, x.shape, axis, "gather_elements");
  const int64_t stride = contiguous_strides(x.shape)[axis];
  const int64_t* ids = indices_as_i64(ctx, idx);
  describe_errors(ctx, ErrorKind::index_on_axis, axis, x.shape[axis]);
  dispatch_elem(size_of(x.dtype), [&](auto u) {
    using U = decltype(u);
    gather_elements_kernel<U><<<blocks_for(total), kThreads, 0, stream_of(ctx)>>>(
        x.ptr<U>(), ids, out.ptr<U>(), lines, total, x.shape[axis], stride, ctx.error_slot());
  });
  check_launch("gather_elements");
}

// ---- one_hot, coordinate_along_axis, hamming_distance

template <typename T> __global__ void one_hot_kernel(const int64_t* __restrict__ ids,
                                                     T* __restrict__ out, int64_t total,
                                                     int64_t depth, int64_t inner, T on, T off) {
  for (int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; t < total;
       t += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = t / inner, i = t - r * inner, o = r / depth, k = r - o * depth;
    out[t] = ids[o * inner + i] == k ? on : off;  // indices outside [0, depth) match no k
  }
}

void one_hot(KernelContext& ctx) {
  const TensorView &idx = ctx.in(0), &out = ctx.out(0);
  const int64_t total = out.numel();
  if (total == 0) return;
  const OneHotParams p = params_of<OneHotParams>(ctx);
  const AxisSplit v = split_at(out.shape, p.axis);
  const double on = p.on_value, off = p.off_value;
  const int64_t* ids = indices_as_i64(ctx, idx);
  dispatch(out.dtype, "one_hot", [&](auto t) {
    using T = decltype(t);
    // half types go through f32 as on the CPU
    const T on_t = from_acc<T>(static_cast<acc_t<T>>(on)),
            off_t = from_acc<T>(static_cast<acc_t<T>>(off));
    one_hot_kernel<T><<<blocks_for(total), kThreads, 0, stream_of(ctx)>>>(
        ids, out.ptr<T>(), total, v.len, v.inner, on_t, off_t);
  });
  check_launch("one_hot");
}

template <typename T>
__global__ void coordinate_kernel(T* __restrict__ out, int64_t total, int64_t n, int64_t inner) {
  for (int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; t < total;
       t += int64_t{gridDim.x} * blockDim.x)
    out[t] = from_acc<T>(static_cast<acc_t<T>>(t / inner % n));
}

void coordinate_along_axis(KernelContext& ctx) {
  const TensorView& out = ctx.out(0);
  const int64_t total = out.numel();
  if (total == 0) return;
  const AxisSplit v = split_at(out.shape, params_of<AxisParams>(ctx).axis);
  dispatch(out.dtype, "coordinate_along_axis", [&](auto t) {
    using T = decltype(t);
    if constexpr (std::is_same_v<T, bool>)  // inference takes numeric dtypes only
      fail<UnsupportedError>("[coordinate_along_axis] cuda kernel got dtype bool");
    else
      coordinate_kernel<T>
          <<<blocks_for(total), kThreads, 0, stream_of(ctx)>>>(out.ptr<T>(), total, v.len, v.inner);
  });
  check_launch("coordinate_along_axis");
}

__device__ inline int popc_xor(uint8_t a, uint8_t b) { return __popc(uint32_t{a} ^ b); }
__device__ inline int popc_xor(uint16_t a, uint16_t b) { return __popc(uint32_t{a} ^ b); }
__device__ inline int popc_xor(uint32_t a, uint32_t b) { return __popc(a ^ b); }
__device__ inline int popc_xor(uint64_t a, uint64_t b) { return __popcll(a ^ b); }
__device__ inline int popc_xor(uint4 a, uint4 b) {
  return __popc(a.x ^ b.x) + __popc(a.y ^ b.y) + __popc(a.z ^ b.z) + __popc(a.w ^ b.w);
}

// Bit counts do not depend on how a row's bytes group into elements, so rows are read in the
// widest unit their length and alignment allow.
template <typename U, typename O>
__global__ void hamming_kernel(const U* __restrict__ a, const U* __restrict__ b,
                               O* __restrict__ out, BroadcastIndex ia, BroadcastIndex ib,
                               int64_t total, int64_t units) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const U *ra = a + ia.offset(i) * units, *rb = b + ib.offset(i) * units;
    int64_t c = 0;
    for (int64_t k = 0; k < units; ++k) c += popc_xor(ra[k], rb[k]);
    out[i] = from_acc<O>(c);
  }
}

void hamming_distance(KernelContext& ctx) {
  const TensorView &a = ctx.in(0), &b = ctx.in(1), &out = ctx.out(0);
  const int64_t total = out.numel();
  if (total == 0) return;
  const int64_t row = a.shape.back() * static_cast<int64_t>(size_of(a.dtype));
  const Shape la(a.shape.begin(), a.shape.end() - 1), lb(b.shape.begin(), b.shape.end() - 1);
  const BroadcastIndex ia = make_broadcast_index(la, out.shape, "hamming_distance");
  const BroadcastIndex ib = make_broadcast_index(lb, out.shape, "hamming_distance");
  const size_t unit = widest_unit({row, addr(a.data), addr(b.data)});
  const int64_t units = row / static_cast<int64_t>(unit);
  dispatch_unit(unit, [&](auto u) {
    using U = decltype(u);
    auto run = [&](auto o) {
      using O = decltype(o);
      hamming_kernel<U, O><<<blocks_for(total), kThreads, 0, stream_of(ctx)>>>(
          a.ptr<U>(), b.ptr<U>(), out.ptr<O>(), ia, ib, total, units);
    };
    switch (out.dtype) {
      case DType::i8:
        run(int8_t{});
        break;
      case DType::u8:
        run(uint8_t{});
        break;
      case DType::i16:
        run(int16_t{});
        break;
      case DType::i32:
        run(int32_t{});
        break;
      case DType::i64:
        run(int64_t{});
        break;
      case DType::u16:
        run(uint16_t{});
        break;
      case DType::u32:
        run(uint32_t{});
        break;
      case DType::u64:
        run(uint64_t{});
        break;
      case DType::f32:
        run(float{});
        break;
      case DType::f64:
        run(double{});
        break;
      default:
        fail<UnsupportedError>("[hamming_distance] cuda kernel got result dtype {}",
                               name(out.dtype));
    }
  });
  check_launch("hamming_distance");
}
}  // namespace

const int64_t* indices_as_i64(KernelContext& ctx, const TensorView& idx) {
  const int64_t n = idx.numel();
  if (idx.dtype == DType::i64 || n == 0) return idx.ptr<int64_t>();
  auto* out = static_cast<int64_t*>(ctx.scratch(static_cast<size_t>(n) * sizeof(int64_t)));
  auto run = [&](auto i) {
    using I = decltype(i);
    to_i64_kernel<I><<<blocks_for(n), kThreads, 0, stream_of(ctx)>>>(idx.ptr<I>(), out, n);
  };
  switch (idx.dtype) {
    case DType::i8:
      run(int8_t{});
      break;
    case DType::u8:
      run(uint8_t{});
      break;
    case DType::i16:
      run(int16_t{});
      break;
    case DType::i32:
      run(int32_t{});
      break;
    case DType::u16:
      run(uint16_t{});
      break;
    case DType::u32:
      run(uint32_t{});
      break;
    case DType::u64:  // (past INT64_MAX, an index out of range)
      run(uint64_t{});
      break;
    default:
      fail<UnsupportedError>("[{}] indices must have an integer dtype, got {}", ctx.op_name(),
                             name(idx.dtype));
  }
  check_launch(ctx.op_name());
  return out;
}

BroadcastIndex elements_index(const Shape& idx, const Shape& x, int axis, const char* op) {
  if (idx.size() > kMaxRank)
    fail<UnsupportedError>("[{}] cuda kernel takes rank <= {}, got {}", op, kMaxRank, idx.size());
  BroadcastIndex b;
  b.rank = static_cast<int>(idx.size());
  const auto xs = contiguous_strides(x);
  for (int d = 0; d < b.rank; ++d) {
    b.dims[d] = idx[d];
    b.strides[d] = d == axis ? 0 : xs[d];
  }
  return b;
}

void register_transform_index_kernels() {
  auto reg = [](OpId op, KernelFn fn, DTypeSet types = kAllTypes, int dtype_input = 0) {
    register_kernel(op, Backend::cuda, {fn, types, dtype_input, /*half_via_f32=*/false});
  };
  // gather and gather_elements report out-of-range indices (KernelContext::error_slot)
  for (OpId op : {OpId::Gather, OpId::GatherElements})
    register_kernel(op, Backend::cuda,
                    {op == OpId::Gather ? gather : gather_elements, kAllTypes, 0, false, true});
  reg(OpId::OneHot, one_hot, kAllTypes, -1);
  reg(OpId::CoordinateAlongAxis, coordinate_along_axis, kNumericTypes, -1);
  reg(OpId::HammingDistance, hamming_distance, kIntTypes);
}

}  // namespace kiln::cuda
