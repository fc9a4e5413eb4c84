// CPU kernels of the transform family.
#include "backends/cpu/cpu_common.h"
#include "backends/cpu/kernels.h"

namespace kiln::cpu {

void register_transform_kernels() {}

}  // namespace kiln::cpu
