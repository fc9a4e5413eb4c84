// The profiler on a CUDA device: every op timed on its stream's track (recorded runs are not
// replayed while profiling), a forced CPU fallback with its reason, both copies and the GPU idle
// gap it causes, run_async on a queue's track, allocator growth. Skipped without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>
#include <map>
#include <set>

#include "core/op_id.h"
#include "kiln/kernel.h"
#include "kiln/kiln.h"
#include "profiler/trace_check.h"
#include "support/reference.h"
#include "support/gpu.h"

namespace kiln {
namespace {
using namespace kiln::test;

const Device kGpu = Device::cuda(0);

struct StopAtEnd {
  ~StopAtEnd() {
    if (Profiler::active()) Profiler::stop();
  }
};

std::vector<const ProfileSpan*> spans_of(const Profile& p, SpanKind kind) {
  std::vector<const ProfileSpan*> r;
  for (auto& s : p.spans)
    if (s.kind == kind) r.push_back(&s);
  return r;
}

TEST(ProfilerGpu, ForcedFallbackShowsReasonCopiesAndIdleGap) {
  REQUIRE_GPU();
  StopAtEnd stop;
  // an MLP whose Softshrink runs on the CPU
  Graph g;
  auto x = g.placeholder({256, 784}, f32, "x");
  auto w1 = g.variable(random_array({784, 256}, f32, -0.05, 0.05), "w1");
  auto w2 = g.variable(random_array({256, 10}, f32, -0.05, 0.05), "w2");
  auto out = matmul(softshrink(matmul(x, w1)), w2);
  WithoutCudaKernel cpu_softshrink(OpId::Softshrink);
  auto exe = g.compile(kGpu, {}, {out});
  int32_t node = -1;
  for (auto& s : exe.placement())
    if (s.op == "softshrink") node = s.node;
  ASSERT_GE(node, 0);
  Array xv = random_array({256, 784}, f32).to(kGpu);
  exe.run({{x, xv}});  // warm
  Profiler::start();
  for (int i = 0; i < 3; ++i) exe.run({{x, xv}});
  const Profile p = Profiler::stop();

  auto fallbacks = spans_of(p, SpanKind::fallback);
  ASSERT_EQ(fallbacks.size(), 3u);
  for (auto* f : fallbacks) {
    EXPECT_EQ(f->name, "softshrink");
    EXPECT_EQ(f->node, node);
    EXPECT_NE(f->detail.find("no cuda kernel"), std::string::npos) << f->detail;
  }
  std::map<std::string, int> copies;
  for (auto* c : spans_of(p, SpanKind::copy)) {
    if (c->node != node) continue;
    EXPECT_EQ(c->bytes, 256 * 256 * 4);
    EXPECT_EQ(c->process, "cuda:0");
    ++copies[c->detail];
  }
  EXPECT_EQ(copies["D2H"], 3);
  EXPECT_EQ(copies["H2D"], 3);
  // every device op of every run on the device track
  const size_t device_steps = exe.num_steps() - 1;
  EXPECT_EQ(spans_of(p, SpanKind::op).size(), 3 * device_steps);
  // one gap a run while the host runs softshrink
  std::set<int64_t> runs_with_gap;
  for (auto& gap : p.idle_gaps(10))
    if (gap.cause.find("softshrink %" + std::to_string(node) + " on the cpu") !=
        std::string::npos) {
      EXPECT_EQ(gap.process, "cuda:0");
      runs_with_gap.insert(gap.run);
    }
  EXPECT_EQ(runs_with_gap.size(), 3u) << p.summary();
  const auto j = check_trace(p.chrome_trace());
  EXPECT_EQ(events_of(j, "fallback").size(), 3u);
  std::cout << p.summary();  // for the log: the gaps and what they cost
  EXPECT_NE(p.summary().find("softshrink"), std::string::npos);
}

TEST(ProfilerGpu, EveryOpIsTimedAndRecordedRunsAreNotReplayed) {
  REQUIRE_GPU();
  StopAtEnd stop;
  Graph g;
  auto x = g.placeholder({64, 128}, f32, "x");
  auto w = g.variable(random_array({128, 128}, f32), "w");
  auto out = softmax(relu(matmul(x, w)) + x, -1);
  auto exe = g.compile(kGpu, {}, {out}, CompileOptions{.capture = true});
  Array xv = random_array({64, 128}, f32).to(kGpu);
  exe.run({{x, xv}});
  exe.run({{x, xv}});
  const int64_t replays = exe.replayed_runs();
  Profiler::start();
  std::vector<Array> got;
  for (int i = 0; i < 3; ++i) got = exe.run({{x, xv}});
  const Profile p = Profiler::stop();
  EXPECT_EQ(exe.replayed_runs(), replays);
  EXPECT_EQ(spans_of(p, SpanKind::op).size(), 3 * exe.num_steps());
  EXPECT_EQ(spans_of(p, SpanKind::encode).size(), 3 * exe.num_steps());
  for (auto* s : spans_of(p, SpanKind::op)) EXPECT_EQ(s->process, "cuda:0");
  // the results are those of an unprofiled (replayed) run
  const auto want = exe.run({{x, xv}})[0].to(Device::cpu()).to_vector<float>();
  const auto have = got[0].to(Device::cpu()).to_vector<float>();
  ASSERT_EQ(have.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_NEAR(have[i], want[i], 1e-5 * (1 + std::abs(want[i]))) << i;
  check_trace(p.chrome_trace());
}

TEST(ProfilerGpu, AsyncRunsAreOnTheQueueTrack) {
  REQUIRE_GPU();
  StopAtEnd stop;
  Graph g;
  auto x = g.placeholder({1024}, f32, "x");
  auto exe = g.compile(kGpu, {}, {exp(x) * x});
  Queue q(kGpu);
  Array xv = random_array({1024}, f32);
  Profiler::start();
  auto out = exe.run_async(q, {{x, xv}}).get();
  const Profile p = Profiler::stop();
  auto ops = spans_of(p, SpanKind::op);
  ASSERT_EQ(ops.size(), exe.num_steps());
  EXPECT_EQ(ops[0]->track.rfind("queue ", 0), 0u) << ops[0]->track;
  std::map<std::string, int> copies;
  for (auto* c : spans_of(p, SpanKind::copy)) ++copies[c->detail];
  EXPECT_EQ(copies["H2D"], 1);  // the host feed
  check_trace(p.chrome_trace());
}

}  // namespace
}  // namespace kiln
