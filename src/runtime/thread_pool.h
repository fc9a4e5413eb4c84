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

  /// While alive, OpenMP's thread count on the calling thread is the pool's (none: unchanged):
  /// oneDNN's primitives take their threads from there (and lay out their work by it when made),
  /// so an executable compiled for N threads runs its convolutions and products on N, not on
  /// every core. The count is per calling thread, so runs on other threads are unaffected; the
  /// caller's count is restored at the end. Only executables compiled with a thread count do
  /// this: under the process pool (KILN_THREADS) oneDNN keeps OpenMP's own count, so that a
  /// KILN_THREADS of any size gives the same bits (oneDNN's reductions split by its threads).
  class Bound {
   public:
    explicit Bound(const ThreadPool* pool);
    ~Bound();
    Bound(const Bound&) = delete;
    Bound& operator=(const Bound&) = delete;

   private:
    int before_;
  };

 private:
  int threads_;
};

}  // namespace kiln
