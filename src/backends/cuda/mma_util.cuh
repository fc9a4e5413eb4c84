// Building blocks of kiln's tensor-core kernels (sm_80 and later): asynchronous 16-byte copies
// global -> shared (cp.async) and ldmatrix loads of 8x8 16-bit matrices from shared memory.
// Used by the attention kernel (attention.cu) and the int8 implicit GEMM (quant_conv.cu).
// Host side: the opt-in for more than 48 KiB of dynamic shared memory.
#pragma once

#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <utility>

#include "backends/cuda/cuda_check.h"

namespace kiln::cuda {

__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

/// 16 bytes global -> shared without passing through registers (through L2, not L1);
/// src_bytes 0 writes zeros instead.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, int src_bytes = 16) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem)),
               "l"(gmem), "r"(src_bytes)
               : "memory");
}
/// kBytes (4, 8 or 16) global -> shared through L1 (.ca): for data that neighbouring rows of a
/// block read again; both addresses aligned to kBytes.
template <int kBytes>
__device__ __forceinline__ void cp_async_ca(void* smem, const void* gmem) {
  static_assert(kBytes == 4 || kBytes == 8 || kBytes == 16, "cp.async copies 4, 8 or 16 bytes");
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(smem_addr(smem)), "l"(gmem),
               "n"(kBytes)
               : "memory");
}
/// Closes the thread's group of copies since the last one.
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
/// Waits until at most N of the thread's groups are still in flight.
template <int N> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/// Four 8x8 matrices of 16-bit values (or 8x16 bytes) from shared memory: lanes 8m..8m+7 give
/// the row addresses of matrix m; register m receives the lane's two values of it (row lane/4,
/// columns 2(lane%4) and the next).
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
/// The same, each matrix transposed.
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

/// Lets `kernel` take `smem` bytes of dynamic shared memory on the current device: the driver is
/// asked once per kernel, device and larger size (the call costs host time on every launch).
template <typename Kernel> void allow_smem(Kernel kernel, size_t smem) {
  if (smem <= 48 * 1024) return;
  int dev = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&dev));
  static std::mutex mu;
  static std::map<std::pair<int, const void*>, size_t> allowed;
  std::lock_guard<std::mutex> l(mu);
  size_t& have = allowed[{dev, reinterpret_cast<const void*>(kernel)}];
  if (have >= smem) return;
  KILN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(smem)));
  have = smem;
}

}  // namespace kiln::cuda
