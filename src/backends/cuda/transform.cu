// CUDA kernels of the transform family.
#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/kernels.h"

namespace kiln::cuda {

void register_transform_kernels() {}

}  // namespace kiln::cuda
