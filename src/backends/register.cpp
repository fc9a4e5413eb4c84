#include "backends/cpu/kernels.h"
#include "runtime/backends.h"

namespace kiln {

namespace cuda {
void register_kernels();  // src/backends/cuda/ (or no_cuda.cpp when built without CUDA)
}

void register_builtin_backends() {
  cpu::register_kernels();
  cuda::register_kernels();
}

}  // namespace kiln
