// KILN_STEP_TIMES: step observers that add each op's time to the executable's table (host wall
// time, or device time between timing events), and the table printed when it is destroyed.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "core/device_backend.h"
#include "core/op_registry.h"
#include "runtime/env.h"
#include "runtime/step_loop.h"

namespace kiln {

namespace {
using Clock = std::chrono::steady_clock;

// Wall time of every step; on a device the host waits for the stream after each (and before the
// first), so a step's time is its kernel's.
class HostStepTimer final : public StepObserver {
 public:
  HostStepTimer(detail::ExecutableImpl& x, DeviceBackend* b, void* stream)
      : x_(x), b_(b), stream_(stream) {
    if (b_) b_->synchronize(x_.device.index, stream_);
  }
  void before_step(const StepCall&) override { t0_ = Clock::now(); }
  void after_step(const StepCall& call) override {
    if (b_) b_->synchronize(x_.device.index, stream_);
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0_).count();
    std::lock_guard<std::mutex> l(x_.times_mu);
    auto& [total, calls] = x_.step_ms[op_name(call.node.op)];
    total += ms;
    ++calls;
  }

 private:
  detail::ExecutableImpl& x_;
  DeviceBackend* b_;
  void* stream_;
  Clock::time_point t0_;
};

// A timing event before every step and one after the last, read once the stream has passed them.
class DeviceStepTimer final : public StepObserver {
 public:
  DeviceStepTimer(detail::ExecutableImpl& x, DeviceBackend& b, void* stream)
      : x_(x), b_(b), dev_(x.device.index), stream_(stream) {
    events_.reserve(x.steps.size() + 1);
    for (size_t k = 0; k <= x.steps.size(); ++k) events_.push_back(b_.create_timing_event(dev_));
  }
  ~DeviceStepTimer() override {
    for (void* e : events_) b_.destroy_event(dev_, e);
  }
  void before_step(const StepCall& call) override {
    b_.record_event(dev_, events_[call.index], stream_);
  }
  void after_steps() override {
    b_.record_event(dev_, events_.back(), stream_);
    b_.synchronize(dev_, stream_);
    std::lock_guard<std::mutex> l(x_.times_mu);
    for (size_t k = 0; k < x_.steps.size(); ++k) {
      auto& [ms, calls] = x_.step_ms[op_name(x_.program.graph.nodes[x_.steps[k].node].op)];
      ms += b_.elapsed_ms(dev_, events_[k], events_[k + 1]);
      ++calls;
    }
  }

 private:
  detail::ExecutableImpl& x_;
  DeviceBackend& b_;
  int dev_;
  void* stream_;
  std::vector<void*> events_;
};
}  // namespace

std::unique_ptr<StepObserver> time_steps_on_host(detail::ExecutableImpl& x, DeviceBackend* b,
                                                 void* stream) {
  return std::make_unique<HostStepTimer>(x, b, stream);
}

std::unique_ptr<StepObserver> time_steps_on_device(detail::ExecutableImpl& x, DeviceBackend& b,
                                                   void* stream) {
  return std::make_unique<DeviceStepTimer>(x, b, stream);
}

void print_step_times(const detail::ExecutableImpl& x) {
  if (x.step_ms.empty()) return;
  std::vector<std::pair<double, std::string>> rows;
  double total = 0;
  for (auto& [op, t] : x.step_ms) {
    rows.emplace_back(t.first, fmt::format("{:>10.3f} ms {:>8} calls  {}", t.first, t.second, op));
    total += t.first;
  }
  std::sort(rows.rbegin(), rows.rend());
  fmt::print(stderr, "[kiln] KILN_STEP_TIMES on {}{}: {:.3f} ms in all\n", x.device.str(),
             env::step_times_device() ? " (device time, runs after the first)" : "", total);
  for (auto& r : rows) fmt::print(stderr, "  {}\n", r.second);
}

}  // namespace kiln
