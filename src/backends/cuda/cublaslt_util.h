// cuBLASLt handles that destroy themselves, and operand alignment, for the cuBLASLt products of
// linalg.cu and quant_gemm.cu.
#pragma once

#include <cublasLt.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include "backends/cuda/library_check.h"

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

/// A preference capping the workspace at `max_workspace` bytes, for operands A, B and C/D aligned
/// to the given bytes.
inline void make_preference(Preference& pref, size_t max_workspace, uint32_t align_a,
                            uint32_t align_b, uint32_t align_d) {
  KILN_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref.h));
  KILN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref.h, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_workspace, sizeof(max_workspace)));
  const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> aligns[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_a},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_b},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_d},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_d}};
  for (const auto& al : aligns)
    KILN_CUBLAS_CHECK(
        cublasLtMatmulPreferenceSetAttribute(pref.h, al.first, &al.second, sizeof(al.second)));
}

/// The heuristic's first algorithm for D = op(A) op(B) (C is D) within `max_workspace` bytes:
/// false when cuBLASLt has none for the product; any other failure throws.
inline bool first_algo(cublasLtHandle_t handle, const MatmulDesc& desc, const Layout& a,
                       const Layout& b, const Layout& d, const Preference& pref,
                       size_t max_workspace, cublasLtMatmulAlgo_t& algo, size_t& workspace) {
  cublasLtMatmulHeuristicResult_t result{};
  int count = 0;
  const cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(handle, desc.h, a.h, b.h, d.h, d.h,
                                                          pref.h, 1, &result, &count);
  if (s == CUBLAS_STATUS_SUCCESS && count > 0 && result.state == CUBLAS_STATUS_SUCCESS &&
      result.workspaceSize <= max_workspace) {
    algo = result.algo;
    workspace = result.workspaceSize;
    return true;
  }
  if (s != CUBLAS_STATUS_SUCCESS && s != CUBLAS_STATUS_NOT_SUPPORTED)
    throw_cublas_error(s, "cublasLtMatmulAlgoGetHeuristic", __FILE__, __LINE__);
  return false;
}

/// build(key) once per key, shared by threads afterwards (a value without an algorithm is
/// remembered too). Keys are shapes: the cache only grows. One cache per call site.
template <typename Key, typename Value, typename Build>
std::shared_ptr<const Value> build_once(const Key& key, Build&& build) {
  static std::mutex mu;
  static std::map<Key, std::shared_ptr<const Value>> built;
  {
    std::lock_guard<std::mutex> l(mu);
    auto it = built.find(key);
    if (it != built.end()) return it->second;
  }
  std::shared_ptr<const Value> v = build(key);
  std::lock_guard<std::mutex> l(mu);
  return built.emplace(key, std::move(v)).first->second;
}

}  // namespace kiln::cuda::lt
