// The linalg family's attributes (matmul, linear; src/ops/linalg.cpp documents them) decoded once
// into the struct their kernels read. (C++17: CUDA files include it.)
#pragma once

#include "core/op_id.h"
#include "core/op_params.h"

namespace kiln {

/// matmul and linear.
struct LinalgParams : OpParams {
  /// linear: a bias at input 2 (false for matmul).
  bool has_bias = false;
  /// TF32 math may run it (the tf32 pass, CompileOptions::allow_tf32).
  bool tf32 = false;

  static LinalgParams decode(OpId op, const Attrs& a) {
    LinalgParams p;
    if (op == OpId::Linear) p.has_bias = a.b("has_bias");
    p.tf32 = a.b("tf32", false);
    return p;
  }
};

}  // namespace kiln
