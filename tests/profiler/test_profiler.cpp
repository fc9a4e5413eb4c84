// The profiler on the CPU and on a stand-in device backend (host clock timing events): spans of
// every op, fallbacks with their reason and copies, idle gaps, compile phases, queue waits and
// signals, the trace-event format, and the off switch.
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "core/device_backend.h"
#include "kiln/kiln.h"
#include "profiler/trace_check.h"
#include "runtime/profiler_run.h"
#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;

// Busy-waits `us` microseconds (sleeping may take far longer on a loaded machine).
void spin_us(int64_t us) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(us);
  while (std::chrono::steady_clock::now() < until) {
  }
}

// A device whose work completes as it is enqueued: its timing events read the host clock.
class HostClockBackend final : public DeviceBackend {
 public:
  std::vector<std::string> ranges;  // pushed names, "/" for a pop
  void* allocate(int, size_t bytes, void*) override { return std::malloc(bytes); }
  void release(int, void* p) override { std::free(p); }
  void copy_async(int, void* dst, bool, const void* src, bool, size_t bytes, void*) override {
    std::memcpy(dst, src, bytes);
  }
  void memset_async(int, void* dst, int v, size_t bytes, void*) override {
    std::memset(dst, v, bytes);
  }
  void* create_stream(int) override { return this; }
  void destroy_stream(int, void*) override {}
  void synchronize(int, void*) override {}
  KernelEnv kernel_env(int device, void* stream) override { return {device, stream}; }
  void* allocate_mapped(size_t bytes) override { return std::calloc(1, bytes); }
  void release_mapped(void* p) override { std::free(p); }
  void memory_info(int, size_t* free, size_t* total) override { *free = *total = 0; }
  void* create_timing_event(int) override { return new int64_t(0); }
  void record_event(int, void* e, void*) override { *static_cast<int64_t*>(e) = prof::now_ns(); }
  double elapsed_ms(int, void* a, void* b) override {
    return static_cast<double>(*static_cast<int64_t*>(b) - *static_cast<int64_t*>(a)) / 1e6;
  }
  void destroy_event(int, void* e) override { delete static_cast<int64_t*>(e); }
  void range_push(const char* name) override { ranges.emplace_back(name); }
  void range_pop() override { ranges.emplace_back("/"); }
  int64_t measured = 0;  // algorithm searches so far
  TuningStats tuning_stats() override { return {measured, 0, 0}; }
};

std::vector<const ProfileSpan*> spans_of(const Profile& p, SpanKind kind) {
  std::vector<const ProfileSpan*> r;
  for (auto& s : p.spans)
    if (s.kind == kind) r.push_back(&s);
  return r;
}

// Always stops the profiler, so that one failing test does not break the next.
struct StopAtEnd {
  ~StopAtEnd() {
    if (Profiler::active()) Profiler::stop();
  }
};

// A device run of three steps whose middle one falls back to the host for `host_us`.
// `before_copy_us` delays the download, as a preempted host would.
Profile simulated_fallback_run(HostClockBackend& b, int64_t host_us, size_t bytes,
                               int64_t before_copy_us = 0) {
  Profiler::start();
  auto run = prof::RunProfile::begin(Device::cuda(0), &b, &b);
  EXPECT_TRUE(run);
  run->step_begin(0, 3, "matmul", nullptr);
  spin_us(20);
  run->step_end();
  const std::string reason = "no cuda kernel";
  run->step_begin(1, 4, "softshrink", &reason);
  spin_us(before_copy_us);
  int m = run->mark();
  run->copy(m, "D2H", bytes);
  spin_us(host_us);  // the host runs the kernel; the device waits
  m = run->mark();
  run->copy(m, "H2D", bytes);
  run->step_end();
  run->step_begin(2, 5, "add", nullptr);
  spin_us(5);
  ++b.measured;  // as if the library searched for an algorithm
  run->step_end();
  run->encoded();
  run->finish();
  return Profiler::stop();
}

TEST(Profiler, FallbackShowsItsReasonBothCopiesAndTheIdleGap) {
  StopAtEnd stop;
  HostClockBackend b;
  const size_t bytes = 4096 + static_cast<size_t>(std::rand() % 1000);
  const Profile p = simulated_fallback_run(b, 300, bytes);

  auto fallbacks = spans_of(p, SpanKind::fallback);
  ASSERT_EQ(fallbacks.size(), 1u);
  EXPECT_EQ(fallbacks[0]->name, "softshrink");
  EXPECT_EQ(fallbacks[0]->detail, "no cuda kernel");
  EXPECT_EQ(fallbacks[0]->process, "host");
  EXPECT_EQ(fallbacks[0]->node, 4);
  EXPECT_GE(fallbacks[0]->dur_us, 300);

  auto copies = spans_of(p, SpanKind::copy);
  ASSERT_EQ(copies.size(), 2u);
  std::sort(copies.begin(), copies.end(),
            [](auto* a, auto* c) { return a->start_us < c->start_us; });
  EXPECT_EQ(copies[0]->detail, "D2H");
  EXPECT_EQ(copies[1]->detail, "H2D");
  for (auto* c : copies) {
    EXPECT_EQ(c->bytes, static_cast<int64_t>(bytes));
    EXPECT_EQ(c->node, 4);
    EXPECT_EQ(c->process, "cuda:0");
  }
  // the device ops on the device track, in order; encoding on the host
  auto ops = spans_of(p, SpanKind::op);
  ASSERT_EQ(ops.size(), 2u);
  EXPECT_EQ(ops[0]->name, "matmul");
  EXPECT_EQ(ops[1]->name, "add");
  EXPECT_EQ(ops[0]->process, "cuda:0");
  EXPECT_EQ(ops[0]->track, copies[0]->track);
  EXPECT_GE(ops[0]->dur_us, 20);
  EXPECT_LE(ops[0]->start_us + ops[0]->dur_us, copies[0]->start_us + 1e-6);
  EXPECT_LE(copies[1]->start_us + copies[1]->dur_us, ops[1]->start_us + 1e-6);
  EXPECT_EQ(ops[0]->detail, "");
  EXPECT_EQ(ops[1]->detail, "algorithm search");
  auto encodes = spans_of(p, SpanKind::encode);
  ASSERT_EQ(encodes.size(), 2u);
  auto searches = spans_of(p, SpanKind::compile);
  ASSERT_EQ(searches.size(), 1u);  // while add was enqueued
  EXPECT_EQ(searches[0]->name, "algorithm search");
  EXPECT_EQ(searches[0]->detail, "add");
  EXPECT_EQ(searches[0]->start_us, encodes[1]->start_us);
  EXPECT_EQ(searches[0]->dur_us, encodes[1]->dur_us);
  EXPECT_EQ(spans_of(p, SpanKind::run).size(), 1u);
  // NVTX ranges named after the ops
  EXPECT_EQ(b.ranges, (std::vector<std::string>{"matmul", "/", "softshrink", "/", "add", "/"}));

  // the gap between the copies, caused by the fallback
  const auto gaps = p.idle_gaps(10);
  const IdleGap* gap = nullptr;
  for (auto& g : gaps)  // the one caused by the fallback (another may come from host latency)
    if (!gap && g.cause.find("softshrink %4 on the cpu") != std::string::npos) gap = &g;
  ASSERT_TRUE(gap) << p.summary();
  EXPECT_GE(gap->dur_us, 290);
  EXPECT_EQ(gap->cause, "softshrink %4 on the cpu (no cuda kernel)");
  EXPECT_NEAR(gap->start_us, copies[0]->start_us + copies[0]->dur_us, 1e-6);

  const std::string summary = p.summary();
  for (const char* part : {"matmul", "add", "D2H", "H2D", "softshrink %4", "no cuda kernel",
                           "GPU idle gaps >= 10 us within runs: ", "ms searching algorithms"})
    EXPECT_NE(summary.find(part), std::string::npos) << part << "\n" << summary;

  const auto j = check_trace(p.chrome_trace());
  auto fb = events_of(j, "fallback");
  ASSERT_EQ(fb.size(), 1u);
  EXPECT_EQ(fb[0]["args"]["detail"], "no cuda kernel");
  EXPECT_EQ(fb[0]["args"]["node"], 4);
  auto cp = events_of(j, "copy");
  ASSERT_EQ(cp.size(), 2u);
  std::set<std::string> dirs;
  for (auto& c : cp) {
    dirs.insert(c["args"]["detail"].get<std::string>());
    EXPECT_EQ(c["args"]["bytes"], bytes);
  }
  EXPECT_EQ(dirs, (std::set<std::string>{"D2H", "H2D"}));
}

TEST(Profiler, HostLatencyBeforeTheDownloadIsNotBlamedOnTheFallback) {
  StopAtEnd stop;
  HostClockBackend b;
  // the host is late to start the fallback by longer than the fallback itself takes
  const Profile p = simulated_fallback_run(b, 100, 4096, 400);
  const auto gaps = p.idle_gaps(10);
  ASSERT_GE(gaps.size(), 2u) << p.summary();
  auto copies = spans_of(p, SpanKind::copy);
  ASSERT_EQ(copies.size(), 2u);
  std::sort(copies.begin(), copies.end(),
            [](auto* a, auto* c) { return a->start_us < c->start_us; });
  const IdleGap* late = nullptr;
  const IdleGap* fallback = nullptr;
  for (auto& g : gaps) {
    if (std::abs(g.start_us + g.dur_us - copies[0]->start_us) < 1e-6) late = &g;
    if (std::abs(g.start_us - (copies[0]->start_us + copies[0]->dur_us)) < 1e-6) fallback = &g;
  }
  ASSERT_TRUE(late && fallback) << p.summary();
  EXPECT_GE(late->dur_us, 390);
  EXPECT_EQ(late->cause, "waiting for the host to enqueue D2H %4");
  EXPECT_GE(fallback->dur_us, 90);
  EXPECT_EQ(fallback->cause, "softshrink %4 on the cpu (no cuda kernel)");
}

TEST(Profiler, ShortHostWorkIsNoGap) {
  StopAtEnd stop;
  HostClockBackend b;
  const Profile p = simulated_fallback_run(b, 0, 64);
  // (a gap this long would take the machine stopping the thread)
  for (auto& g : p.idle_gaps(20000)) ADD_FAILURE() << g.dur_us << " us: " << g.cause;
}

TEST(Profiler, CpuRunRecordsEveryOpAndCompilePhase) {
  StopAtEnd stop;
  Graph g;
  auto x = g.placeholder({32, 48}, f32, "x");
  auto w = g.variable(random_array({48, 16}, f32), "w");
  auto out = softmax(relu(matmul(x, w)) * 2.0 - exp(matmul(x, w)), -1);
  Profiler::start();
  auto exe = g.compile(Device::cpu(), {}, {out});
  const int runs = 2 + std::rand() % 2;
  for (int i = 0; i < runs; ++i) exe.run({{x, random_array({32, 48}, f32)}});
  const Profile p = Profiler::stop();

  const auto placement = exe.placement();
  auto ops = spans_of(p, SpanKind::op);
  ASSERT_EQ(ops.size(), placement.size() * runs);
  std::set<int64_t> run_ids;
  for (size_t i = 0; i < ops.size(); ++i) {
    const auto& step = placement[i % placement.size()];
    EXPECT_EQ(ops[i]->name, step.op);
    EXPECT_EQ(ops[i]->node, step.node);
    EXPECT_EQ(ops[i]->step, static_cast<int32_t>(i % placement.size()));
    EXPECT_EQ(ops[i]->process, "cpu");
    EXPECT_GE(ops[i]->dur_us, 0);
    run_ids.insert(ops[i]->run);
  }
  EXPECT_EQ(run_ids.size(), static_cast<size_t>(runs));
  // the run spans hold their ops' times
  auto run_spans = spans_of(p, SpanKind::run);
  ASSERT_EQ(run_spans.size(), static_cast<size_t>(runs));
  for (auto* op : ops) {
    const ProfileSpan* r = run_spans[op->run];
    EXPECT_LE(r->start_us, op->start_us + 1e-6);
    EXPECT_GE(r->start_us + r->dur_us, op->start_us + op->dur_us - 1e-6);
  }
  // compile phases inside the compile span
  auto compile = spans_of(p, SpanKind::compile);
  std::set<std::string> phases;
  const ProfileSpan* whole = nullptr;
  for (auto* c : compile) {
    phases.insert(c->name);
    if (c->name == "compile") whole = c;
  }
  ASSERT_TRUE(whole);
  EXPECT_EQ(whole->detail, "for cpu");
  for (const char* phase :
       {"specialize_shapes", "constant_folding", "cse", "dce", "placement", "plan_memory"})
    EXPECT_TRUE(phases.count(phase)) << phase;
  for (auto* c : compile) {
    EXPECT_GE(c->start_us, whole->start_us - 1e-6) << c->name;
    EXPECT_LE(c->start_us + c->dur_us, whole->start_us + whole->dur_us + 1e-6) << c->name;
  }
  check_trace(p.chrome_trace());
  EXPECT_NE(p.summary().find("matmul (cpu)"), std::string::npos) << p.summary();
}

// A loop's iterations and the branch a cond takes are spans of their own (kind run), each
// holding its body's run and that run's ops.
TEST(Profiler, LoopIterationsAndBranchesAreSpans) {
  StopAtEnd stop;
  Graph g;
  auto x = g.placeholder({8}, f32, "x");
  auto pred = g.placeholder({}, boolean, "pred");
  auto y = for_loop(3, {x}, [](const std::vector<Tensor>& v) {
    return std::vector<Tensor>{tanh(v[1]) * 2.0};
  })[0];
  auto z = cond(
      pred, {y}, [](const std::vector<Tensor>& a) { return std::vector<Tensor>{-a[0]}; },
      [](const std::vector<Tensor>& a) { return a; })[0];
  auto exe = g.compile(Device::cpu(), {}, {z});
  Profiler::start();
  exe.run({{x, random_array({8}, f32)}, {pred, Array::scalar(false)}});
  const Profile p = Profiler::stop();
  std::vector<std::string> iterations;
  const ProfileSpan* branch = nullptr;
  for (const ProfileSpan* s : spans_of(p, SpanKind::run)) {
    if (s->name == "for_loop iteration") iterations.push_back(s->detail);
    if (s->name.rfind("cond: ", 0) == 0) branch = s;
  }
  EXPECT_EQ(iterations, (std::vector<std::string>{"0", "1", "2"}));
  ASSERT_TRUE(branch);
  EXPECT_EQ(branch->name, "cond: else_fn");
  // the body's ops ran inside the iterations: tanh three times, neg never
  size_t tanh_ops = 0, neg_ops = 0;
  for (const ProfileSpan* s : spans_of(p, SpanKind::op)) {
    tanh_ops += s->name == "tanh" || s->name == "fused_elementwise";
    neg_ops += s->name == "neg";
  }
  EXPECT_GE(tanh_ops, 3u);
  EXPECT_EQ(neg_ops, 0u);
  check_trace(p.chrome_trace());
}

TEST(Profiler, OffRecordsNothingAndStartStopAreChecked) {
  StopAtEnd stop;
  Graph g;
  auto x = g.placeholder({8}, f32, "x");
  auto exe = g.compile(Device::cpu(), {}, {exp(x) + x});
  EXPECT_FALSE(Profiler::active());
  exe.run({{x, random_array({8}, f32)}});  // not recorded
  EXPECT_EQ(prof::RunProfile::begin(Device::cpu(), nullptr, nullptr), nullptr);
  Profiler::start();
  EXPECT_TRUE(Profiler::active());
  expect_error<ValueError>([] { Profiler::start(); }, {"[profiler]", "already on"});
  const Profile p = Profiler::stop();
  EXPECT_TRUE(p.spans.empty());
  EXPECT_FALSE(Profiler::active());
  expect_error<ValueError>([] { Profiler::stop(); }, {"[profiler]", "not on"});
  expect_error<IoError>([&] { p.save("/nonexistent-dir/x/trace.json"); },
                        {"[profiler]", "trace.json"});
}

TEST(Profiler, ScopeWritesTheTraceOrTheReport) {
  StopAtEnd stop;
  const auto dir = std::filesystem::temp_directory_path() /
                   ("kiln_profile_scope_" + std::to_string(std::rand()));
  std::filesystem::create_directories(dir);
  Graph g;
  auto x = g.placeholder({16}, f32, "x");
  auto exe = g.compile(Device::cpu(), {}, {tanh(x) * x});
  for (const char* name : {"t.json", "t.html"}) {
    {
      ProfileScope scope((dir / name).string());
      exe.run({{x, random_array({16}, f32)}});
    }
    std::ifstream f(dir / name);
    std::stringstream text;
    text << f.rdbuf();
    if (std::string(name) == "t.json") {
      auto j = check_trace(text.str());
      EXPECT_EQ(events_of(j, "op").size(), exe.num_steps());
    } else {
      EXPECT_EQ(text.str().rfind("<!doctype html>", 0), 0u);
      EXPECT_NE(text.str().find("timeline"), std::string::npos);
      EXPECT_EQ(text.str().find("http://"), text.str().find("http://www.w3.org/2000/svg"))
          << "the report must not load anything";
    }
  }
  std::filesystem::remove_all(dir);
}

TEST(Profiler, QueueWaitsAndSignalsAreOnTheQueueTrack) {
  StopAtEnd stop;
  Graph g;
  auto x = g.placeholder({64}, f32, "x");
  auto exe = g.compile(Device::cpu(), {}, {sigmoid(x) + x});
  Queue q(Device::cpu());
  Event ready, done;
  Profiler::start();
  ExecutionDescriptor d;
  d.wait_events = {{ready, 1}};
  d.signal_events = {{done, 7}};
  auto f = exe.run_async(q, {{x, random_array({64}, f32)}}, std::move(d));
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  ready.signal(1);
  f.get();
  done.wait(7);
  const Profile p = Profiler::stop();
  const ProfileSpan* wait = nullptr;
  for (auto* s : spans_of(p, SpanKind::wait))
    if (s->track.find("queue") == 0) wait = s;
  ASSERT_TRUE(wait);
  EXPECT_EQ(wait->detail, "value 1");
  std::set<std::string> signaled;
  for (auto* s : spans_of(p, SpanKind::signal)) signaled.insert(s->detail);
  EXPECT_TRUE(signaled.count("value 1"));
  EXPECT_TRUE(signaled.count("value 7"));
  // the run's ops on the queue's thread
  auto ops = spans_of(p, SpanKind::op);
  ASSERT_EQ(ops.size(), exe.num_steps());
  EXPECT_EQ(ops[0]->track, wait->track);
  check_trace(p.chrome_trace());
}

TEST(Profiler, NamesAreEscapedInTheTrace) {
  Profile p;
  ProfileSpan s;
  s.name = "we\"ird\\name\n</script>";
  s.process = "host";
  s.track = "thread \"1\"";
  s.dur_us = 1;
  p.spans.push_back(s);
  auto j = check_trace(p.chrome_trace());
  EXPECT_EQ(events_of(j, "op")[0]["name"], s.name);
  const std::string html = p.html();
  EXPECT_EQ(html.find("</script>\""), std::string::npos);
}

TEST(Profiler, TraceCheckCatchesOverlapsAndNegativeTimes) {
  Profile p;
  auto add = [&](const char* name, double start, double dur) {
    ProfileSpan s;
    s.name = name;
    s.process = "cuda:0";
    s.track = "stream 1";
    s.start_us = start;
    s.dur_us = dur;
    p.spans.push_back(s);
  };
  add("outer", 0, 10);
  add("inner", 2, 3);
  add("next", 10, 5);
  check_trace(p.chrome_trace());  // nested and sequential: fine
  add("straddles", 12, 10);
  EXPECT_NONFATAL_FAILURE(check_trace(p.chrome_trace()), "overlaps");
  std::string text = Profile{{p.spans[0]}}.chrome_trace();
  text.replace(text.find("\"dur\":10.000"), 12, "\"dur\":-1.000");
  EXPECT_NONFATAL_FAILURE(check_trace(text), "dur");
}

}  // namespace
}  // namespace kiln
