// The attention family's attributes (src/ops/attention.cpp documents them) decoded once into the
// struct its kernels read. (C++17: CUDA files include it.)
#pragma once

#include <cmath>
#include <cstdint>

#include "core/op_id.h"
#include "core/op_params.h"

namespace kiln {

/// scaled_dot_product_attention and scaled_dot_product_attention_grad.
struct AttentionParams : OpParams {
  /// Query i sees keys j <= i only.
  bool causal = false;
  /// A mask follows the operands (input 3; the gradient op's input 5).
  bool has_mask = false;
  /// The gradient op: its one output is the additive mask's gradient (else dq, dk, dv).
  bool mask_grad = false;
  /// The node's `scale`; absent (has_scale false) where the builder left it to the kernel.
  bool has_scale = false;
  double scale = 0;

  /// The scale for head dim e: the node's, or 1 / sqrt(e) (dynamic E).
  double scale_for(int64_t e) const {
    return has_scale ? scale : 1.0 / std::sqrt(static_cast<double>(e > 0 ? e : 1));
  }

  static AttentionParams decode(OpId op, const Attrs& a) {
    AttentionParams p;
    p.causal = a.b("causal");
    p.has_mask = a.b("has_mask");
    if (op == OpId::ScaledDotProductAttentionGrad) p.mask_grad = a.b("mask_grad", false);
    p.has_scale = a.has("scale");
    if (p.has_scale) p.scale = a.f("scale");
    return p;
  }
};

}  // namespace kiln
