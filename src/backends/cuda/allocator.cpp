#include "backends/cuda/allocator.h"

#include <fmt/format.h>

#include "backends/cuda/cuda_check.h"
#include "runtime/profiler.h"

namespace kiln::cuda {

namespace {
constexpr size_t kSmall = size_t{1} << 20;       // below: 512-byte classes
constexpr size_t kLargeStep = size_t{2} << 20;   // above: 2 MiB classes

// Makes `device` current for the scope.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    KILN_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device) KILN_CUDA_CHECK(cudaSetDevice(device));
  }
  ~DeviceGuard() { cudaSetDevice(previous_); }

 private:
  int previous_ = 0;
};
}  // namespace

void throw_cuda_error(cudaError_t err, const char* expr, const char* file, int line) {
  throw DeviceError(fmt::format("[cuda] {} failed: {} ({}) at {}:{}", expr, cudaGetErrorName(err),
                                cudaGetErrorString(err), file, line));
}

size_t CachingAllocator::round_size(size_t bytes) {
  if (bytes < kSmall) return (std::max<size_t>(bytes, 1) + 511) / 512 * 512;
  return (bytes + kLargeStep - 1) / kLargeStep * kLargeStep;
}

CachingAllocator::CachingAllocator(int device) : device_(device) {}

CachingAllocator::~CachingAllocator() {
  std::lock_guard<std::mutex> l(mu_);
  DeviceGuard g(device_);
  cudaDeviceSynchronize();
  for (auto& [key, p] : cache_) cudaFree(p);
  for (auto& [p, b] : live_) cudaFree(p);
}

void* CachingAllocator::allocate(size_t bytes, cudaStream_t stream) {
  const size_t n = round_size(bytes);
  std::lock_guard<std::mutex> l(mu_);
  ++stats_.allocations;
  // best fit among this stream's cached blocks, at most a quarter larger than asked
  auto it = cache_.lower_bound({stream, n});
  if (it != cache_.end() && it->first.first == stream && it->first.second <= n + n / 4) {
    void* p = it->second;
    live_[p] = {it->first.second, stream};
    cache_.erase(it);
    ++stats_.cache_hits;
    stats_.allocated_bytes += live_[p].size;
    stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
    return p;
  }
  DeviceGuard g(device_);
  void* p = nullptr;
  cudaError_t err = cudaMalloc(&p, n);
  if (err == cudaErrorMemoryAllocation && !cache_.empty()) {
    cudaGetLastError();  // clear the error before retrying
    free_cached_locked();
    ++stats_.cache_flushes;
    if (prof::on())
      prof::instant(SpanKind::alloc, "cache flushed", fmt::format("cuda:{}", device_), "allocator",
                    0, "out of memory: cached blocks freed and the allocation retried");
    err = cudaMalloc(&p, n);
  }
  if (err == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    size_t free = 0, total = 0;
    cudaMemGetInfo(&free, &total);
    throw OutOfMemory(fmt::format(
        "[cuda] out of memory on cuda:{}: asked for {} bytes; {} bytes free of {}, {} bytes held "
        "by kiln",
        device_, bytes, free, total, stats_.reserved_bytes));
  }
  KILN_CUDA_CHECK(err);
  ++stats_.device_mallocs;
  live_[p] = {n, stream};
  stats_.reserved_bytes += n;
  stats_.allocated_bytes += n;
  stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
  if (prof::on())  // the allocator grew
    prof::instant(SpanKind::alloc, "cudaMalloc", fmt::format("cuda:{}", device_), "allocator",
                  static_cast<int64_t>(n), fmt::format("{} bytes reserved", stats_.reserved_bytes));
  return p;
}

void CachingAllocator::release(void* ptr) {
  if (!ptr) return;
  std::lock_guard<std::mutex> l(mu_);
  auto it = live_.find(ptr);
  if (it == live_.end())
    throw ValueError(fmt::format("[cuda] release of a pointer this allocator did not hand out"));
  stats_.allocated_bytes -= it->second.size;
  cache_.emplace(std::make_pair(it->second.stream, it->second.size), ptr);
  live_.erase(it);
}

void CachingAllocator::free_cached_locked() {
  DeviceGuard g(device_);
  // cached blocks may still be read by queued work: wait for the device before freeing
  KILN_CUDA_CHECK(cudaDeviceSynchronize());
  for (auto& [key, p] : cache_) {
    KILN_CUDA_CHECK(cudaFree(p));
    stats_.reserved_bytes -= key.second;
  }
  cache_.clear();
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> l(mu_);
  free_cached_locked();
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> l(mu_);
  return stats_;
}

}  // namespace kiln::cuda
