// The CPU backend's kernel families; each registers its kernels in the kernel table.
#pragma once

namespace kiln::cpu {

void register_core_kernels();
void register_elementwise_kernels();
void register_linalg_kernels();
void register_conv_kernels();
void register_pool_kernels();
void register_pool_nhwc_kernels();
void register_reduce_kernels();
void register_norm_kernels();
void register_transform_kernels();
void register_loss_kernels();
void register_dist_kernels();
void register_random_kernels();
void register_fused_elementwise_kernels();
void register_rearrange_kernels();  // rearrange.cpp
void register_rnn_kernels();
void register_attention_kernels();     // attention.cpp
void register_factorization_kernels();  // factorization.cpp
void register_quant_kernels();         // quant.cpp
void register_custom_op_kernels();     // custom_op.cpp: custom, custom_impure
void register_control_kernels();       // control.cpp: cond, while_loop, for_loop

/// Registers every family above.
void register_kernels();

}  // namespace kiln::cpu
