#include "runtime/thread_pool.h"

#include <algorithm>

#include "runtime/env.h"

namespace kiln {

namespace {
thread_local bool t_in_pool = false;
}

ThreadPool::ThreadPool(int threads) {
  if (threads <= 0) threads = env::threads();
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

ThreadPool& ThreadPool::global() {
  static ThreadPool pool;
  return pool;
}

void ThreadPool::worker(int index) {
  t_in_pool = true;
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int64_t, int64_t)>* body;
    int64_t n, chunk;
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      body = body_;
      n = n_;
      chunk = chunk_;
    }
    const int64_t b = index * chunk;
    if (b < n) (*body)(b, std::min(n, b + chunk));
    {
      std::lock_guard<std::mutex> l(mu_);
      if (--pending_ == 0) done_cv_.notify_one();
    }
  }
}

void ThreadPool::parallel_for(int64_t n, int64_t grain,
                              const std::function<void(int64_t, int64_t)>& body) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t max_chunks = (n + grain - 1) / grain;
  const int parts = static_cast<int>(std::min<int64_t>(size(), max_chunks));
  if (parts <= 1 || t_in_pool || workers_.empty()) {
    body(0, n);
    return;
  }
  std::lock_guard<std::mutex> run(run_mu_);
  const int64_t chunk = (n + parts - 1) / parts;
  {
    std::lock_guard<std::mutex> l(mu_);
    body_ = &body;
    n_ = n;
    chunk_ = chunk;
    pending_ = static_cast<int>(workers_.size());
    ++generation_;
  }
  cv_.notify_all();
  t_in_pool = true;
  body(0, std::min(n, chunk));
  t_in_pool = false;
  std::unique_lock<std::mutex> l(mu_);
  done_cv_.wait(l, [&] { return pending_ == 0; });
}

}  // namespace kiln
