// Ops of the norm family (see src/ops/op_list.inc).
#include "ops/common.h"

namespace kiln {

void register_norm_ops() {}

}  // namespace kiln
