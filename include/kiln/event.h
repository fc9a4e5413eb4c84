// Shared events: a 64-bit timeline that orders work across queues, devices and the host.
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>

namespace kiln {

namespace detail {
struct EventState;
}

/// A monotonic 64-bit timeline (MTLSharedEvent's role). Queues signal it when work reaches a
/// stage and wait for a value before later work starts; the host can signal, query and wait too.
/// Any queue of any device can wait on any event. The value never decreases: signaling a value
/// at or below the current one changes nothing.
///
/// An Event is a handle: copies share one timeline, which lives while any copy, or work that
/// signals or waits on it, does.
///
/// Failure: when a run that was to signal value v fails, the values between the current one and
/// v are reached *with that run's error*: host waits for them throw it, runs waiting for them
/// fail with it (and fail the events they signal in turn), so an error travels down a chain of
/// queues instead of leaving it waiting forever.
///
/// Waiting never spins a CPU core: host waits sleep on a condition variable; a GPU queue waiting
/// on work another GPU queue has already submitted waits on the device (a CUDA event), otherwise
/// its submission thread sleeps until the value is signaled.
class Event {
 public:
  explicit Event(uint64_t initial_value = 0);

  /// The value reached so far.
  uint64_t value() const;
  /// Sets the value from the host (no change when `value` is not above the current one); wakes
  /// host waiters and queues waiting for it.
  void signal(uint64_t value) const;
  /// Blocks until the value is at least `value`. Throws the error of a failed run that was to
  /// signal it.
  void wait(uint64_t value) const;
  /// The same, giving up after `timeout`: false when the value was not reached in time.
  bool wait_for(uint64_t value, std::chrono::nanoseconds timeout) const;
  /// Calls `fn` once, on a kiln thread or the signaling thread, when the value reaches `value`
  /// (at once when it already has), with the error of a failed run that was to signal it.
  void notify(uint64_t value, std::function<void(std::exception_ptr)> fn) const;

  bool operator==(const Event& o) const { return state_ == o.state_; }
  const std::shared_ptr<detail::EventState>& state() const { return state_; }

 private:
  std::shared_ptr<detail::EventState> state_;
};

/// When a run signals an event: once it is scheduled on its queue (for a GPU queue: its work is
/// submitted to the device; for a CPU queue: it starts) or once it has completed.
enum class Stage : uint8_t { scheduled, completed };

}  // namespace kiln
