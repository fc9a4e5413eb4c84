// Ops of the conv family (see src/ops/op_list.inc).
#include "ops/common.h"

namespace kiln {

void register_conv_ops() {}

}  // namespace kiln
