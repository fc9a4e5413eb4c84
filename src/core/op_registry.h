// The op registry: one OpDef per op of op_list.inc, filled by the family files in src/ops/.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/graph_impl.h"
#include "core/op_id.h"

namespace kiln {

/// What shape/dtype inference sees.
struct InferContext {
  OpId op;
  const Attrs& attrs;
  const std::vector<TensorInfo>& inputs;
  const char* name() const { return op_name(op); }
};
using InferFn = std::vector<TensorInfo> (*)(const InferContext&);

/// What a gradient rule sees: the node's inputs and outputs as Tensors, its attributes, and the
/// incoming gradient of each output (nullopt where none flows).
struct VjpContext {
  OpId op;
  Attrs attrs;
  std::vector<Tensor> inputs;
  std::vector<Tensor> outputs;
  std::vector<std::optional<Tensor>> cotangents;
  const char* name() const { return op_name(op); }
  /// The cotangent of output i, or zeros of its shape.
  Tensor cotangent_or_zeros(int i) const;
};
/// Returns one gradient per input, written with kiln ops (nullopt: none, e.g. for indices).
/// Each gradient must have its input's shape; autodiff casts it to the input's dtype.
using VjpFn = std::vector<std::optional<Tensor>> (*)(const VjpContext&);

/// Whether an op has a gradient rule. Every op must decide: `undecided` fails a test.
enum class GradKind : uint8_t { undecided, rule, none };

struct OpDef {
  OpId id{};
  InferFn infer = nullptr;
  /// Same inputs give the same outputs (CSE and constant folding may merge or fold it).
  bool pure = true;
  /// Output 0 may be written over input `inplace_input` when that input dies here (-1: never).
  int inplace_input = -1;
  /// Output 0 is a view of input 0 (same bytes, another shape): no copy, no new buffer.
  bool alias_input0 = false;

  /// The gradient rule (or GradKind::none for ops whose outputs are not differentiable).
  GradKind grad_kind = GradKind::undecided;
  VjpFn vjp = nullptr;

  OpDef& set_infer(InferFn f) { infer = f; return *this; }
  OpDef& grad(VjpFn f) { vjp = f; grad_kind = GradKind::rule; return *this; }
  OpDef& not_differentiable() { grad_kind = GradKind::none; return *this; }
  OpDef& impure() { pure = false; return *this; }
  OpDef& inplace(int input) { inplace_input = input; return *this; }
  OpDef& alias() { alias_input0 = true; return *this; }
};

/// The def of `op` (all families registered on first use).
const OpDef& op_def(OpId op);
/// For family registration functions.
OpDef& define_op(OpId op);

// One registration function per family file (src/ops/<family>.cpp).
void register_core_ops();
void register_elementwise_ops();
void register_linalg_ops();
void register_conv_ops();
void register_pool_ops();
void register_reduce_ops();
void register_norm_ops();
void register_transform_ops();
void register_loss_ops();
void register_dist_ops();
void register_random_ops();
void register_fused_elementwise_ops();
void register_rnn_ops();
void register_attention_ops();     // src/ops/attention.cpp
void register_linalg_extra_ops();  // src/ops/linalg_extra.cpp
void register_quant_ops();         // src/ops/quant.cpp
void register_custom_op_ops();     // src/ops/custom_op.cpp

}  // namespace kiln
