// Registration of the CUDA kernels, one function per op family (each in its own file).
#pragma once

namespace kiln::cuda {

void register_core_kernels();         // core.cu: full, arange, assign
void register_elementwise_kernels();  // elementwise.cu
void register_linalg_kernels();       // linalg.cu: matmul, linear (cuBLASLt)
void register_conv_kernels();         // conv.cu: conv, conv_transpose, conv_grad_weight (cuDNN)
void register_pool_kernels();         // pool.cu
void register_pool_grad_kernels();    // pool_grad.cu (called by register_pool_kernels)
void register_reduce_kernels();       // reduce.cu
void register_norm_kernels();         // norm.cu
void register_transform_kernels();    // transform.cu, transform_index.cu, transform_sort.cu
void register_transform_index_kernels();  // transform_index.cu (from register_transform_kernels)
void register_transform_nd_kernels();  // transform_nd.cu: gather_nd, scatter_nd
void register_resize_kernels();        // resize.cu
void register_loss_kernels();         // loss.cu
void register_dist_kernels();         // dist.cu: all_reduce, collective_wait
void register_random_kernels();       // random.cu: random_philox_state, random_*
void register_fused_elementwise_kernels();  // fused_elementwise.cpp: NVRTC-generated kernels
void register_rearrange_kernels();          // rearrange.cu: depth_to_space, embedding, nms, ...
void register_rnn_kernels();          // rnn.cu: lstm, gru, rnn, rnn_grad
void register_attention_kernels();    // attention.cu, attention_backward.cu: fused attention
void register_factorization_kernels();  // factorization.cu: cholesky, triangular_solve
void register_quant_kernels();         // quant.cu: quantize, dequantize, fake_quantize
void register_custom_op_kernels();     // custom_op.cpp: custom, custom_impure
void register_control_kernels();       // control.cpp: cond, while_loop, for_loop

}  // namespace kiln::cuda
