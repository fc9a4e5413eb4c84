// The op registry: one OpDef per op of op_list.inc, filled by the family files in src/ops/.
#pragma once

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

struct OpDef {
  OpId id{};
  InferFn infer = nullptr;
  /// Same inputs give the same outputs (CSE and constant folding may merge or fold it).
  bool pure = true;
  /// Output 0 may be written over input `inplace_input` when that input dies here (-1: never).
  int inplace_input = -1;
  /// Output 0 is a view of input 0 (same bytes, another shape): no copy, no new buffer.
  bool alias_input0 = false;

  OpDef& set_infer(InferFn f) { infer = f; return *this; }
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

}  // namespace kiln
