// The profiler: an op-level timeline of runs, with host<->device copies, CPU fallbacks, compile
// phases, allocator growth and event waits and signals; exported as Chrome trace-event JSON
// (Perfetto, chrome://tracing), a text summary, or a self-contained HTML page.
//
//   kiln::Profiler::start();
//   exe.run(feeds);
//   kiln::Profile p = kiln::Profiler::stop();
//   p.save("trace.json");          // or "report.html"
//   std::cout << p.summary();
//
// `KILN_PROFILE=path` profiles the whole process and writes the trace at exit (HTML when the path
// ends in .html). docs/profiling.md describes the tracks and what each span means.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kiln {

/// What a span stands for.
enum class SpanKind : uint8_t {
  op,        // a kernel: device time on its queue's track, or host time for CPU executables
  encode,    // the host enqueueing one op of a GPU run
  copy,      // host<->device bytes (detail: "H2D", "D2H" or "D2D")
  fallback,  // an op of a GPU executable run on the CPU (detail: the reason)
  compile,   // a compile phase: the whole compile, a pass, generated-kernel builds (NVRTC)
  alloc,     // device memory reserved from the driver (an instant; bytes)
  wait,      // a queue or the host waiting for an Event value
  signal,    // an Event value signaled (an instant)
  run,       // one run of an executable, on the host thread that issued it
};
/// "op", "encode", ... as written in traces.
const char* span_kind_name(SpanKind k);

/// One interval of a profile (an instant when dur_us is 0 and the kind is alloc or signal).
/// Times are microseconds since Profiler::start.
struct ProfileSpan {
  SpanKind kind = SpanKind::op;
  std::string name;     // the op name for op, encode and fallback spans
  std::string process;  // "host", or the device: "cpu", "cuda:0"
  std::string track;    // "thread 1", "queue 2", "stream 1", "allocator"
  double start_us = 0;
  double dur_us = 0;
  int64_t run = -1;    // which run (numbered from 0 in the profile); -1 outside runs
  int32_t step = -1;   // the step of the run
  int32_t node = -1;   // the program node (%N in Executable::dump)
  int64_t bytes = 0;   // copies and allocations
  std::string detail;  // fallback reason, copy direction, event value, "algorithm search", ...
};

/// A GPU idle gap: nothing ran on a device track between two spans of one run.
struct IdleGap {
  std::string process, track;
  double start_us = 0, dur_us = 0;
  int64_t run = -1;
  // "softshrink %7 on the cpu (no cuda kernel)", or "waiting for the host to enqueue add %3"
  std::string cause;
};

/// What the profiler recorded between start and stop.
class Profile {
 public:
  std::vector<ProfileSpan> spans;  // in the order they were recorded

  /// Chrome trace-event JSON: a process per device plus the host, a track (thread) per queue or
  /// stream, "X" events for spans and "i" events for instants; args carry node, bytes, detail.
  std::string chrome_trace() const;
  /// Top ops by total time, copies, fallbacks, and GPU idle gaps of at least `gap_us`.
  std::string summary(double gap_us = 10) const;
  /// One HTML file (no network access) whose script draws the timeline as SVG.
  std::string html() const;
  /// Idle gaps of at least `gap_us` between consecutive spans of a run on each device track.
  std::vector<IdleGap> idle_gaps(double gap_us = 10) const;
  /// Writes html() when `path` ends in ".html", else chrome_trace(). Throws IoError.
  void save(const std::string& path) const;
};

class Profiler {
 public:
  /// Starts recording, forgetting any earlier recording. Throws ValueError when already on.
  static void start();
  /// Stops recording and returns it. Throws ValueError when not on.
  static Profile stop();
  /// Whether the profiler is recording.
  static bool active();
};

/// Profiles its scope; writes the profile to `path` (when not empty) on destruction, unless
/// stop() took it first.
class ProfileScope {
 public:
  explicit ProfileScope(std::string path = {});
  ~ProfileScope();
  ProfileScope(const ProfileScope&) = delete;
  ProfileScope& operator=(const ProfileScope&) = delete;
  /// Stops now and returns the profile (nothing is written then).
  Profile stop();

 private:
  std::string path_;
  bool on_ = false;
};

}  // namespace kiln
