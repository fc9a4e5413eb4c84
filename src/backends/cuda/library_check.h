// Error checks of cuBLAS(Lt) and cuDNN calls: a failure becomes kiln::DeviceError naming the
// failing expression, the library's status string and where it happened.
#pragma once

#include <cublasLt.h>
#include <cudnn.h>
#include <fmt/format.h>

#include "kiln/error.h"

namespace kiln::cuda {

[[noreturn]] inline void throw_cublas_error(cublasStatus_t s, const char* expr, const char* file,
                                            int line) {
  throw DeviceError(
      fmt::format("[cublas] {} failed: {} at {}:{}", expr, cublasLtGetStatusString(s), file, line));
}

[[noreturn]] inline void throw_cudnn_error(cudnnStatus_t s, const char* expr, const char* file,
                                           int line) {
  throw DeviceError(
      fmt::format("[cudnn] {} failed: {} at {}:{}", expr, cudnnGetErrorString(s), file, line));
}

}  // namespace kiln::cuda

#define KILN_CUBLAS_CHECK(expr)                                              \
  do {                                                                       \
    const cublasStatus_t kiln_st_ = (expr);                                  \
    if (kiln_st_ != CUBLAS_STATUS_SUCCESS)                                   \
      ::kiln::cuda::throw_cublas_error(kiln_st_, #expr, __FILE__, __LINE__); \
  } while (0)

#define KILN_CUDNN_CHECK(expr)                                              \
  do {                                                                      \
    const cudnnStatus_t kiln_st_ = (expr);                                  \
    if (kiln_st_ != CUDNN_STATUS_SUCCESS)                                   \
      ::kiln::cuda::throw_cudnn_error(kiln_st_, #expr, __FILE__, __LINE__); \
  } while (0)
