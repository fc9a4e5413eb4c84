// The loss family's attributes (src/ops/loss.cpp documents them) decoded once into the struct
// its kernels read. (C++17: CUDA files include it.)
#pragma once

#include <cstdint>
#include <string>

#include "core/op_id.h"
#include "core/op_params.h"

namespace kiln {

/// softmax_cross_entropy, nll and mse.
struct LossParams : OpParams {
  enum class Reduce : uint8_t { none, mean, sum };
  /// "none", "mean", or "sum" (any other name reads as "sum").
  Reduce reduction = Reduce::sum;
  /// softmax_cross_entropy: the (resolved) class axis.
  int64_t axis = 0;
  /// nll: positions whose target equals it count for nothing.
  int64_t ignore_index = 0;

  static LossParams decode(OpId op, const Attrs& a) {
    LossParams p;
    const std::string& r = a.str("reduction");
    p.reduction = r == "none" ? Reduce::none : r == "mean" ? Reduce::mean : Reduce::sum;
    if (op == OpId::SoftmaxCrossEntropy) p.axis = a.i("axis");
    if (op == OpId::Nll) p.ignore_index = a.i("ignore_index");
    return p;
  }
};

}  // namespace kiln
