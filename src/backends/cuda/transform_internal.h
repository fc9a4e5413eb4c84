// Host-side helpers shared by the CUDA transform kernels of transform.cu and transform_index.cu:
// dispatch on byte widths and the launch shape of a row walk. Included by .cu files only.
#pragma once

#include <cstdint>

#include "backends/cuda/cuda_common.cuh"

namespace kiln::cuda::transform_detail {

/// Calls f(U{}) with an unsigned unit of `bytes` bytes (uint4 for 16).
template <typename F> void dispatch_unit(size_t bytes, F&& f) {
  switch (bytes) {
    case 1:
      f(uint8_t{});
      return;
    case 2:
      f(uint16_t{});
      return;
    case 4:
      f(uint32_t{});
      return;
    case 8:
      f(uint64_t{});
      return;
    case 16:
      f(uint4{});
      return;
    default:
      fail<UnsupportedError>("[transform] cuda kernels got element size {}", bytes);
  }
}

/// Calls f(U{}) with an unsigned type of one element of `bytes` bytes (1, 2, 4 or 8).
template <typename F> void dispatch_elem(size_t bytes, F&& f) {
  switch (bytes) {
    case 1:
      f(uint8_t{});
      return;
    case 2:
      f(uint16_t{});
      return;
    case 4:
      f(uint32_t{});
      return;
    case 8:
      f(uint64_t{});
      return;
    default:
      fail<UnsupportedError>("[transform] cuda kernels got element size {}", bytes);
  }
}

int64_t addr(const void* p);

/// Launch shape of a (rows, inner) walk: threads in x along a row, in y across rows.
struct RowGrid {
  dim3 grid, block;
};
RowGrid row_grid(int64_t rows, int64_t inner);

}  // namespace kiln::cuda::transform_detail
