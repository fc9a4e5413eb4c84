// CUDA kernels of the norm family.
#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/kernels.h"

namespace kiln::cuda {

void register_norm_kernels() {}

}  // namespace kiln::cuda
