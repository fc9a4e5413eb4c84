// The GPU under load: executables compiled and run until device memory runs out, and thousands of
// asynchronous runs across queues ordered by one event. Both fill or churn the device: the GPU
// suite runs CudaLoad.* alone, in a process of its own (scripts/test-gpu.sh). Skipped without a
// GPU.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <deque>
#include <fstream>
#include <future>
#include <string>
#include <vector>

#include "kiln/kiln.h"
#include "support/gpu.h"
#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;

const Device kGpu = Device::cuda(0);

// Resident host memory of this process, in bytes.
size_t resident_bytes() {
  std::ifstream f("/proc/self/statm");
  size_t pages = 0, resident = 0;
  f >> pages >> resident;
  return resident * static_cast<size_t>(::sysconf(_SC_PAGESIZE));
}

// An executable whose run holds about 2 * 4 GiB of intermediates: the running sum of 2^30 copies
// of x, and its last element (x * 2^30).
struct Big {
  Graph g;
  Tensor x;
  Executable exe;
};
constexpr int64_t kBig = int64_t{1} << 30;

std::unique_ptr<Big> big_executable() {
  auto b = std::make_unique<Big>();
  b->x = b->g.placeholder({1}, f32, "x");
  Tensor run = cumsum(broadcast_to(b->x, {kBig}), 0);
  Tensor last = slice(run, {kBig - 1}, {kBig});
  // no optimization: nothing folds or fuses the large buffers away
  b->exe = b->g.compile(kGpu, {}, {last}, {.optimize = false});
  return b;
}

double run_big(const Big& b, float x) {
  const Array out = b.exe.run({{b.x, Array::from_vector(std::vector<float>{x}, {1})}})[0];
  return out.to(Device::cpu()).to_vector<double>()[0];
}

// Executables are compiled and run (twice: the second run records the CUDA graph the later ones
// replay) until the device's memory runs out: the one that does not fit fails with OutOfMemory,
// every earlier one keeps running and answering right, and once all are gone and the cache is
// emptied the allocator holds what it held before.
TEST(CudaLoad, OutOfMemoryUnderLoadThenBackToTheStart) {
  REQUIRE_GPU();
  empty_cache(kGpu);
  const MemoryStats start = memory_stats(kGpu);
  std::vector<std::unique_ptr<Big>> live;
  std::string oom;
  for (int i = 0; i < 1000 && oom.empty(); ++i) {
    try {
      auto b = big_executable();
      for (int r = 0; r < 2; ++r)
        ASSERT_NEAR(run_big(*b, 1.0f + static_cast<float>(i % 3)), (1.0 + i % 3) * kBig,
                    1e-3 * (1.0 + i % 3) * kBig)
            << "executable " << i << " run " << r;
      live.push_back(std::move(b));
    } catch (const OutOfMemory& e) {
      oom = e.what();
    }
  }
  ASSERT_FALSE(oom.empty()) << "device memory never ran out";
  EXPECT_NE(oom.find("[cuda] out of memory"), std::string::npos) << oom;
  ASSERT_GE(live.size(), 2u) << "not even two executables fit: " << oom;
  const MemoryStats full = memory_stats(kGpu);
  std::printf("CudaLoad: %zu executables ran before: %s (kiln held %.1f GiB)\n", live.size(),
              oom.c_str(), static_cast<double>(full.reserved_bytes) / (1 << 30));
  // the others keep running, replayed from their recordings, with fresh feeds
  for (size_t i = 0; i < live.size(); ++i)
    EXPECT_NEAR(run_big(*live[i], -2.0f), -2.0 * kBig, 2e-3 * kBig) << "executable " << i;
  live.clear();
  empty_cache(kGpu);
  const MemoryStats end = memory_stats(kGpu);
  EXPECT_EQ(end.allocated_bytes, start.allocated_bytes);
  EXPECT_EQ(end.reserved_bytes, start.reserved_bytes);
  // and the device works as before
  auto b = big_executable();
  EXPECT_NEAR(run_big(*b, 0.5f), 0.5 * kBig, 1e-3 * kBig);
}

// 10,000 runs of three executables on three queues, each run waiting for the previous one's
// event value and signalling the next: every output right. What the executables keep for runs in
// flight (argument slots, recordings) grows with the deepest queue they have seen, which timing
// decides: so first 49 runs (the most the loop keeps pending) are submitted at once behind a
// gate, and the first 3,000 runs settle. Over the last 7,000, device memory may grow by what a
// full queue of runs could still hold (2 MiB) but not at all over the last 3,500 (a leak of one
// block a run would add megabytes to each), and host memory by a few MiB at most.
TEST(CudaLoad, TenThousandAsyncRunsLeakNothing) {
  REQUIRE_GPU();
  Graph g;
  Tensor x = g.placeholder({64, 64}, f32, "x");
  const Array wv = random_array({64, 64}, f32, -0.2, 0.2);
  Tensor w = g.constant(wv);
  const std::vector<Tensor> outs = {relu(matmul(x, w)), sum(x * 2.0, {1}), softmax(x, -1)};
  std::vector<Executable> exes;
  for (const Tensor& o : outs) exes.push_back(g.compile(kGpu, {}, {o}));
  std::vector<Array> feeds;
  for (int k = 0; k < 4; ++k) feeds.push_back(random_array({64, 64}, f32, -1, 1));
  // references from the CPU
  std::vector<std::vector<Array>> want(3);
  for (int e = 0; e < 3; ++e) {
    Executable cpu = g.compile(Device::cpu(), {}, {outs[static_cast<size_t>(e)]});
    for (const Array& f : feeds) want[e].push_back(cpu.run({{x, f}})[0].copy());
  }
  std::vector<Queue> queues;
  for (int q = 0; q < 3; ++q) queues.emplace_back(kGpu);
  Event order;
  struct Pending {
    int index;
    std::future<std::vector<Array>> out;
  };
  std::deque<Pending> pending;
  int checked = 0, wrong = 0;
  auto check_oldest = [&] {
    Pending p = std::move(pending.front());
    pending.pop_front();
    const Array got = p.out.get()[0].to(Device::cpu());
    const Array& ref = want[p.index % 3][(p.index / 3) % 4];
    const auto a = to_f64(got), b = to_f64(ref);
    bool ok = a.size() == b.size();
    for (size_t i = 0; ok && i < a.size(); ++i)
      ok = std::fabs(a[i] - b[i]) <= 1e-4 + 1e-4 * std::fabs(b[i]);
    wrong += !ok;
    ++checked;
  };
  auto settle = [&] {
    while (!pending.empty()) check_oldest();
    for (Queue& q : queues) q.wait();
  };
  constexpr int kDepth = 49;
  {
    Event gate;
    std::vector<std::future<std::vector<Array>>> held;
    for (int i = 0; i < kDepth; ++i) {
      ExecutionDescriptor d;
      d.wait_events.push_back({gate, 1});
      held.push_back(exes[i % 3].run_async(queues[i % 3], {{x, feeds[0]}}, std::move(d)));
    }
    gate.signal(1);
    for (auto& h : held) h.get();
  }
  size_t rss_settled = 0;
  MemoryStats settled{}, halfway{};
  const int kRuns = 10000, kSettle = 3000, kHalfway = 6500;
  for (int i = 0; i < kRuns; ++i) {
    if (i == kSettle || i == kHalfway) {
      settle();
      (i == kSettle ? settled : halfway) = memory_stats(kGpu);
      if (i == kSettle) rss_settled = resident_bytes();
    }
    ExecutionDescriptor d;
    d.wait_events.push_back({order, static_cast<uint64_t>(i)});
    d.signal_events.push_back({order, static_cast<uint64_t>(i) + 1, Stage::completed});
    pending.push_back(
        {i, exes[i % 3].run_async(queues[i % 3], {{x, feeds[(i / 3) % 4]}}, std::move(d))});
    if (pending.size() >= kDepth) check_oldest();
  }
  settle();
  EXPECT_EQ(order.value(), static_cast<uint64_t>(kRuns));
  EXPECT_EQ(checked, kRuns);
  EXPECT_EQ(wrong, 0);
  const MemoryStats end = memory_stats(kGpu);
  const size_t rss_end = resident_bytes();
  std::printf(
      "CudaLoad: %d runs; device allocated %zu -> %zu -> %zu bytes, reserved %zu -> %zu over "
      "the last %d; host resident %.1f -> %.1f MiB\n",
      kRuns, settled.allocated_bytes, halfway.allocated_bytes, end.allocated_bytes,
      settled.reserved_bytes, end.reserved_bytes, kRuns - kSettle, rss_settled / 1048576.0,
      rss_end / 1048576.0);
  EXPECT_LE(end.allocated_bytes, settled.allocated_bytes + (size_t{2} << 20));
  EXPECT_LE(end.allocated_bytes, halfway.allocated_bytes + (size_t{256} << 10));
  EXPECT_LE(end.reserved_bytes, settled.reserved_bytes + (size_t{64} << 20));
  EXPECT_LE(rss_end, rss_settled + (size_t{16} << 20));
}

// Strided copies past 2^31 units take the kernel's 64-bit index (transform.cu): a slice [k:] of a
// 1-D tensor whose rest holds at least 2^31 + 1 units, one case per unit width (1, 2, 4, 8 and
// 16 bytes: the offset k and the dtype fix it). Up to 64 GiB on the device: alone on the GPU, as
// the rest of CudaLoad. Elements around 2^31 units and at the end must equal the source's, k on.
TEST(CudaLoad, CopiesPast2To31UnitsOfEveryWidth) {
  REQUIRE_GPU();
  struct Width {
    DType t;
    int64_t k, unit_elems, mod;  // offset, elements per unit, values taken modulo (0: none)
  };
  const Width widths[] = {{u8, 1, 1, 251}, {i16, 1, 1, 30011}, {f32, 1, 1, 0}, {f64, 1, 1, 0},
                          {f64, 2, 2, 0}};
  const int64_t units = (int64_t{1} << 31) + 1;
  for (const Width& w : widths) {
    SCOPED_TRACE(std::string(name(w.t)) + " k " + std::to_string(w.k));
    const int64_t n = units * w.unit_elems + w.k;
    Graph g;
    Tensor x = arange(g, 0, static_cast<double>(n), 1, w.mod ? i64 : w.t);
    if (w.mod) x = cast(mod(x, full(g, {}, static_cast<double>(w.mod), i64)), w.t);
    const Tensor y = slice(x, {w.k}, {n});
    // positions of y: the start, around 2^31 units, the end
    const int64_t m = y.shape()[0], edge = (int64_t{1} << 31) * w.unit_elems;
    const std::vector<int64_t> at = {0, edge - 8, m - 8};
    std::vector<Tensor> outs;
    for (int64_t p : at) {
      outs.push_back(slice(y, {p}, {p + 8}));
      outs.push_back(slice(x, {p + w.k}, {p + w.k + 8}));
    }
    std::vector<Array> got;
    {
      // no optimization: the slices of y stay slices of a materialized y
      Executable exe = g.compile(kGpu, {}, outs, {.optimize = false});
      got = exe.run(Feeds{});
    }
    for (size_t i = 0; i < at.size(); ++i) {
      const std::vector<double> yv = got[2 * i].to(Device::cpu()).to_vector<double>();
      const std::vector<double> xv = got[2 * i + 1].to(Device::cpu()).to_vector<double>();
      EXPECT_EQ(yv, xv) << "y[" << at[i] << ":+8] differs from x[" << at[i] + w.k << ":+8]";
    }
    empty_cache(kGpu);
  }
}

// A convolution's bias over an output of 2^31 elements or more takes the bias kernel's 64-bit
// index (conv.cu), wide (spatial size a multiple of the 16-byte pack) and one element a thread
// (odd spatial size). An input with zero channels leaves the output to the bias alone; the check
// runs on the device (the largest |y - bias|), so only a scalar comes back.
TEST(CudaLoad, ConvolutionBiasPast2To31Elements) {
  REQUIRE_GPU();
  for (DType t : {f32, f16, bf16, f64}) {
    for (int64_t side : {int64_t{32768}, int64_t{32769}}) {  // 2^31 outputs; 2 * 32769^2 > 2^31
      SCOPED_TRACE(std::string(name(t)) + " side " + std::to_string(side));
      Graph g;
      const Tensor x = g.placeholder({1, 0, side, side}, t, "x");
      const Tensor w = g.placeholder({2, 0, 1, 1}, t, "w");
      const Tensor b = g.placeholder({2}, t, "b");
      const Tensor y = conv2d(x, w, b, {});
      const Tensor worst = max(abs(y - reshape(b, {1, 2, 1, 1})), {0, 1, 2, 3});
      double got = -1;
      {
        Executable exe = g.compile(kGpu, {}, {worst}, {.optimize = false});
        const Array out = exe.run({{x, Array::empty({1, 0, side, side}, t)},
                                   {w, Array::empty({2, 0, 1, 1}, t)},
                                   {b, Array::from_vector(std::vector<float>{0.75f, -1.5f}, {2})
                                           .astype(t)}})[0];
        got = out.to(Device::cpu()).to_vector<double>()[0];
      }
      EXPECT_EQ(got, 0.0);
      empty_cache(kGpu);
    }
  }
}

}  // namespace
}  // namespace kiln
