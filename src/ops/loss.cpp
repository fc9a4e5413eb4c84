// Ops of the loss family (see src/ops/op_list.inc).
#include "ops/common.h"

namespace kiln {

void register_loss_ops() {}

}  // namespace kiln
