// Pieces of the CUDA pool kernels shared by the forward ops (pool.cu) and the gradients
// (pool_grad.cu): the geometry, the averaging windows and the channels_last helpers. Included by
// .cu files only.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "backends/cuda/cuda_common.cuh"
#include "ops/pool_params.h"

namespace kiln::cuda::pool_detail {

// Pooling geometry over (D, H, W); unused leading dims have size 1 and a 1-wide window.
struct PoolGeom {
  int64_t planes = 1;  // N * C
  int64_t in[3] = {1, 1, 1}, out[3] = {1, 1, 1};
  int64_t k[3] = {1, 1, 1}, s[3] = {1, 1, 1}, pad[3] = {0, 0, 0}, pad_end[3] = {0, 0, 0};
  int64_t dil[3] = {1, 1, 1};
  __host__ __device__ int64_t in_plane() const { return in[0] * in[1] * in[2]; }
  __host__ __device__ int64_t out_plane() const { return out[0] * out[1] * out[2]; }
};

// pool.cu
// Geometry of pooling input x to output y (for the gradient ops: dx to dy) with 1-wide windows:
// adaptive pooling and max_pool_grad, whose windows follow from the shapes.
PoolGeom pool_geom(const Shape& x, const Shape& y);
// The same with the node's window (max_pool, avg_pool, avg_pool_grad).
PoolGeom pool_geom(const PoolParams& p, const Shape& x, const Shape& y);
Shape nchw_of(const Shape& s);

// Average pooling's window along dim e: the clipped input range and the size counted with
// padding included (clipped to the padded input, as PyTorch does).
struct AvgWindow {
  int64_t lo, hi, padded;
};
__host__ __device__ inline AvgWindow avg_window(const PoolGeom& g, int e, int64_t o) {
  const int64_t start = o * g.s[e] - g.pad[e];
  const int64_t end = min(start + g.k[e], g.in[e] + g.pad_end[e]);
  return {max(start, int64_t{0}), min(end, g.in[e]), end - start};
}
// Adaptive pooling: output o of `out` covers inputs [floor(o*in/out), ceil((o+1)*in/out)).
__host__ __device__ inline AvgWindow adaptive_window(const PoolGeom& g, int e, int64_t o) {
  const int64_t lo = o * g.in[e] / g.out[e];
  const int64_t hi = ((o + 1) * g.in[e] + g.out[e] - 1) / g.out[e];
  return {lo, hi, hi - lo};
}

// Output (od, oh, ow) of flat in-plane output index r.
struct Pos {
  int64_t d, h, w;
};
__device__ inline Pos pos_at(const int64_t* dims, int64_t r) {
  return {r / (dims[1] * dims[2]), r / dims[2] % dims[1], r % dims[2]};
}

// channels_last (NHWC)

template <typename T, int V> struct alignas(sizeof(T) * V) Vec { T v[V]; };

// Calls run(width) with the widest V (16 bytes of T) that C and the buffers allow, else 1.
template <typename T, typename Run>
void nhwc_width(int64_t C, std::initializer_list<const void*> buffers, Run&& run) {
  constexpr int kV = sizeof(T) <= 16 ? static_cast<int>(16 / sizeof(T)) : 1;
  bool wide = C % kV == 0;
  for (const void* b : buffers) wide = wide && reinterpret_cast<uintptr_t>(b) % 16 == 0;
  if (wide) run(std::integral_constant<int, kV>{});
  else run(std::integral_constant<int, 1>{});
}

}  // namespace kiln::cuda::pool_detail
