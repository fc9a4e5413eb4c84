// What the quant family's CPU kernel files share (quant.cpp, quant_conv.cpp).
#pragma once

#include <oneapi/dnnl/dnnl.hpp>

#include "backends/quant_math.h"
#include "kiln/kernel.h"

namespace kiln::cpu {

/// oneDNN's u8/s8 x s8 -> s32 products are exact where the CPU has VNNI (elsewhere its int8
/// kernels may saturate 16-bit pair sums): only then do the quantized kernels use them.
bool dnnl_int8_exact();

/// Appends an int8 epilogue's activation (quant_math::Activation: relu, either GELU, or none) to
/// oneDNN post-ops, on the values they hold there (real ones for a GELU).
inline void append_activation(dnnl::post_ops& ops, int act) {
  if (act == quant_math::kRelu) ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
  if (act == quant_math::kGeluErf)
    ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_gelu_erf, 0.0f, 0.0f);
  if (act == quant_math::kGeluTanh)
    ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_gelu_tanh, 0.0f, 0.0f);
}

/// quantized_conv in layouts plain and channels_last (quant_conv.cpp).
void quantized_conv(KernelContext& ctx);
void quantized_conv_channels_last(KernelContext& ctx);

}  // namespace kiln::cpu
