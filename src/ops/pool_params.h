// The pool family's attributes (src/ops/pool.cpp documents them) decoded once into the struct
// its kernels read. (C++17: CUDA files include it.)
#pragma once

#include <cstdint>
#include <vector>

#include "core/errors.h"
#include "core/op_id.h"
#include "core/op_params.h"

namespace kiln {

/// max_pool, avg_pool, adaptive_avg_pool and their gradient ops.
struct PoolParams : OpParams {
  /// The window of max_pool, avg_pool and avg_pool_grad: one value per pooled dim (at most 3),
  /// pads holds the nd begins, then the nd ends; dilation is all 1 where the node has none. Empty
  /// for the other ops, whose windows follow from their input and output shapes.
  std::vector<int64_t> kernel, stride, pads, dilation;
  bool ceil_mode = false;
  /// avg_pool, avg_pool_grad: padded positions count in a window's divisor.
  bool count_include_pad = false;
  /// max_pool: nothing reads the indices output, which kernels may then leave unwritten.
  bool no_indices = false;
  /// adaptive_avg_pool's output spatial dims.
  std::vector<int64_t> output_size;
  /// The gradient ops': the forward input's shape (N, C, spatial...).
  std::vector<int64_t> input_shape;

  int nd() const { return static_cast<int>(kernel.size()); }

  static PoolParams decode(OpId op, const Attrs& a) {
    PoolParams p;
    const bool window = op == OpId::MaxPool || op == OpId::AvgPool || op == OpId::AvgPoolGrad;
    if (window) {
      p.kernel = a.ints("kernel");
      p.stride = a.ints("stride");
      p.pads = a.ints("pads");
      const size_t nd = p.kernel.size();
      p.dilation = a.has("dilation") ? a.ints("dilation") : std::vector<int64_t>(nd, 1);
      p.ceil_mode = a.b("ceil_mode");
      if (nd > 3 || p.stride.size() != nd || p.dilation.size() != nd || p.pads.size() != 2 * nd)
        fail<ValueError>(
            "[{}] needs kernel, stride and dilation with one value per pooled dim "
            "(at most 3) and pads with two, got {}",
            op_name(op), a.to_string());
    }
    if (op == OpId::AvgPool || op == OpId::AvgPoolGrad)
      p.count_include_pad = a.b("count_include_pad");
    if (op == OpId::MaxPool) p.no_indices = a.b("no_indices", false);
    if (op == OpId::AdaptiveAvgPool) p.output_size = a.ints("output_size");
    if (op == OpId::MaxPoolGrad || op == OpId::AvgPoolGrad || op == OpId::AdaptiveAvgPoolGrad)
      p.input_shape = a.ints("input_shape");
    return p;
  }
};

}  // namespace kiln
