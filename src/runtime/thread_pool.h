// Parallel loops of the CPU kernels. They run on OpenMP's threads, the same threads oneDNN uses,
// so kiln's own kernels and oneDNN's never compete for the cores (two runtimes, each spinning
// while the other works, made mixed graphs several times slower).
#pragma once

#include <cstdint>
#include <functional>

namespace kiln {

class ThreadPool {
 public:
  /// `threads` = 0: KILN_THREADS, else one per hardware thread.
  explicit ThreadPool(int threads = 0);
  int size() const { return threads_; }
  /// Runs body(begin, end) over [0, n) in at most size() chunks of at least `grain` items.
  /// Calls from inside a running body run serially (no nested parallelism). An exception thrown
  /// by a chunk is rethrown here after every chunk has finished.
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& body);

  /// The process-wide pool.
  static ThreadPool& global();

 private:
  int threads_;
};

}  // namespace kiln
