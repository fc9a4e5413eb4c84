// The CUDA caching allocator. Freed blocks stay with the stream they were used on and are handed
// out again to allocations on that stream: work on one stream runs in order, so the next user of
// a block can never overtake the previous one and no synchronization is needed. When cudaMalloc
// fails, the cache is released and the allocation retried once before OutOfMemory is thrown.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <unordered_map>

namespace kiln::cuda {

struct AllocatorStats {
  size_t allocated_bytes = 0;       // in blocks handed out now (rounded sizes)
  size_t reserved_bytes = 0;        // held from the driver: allocated + cached
  size_t peak_allocated_bytes = 0;
  uint64_t allocations = 0;         // allocate() calls
  uint64_t cache_hits = 0;          // served from the cache
  uint64_t device_mallocs = 0;      // cudaMalloc calls
  uint64_t cache_flushes = 0;       // times the cache was released to retry after a failure
};

class CachingAllocator {
 public:
  explicit CachingAllocator(int device);
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  /// Device memory of at least `bytes` (256-byte aligned) for use on `stream`.
  /// Throws OutOfMemory naming the bytes requested and the bytes free on the device.
  void* allocate(size_t bytes, cudaStream_t stream);
  /// Returns a block from allocate(); it may be reused by later work on the same stream.
  void release(void* ptr);
  /// Returns every cached block to the driver (after the device has finished with them).
  void empty_cache();
  AllocatorStats stats() const;
  /// The size class a request of `bytes` is rounded to.
  static size_t round_size(size_t bytes);

 private:
  struct Block {
    size_t size = 0;
    cudaStream_t stream = nullptr;
  };
  void free_cached_locked();

  int device_;
  mutable std::mutex mu_;
  std::unordered_map<void*, Block> live_;
  std::multimap<std::pair<cudaStream_t, size_t>, void*> cache_;  // (stream, size) -> block
  AllocatorStats stats_;
};

}  // namespace kiln::cuda
