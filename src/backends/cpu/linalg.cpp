// CPU kernels of the linalg family.
#include "backends/cpu/cpu_common.h"
#include "backends/cpu/kernels.h"

namespace kiln::cpu {

void register_linalg_kernels() {}

}  // namespace kiln::cpu
