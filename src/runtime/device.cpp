#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <thread>

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

DeviceBackend* backend_of(Device device) {
  if (device.kind == Device::Kind::cpu) return nullptr;
  DeviceBackend* b = cuda_backend();
  const int n = cuda_device_count();
  if (!b || device.index < 0 || device.index >= n)
    fail<UnsupportedError>("[device] {} is not available: {} CUDA devices visible{}", device.str(),
                           n, b || n ? "" : " (kiln was built without CUDA or no GPU is present)");
  return b;
}

Device default_device() {
  if (const char* d = env::device()) return Device::parse(d);
  return cuda_device_count() > 0 ? Device::cuda(0) : Device::cpu();
}

struct Queue::Impl {
  Device device;
  std::mutex mu;
  std::condition_variable cv, idle_cv;
  std::deque<std::function<void()>> work;
  bool busy = false, stop = false;
  std::thread thread;

  void loop() {
    for (;;) {
      std::function<void()> w;
      {
        std::unique_lock<std::mutex> l(mu);
        cv.wait(l, [&] { return stop || !work.empty(); });
        if (work.empty()) return;
        w = std::move(work.front());
        work.pop_front();
        busy = true;
      }
      w();
      {
        std::lock_guard<std::mutex> l(mu);
        busy = false;
      }
      idle_cv.notify_all();
    }
  }
};

Queue::Queue(Device device) : impl_(std::make_unique<Impl>()) {
  if (device.kind != Device::Kind::cpu)
    fail<UnsupportedError>("[queue] no queue for {} in this build", device.str());
  impl_->device = device;
  impl_->thread = std::thread([p = impl_.get()] { p->loop(); });
}

Queue::~Queue() {
  if (!impl_) return;
  {
    std::lock_guard<std::mutex> l(impl_->mu);
    impl_->stop = true;
  }
  impl_->cv.notify_all();
  impl_->thread.join();
}

Queue::Queue(Queue&&) noexcept = default;
Queue& Queue::operator=(Queue&&) noexcept = default;
Device Queue::device() const { return impl_->device; }

void Queue::submit(std::function<void()> work) {
  {
    std::lock_guard<std::mutex> l(impl_->mu);
    impl_->work.push_back(std::move(work));
  }
  impl_->cv.notify_one();
}

void Queue::wait() {
  std::unique_lock<std::mutex> l(impl_->mu);
  impl_->idle_cv.wait(l, [&] { return impl_->work.empty() && !impl_->busy; });
}

}  // namespace kiln
