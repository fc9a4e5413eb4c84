// CPU kernels of the reduce family.
#include "backends/cpu/cpu_common.h"
#include "backends/cpu/kernels.h"

namespace kiln::cpu {

void register_reduce_kernels() {}

}  // namespace kiln::cpu
