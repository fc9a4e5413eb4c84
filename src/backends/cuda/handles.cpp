#include "backends/cuda/handles.h"

#include <map>
#include <mutex>
#include <unordered_map>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/library_check.h"

namespace kiln::cuda {

namespace {
// Handles bind to the device current at creation.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    KILN_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device) KILN_CUDA_CHECK(cudaSetDevice(device));
  }
  ~DeviceScope() { cudaSetDevice(previous_); }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = 0;
};

struct ThreadHandles {
  std::unordered_map<int, cublasLtHandle_t> cublaslt;
  std::unordered_map<int, cudnnHandle_t> cudnn;
  ThreadHandles() = default;
  ThreadHandles(const ThreadHandles&) = delete;
  ThreadHandles& operator=(const ThreadHandles&) = delete;
  // Errors are ignored: at process exit the driver may already be shutting down.
  ~ThreadHandles() {
    for (auto& [d, h] : cublaslt) cublasLtDestroy(h);
    for (auto& [d, h] : cudnn) cudnnDestroy(h);
  }
};

ThreadHandles& thread_handles() {
  thread_local ThreadHandles handles;
  return handles;
}
}  // namespace

cublasLtHandle_t cublaslt_handle(int device) {
  auto& map = thread_handles().cublaslt;
  auto it = map.find(device);
  if (it != map.end()) return it->second;
  DeviceScope scope(device);
  cublasLtHandle_t h = nullptr;
  KILN_CUBLAS_CHECK(cublasLtCreate(&h));
  map.emplace(device, h);
  return h;
}

cudnnHandle_t cudnn_handle(int device, cudaStream_t stream) {
  auto& map = thread_handles().cudnn;
  auto it = map.find(device);
  cudnnHandle_t h = nullptr;
  if (it != map.end()) {
    h = it->second;
  } else {
    DeviceScope scope(device);
    KILN_CUDNN_CHECK(cudnnCreate(&h));
    map.emplace(device, h);
  }
  KILN_CUDNN_CHECK(cudnnSetStream(h, stream));
  return h;
}

cudnnHandle_t cudnn_shared_handle(int device) {
  static std::mutex mu;
  static std::map<int, cudnnHandle_t> handles;  // never destroyed: plans refer to them
  std::lock_guard<std::mutex> l(mu);
  if (auto it = handles.find(device); it != handles.end()) return it->second;
  DeviceScope scope(device);
  cudnnHandle_t h = nullptr;
  KILN_CUDNN_CHECK(cudnnCreate(&h));
  return handles[device] = h;
}

}  // namespace kiln::cuda
