// The linalg family's attributes (matmul, linear; src/ops/linalg.cpp documents them) decoded once
// into the struct their kernels read. (C++17: CUDA files include it.)
#pragma once

#include <vector>

#include "core/op_id.h"
#include "core/op_params.h"

namespace kiln {

/// One step of fused_matmul's epilogue (attribute `epilogue`, these values, in order): add or
/// multiply by the next operand input, or an activation.
enum class MatmulStep : int8_t {
  add = 1,
  mul = 2,
  relu = 3,
  gelu = 4,       // erf form
  gelu_tanh = 5,  // tanh form
  sigmoid = 6,
  silu = 7,
  tanh = 8,
};
constexpr int kMaxMatmulSteps = 8;
inline bool is_matmul_step(int64_t v) { return v >= 1 && v <= 8; }
inline bool takes_operand(MatmulStep s) { return s == MatmulStep::add || s == MatmulStep::mul; }

/// matmul, linear and fused_matmul.
struct LinalgParams : OpParams {
  /// linear: a bias at input 2 (false for matmul).
  bool has_bias = false;
  /// fused_matmul: input 1 is (N, K), as linear's weight (else (K, N), as matmul's).
  bool transpose_b = false;
  /// fused_matmul: its epilogue, applied to the product in order; each add or mul takes the next
  /// input from input 2 on.
  std::vector<MatmulStep> epilogue;
  /// TF32 math may run it (the tf32 pass, CompileOptions::allow_tf32).
  bool tf32 = false;
  /// The weight (input 1: a matrix) is a constant of the executable (CPU: prepare_cpu_matmuls),
  /// which the kernel may lay out for its primitive once and keep in `state`.
  bool const_weight = false;
  /// The packed constant weight (made by decode).
  std::shared_ptr<KernelState> state;
  KernelState* kernel_state() const override { return state.get(); }

  static LinalgParams decode(OpId op, const Attrs& a) {
    LinalgParams p;
    if (op == OpId::Linear) p.has_bias = a.b("has_bias");
    if (op == OpId::FusedMatmul) {
      p.transpose_b = a.b("transpose_b", false);
      for (int64_t s : a.ints("epilogue")) p.epilogue.push_back(static_cast<MatmulStep>(s));
    }
    p.tf32 = a.b("tf32", false);
    p.const_weight = a.b("const_weight", false);
    if (p.const_weight) p.state = std::make_shared<KernelState>();
    return p;
  }
};

}  // namespace kiln
