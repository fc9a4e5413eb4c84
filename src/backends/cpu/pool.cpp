// CPU kernels of the pool family.
#include "backends/cpu/cpu_common.h"
#include "backends/cpu/kernels.h"

namespace kiln::cpu {

void register_pool_kernels() {}

}  // namespace kiln::cpu
