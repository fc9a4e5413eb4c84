// Helpers shared by the CUDA kernels: dtype dispatch over device types, float conversion of half
// types, launch shapes, broadcast indexing and the launch check. Included by .cu files only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <type_traits>

#include "backends/cuda/cuda_check.h"
#include "core/errors.h"
#include "core/op_id.h"
#include "kiln/kernel.h"

namespace kiln::cuda {

using half = __half;
using bf16_t = __nv_bfloat16;

inline cudaStream_t stream_of(const KernelContext& ctx) {
  return static_cast<cudaStream_t>(ctx.stream());
}

/// Calls f(T{}) with the device type of `t`: float, double, half, bf16_t, ints, bool.
template <typename F> void dispatch(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::f32: f(float{}); return;
    case DType::f16: f(half{}); return;
    case DType::bf16: f(bf16_t{}); return;
    case DType::f64: f(double{}); return;
    case DType::i8: f(int8_t{}); return;
    case DType::u8: f(uint8_t{}); return;
    case DType::i16: f(int16_t{}); return;
    case DType::i32: f(int32_t{}); return;
    case DType::i64: f(int64_t{}); return;
    case DType::boolean: f(bool{}); return;
    case DType::u16:
      f(uint16_t{});
      return;
    case DType::u32:
      f(uint32_t{});
      return;
    case DType::u64:
      f(uint64_t{});
      return;
    default:
      break;  // (the narrow types: cast's own kernels, cast_narrow)
  }
  fail<UnsupportedError>("[{}] cuda kernel got dtype {}", op, name(t));
}
/// Float types only: float, half, bf16_t, double.
template <typename F> void dispatch_float(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::f32: f(float{}); return;
    case DType::f16: f(half{}); return;
    case DType::bf16: f(bf16_t{}); return;
    case DType::f64: f(double{}); return;
    default: fail<UnsupportedError>("[{}] cuda kernel got dtype {}", op, name(t));
  }
}
/// Index types (i32, i64).
template <typename F> void dispatch_index(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::i32: f(int32_t{}); return;
    case DType::i64: f(int64_t{}); return;
    default: fail<UnsupportedError>("[{}] indices must be i32 or i64, got {}", op, name(t));
  }
}

/// The type arithmetic on T is done in: float for half types, T otherwise.
template <typename T> struct AccOf { using type = T; };
template <> struct AccOf<half> { using type = float; };
template <> struct AccOf<bf16_t> { using type = float; };
template <typename T> using acc_t = typename AccOf<T>::type;

template <typename T> __host__ __device__ inline acc_t<T> to_acc(T v) {
  if constexpr (std::is_same_v<T, half>) return __half2float(v);
  else if constexpr (std::is_same_v<T, bf16_t>) return __bfloat162float(v);
  else return v;
}
/// Converts an arithmetic value to T (half types round to nearest even).
template <typename T, typename V> __host__ __device__ inline T from_acc(V v) {
  if constexpr (std::is_same_v<T, half>) return __float2half_rn(static_cast<float>(v));
  else if constexpr (std::is_same_v<T, bf16_t>) return __float2bfloat16_rn(static_cast<float>(v));
  else if constexpr (std::is_same_v<T, bool>) return v != V(0);
  else return static_cast<T>(v);
}

constexpr int kThreads = 256;
/// Blocks for a grid-stride loop over n items (capped; the loop covers the rest).
/// The device's number of SMs (at least 1).
inline int sm_count(int device) {
  int n = 0;
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device));
  return n > 0 ? n : 1;
}

/// The SM count that sizes a split of work whose sums depend on it (reductions, scans): the
/// device's, or in deterministic executables a fixed 132 (the H200's), so that the split, and
/// with it the order of the sums, is a function of shapes alone.
inline int split_sms(const KernelContext& ctx) {
  return ctx.deterministic() ? 132 : sm_count(ctx.device());
}

inline unsigned blocks_for(int64_t n, int threads = kThreads) {
  const int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 65535 * 8 ? 65535 * 8 : b));
}

/// Throws DeviceError naming the op when the last launch failed.
inline void check_launch(const char* op) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw_cuda_error(e, op, __FILE__, __LINE__);
}

/// Records, from device code, the value at `position` of an input the CPU kernel would reject at
/// run time (see KernelEnv::errors); the first position wins. The runtime throws ValueError
/// after the run.
__device__ inline void report_bad_value(int64_t* slot, int64_t position, int64_t value) {
  if (!slot) return;
  const bool fits = value > INT32_MIN && value <= INT32_MAX;
  if (!fits) slot[1] = value;
  const uint64_t pos = position < 0xffffffffll ? static_cast<uint64_t>(position) : 0xfffffffeull;
  const uint64_t low = fits ? static_cast<uint32_t>(static_cast<int32_t>(value)) : 0x80000000u;
  atomicMin(reinterpret_cast<unsigned long long*>(slot), (pos << 32) | low);
}
/// Host side, while encoding: what the step's error slot will mean if a kernel reports.
inline void describe_errors(const KernelContext& ctx, ErrorKind kind, int64_t axis, int64_t size) {
  if (int64_t* info = ctx.error_info()) {
    info[0] = static_cast<int64_t>(kind);
    info[1] = axis;
    info[2] = size;
  }
}

constexpr int kMaxRank = 8;

/// Output-index -> input-offset map of one input broadcast to an output shape, passed by value
/// to kernels. Dims are the output's; strides are 0 along broadcast dims.
struct BroadcastIndex {
  int rank = 0;
  int64_t dims[kMaxRank] = {};
  int64_t strides[kMaxRank] = {};
  __host__ __device__ int64_t offset(int64_t i) const {
    int64_t off = 0;
    for (int d = rank - 1; d >= 0; --d) {
      const int64_t q = i / dims[d];
      off += (i - q * dims[d]) * strides[d];
      i = q;
    }
    return off;
  }
};
/// Throws UnsupportedError for ranks above kMaxRank.
BroadcastIndex make_broadcast_index(const Shape& in, const Shape& out, const char* op);

/// A dense tensor viewed as (outer, len, inner) around one axis.
struct AxisSplit {
  int64_t outer = 1, len = 1, inner = 1;
};
AxisSplit split_at(const Shape& s, int64_t axis);

}  // namespace kiln::cuda
