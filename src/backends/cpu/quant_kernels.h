// What the quant family's CPU kernel files share (quant.cpp, quant_conv.cpp).
#pragma once

#include "kiln/kernel.h"

namespace kiln::cpu {

/// oneDNN's u8/s8 x s8 -> s32 products are exact where the CPU has VNNI (elsewhere its int8
/// kernels may saturate 16-bit pair sums): only then do the quantized kernels use them.
bool dnnl_int8_exact();

/// quantized_conv (quant_conv.cpp).
void quantized_conv(KernelContext& ctx);

}  // namespace kiln::cpu
