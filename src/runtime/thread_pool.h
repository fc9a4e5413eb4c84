// A fork-join pool for CPU kernels: parallel_for splits a range over the workers and the caller.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kiln {

class ThreadPool {
 public:
  /// `threads` = 0: one per hardware thread.
  explicit ThreadPool(int threads = 0);
  ~ThreadPool();
  int size() const { return static_cast<int>(workers_.size()) + 1; }
  /// Runs body(begin, end) over [0, n) in at most size() chunks of at least `grain` items.
  /// Calls from inside a running body run serially (no nested parallelism).
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& body);

  /// The process-wide pool.
  static ThreadPool& global();

 private:
  void worker(int index);
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::mutex run_mu_;  // one parallel_for at a time
  std::condition_variable cv_, done_cv_;
  const std::function<void(int64_t, int64_t)>* body_ = nullptr;
  int64_t n_ = 0, chunk_ = 0;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
};

}  // namespace kiln
