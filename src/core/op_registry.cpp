#include "core/op_registry.h"

#include <array>
#include <mutex>

#include "core/errors.h"

namespace kiln {

namespace {
struct NameEntry {
  const char* snake = nullptr;
  const char* pascal = nullptr;
  const char* family = nullptr;
};

const std::array<NameEntry, kOpIdLimit>& names() {
  static const std::array<NameEntry, kOpIdLimit> t = [] {
    std::array<NameEntry, kOpIdLimit> a{};
#define KILN_OP(Name, snake, id, fam) a[id] = {#snake, #Name, #fam};
#include "ops/op_list.inc"
#undef KILN_OP
    return a;
  }();
  return t;
}

std::array<OpDef, kOpIdLimit>& defs_storage() {
  static std::array<OpDef, kOpIdLimit> d{};
  return d;
}
}  // namespace

const char* op_name(OpId op) {
  const char* n = names()[static_cast<int>(op)].snake;
  return n ? n : "unknown_op";
}
const char* op_pascal_name(OpId op) {
  const char* n = names()[static_cast<int>(op)].pascal;
  return n ? n : "UnknownOp";
}
const char* op_family(OpId op) {
  const char* n = names()[static_cast<int>(op)].family;
  return n ? n : "";
}
bool op_from_name(std::string_view name, OpId& out) {
  for (OpId op : kAllOps)
    if (name == op_name(op)) {
      out = op;
      return true;
    }
  return false;
}

OpDef& define_op(OpId op) {
  OpDef& d = defs_storage()[static_cast<int>(op)];
  d.id = op;
  return d;
}

const OpDef& op_def(OpId op) {
  static std::once_flag once;
  std::call_once(once, [] {
    register_core_ops();
    register_elementwise_ops();
    register_linalg_ops();
    register_conv_ops();
    register_pool_ops();
    register_reduce_ops();
    register_norm_ops();
    register_transform_ops();
    register_loss_ops();
    register_dist_ops();
    register_random_ops();
    register_fused_elementwise_ops();
    register_rnn_ops();
    register_attention_ops();
    register_linalg_extra_ops();
    register_quant_ops();
    register_custom_op_ops();
  });
  return defs_storage()[static_cast<int>(op)];
}

}  // namespace kiln
