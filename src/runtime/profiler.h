// The profiler's recorder, as the runtime and the backends feed it. Everything here costs one
// relaxed atomic load when the profiler is off: callers test prof::on() (or hold a null
// RunProfile) before doing anything else.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "kiln/profiler.h"

namespace kiln::prof {

extern std::atomic<bool> g_on;
/// Whether the profiler is recording.
inline bool on() { return g_on.load(std::memory_order_relaxed); }

/// Steady-clock nanoseconds (the clock spans are measured with).
int64_t now_ns();
/// Which recording is on (spans of a run begun under another are dropped).
uint64_t session();
/// Microseconds since the current recording started.
double to_us(int64_t ns);
/// When the current recording started (steady-clock ns): times are microseconds since then.
int64_t start_ns();
/// Adds a span (times already in microseconds since the start) to recording `session`.
void add(ProfileSpan span, uint64_t session);
/// Adds spans, moved out of `spans`, at once.
void add_all(std::vector<ProfileSpan>& spans, uint64_t session);
/// A fresh run number.
int64_t next_run();

/// The track of the calling thread on the host ("thread N", or the name given to it).
std::string thread_track();
void name_thread(const std::string& name);
/// The track of a device stream ("queue N" for a Queue's, else "stream N").
std::string stream_track(void* stream);
void name_stream(void* stream, const std::string& name);

/// An instant (alloc, signal) now on `process`/`track`.
void instant(SpanKind kind, std::string name, std::string process, std::string track,
             int64_t bytes = 0, std::string detail = {});

/// A host span on the calling thread's track from construction to destruction (when on).
class HostScope {
 public:
  HostScope(SpanKind kind, const char* name, std::string detail = {});
  ~HostScope();
  HostScope(const HostScope&) = delete;
  HostScope& operator=(const HostScope&) = delete;

 private:
  bool on_;
  SpanKind kind_;
  const char* name_;
  std::string detail_;
  int64_t t0_ = 0;
  uint64_t session_ = 0;
};

}  // namespace kiln::prof
