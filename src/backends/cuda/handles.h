// Library handles of the CUDA kernels: one cuBLASLt and one cuDNN handle per device and per
// host thread, created on first use and destroyed when the thread ends. A handle is never shared
// between threads, so kernels on different threads need no locking around library calls.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cudnn.h>

namespace kiln::cuda {

/// The calling thread's cuBLASLt handle for `device`.
cublasLtHandle_t cublaslt_handle(int device);
/// The calling thread's cuDNN handle for `device`, bound to `stream` (cudnnSetStream).
cudnnHandle_t cudnn_handle(int device, cudaStream_t stream);
/// A cuDNN handle of `device` that lives as long as the process, for objects that outlive a
/// thread and keep the handle they were made with (graph-API plans). Not bound to any stream;
/// callers serialize their use of it.
cudnnHandle_t cudnn_shared_handle(int device);

}  // namespace kiln::cuda
