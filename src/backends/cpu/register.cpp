#include "backends/cpu/kernels.h"

namespace kiln::cpu {

void register_kernels() {
  register_core_kernels();
  register_elementwise_kernels();
  register_linalg_kernels();
  register_conv_kernels();
  register_pool_kernels();
  register_pool_nhwc_kernels();
  register_reduce_kernels();
  register_norm_kernels();
  register_transform_kernels();
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

}  // namespace kiln::cpu
