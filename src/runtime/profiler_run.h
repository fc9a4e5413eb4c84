// One profiled run of an executable: host spans of its steps and, on a device, timing events
// recorded on the run's stream around every op and copy, read once the stream has passed them
// (no host synchronization per op).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kiln/device.h"
#include "runtime/profiler.h"

namespace kiln {

class DeviceBackend;

namespace prof {

class RunProfile {
 public:
  /// A profile of a run on `device` (`b` null: the CPU) with work on `stream`, or nullptr when
  /// the profiler is off: the one test a run makes per op is whether it holds one.
  static std::shared_ptr<RunProfile> begin(Device device, DeviceBackend* b, void* stream);
  ~RunProfile();
  RunProfile(const RunProfile&) = delete;
  RunProfile& operator=(const RunProfile&) = delete;

  /// Around step `step` (program node `node`, op `name`): a fallback step runs on the host with
  /// `reason`, its copies recorded by copy().
  void step_begin(int32_t step, int32_t node, const char* name, const std::string* reason);
  void step_end();
  /// A timing mark on the run's stream before a copy; copy() records the one after it.
  int mark();
  /// A copy of `bytes` ("H2D", "D2H", "D2D") enqueued since mark `from`.
  void copy(int from, const char* direction, size_t bytes);
  /// The host has enqueued everything (ends the run span).
  void encoded();
  /// The stream has passed the run: reads the timing events and adds the device spans.
  void finish();

 private:
  RunProfile() = default;
  double us(int64_t ns) const { return static_cast<double>(ns - t0_) / 1000.0; }
  struct Mark {
    void* event;
    int64_t host_ns;  // when it was recorded: the device reaches it no earlier
  };
  struct DeviceSpan {
    SpanKind kind;
    const char* name;
    int from, to;  // marks
    int32_t step, node;
    int64_t bytes;
    std::string detail;
  };
  Device device_;
  DeviceBackend* b_ = nullptr;
  void* stream_ = nullptr;
  uint64_t session_ = 0;
  int64_t t0_ = 0;                 // the recording's start (steady ns)
  std::vector<ProfileSpan> host_;  // added at once when the run is enqueued
  int64_t run_ = -1;
  std::string process_, host_track_, device_track_;
  int64_t run_t0_ = 0;
  bool encoded_ = false, finished_ = false;
  std::vector<Mark> marks_;
  std::vector<DeviceSpan> device_spans_;
  // the step in progress
  int32_t step_ = -1, node_ = -1;
  const char* name_ = nullptr;
  const std::string* reason_ = nullptr;
  int64_t step_t0_ = 0, measured0_ = 0;
  int step_mark_ = -1;
};

}  // namespace prof
}  // namespace kiln
