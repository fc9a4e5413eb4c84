// CUDA kernels of the core family: full, arange, assign, assign_slice. Semantics:
// src/backends/cpu/core.cpp.
#include <cstring>

#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/elementwise.cuh"
#include "backends/cuda/kernels.h"
#include "ops/core_params.h"

namespace kiln::cuda {

namespace {
// Fills n elements of type U (an unsigned type of the element's size) with v; 16-byte stores of
// `pattern` (v repeated) when p is 16-byte aligned.
template <typename U> __global__ void fill_kernel(U* p, int64_t n, U v, uint4 pattern, bool vec) {
  constexpr int64_t kPer = 16 / sizeof(U);
  const int64_t step = ew::grid_stride(), t = ew::thread_index();
  int64_t start = 0;
  if (vec) {
    const int64_t nv = n / kPer;
    for (int64_t i = t; i < nv; i += step) reinterpret_cast<uint4*>(p)[i] = pattern;
    start = nv * kPer;
  }
  for (int64_t i = start + t; i < n; i += step) p[i] = v;
}

template <typename U> void fill_bytes(void* data, int64_t n, U v, cudaStream_t s) {
  uint4 pattern;
  auto* words = reinterpret_cast<U*>(&pattern);
  for (size_t k = 0; k < 16 / sizeof(U); ++k) words[k] = v;
  const bool vec = ew::aligned(data, 16);
  const int64_t work = vec ? std::max<int64_t>(n * static_cast<int64_t>(sizeof(U)) / 16, 1) : n;
  fill_kernel<U><<<blocks_for(work), kThreads, 0, s>>>(static_cast<U*>(data), n, v, pattern, vec);
  check_launch("full");
}

// The value is converted on the host as the CPU kernel does (f16/bf16 through f32).
void full(KernelContext& ctx) {
  const TensorView& o = ctx.out(0);
  const int64_t n = o.numel();
  if (n == 0) return;
  const double v = params_of<FullParams>(ctx).value;
  cudaStream_t s = stream_of(ctx);
  dispatch(o.dtype, "full", [&](auto t) {
    using T = decltype(t);
    T tv;
    if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bf16_t>)
      tv = from_acc<T>(static_cast<float>(v));
    else tv = static_cast<T>(v);
    using U = std::conditional_t<
        sizeof(T) == 1, uint8_t,
        std::conditional_t<sizeof(T) == 2, uint16_t,
                           std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>>>;
    static_assert(sizeof(U) == sizeof(T));
    U bits;
    std::memcpy(&bits, &tv, sizeof(T));
    if (bits == 0) {
      KILN_CUDA_CHECK(cudaMemsetAsync(o.data, 0, static_cast<size_t>(n) * sizeof(T), s));
      return;
    }
    fill_bytes<U>(o.data, n, bits, s);
  });
}

// start + i * step in double without contraction to fma, as on the host; integers truncate to
// int64 and wrap to T, as on the host.
template <typename T> __global__ void arange_kernel(T* p, int64_t n, double start, double step) {
  const int64_t stride = ew::grid_stride();
  for (int64_t i = ew::thread_index(); i < n; i += stride) {
    const double v = __dadd_rn(start, __dmul_rn(static_cast<double>(i), step));
    if constexpr (std::is_integral_v<T>) p[i] = static_cast<T>(static_cast<int64_t>(v));
    else p[i] = ew::from_double<T>(v);
  }
}

void arange(KernelContext& ctx) {
  const TensorView& o = ctx.out(0);
  const int64_t n = o.numel();
  if (n == 0) return;
  const ArangeParams range = params_of<ArangeParams>(ctx);
  const double start = range.start, step = range.step;
  dispatch(o.dtype, "arange", [&](auto t) {
    using T = decltype(t);
    if constexpr (!std::is_same_v<T, bool>) {
      arange_kernel<T><<<blocks_for(n), kThreads, 0, stream_of(ctx)>>>(o.ptr<T>(), n, start, step);
      check_launch("arange");
    } else {
      fail<UnsupportedError>("[arange] cuda kernel got dtype bool");
    }
  });
}

// The update's shape and the variable's dims and strides, passed by value.
struct SliceDims {
  int rank = 0;
  int64_t up[kMaxRank] = {}, dim[kMaxRank] = {}, stride[kMaxRank] = {};
};

// Every thread checks every start first: one out of range is reported (by one thread) and nothing
// is written. U is an unsigned type of the element's size.
template <typename U> __global__ void assign_slice_kernel(U* var, const U* up,
                                                          const int64_t* starts, SliceDims d,
                                                          int64_t n, int64_t* errors) {
  int64_t s[kMaxRank];
  for (int k = 0; k < d.rank; ++k) {
    s[k] = starts[k];
    if (s[k] < 0 || s[k] > d.dim[k] - d.up[k]) {
      if (blockIdx.x == 0 && threadIdx.x == 0) report_bad_value(errors, k, s[k]);
      return;
    }
  }
  const int64_t step = ew::grid_stride();
  for (int64_t i = ew::thread_index(); i < n; i += step) {
    int64_t off = 0, rest = i;
    for (int k = d.rank - 1; k >= 0; --k) {
      const int64_t q = rest / d.up[k];
      off += (rest - q * d.up[k] + s[k]) * d.stride[k];
      rest = q;
    }
    var[off] = up[i];
  }
}

template <typename U> void launch_assign_slice(const TensorView& var, const TensorView& up,
                                               const int64_t* starts, const SliceDims& d,
                                               int64_t* errors, cudaStream_t s) {
  const int64_t n = up.numel();
  assign_slice_kernel<U><<<blocks_for(std::max<int64_t>(n, 1)), kThreads, 0, s>>>(
      var.ptr<U>(), up.ptr<U>(), starts, d, n, errors);
  check_launch("assign_slice");
}

// Only the update's region of the variable is written (the starts stay on the device); output 0
// is the variable's storage unless the new value is also returned (then copied there after).
void assign_slice(KernelContext& ctx) {
  const TensorView &var = ctx.in(0), &up = ctx.in(1), &out = ctx.out(0);
  if (var.rank() > kMaxRank)
    fail<UnsupportedError>("[assign_slice] cuda kernel takes rank <= {}, got {}", kMaxRank,
                           var.rank());
  SliceDims d;
  d.rank = var.rank();
  int64_t stride = 1;
  for (int k = d.rank - 1; k >= 0; --k) {
    d.up[k] = up.shape[k];
    d.dim[k] = var.shape[k];
    d.stride[k] = stride;
    stride *= var.shape[k];
  }
  describe_errors(ctx, ErrorKind::slice_start, 0, 0);
  cudaStream_t s = stream_of(ctx);
  const auto* starts = ctx.in(2).ptr<int64_t>();
  switch (size_of(var.dtype)) {
    case 1:
      launch_assign_slice<uint8_t>(var, up, starts, d, ctx.error_slot(), s);
      break;
    case 2:
      launch_assign_slice<uint16_t>(var, up, starts, d, ctx.error_slot(), s);
      break;
    case 4:
      launch_assign_slice<uint32_t>(var, up, starts, d, ctx.error_slot(), s);
      break;
    default:
      launch_assign_slice<uint64_t>(var, up, starts, d, ctx.error_slot(), s);
      break;
  }
  const size_t bytes = static_cast<size_t>(var.numel()) * size_of(var.dtype);
  if (out.data != var.data && bytes)
    KILN_CUDA_CHECK(cudaMemcpyAsync(out.data, var.data, bytes, cudaMemcpyDeviceToDevice, s));
}

// Input 0 is the variable's own storage; output 0 is the same bytes unless the new value is also
// returned (then a separate output array). Both copies are ordered on the stream.
void assign(KernelContext& ctx) {
  const TensorView &var = ctx.in(0), &val = ctx.in(1), &out = ctx.out(0);
  const size_t bytes = static_cast<size_t>(var.numel()) * size_of(var.dtype);
  if (bytes == 0) return;
  cudaStream_t s = stream_of(ctx);
  if (var.data != val.data)
    KILN_CUDA_CHECK(cudaMemcpyAsync(var.data, val.data, bytes, cudaMemcpyDeviceToDevice, s));
  if (out.data != var.data)
    KILN_CUDA_CHECK(cudaMemcpyAsync(out.data, var.data, bytes, cudaMemcpyDeviceToDevice, s));
}
}  // namespace

void register_core_kernels() {
  register_kernel(OpId::Full, Backend::cuda, {full, kAllTypes, -1, false});
  register_kernel(OpId::Arange, Backend::cuda, {arange, kNumericTypes, -1, false});
  register_kernel(OpId::Assign, Backend::cuda, {assign, kAllTypes, 0, false});
  register_kernel(OpId::AssignSlice, Backend::cuda,
                  {assign_slice, kAllTypes, 0, false, /*reports_errors=*/true});
}

}  // namespace kiln::cuda
