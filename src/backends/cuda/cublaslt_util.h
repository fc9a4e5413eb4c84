// cuBLASLt handles that destroy themselves, and operand alignment, for the cuBLASLt products of
// linalg.cu and quant_gemm.cu.
#pragma once

#include <cublasLt.h>

#include <cstdint>

namespace kiln::cuda::lt {

template <typename T, cublasStatus_t (*Destroy)(T)>
struct Handle {
  T h = nullptr;
  Handle() = default;
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle() {
    if (h) Destroy(h);
  }
};
using MatmulDesc = Handle<cublasLtMatmulDesc_t, cublasLtMatmulDescDestroy>;
using Layout = Handle<cublasLtMatrixLayout_t, cublasLtMatrixLayoutDestroy>;
using Preference = Handle<cublasLtMatmulPreference_t, cublasLtMatmulPreferenceDestroy>;

/// The largest power of two (<= 256) that divides p's address: what cuBLASLt's alignment
/// preferences take.
inline uint32_t alignment_of(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t r = 256;
  while (r > 1 && a % r != 0) r /= 2;
  return r;
}

}  // namespace kiln::cuda::lt
