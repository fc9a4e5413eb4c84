// CUDA backend: device discovery. Kernels arrive with the CUDA backend work; until then the
// backend registers none and graphs compile for the CPU.
#include <cuda_runtime.h>

#include "kiln/device.h"

namespace kiln {
namespace cuda {
void register_kernels() {}
}  // namespace cuda

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

}  // namespace kiln
