// The reduce family's attributes (src/ops/reduce.cpp documents them) decoded once into the
// structs its kernels read. (C++17: CUDA files include it.)
#pragma once

#include <cstdint>
#include <vector>

#include "core/op_id.h"
#include "core/op_params.h"

namespace kiln {

/// sum, prod, mean, logsumexp, norm_l1, norm_l2, max, min and variance.
struct ReduceParams : OpParams {
  /// The reduced axes (sorted, non-negative, distinct).
  std::vector<int64_t> axes;
  /// variance: the divisor is count - correction (0 for the other ops).
  int64_t correction = 0;

  static ReduceParams decode(OpId op, const Attrs& a) {
    ReduceParams p;
    p.axes = a.ints("axes");
    if (op == OpId::Variance) p.correction = a.i("correction");
    return p;
  }
};

/// argmax, argmin and cumsum: the (resolved) axis they run along.
struct ReduceAxisParams : OpParams {
  int64_t axis = 0;
  /// cumsum: each output leaves out its own element; the sums run from the end.
  bool exclusive = false, reverse = false;

  static ReduceAxisParams decode(OpId op, const Attrs& a) {
    ReduceAxisParams p;
    p.axis = a.i("axis");
    if (op == OpId::Cumsum) {
      p.exclusive = a.b("exclusive");
      p.reverse = a.b("reverse");
    }
    return p;
  }
};

}  // namespace kiln
