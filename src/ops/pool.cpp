// Ops of the pool family (see src/ops/op_list.inc).
#include "ops/common.h"

namespace kiln {

void register_pool_ops() {}

}  // namespace kiln
