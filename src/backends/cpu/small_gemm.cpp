// Small f32 products on the calling thread (small_gemm.h): blocks of 4 rows of C by 64 columns
// kept in registers (16 AVX-512 vectors) while a row of B's block is read once for the 4 rows.
// Compiled for the baseline and (GCC, x86-64) for AVX-512, picked by cpu_isa (not
// target_clones: see attention.cpp).
#include "backends/cpu/small_gemm.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "backends/cpu/cpu_common.h"

namespace kiln::cpu {

namespace {

// 16 floats: one AVX-512 register (four SSE registers in the baseline build), moved by memcpy
// (no aliasing question; compiled to unaligned vector loads and stores)
typedef float Vec __attribute__((vector_size(64), aligned(4)));

// C's rows [0, R) by columns [0, 16·V) from A's R rows and B's columns, in R·V vectors.
template <int R, int V>
inline __attribute__((always_inline)) void block(int64_t K, float alpha, const float* A,
                                                 int64_t lda, const float* B, int64_t ldb,
                                                 float beta, float* C, int64_t ldc) {
  Vec acc[R][V] = {};
  for (int64_t k = 0; k < K; ++k) {
    const float* b = B + k * ldb;
    Vec bv[V];
    for (int v = 0; v < V; ++v) std::memcpy(&bv[v], b + 16 * v, sizeof(Vec));
    for (int r = 0; r < R; ++r) {
      const Vec a = Vec{} + A[r * lda + k];
      for (int v = 0; v < V; ++v) acc[r][v] += a * bv[v];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) {
      Vec c;
      std::memcpy(&c, C + r * ldc + 16 * v, sizeof(Vec));
      c = beta == 0.f ? acc[r][v] * alpha : acc[r][v] * alpha + c * beta;
      std::memcpy(C + r * ldc + 16 * v, &c, sizeof(Vec));
    }
}

// Up to 4 rows of C, every column: 64 at a time, then 16, then the last w < 16 from `panel`,
// those columns of B zero-padded to 16 (K x 16), through a 16-column scratch of C.
template <int R> inline __attribute__((always_inline)) void rows(int64_t N, int64_t K, float alpha,
                                                                 const float* A, int64_t lda,
                                                                 const float* B, int64_t ldb,
                                                                 const float* panel, float beta,
                                                                 float* C, int64_t ldc) {
  int64_t n = 0;
  for (; n + 64 <= N; n += 64) block<R, 4>(K, alpha, A, lda, B + n, ldb, beta, C + n, ldc);
  for (; n + 16 <= N; n += 16) block<R, 1>(K, alpha, A, lda, B + n, ldb, beta, C + n, ldc);
  if (n == N) return;
  float c[R * 16] = {};
  for (int r = 0; r < R; ++r) std::copy(C + r * ldc + n, C + r * ldc + N, c + r * 16);
  block<R, 1>(K, alpha, A, lda, panel, 16, beta, c, 16);
  for (int r = 0; r < R; ++r) std::copy(c + r * 16, c + r * 16 + (N - n), C + r * ldc + n);
}

inline __attribute__((always_inline)) void body(int64_t M, int64_t N, int64_t K, float alpha,
                                                const float* A, int64_t lda, const float* B,
                                                int64_t ldb, float beta, float* C, int64_t ldc) {
  const int64_t n0 = N / 16 * 16;
  // (one buffer a thread, kept from call to call: an RNN calls this every step)
  thread_local std::vector<float> panel;
  if (n0 < N && panel.size() < static_cast<size_t>(K * 16))
    panel.resize(static_cast<size_t>(K * 16));
  for (int64_t k = 0; k < K && n0 < N; ++k)
    std::copy(B + k * ldb + n0, B + k * ldb + N, panel.data() + k * 16);
  const float* p = panel.data();
  int64_t m = 0;
  for (; m + 4 <= M; m += 4)
    rows<4>(N, K, alpha, A + m * lda, lda, B, ldb, p, beta, C + m * ldc, ldc);
  switch (M - m) {
    case 3:
      rows<3>(N, K, alpha, A + m * lda, lda, B, ldb, p, beta, C + m * ldc, ldc);
      break;
    case 2:
      rows<2>(N, K, alpha, A + m * lda, lda, B, ldb, p, beta, C + m * ldc, ldc);
      break;
    case 1:
      rows<1>(N, K, alpha, A + m * lda, lda, B, ldb, p, beta, C + m * ldc, ldc);
      break;
    default:
      break;
  }
}

#define KILN_SMALL_GEMM_ARGS                                                                 \
  int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda, const float *B, \
      int64_t ldb, float beta, float *C, int64_t ldc
void baseline(KILN_SMALL_GEMM_ARGS) { body(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc); }
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target("avx512f"))) void avx512(KILN_SMALL_GEMM_ARGS) {
  body(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
#endif

}  // namespace

void small_gemm_nn(KILN_SMALL_GEMM_ARGS) {
  if (M <= 0 || N <= 0) return;
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
  if (cpu_isa() == CpuIsa::avx512) return avx512(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
#endif
  baseline(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
#undef KILN_SMALL_GEMM_ARGS

}  // namespace kiln::cpu
