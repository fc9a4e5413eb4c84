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
  /// The weight (input 1: a matrix) is a constant of the executable (CPU: prepare_cpu_matmuls),
  /// which the kernel may lay out for its primitive once and keep in `state`.
  bool const_weight = false;
  /// The packed constant weight (made by decode).
  std::shared_ptr<KernelState> state;

  static LinalgParams decode(OpId op, const Attrs& a) {
    LinalgParams p;
    if (op == OpId::Linear) p.has_bias = a.b("has_bias");
    p.tf32 = a.b("tf32", false);
    p.const_weight = a.b("const_weight", false);
    if (p.const_weight) p.state = std::make_shared<KernelState>();
    return p;
  }
};

}  // namespace kiln
