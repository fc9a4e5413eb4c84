// Ops of the reduce family (see src/ops/op_list.inc).
#include "ops/common.h"

namespace kiln {

void register_reduce_ops() {}

}  // namespace kiln
