// Error checks of CUDA calls: a failure becomes kiln::DeviceError naming the failing expression,
// the error and where it happened.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "kiln/error.h"

namespace kiln::cuda {

[[noreturn]] void throw_cuda_error(cudaError_t err, const char* expr, const char* file, int line);

}  // namespace kiln::cuda

#define KILN_CUDA_CHECK(expr)                                                          \
  do {                                                                                 \
    const cudaError_t kiln_err_ = (expr);                                              \
    if (kiln_err_ != cudaSuccess)                                                      \
      ::kiln::cuda::throw_cuda_error(kiln_err_, #expr, __FILE__, __LINE__);            \
  } while (0)
