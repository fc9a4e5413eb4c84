// Small f32 matrix products on the calling thread: where a product has fewer multiply-adds than
// kSmallGemm, a library call (oneDNN's argument maps, its threads' fork and join) costs more than
// the arithmetic. The models' tiny projections (a few dozen tokens by a few dozen features) and
// an RNN step's recurrent product run here.
#pragma once

#include <cstdint>

namespace kiln::cpu {

/// Products up to this many multiply-adds (M·N·K) are small.
constexpr int64_t kSmallGemm = int64_t{1} << 18;

/// C (M x N, leading dim ldc) = alpha · A (M x K, lda) · B (K x N, ldb) + beta · C, all
/// row-major f32 (C is not read where beta is 0). AVX-512 where the CPU has it (cpu_isa).
void small_gemm_nn(int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                   const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

}  // namespace kiln::cpu
