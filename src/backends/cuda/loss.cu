// CUDA kernels of the loss family.
#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/kernels.h"

namespace kiln::cuda {

void register_loss_kernels() {}

}  // namespace kiln::cuda
