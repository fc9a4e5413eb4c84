// The recorder behind kiln::Profiler, and KILN_PROFILE.
#include "runtime/profiler.h"

#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>

#include "core/errors.h"
#include "runtime/env.h"

namespace kiln {

const char* span_kind_name(SpanKind k) {
  switch (k) {
    case SpanKind::op:
      return "op";
    case SpanKind::encode:
      return "encode";
    case SpanKind::copy:
      return "copy";
    case SpanKind::fallback:
      return "fallback";
    case SpanKind::compile:
      return "compile";
    case SpanKind::alloc:
      return "alloc";
    case SpanKind::wait:
      return "wait";
    case SpanKind::signal:
      return "signal";
    case SpanKind::run:
      return "run";
  }
  return "?";
}

namespace prof {

std::atomic<bool> g_on{false};

namespace {
struct Recorder {
  std::mutex mu;
  uint64_t session = 0;  // bumped by every start
  int64_t t0 = 0;        // steady ns at start
  std::atomic<int64_t> runs{0};
  std::vector<ProfileSpan> spans;
  std::map<void*, std::string> streams;
  int64_t unnamed_streams = 0, threads = 0;
};
Recorder& recorder() {
  static Recorder* r = new Recorder();  // never destroyed: spans may arrive during exit
  return *r;
}
thread_local std::string t_track;
}  // namespace

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

uint64_t session() {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> l(r.mu);
  return r.session;
}

double to_us(int64_t ns) {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> l(r.mu);
  return static_cast<double>(ns - r.t0) / 1000.0;
}

int64_t start_ns() {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> l(r.mu);
  return r.t0;
}

void add_all(std::vector<ProfileSpan>& spans, uint64_t session) {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> l(r.mu);
  if (!on() || session != r.session) return;
  for (auto& s : spans) {
    s.start_us = std::max(0.0, s.start_us);
    s.dur_us = std::max(0.0, s.dur_us);
    r.spans.push_back(std::move(s));
  }
  spans.clear();
}

void add(ProfileSpan span, uint64_t session) {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> l(r.mu);
  if (!on() || session != r.session) return;
  span.start_us = std::max(0.0, span.start_us);
  span.dur_us = std::max(0.0, span.dur_us);
  r.spans.push_back(std::move(span));
}

int64_t next_run() { return recorder().runs.fetch_add(1); }

std::string thread_track() {
  if (t_track.empty()) {
    Recorder& r = recorder();
    std::lock_guard<std::mutex> l(r.mu);
    t_track = fmt::format("thread {}", ++r.threads);
  }
  return t_track;
}

void name_thread(const std::string& name) { t_track = name; }

std::string stream_track(void* stream) {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> l(r.mu);
  auto it = r.streams.find(stream);
  if (it != r.streams.end()) return it->second;
  return r.streams[stream] = fmt::format("stream {}", ++r.unnamed_streams);
}

void name_stream(void* stream, const std::string& name) {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> l(r.mu);
  r.streams[stream] = name;
}

void instant(SpanKind kind, std::string name, std::string process, std::string track, int64_t bytes,
             std::string detail) {
  if (!on()) return;
  ProfileSpan s;
  s.kind = kind;
  s.name = std::move(name);
  s.process = std::move(process);
  s.track = std::move(track);
  s.bytes = bytes;
  s.detail = std::move(detail);
  const uint64_t id = session();
  s.start_us = to_us(now_ns());
  add(std::move(s), id);
}

HostScope::HostScope(SpanKind kind, const char* name, std::string detail)
    : on_(on()), kind_(kind), name_(name) {
  if (!on_) return;
  detail_ = std::move(detail);
  session_ = session();
  t0_ = now_ns();
}

HostScope::~HostScope() {
  if (!on_) return;
  const int64_t t1 = now_ns();
  ProfileSpan s;
  s.kind = kind_;
  s.name = name_;
  s.process = "host";
  s.track = thread_track();
  s.detail = std::move(detail_);
  s.start_us = to_us(t0_);
  s.dur_us = static_cast<double>(t1 - t0_) / 1000.0;
  add(std::move(s), session_);
}

namespace {
// KILN_PROFILE=path: on from the start of the process, written at its exit.
struct EnvProfile {
  std::string path;
  EnvProfile() {
    const char* p = env::get(env::Var::KILN_PROFILE);
    if (!p) return;
    path = p;
    Profiler::start();
    std::atexit([] {
      if (!Profiler::active()) return;
      try {
        const Profile prof = Profiler::stop();
        prof.save(env_profile().path);
        std::fprintf(stderr, "[profile] wrote %s (%zu spans)\n", env_profile().path.c_str(),
                     prof.spans.size());
      } catch (const std::exception& e) {
        std::fprintf(stderr, "[profile] KILN_PROFILE: %s\n", e.what());
      }
    });
  }
  static EnvProfile& env_profile();
};
EnvProfile& EnvProfile::env_profile() {
  static EnvProfile* e = new EnvProfile();
  return *e;
}
const bool g_env_profile = (EnvProfile::env_profile(), true);
}  // namespace

}  // namespace prof

void Profiler::start() {
  auto& r = prof::recorder();
  std::lock_guard<std::mutex> l(r.mu);
  if (prof::on()) fail<ValueError>("[profiler] start: the profiler is already on");
  ++r.session;
  r.spans.clear();
  r.runs = 0;
  r.t0 = prof::now_ns();
  prof::g_on.store(true);
}

Profile Profiler::stop() {
  auto& r = prof::recorder();
  std::lock_guard<std::mutex> l(r.mu);
  if (!prof::on()) fail<ValueError>("[profiler] stop: the profiler is not on");
  prof::g_on.store(false);
  Profile p;
  p.spans = std::move(r.spans);
  r.spans.clear();
  return p;
}

bool Profiler::active() { return prof::on(); }

ProfileScope::ProfileScope(std::string path) : path_(std::move(path)) {
  Profiler::start();
  on_ = true;
}

ProfileScope::~ProfileScope() {
  if (!on_) return;
  try {
    Profile p = Profiler::stop();
    if (!path_.empty()) p.save(path_);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[profiler] %s\n", e.what());
  }
}

Profile ProfileScope::stop() {
  if (!on_) fail<ValueError>("[profiler] ProfileScope::stop: already stopped");
  on_ = false;
  return Profiler::stop();
}

}  // namespace kiln
