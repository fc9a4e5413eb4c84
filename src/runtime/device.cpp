#include <cstdlib>

#include "core/errors.h"
#include "kiln/device.h"
#include "core/device_backend.h"
#include "runtime/env.h"

namespace kiln {

Device Device::parse(const std::string& s) {
  if (s == "cpu") return cpu();
  if (s == "cuda") return cuda(0);
  if (s.rfind("cuda:", 0) == 0) {
    const std::string idx = s.substr(5);
    if (!idx.empty() && idx.size() < 4 && idx.find_first_not_of("0123456789") == std::string::npos)
      return cuda(std::stoi(idx));
  }
  fail<ValueError>("[device] unknown device '{}' (expected cpu, cuda or cuda:N)", s);
}

std::string Device::str() const {
  return kind == Kind::cpu ? "cpu" : "cuda:" + std::to_string(index);
}

DeviceBackend* device_backend(Backend b) { return b == Backend::cuda ? cuda_backend() : nullptr; }

DeviceBackend* backend_of(Device device) {
  const Backend kind = backend_for(device);
  if (kind == Backend::cpu) return nullptr;
  DeviceBackend* b = device_backend(kind);
  const int n = b ? b->device_count() : 0;
  if (!b || device.index < 0 || device.index >= n)
    fail<UnsupportedError>("[device] {} is not available: {} {} devices visible{}", device.str(), n,
                           backend_name(kind),
                           b ? "" : " (kiln was built without it or no such device is present)");
  return b;
}

MemoryStats memory_stats(Device device) {
  DeviceBackend* b = backend_of(device);
  return b ? b->memory_stats(device.index) : MemoryStats{};
}

void empty_cache(Device device) {
  if (DeviceBackend* b = backend_of(device)) b->empty_cache(device.index);
}

Device default_device() {
  if (const char* d = env::device()) return Device::parse(d);
  DeviceBackend* gpu = device_backend(Backend::cuda);
  return gpu && gpu->device_count() > 0 ? Device::cuda(0) : Device::cpu();
}

}  // namespace kiln
