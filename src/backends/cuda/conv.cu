// CUDA kernels of the conv family.
#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/kernels.h"

namespace kiln::cuda {

void register_conv_kernels() {}

}  // namespace kiln::cuda
