// CUDA training batch norm on NHWC values (the channels_last pass gives CUDA training programs
// such nodes): norm_nhwc.cu. norm.cu registers them as the Layout::channels_last kernels.
#pragma once

#include "kiln/kernel.h"

namespace kiln::cuda {

/// batch_norm_train with x and y (N, H, W, C); mean and var (C).
void batch_norm_train_nhwc(KernelContext& ctx);
/// batch_norm_train_grad with dy, x and dx (N, H, W, C); mean, var, weight and the sums (C).
void batch_norm_train_grad_nhwc(KernelContext& ctx);

}  // namespace kiln::cuda
