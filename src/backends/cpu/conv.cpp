// CPU kernels of the conv family.
#include "backends/cpu/cpu_common.h"
#include "backends/cpu/kernels.h"

namespace kiln::cpu {

void register_conv_kernels() {}

}  // namespace kiln::cpu
