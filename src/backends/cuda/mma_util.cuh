// Building blocks of kiln's tensor-core kernels (sm_80 and later): asynchronous 16-byte copies
// global -> shared (cp.async) and ldmatrix loads of 8x8 16-bit matrices from shared memory.
// Used by the attention kernel (attention.cu) and the int8 implicit GEMM (qconv_igemm.cu).
// Host side: the opt-in for more than 48 KiB of dynamic shared memory.
#pragma once

#include <cuda_runtime.h>

#include <cstdlib>
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

/// Programmatic dependent launch (sm_90; a no-op before): a kernel launched by
/// launch_after_previous may start while the grid before it in the stream still runs, and must
/// pass wait_for_previous_grids (which returns once the grids before it have finished and their
/// writes are visible) before it reads or writes global memory that other kernels use. Until then
/// it may do index math, shared-memory setup, and read what no kernel of the stream writes.
__device__ __forceinline__ void wait_for_previous_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
/// Lets the next kernel of the stream (if launched by launch_after_previous) start its blocks
/// once every block of this grid has called this or exited: called where a block's remaining
/// work no longer needs the whole SM (its epilogue).
__device__ __forceinline__ void allow_next_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

/// Launches kernel<<<grid, block, smem, stream>>>(args...), with a programmatic dependency on the
/// stream's previous kernel when `pdl` (KernelChoices::programmatic_launch; see
/// wait_for_previous_grids: the kernel must call it before it touches the tensors). Without it
/// the kernel launches as <<<>>> would and its wait returns at once. A failed launch is left for
/// check_launch (the runtime keeps it as the last error), which names the op.
template <typename... Params, typename... Args>
void launch_after_previous(bool pdl, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                           cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = pdl ? 1 : 0;
  (void)cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
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
