// Queues and events (include/kiln/device.h, include/kiln/event.h).
//
// A GPU queue's stream is fed by one submission thread, so work lands on it in submission order.
// What must happen once the device has passed a point (finishing a run, signaling an event at
// its completed stage, host work) is handed to the queue's completion thread with a blocking-sync
// CUDA event recorded at that point; the thread sleeps in cudaEventSynchronize until the device
// has passed it (this wakes sooner than a cudaLaunchHostFunc callback handing work to a thread:
// 43 against 62 us from a one-kernel run to a host waiter on the H200).
#include <future>

#include <fmt/format.h>

#include "core/device_backend.h"
#include "core/errors.h"
#include "runtime/profiler.h"
#include "runtime/queue_impl.h"

namespace kiln {

namespace detail {

EventState::~EventState() {
  for (auto& p : pending) p.backend->destroy_event(p.device, p.event);
}

std::exception_ptr EventState::failure_locked(uint64_t v) const {
  for (auto it = failures.rbegin(); it != failures.rend(); ++it)
    if (v >= it->lo && v <= it->hi) return it->error;
  return nullptr;
}

void EventState::advance(uint64_t v, std::exception_ptr error) {
  std::vector<Pending> passed;
  std::vector<std::pair<std::function<void(std::exception_ptr)>, std::exception_ptr>> reached;
  {
    std::lock_guard<std::mutex> l(mu);
    if (v <= value) return;
    if (error) {
      failures.push_back({value + 1, v, error});
      if (failures.size() > 64) failures.erase(failures.begin());
    }
    value = v;
    for (size_t i = 0; i < pending.size();) {
      if (pending[i].value <= v) {
        passed.push_back(pending[i]);
        pending[i] = pending.back();
        pending.pop_back();
      } else {
        ++i;
      }
    }
    for (size_t i = 0; i < listeners.size();) {
      if (listeners[i].first <= v) {
        reached.emplace_back(std::move(listeners[i].second), failure_locked(listeners[i].first));
        listeners[i] = std::move(listeners.back());
        listeners.pop_back();
      } else {
        ++i;
      }
    }
  }
  cv.notify_all();
  if (prof::on())
    prof::instant(SpanKind::signal, "signal event", "host", prof::thread_track(), 0,
                  fmt::format("value {}{}", v, error ? " (failed run)" : ""));
  for (auto& p : passed) p.backend->destroy_event(p.device, p.event);
  for (auto& [fn, e] : reached) fn(e);
}

void EventState::host_wait(uint64_t v) {
  prof::HostScope span(SpanKind::wait, "wait event", prof::on() ? fmt::format("value {}", v) : "");
  std::unique_lock<std::mutex> l(mu);
  cv.wait(l, [&] { return value >= v; });
  if (auto e = failure_locked(v)) std::rethrow_exception(e);
}

void EventState::add_pending(uint64_t v, DeviceBackend& b, int device, void* stream) {
  void* e = b.create_sync_event(device);
  try {
    b.record_event(device, e, stream);
  } catch (...) {
    b.destroy_event(device, e);
    throw;
  }
  {
    std::lock_guard<std::mutex> l(mu);
    if (v > value) {
      pending.push_back({v, &b, device, e});
      e = nullptr;
    }
  }
  if (e) b.destroy_event(device, e);
  if (prof::on())
    prof::instant(SpanKind::signal, "signal event", fmt::format("cuda:{}", device),
                  prof::stream_track(stream), 0,
                  fmt::format("value {} once the device gets here", v));
  cv.notify_all();  // GPU queues waiting for v can chain on the device now
}

void EventState::device_wait(uint64_t v, DeviceBackend& b, int device, void* stream) {
  std::unique_lock<std::mutex> l(mu);
  for (;;) {
    if (value >= v) {
      if (auto e = failure_locked(v)) std::rethrow_exception(e);
      return;
    }
    // any submitted signal at or above v reaches it once the device passes it
    for (auto& p : pending)
      if (p.value >= v) {
        b.stream_wait_event(device, stream, p.event);  // under mu: p.event stays alive
        return;
      }
    cv.wait(l);
  }
}

}  // namespace detail

// ---- Event

Event::Event(uint64_t initial_value) : state_(std::make_shared<detail::EventState>()) {
  state_->value = initial_value;
}

uint64_t Event::value() const {
  std::lock_guard<std::mutex> l(state_->mu);
  return state_->value;
}

void Event::signal(uint64_t value) const { state_->advance(value); }

void Event::wait(uint64_t value) const { state_->host_wait(value); }

bool Event::wait_for(uint64_t value, std::chrono::nanoseconds timeout) const {
  auto& s = *state_;
  std::unique_lock<std::mutex> l(s.mu);
  if (!s.cv.wait_for(l, timeout, [&] { return s.value >= value; })) return false;
  if (auto e = s.failure_locked(value)) std::rethrow_exception(e);
  return true;
}

void Event::notify(uint64_t value, std::function<void(std::exception_ptr)> fn) const {
  auto& s = *state_;
  std::exception_ptr e;
  {
    std::lock_guard<std::mutex> l(s.mu);
    if (s.value < value) {
      s.listeners.emplace_back(value, std::move(fn));
      return;
    }
    e = s.failure_locked(value);
  }
  fn(e);
}

// ---- Queue

namespace {
void report_thrown(const char* what) {
  fmt::print(stderr, "[queue] work submitted to a queue threw: {}\n", what);
}

}  // namespace

void Queue::Impl::loop() {
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
    try {
      w();
    } catch (const std::exception& e) {
      report_thrown(e.what());
    } catch (...) {
      report_thrown("an exception of unknown type");
    }
    {
      std::lock_guard<std::mutex> l(mu);
      busy = false;
    }
    idle_cv.notify_all();
  }
}

void Queue::Impl::done_loop() {
  backend->kernel_env(device.index, stream);  // this thread's device
  for (;;) {
    Done d;
    {
      std::unique_lock<std::mutex> l(done_mu);
      done_cv.wait(l, [&] { return done_stop || !done.empty(); });
      if (done.empty()) return;
      d = std::move(done.front());
      done.pop_front();
    }
    try {
      if (d.event) backend->host_wait_event(device.index, d.event);  // sleeps, does not spin
    } catch (const std::exception& e) {
      report_thrown(e.what());  // the run's finish meets the device error again
    }
    try {
      d.fn();
    } catch (const std::exception& e) {
      report_thrown(e.what());
    } catch (...) {
      report_thrown("an exception of unknown type");
    }
    {
      std::lock_guard<std::mutex> l(done_mu);
      if (d.event) free_events.push_back(d.event);
      --in_flight;
    }
    done_cv.notify_all();
  }
}

void Queue::Impl::enqueue(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> l(mu);
    work.push_back(std::move(fn));
  }
  cv.notify_one();
}

void Queue::Impl::after_device(std::function<void()> fn) {
  if (!backend) {
    fn();
    return;
  }
  // the completion thread sleeps on an event recorded here, then runs fn
  void* e = nullptr;
  {
    std::lock_guard<std::mutex> l(done_mu);
    if (!free_events.empty()) {
      e = free_events.back();
      free_events.pop_back();
    }
  }
  if (!e) e = backend->create_blocking_event(device.index);
  try {
    backend->record_event(device.index, e, stream);
  } catch (...) {
    backend->destroy_event(device.index, e);
    throw;
  }
  {
    std::lock_guard<std::mutex> l(done_mu);
    ++in_flight;
    done.push_back({e, std::move(fn)});
  }
  done_cv.notify_all();
}

void Queue::Impl::drain_device() {
  if (!backend) return;
  std::promise<void> passed;
  auto f = passed.get_future();
  after_device([&passed] { passed.set_value(); });
  f.wait();
}

void Queue::Impl::wait_event(const Event& event, uint64_t value) {
  if (!backend) return event.state()->host_wait(value);  // a span of its own
  prof::HostScope span(SpanKind::wait, "wait event",
                       prof::on() ? fmt::format("value {}", value) : "");
  event.state()->device_wait(value, *backend, device.index, stream);
}

Queue::Queue(Device device) : impl_(std::make_unique<Impl>()) {
  static std::atomic<int64_t> queues{0};
  const int64_t id = ++queues;  // names its tracks in profiles
  impl_->device = device;
  if (device.kind != Device::Kind::cpu) {
    impl_->backend = backend_of(device);  // throws for a device this build or machine lacks
    impl_->stream = impl_->backend->create_stream(device.index);
    prof::name_stream(impl_->stream, fmt::format("queue {}", id));
    impl_->done_thread = std::thread([p = impl_.get()] { p->done_loop(); });
  }
  impl_->thread = std::thread([p = impl_.get(), id] {
    prof::name_thread(fmt::format("queue {} ({})", id, p->device.str()));
    p->loop();
  });
}

Queue::Impl::~Impl() {
  {
    std::lock_guard<std::mutex> l(mu);
    stop = true;
  }
  cv.notify_all();
  if (thread.joinable()) thread.join();  // after the work submitted so far
  if (!backend) return;
  {
    std::unique_lock<std::mutex> l(done_mu);
    done_cv.wait(l, [&] { return in_flight == 0; });
    done_stop = true;
  }
  done_cv.notify_all();
  if (done_thread.joinable()) done_thread.join();
  for (void* e : free_events) backend->destroy_event(device.index, e);
  if (stream) backend->destroy_stream(device.index, stream);
}

Queue::~Queue() = default;
Queue::Queue(Queue&&) noexcept = default;
Queue& Queue::operator=(Queue&&) noexcept = default;
Device Queue::device() const { return impl_->device; }
void* Queue::native_handle() const { return impl_->stream; }

void Queue::submit(std::function<void()> work) {
  auto* q = impl_.get();
  if (!q->backend) {
    q->enqueue(std::move(work));
    return;
  }
  // on a GPU queue: after the device has passed the work before it
  q->enqueue([q, work = std::move(work)] {
    q->drain_device();
    work();
  });
}

void Queue::wait() {
  auto* q = impl_.get();
  std::promise<void> done;
  auto f = done.get_future();
  q->enqueue([q, &done] {
    try {
      q->drain_device();
    } catch (...) {
    }
    done.set_value();
  });
  f.wait();
}

}  // namespace kiln
