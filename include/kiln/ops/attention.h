// Attention.
#pragma once

#include <optional>

#include "kiln/graph.h"

namespace kiln {

struct AttentionOptions {
  /// Key j is visible to query i only when j <= i (top-left aligned when Lq != Lk, as in
  /// PyTorch's is_causal). Combines with `mask`.
  bool causal = false;
  /// Multiplies q kᵀ; default 1 / sqrt(E) (E = the last dim of q).
  std::optional<double> scale;
};

/// softmax(scale · q kᵀ + mask) v over the last two dims. q (..., Lq, E), k (..., Lk, E),
/// v (..., Lk, Ev); leading dims broadcast. Result (..., Lq, Ev) in the promoted float dtype.
/// `mask` broadcasts to (..., Lq, Lk): bool keeps a key where true; a float mask is added to the
/// scores (-inf removes a key). A query that sees no key (every key masked) gets zeros, and its
/// gradient is zero. Differentiable in q, k, v and a float mask.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const std::optional<Tensor>& mask = std::nullopt,
                                    const AttentionOptions& options = {});

/// The gradients (dq, dk, dv) of scaled_dot_product_attention given dout and its output `out`
/// (q, k, v already broadcast to one batch shape). Used by the gradient rule.
std::vector<Tensor> scaled_dot_product_attention_grad(const Tensor& dout, const Tensor& q,
                                                      const Tensor& k, const Tensor& v,
                                                      const Tensor& out,
                                                      const std::optional<Tensor>& mask,
                                                      const AttentionOptions& options);

}  // namespace kiln
