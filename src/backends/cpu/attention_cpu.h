// The CPU attention kernels' shared parts (attention.cpp, attention_bf16.cpp).
#pragma once

#include <cstdint>

#include "kiln/kernel.h"

namespace kiln::cpu {

/// The largest of s[0, n) and init, a vector at a time (the CPU's widest lanes).
float attention_max(const float* s, int64_t n, float init);
/// s[j] = e^(s[j] - mx) for j < n, returning their sum (0 for -inf; attention_lanes.inc).
float attention_exp_sum(float* s, int64_t n, float mx);

/// scaled_dot_product_attention's forward in bf16 through oneDNN's native bf16 products
/// (attention_bf16.cpp); false where that path does not apply (the CPU lacks native bf16, an
/// operand or the mask is of another type, empty keys), leaving the call to the f32 kernel.
bool attention_bf16(KernelContext& ctx);

}  // namespace kiln::cpu
