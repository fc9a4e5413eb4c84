#include "runtime/thread_pool.h"

#include <omp.h>

#include <algorithm>
#include <exception>
#include <mutex>
#include <thread>

#include "runtime/env.h"

namespace kiln {

ThreadPool::ThreadPool(int threads) {
  if (threads <= 0) threads = env::threads();
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  threads_ = threads;
}

ThreadPool& ThreadPool::global() {
  static ThreadPool pool;
  return pool;
}

ThreadPool::Bound::Bound(const ThreadPool* pool) : before_(omp_get_max_threads()) {
  if (pool && pool->size() != before_) omp_set_num_threads(pool->size());
}

ThreadPool::Bound::~Bound() {
  if (omp_get_max_threads() != before_) omp_set_num_threads(before_);
}

void ThreadPool::parallel_for(int64_t n, int64_t grain,
                              const std::function<void(int64_t, int64_t)>& body) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int parts = static_cast<int>(std::min<int64_t>(threads_, (n + grain - 1) / grain));
  if (parts <= 1 || omp_in_parallel()) {
    body(0, n);
    return;
  }
  const int64_t chunk = (n + parts - 1) / parts;
  std::exception_ptr error;
  std::mutex error_mu;
#pragma omp parallel num_threads(parts)
  {
    const int64_t b = omp_get_thread_num() * chunk;
    if (b < n) {
      try {
        body(b, std::min(n, b + chunk));
      } catch (...) {  // an exception must not leave an OpenMP region
        std::lock_guard<std::mutex> l(error_mu);
        if (!error) error = std::current_exception();
      }
    }
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace kiln
