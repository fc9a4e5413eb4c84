// OpId and op names, generated from src/ops/op_list.inc.
#pragma once

#include <cstdint>
#include <string_view>

#include "kiln/op_catalog.h"

namespace kiln {

enum class OpId : uint16_t {
#define KILN_OP(Name, snake, id, family) Name = id,
#include "ops/op_list.inc"
#undef KILN_OP
};

/// Every op in list order.
inline constexpr OpId kAllOps[] = {
#define KILN_OP(Name, snake, id, family) OpId::Name,
#include "ops/op_list.inc"
#undef KILN_OP
};
inline constexpr int kOpIdLimit = 512;  // stable ids are below this (tables are this long)
#define KILN_OP(Name, snake, id, family) \
  static_assert(id > 0 && id < kOpIdLimit, "op " #snake ": stable id out of range");
#include "ops/op_list.inc"
#undef KILN_OP

/// "Add", "Conv", ... (the PascalCase name of tests and kernels).
const char* op_pascal_name(OpId op);

}  // namespace kiln
