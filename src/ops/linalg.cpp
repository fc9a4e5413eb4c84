// Ops of the linalg family (see src/ops/op_list.inc).
#include "ops/common.h"

namespace kiln {

void register_linalg_ops() {}

}  // namespace kiln
