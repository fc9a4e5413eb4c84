// The insides of Queue and Event, shared by the runtime (Executable::run_async).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "kiln/device.h"
#include "kiln/event.h"

namespace kiln {

class DeviceBackend;

namespace detail {

/// An Event's timeline. GPU signals are recorded as CUDA events when their work is submitted
/// (`pending`) and reach `value` when the device has passed them.
struct EventState {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t value = 0;
  // values reached by a failed run: waits for lo..hi get its error
  struct Failure {
    uint64_t lo, hi;
    std::exception_ptr error;
  };
  std::vector<Failure> failures;
  struct Pending {
    uint64_t value;
    DeviceBackend* backend;
    int device;
    void* event;
  };
  std::vector<Pending> pending;
  std::vector<std::pair<uint64_t, std::function<void(std::exception_ptr)>>> listeners;

  ~EventState();
  /// The error of a failed run for `v`, if any (caller holds mu).
  std::exception_ptr failure_locked(uint64_t v) const;
  /// Moves the value up to `v` (nothing when not above), with `error` when a failed run was to
  /// signal it; wakes waiters and calls the listeners it reached.
  void advance(uint64_t v, std::exception_ptr error = nullptr);
  /// Blocks until the value reaches `v`; throws the failure for `v`.
  void host_wait(uint64_t v);
  /// Records on `stream` that the value becomes `v` once the device passes this point (the
  /// caller advances it then).
  void add_pending(uint64_t v, DeviceBackend& b, int device, void* stream);
  /// Makes `stream` wait until the value reaches `v`: at once when it has, on the device when a
  /// submitted GPU signal will reach it, else the calling thread sleeps until one of those holds.
  /// Throws the failure for `v`.
  void device_wait(uint64_t v, DeviceBackend& b, int device, void* stream);
};

}  // namespace detail

/// A queue: a submission thread that runs work in order and, on a GPU, the stream that work
/// enqueues on plus a thread that runs what must happen once the device has passed a point.
struct Queue::Impl {
  Device device;
  DeviceBackend* backend = nullptr;  // GPU queues
  void* stream = nullptr;

  std::mutex mu;
  std::condition_variable cv, idle_cv;
  std::deque<std::function<void()>> work;
  bool busy = false, stop = false;
  std::thread thread;

  std::mutex done_mu;
  std::condition_variable done_cv;
  // what the completion thread runs, each once the device has passed its event (nullptr: now)
  struct Done {
    void* event = nullptr;
    std::function<void()> fn;
  };
  std::deque<Done> done;
  std::vector<void*> free_events;  // blocking-sync events to record again
  int64_t in_flight = 0;  // device callbacks enqueued, not yet run
  bool done_stop = false;
  std::thread done_thread;

  Impl() = default;
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;
  /// Waits for everything submitted, then stops the threads and destroys the stream.
  ~Impl();

  /// Runs `fn` on the submission thread after everything submitted before it.
  void enqueue(std::function<void()> fn);
  /// On the submission thread: runs `fn` on the completion thread once the device has passed
  /// everything enqueued on the stream so far (CPU queues: now, on the calling thread).
  void after_device(std::function<void()> fn);
  /// On the submission thread: sleeps until the device has passed everything enqueued so far.
  void drain_device();
  /// On the submission thread: later work waits until `event` reaches `value`. Throws the
  /// failure for `value`.
  void wait_event(const Event& event, uint64_t value);

  void loop();
  void done_loop();
};

}  // namespace kiln
