// Devices and their in-order work queues.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace kiln {

struct Device {
  enum class Kind : uint8_t { cpu, cuda };
  Kind kind = Kind::cpu;
  int index = 0;

  static Device cpu() { return {Kind::cpu, 0}; }
  static Device cuda(int i = 0) { return {Kind::cuda, i}; }
  /// Parses "cpu", "cuda", "cuda:1"; throws ValueError otherwise.
  static Device parse(const std::string& s);
  std::string str() const;
  bool operator==(const Device& o) const { return kind == o.kind && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
};

/// Device memory held by kiln's allocator on a GPU (all zeros for the CPU, whose buffers come
/// from the system allocator).
struct MemoryStats {
  size_t allocated_bytes = 0;       // in buffers handed out now (rounded to size classes)
  size_t reserved_bytes = 0;        // held from the driver: allocated plus cached for reuse
  size_t peak_allocated_bytes = 0;  // the most allocated_bytes has been
  uint64_t allocations = 0;         // requests so far
  uint64_t device_mallocs = 0;      // of which went to the driver (cudaMalloc)
  uint64_t cache_flushes = 0;       // times the cache was returned to retry an allocation
};
/// The allocator's figures for `device`. Throws UnsupportedError for a device not present.
MemoryStats memory_stats(Device device);
/// Returns the memory cached for reuse on `device` to the driver once the device has finished
/// with it (buffers in use stay). Throws UnsupportedError for a device not present.
void empty_cache(Device device);

/// Number of CUDA devices visible (0 when kiln was built without CUDA or no GPU is present).
int cuda_device_count();
/// KILN_DEVICE if set, else the first device whose backend can run graphs (CPU without a GPU).
Device default_device();

/// An in-order work queue of one device (MTLCommandQueue's role). Executables run on it with
/// Executable::run_async; host work runs on it with submit. A CPU queue has a thread that runs its
/// work in order. A GPU queue has a CUDA stream of its own, a thread that submits work to it in
/// order, and a thread that finishes runs once the GPU has passed them. Any number of queues may
/// exist per device; work on different queues is unordered unless events order it.
/// Destroying a queue waits for everything submitted to it.
class Queue {
 public:
  /// Throws UnsupportedError for a device this build or machine does not have.
  explicit Queue(Device device = Device::cpu());
  ~Queue();
  Queue(Queue&&) noexcept;
  Queue& operator=(Queue&&) noexcept;
  Device device() const;
  /// Enqueues host work: it runs on a kiln thread after everything submitted before it has
  /// completed (on a GPU queue: the device work too), and before later work starts. An exception
  /// it throws is reported on stderr and does not stop the queue.
  void submit(std::function<void()> work);
  /// Blocks until everything submitted so far has completed (device work included).
  void wait();
  /// The native handle of a GPU queue (cudaStream_t); nullptr for a CPU queue.
  void* native_handle() const;

  struct Impl;
  Impl& impl() const { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln
