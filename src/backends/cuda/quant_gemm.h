// cuBLASLt's int8 product for the quantized kernels (quant_gemm.cu): raw (M, N) = a (M, K) · wᵀ
// with a and w row-major i8 (w as (N, K)) and raw row-major i32, exact.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kiln/kernel.h"

namespace kiln::cuda {

/// Shapes the int8 path takes: K and N multiples of 4 (cuBLASLt's leading-dimension rule for
/// int8), K <= 65536 (i32 sums stay exact), and enough work to beat the exact kernels.
inline bool int8_gemm_fits(int64_t m, int64_t n, int64_t k) {
  return m > 0 && n > 0 && k > 0 && k % 4 == 0 && n % 4 == 0 && k <= (int64_t{1} << 16) &&
         m <= INT32_MAX && n <= INT32_MAX && m * n * k >= (int64_t{1} << 18);
}
/// Whether cuBLASLt offers an algorithm for these sizes and operand alignments (bytes); cached.
bool int8_gemm_available(int device, int64_t m, int64_t n, int64_t k, uint32_t align_a,
                         uint32_t align_w);
/// Enqueues raw = a8 · w8ᵀ on the kernel's stream (int8_gemm_available must have said yes).
void int8_gemm(KernelContext& ctx, const int8_t* a8, const int8_t* w8, int32_t* raw, int64_t m,
               int64_t n, int64_t k, uint32_t align_a, uint32_t align_w);
/// sums[r] = the sum of row r of v (rows, k), enqueued on `st`.
void int8_row_sums(const int8_t* v, int64_t rows, int64_t k, int32_t* sums, cudaStream_t st);
/// The largest power of two (<= 256) that divides p's address.
uint32_t pointer_alignment(const void* p);

/// quantized_matmul through the int8 product (u8 shifted to i8, zero points through row and
/// column sums, one epilogue); false when the shape rules or cuBLASLt say no (nothing enqueued).
bool quantized_matmul_lt(KernelContext& ctx, int64_t m, int64_t n, int64_t k, bool transpose_w);

/// quantized_matmul as a 1x1 NHWC convolution through quantized_conv's implicit GEMM on int8
/// tensor cores (qconv_igemm.cu), the requantize (and GELU) fused, within 1 LSB of the exact
/// epilogue: i8 weights with zero_w_zp (symmetric), K a multiple of 64, 16-byte aligned operands;
/// false (nothing enqueued unless it returns true) elsewhere or with KILN_QCONV_IGEMM=0.
bool quantized_matmul_igemm(KernelContext& ctx, int64_t m, int64_t n, int64_t k,
                            bool transpose_w);

}  // namespace kiln::cuda
