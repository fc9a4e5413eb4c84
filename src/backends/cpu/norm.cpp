// CPU kernels of the norm family.
#include "backends/cpu/cpu_common.h"
#include "backends/cpu/kernels.h"

namespace kiln::cpu {

void register_norm_kernels() {}

}  // namespace kiln::cpu
