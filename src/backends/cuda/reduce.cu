// CUDA kernels of the reduce family.
#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/kernels.h"

namespace kiln::cuda {

void register_reduce_kernels() {}

}  // namespace kiln::cuda
