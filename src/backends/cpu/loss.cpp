// CPU kernels of the loss family.
#include "backends/cpu/cpu_common.h"
#include "backends/cpu/kernels.h"

namespace kiln::cpu {

void register_loss_kernels() {}

}  // namespace kiln::cpu
