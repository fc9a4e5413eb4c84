// CUDA kernels of the core family.
#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/kernels.h"

namespace kiln::cuda {

void register_core_kernels() {}

}  // namespace kiln::cuda
