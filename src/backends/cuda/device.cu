// CUDA backend: device discovery and the kernel tables.
#include <cuda_runtime.h>

#include "backends/cuda/kernels.h"
#include "kiln/device.h"

namespace kiln {
namespace cuda {
void register_kernels() {
  register_core_kernels();
  register_elementwise_kernels();
  register_linalg_kernels();
  register_conv_kernels();
  register_pool_kernels();
  register_reduce_kernels();
  register_norm_kernels();
  register_transform_kernels();
  register_transform_nd_kernels();
  register_resize_kernels();
  register_loss_kernels();
  register_dist_kernels();
  register_random_kernels();
  register_fused_elementwise_kernels();
  register_rearrange_kernels();
  register_rnn_kernels();
  register_attention_kernels();
  register_factorization_kernels();
  register_quant_kernels();
  register_custom_op_kernels();
  register_control_kernels();
}
}  // namespace cuda

int cuda_device_count() {
  static const int n = [] {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
      cudaGetLastError();  // clear the sticky "no device" error
      return 0;
    }
    return count;
  }();
  return n;
}

}  // namespace kiln
