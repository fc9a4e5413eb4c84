// CUDA kernels of the elementwise family.
#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/kernels.h"

namespace kiln::cuda {

void register_elementwise_kernels() {}

}  // namespace kiln::cuda
