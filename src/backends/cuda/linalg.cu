// CUDA kernels of the linalg family.
#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/kernels.h"

namespace kiln::cuda {

void register_linalg_kernels() {}

}  // namespace kiln::cuda
