// The attributes of cholesky and triangular_solve (src/ops/factorization.cpp documents them)
// decoded once into the struct their kernels read. (C++17: CUDA files include it.)
#pragma once

#include "core/op_id.h"
#include "core/op_params.h"

namespace kiln {

/// cholesky and triangular_solve.
struct FactorizationParams : OpParams {
  /// cholesky: the upper factor, read from a's upper triangle. triangular_solve: a is upper
  /// triangular.
  bool upper = false;
  /// triangular_solve: solves op(a) x = b (left), else x op(a) = b; op(a) = aᵀ (transpose), else
  /// a; a's diagonal reads as ones (unit_diagonal). All false for cholesky.
  bool left = false, transpose = false, unit_diagonal = false;

  static FactorizationParams decode(OpId op, const Attrs& a) {
    FactorizationParams p;
    p.upper = a.b("upper");
    if (op == OpId::TriangularSolve) {
      p.left = a.b("left");
      p.transpose = a.b("transpose");
      p.unit_diagonal = a.b("unit_diagonal");
    }
    return p;
  }
};

}  // namespace kiln
