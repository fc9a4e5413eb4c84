// Devices and their in-order work queues.
#pragma once

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

/// Number of CUDA devices visible (0 when kiln was built without CUDA or no GPU is present).
int cuda_device_count();
/// KILN_DEVICE if set, else the first device whose backend can run graphs (CPU without a GPU).
Device default_device();

/// An in-order work queue of one device. On the CPU, a worker thread runs submitted work in order.
class Queue {
 public:
  explicit Queue(Device device = Device::cpu());
  ~Queue();
  Queue(Queue&&) noexcept;
  Queue& operator=(Queue&&) noexcept;
  Device device() const;
  /// Enqueues work; it runs after everything submitted before it.
  void submit(std::function<void()> work);
  /// Blocks until everything submitted so far has run.
  void wait();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln
