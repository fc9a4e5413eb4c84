// Ops of the transform family (see src/ops/op_list.inc).
#include "ops/common.h"

namespace kiln {

void register_transform_ops() {}

}  // namespace kiln
