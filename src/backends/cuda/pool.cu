// CUDA kernels of the pool family.
#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/kernels.h"

namespace kiln::cuda {

void register_pool_kernels() {}

}  // namespace kiln::cuda
