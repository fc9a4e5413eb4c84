// Linked when kiln is built without CUDA (KILN_CUDA=OFF).
#include "kiln/device.h"
#include "core/device_backend.h"

namespace kiln {
namespace cuda {
void register_kernels() {}
}  // namespace cuda
int cuda_device_count() { return 0; }
DeviceBackend* cuda_backend() { return nullptr; }
}  // namespace kiln
