#include "runtime/profiler_run.h"

#include <algorithm>
#include <map>
#include <mutex>

#include "core/device_backend.h"
#include "core/op_registry.h"
#include "runtime/step_loop.h"

namespace kiln::prof {

namespace {
// Timing events of finished runs, kept for the next ones (creating one per op would add to
// the host time between ops, and so to the idle gaps the profile shows).
struct EventPool {
  std::mutex mu;
  std::map<std::pair<DeviceBackend*, int>, std::vector<void*>> free;
};
EventPool& event_pool() {
  static auto* p = new EventPool();  // never destroyed: backends outlive nothing at exit
  return *p;
}
}  // namespace

std::shared_ptr<RunProfile> RunProfile::begin(Device device, DeviceBackend* b, void* stream) {
  if (!on()) return nullptr;
  std::shared_ptr<RunProfile> p(new RunProfile());
  p->device_ = device;
  p->b_ = b;
  p->stream_ = stream;
  p->session_ = session();
  p->t0_ = start_ns();
  p->run_ = next_run();
  p->process_ = device.str();
  p->host_track_ = thread_track();
  p->device_track_ = b ? stream_track(stream) : p->host_track_;
  p->run_t0_ = now_ns();
  if (b) p->mark();  // mark 0: the base every device time is measured from
  return p;
}

RunProfile::~RunProfile() {
  if (!b_ || marks_.empty()) return;
  auto& pool = event_pool();
  std::lock_guard<std::mutex> l(pool.mu);
  auto& list = pool.free[{b_, device_.index}];
  for (auto& m : marks_) list.push_back(m.event);
}

int RunProfile::mark() {
  void* e = nullptr;
  {
    auto& pool = event_pool();
    std::lock_guard<std::mutex> l(pool.mu);
    auto& list = pool.free[{b_, device_.index}];
    if (!list.empty()) {
      e = list.back();
      list.pop_back();
    }
  }
  if (!e) e = b_->create_timing_event(device_.index);
  b_->record_event(device_.index, e, stream_);
  marks_.push_back({e, now_ns()});
  return static_cast<int>(marks_.size()) - 1;
}

void RunProfile::copy(int from, const char* direction, size_t bytes) {
  const int to = mark();
  device_spans_.push_back(
      {SpanKind::copy, direction, from, to, step_, node_, static_cast<int64_t>(bytes), direction});
}

void RunProfile::step_begin(int32_t step, int32_t node, const char* name,
                            const std::string* reason) {
  step_ = step;
  node_ = node;
  name_ = name;
  reason_ = reason;
  step_t0_ = now_ns();
  step_mark_ = -1;
  if (!b_) return;
  b_->range_push(name);
  if (!reason) {
    measured0_ = b_->tuning_stats().measured;
    step_mark_ = mark();
  }
}

void RunProfile::step_end() {
  const int64_t t1 = now_ns();
  ProfileSpan s;
  s.name = name_;
  s.run = run_;
  s.step = step_;
  s.node = node_;
  s.start_us = us(step_t0_);
  s.dur_us = static_cast<double>(t1 - step_t0_) / 1000.0;
  if (!b_) {  // a CPU executable: the kernel ran on this thread
    s.kind = SpanKind::op;
    s.process = process_;
    s.track = host_track_;
    host_.push_back(std::move(s));
  } else if (reason_) {  // a fallback: the host ran it, between its copies
    b_->range_pop();
    s.kind = SpanKind::fallback;
    s.process = "host";
    s.track = host_track_;
    s.detail = *reason_;
    host_.push_back(std::move(s));
  } else {
    const int to = mark();
    std::string detail;
    if (b_->tuning_stats().measured > measured0_) detail = "algorithm search";
    device_spans_.push_back({SpanKind::op, name_, step_mark_, to, step_, node_, 0, detail});
    b_->range_pop();
    s.kind = SpanKind::encode;
    s.process = "host";
    s.track = host_track_;
    if (!detail.empty()) {  // the library measured algorithms while the op was enqueued
      ProfileSpan search = s;
      search.kind = SpanKind::compile;
      search.name = "algorithm search";
      search.detail = name_;
      host_.push_back(std::move(search));
    }
    host_.push_back(std::move(s));
  }
  step_ = node_ = -1;
  name_ = nullptr;
  reason_ = nullptr;
}

void RunProfile::encoded() {
  if (encoded_) return;
  encoded_ = true;
  ProfileSpan s;
  s.kind = SpanKind::run;
  s.name = "run " + process_;
  s.process = "host";
  s.track = host_track_;
  s.run = run_;
  s.start_us = us(run_t0_);
  s.dur_us = static_cast<double>(now_ns() - run_t0_) / 1000.0;
  host_.insert(host_.begin(), std::move(s));
  add_all(host_, session_);
}

void RunProfile::finish() {
  encoded();
  if (finished_ || !b_ || marks_.empty()) return;
  finished_ = true;
  // device time of every mark since mark 0, placed on the host clock as early as the marks'
  // host record times allow (the device reaches a mark no earlier than it was recorded)
  std::vector<int64_t> since(marks_.size(), 0);
  int64_t offset = marks_[0].host_ns;
  for (size_t i = 1; i < marks_.size(); ++i) {
    since[i] =
        static_cast<int64_t>(b_->elapsed_ms(device_.index, marks_[0].event, marks_[i].event) * 1e6);
    since[i] = std::max(since[i], since[i - 1]);
    offset = std::max(offset, marks_[i].host_ns - since[i]);
  }
  std::vector<ProfileSpan> spans;
  spans.reserve(device_spans_.size());
  for (auto& d : device_spans_) {
    ProfileSpan& s = spans.emplace_back();
    s.kind = d.kind;
    s.name = d.name;
    s.process = process_;
    s.track = device_track_;
    s.run = run_;
    s.step = d.step;
    s.node = d.node;
    s.bytes = d.bytes;
    s.detail = std::move(d.detail);
    s.start_us = us(offset + since[d.from]);
    s.dur_us = static_cast<double>(since[d.to] - since[d.from]) / 1000.0;
  }
  add_all(spans, session_);
}

namespace {
// The spans of a run's steps: a step of a device run that runs on the CPU is a fallback.
class ProfileSteps final : public StepObserver {
 public:
  ProfileSteps(RunProfile& run, bool device_run) : run_(run), device_run_(device_run) {}
  void before_step(const StepCall& call) override {
    const Step& st = call.step;
    run_.step_begin(static_cast<int32_t>(call.index), st.node, op_name(call.node.op),
                    device_run_ && st.backend == Backend::cpu ? &st.fallback_reason : nullptr);
  }
  void after_step(const StepCall&) override { run_.step_end(); }

 private:
  RunProfile& run_;
  bool device_run_;
};
}  // namespace

}  // namespace kiln::prof

namespace kiln {
std::unique_ptr<StepObserver> profile_steps(prof::RunProfile& run, bool device_run) {
  return std::make_unique<prof::ProfileSteps>(run, device_run);
}
}  // namespace kiln
