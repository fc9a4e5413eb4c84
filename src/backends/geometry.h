// Host-side geometry shared by the backends' kernels: how a matmul's operands broadcast and how
// a reduction's dims group. Backend-neutral: no device code.
#pragma once

#include <cstdint>
#include <vector>

#include "kiln/kernel.h"
#include "kiln/shape.h"

namespace kiln {

// a (..., M, K) times b (..., K, N) with 1-D operands promoted; batches padded to one rank.
struct MatmulDims {
  Shape batch_a, batch_b, batch;
  int64_t M = 1, K = 1, N = 1;
};
MatmulDims matmul_dims(const TensorView& a, const TensorView& b, const TensorView& out);
/// The same into `d`, whose vectors' memory is reused.
void matmul_dims(const TensorView& a, const TensorView& b, const TensorView& out, MatmulDims& d);

// A reduction of a dense tensor over `axes`, with adjacent dims of one kind (kept or reduced)
// merged and size-1 dims dropped.
struct ReducePlan {
  int64_t rows = 1;        // outputs / lanes
  int64_t lanes = 1;       // kept innermost elements, reduced side by side (last dim kept)
  int64_t run = 1;         // size of the innermost reduced group
  int64_t run_stride = 1;  // its stride (1 when lanes == 1)
  int64_t count = 1;       // reduced elements per output
  Shape row_sizes;         // other kept groups, outermost first
  std::vector<int64_t> row_strides;
  Shape outer_sizes;       // other reduced groups, outermost first
  std::vector<int64_t> outer_strides;
};
ReducePlan plan_reduce(const Shape& shape, const std::vector<int64_t>& axes);

}  // namespace kiln
