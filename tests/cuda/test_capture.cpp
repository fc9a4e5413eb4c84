// Recorded runs (CompileOptions::capture): from the second run on a GPU executable replays one
// CUDA graph. Results must equal the runs that are not recorded, for fresh feeds every run, with
// variables updated in place, variables moved by the host, reported input errors, outputs that
// are feeds or constants (concurrent runs: CudaRuntime.ConcurrentRunsKeepTheirBuffersApart).
// Skipped without a GPU.
#include <cmath>
#include <random>
#include <vector>

#include "kiln/kiln.h"
#include "support/gpu.h"
#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;

const Device kGpu = Device::cuda(0);

CompileOptions capture(bool on) {
  CompileOptions o;
  o.capture = on;
  return o;
}

// A model with library calls (matmul, convolution), reductions, scratch memory (softmax over
// rows, a convolution workspace) and elementwise ops.
struct Model {
  Graph g;
  Tensor x, w, img, k, out, conv;
  Model() {
    x = g.placeholder({64, 48}, f32, "x");
    w = g.placeholder({48, 40}, f32, "w");
    img = g.placeholder({4, 3, 20, 20}, f32, "img");
    k = g.placeholder({8, 3, 3, 3}, f32, "k");
    out = softmax(relu(matmul(x, w)) * 0.5 + 1.0, -1);
    conv = sum(tanh(conv2d(img, k, std::nullopt, {.padding = {1, 1}})), {1});
  }
  Feeds feeds(bool on_device) {
    Feeds f{{x, random_array({64, 48}, f32)},
            {w, random_array({48, 40}, f32)},
            {img, random_array({4, 3, 20, 20}, f32)},
            {k, random_array({8, 3, 3, 3}, f32)}};
    if (on_device)
      for (auto& [t, a] : f) a = a.to(kGpu);
    return f;
  }
};

TEST(CudaCapture, ReplaysMatchTheCpuForFreshFeedsEveryRun) {
  REQUIRE_RECORDED_RUNS();
  Model m;
  auto gpu = m.g.compile(kGpu, {}, {m.out, m.conv}, capture(true));
  auto cpu = m.g.compile(Device::cpu(), {}, {m.out, m.conv});
  EXPECT_EQ(gpu.capture_status(), "not run yet");
  for (int run = 0; run < 5; ++run) {
    Feeds f = m.feeds(run % 2 == 1);  // host feeds and device feeds alternate
    auto got = gpu.run(f);
    for (auto& [t, a] : f) a = a.to(Device::cpu());
    auto want = cpu.run(f);
    ASSERT_EQ(got.size(), 2u);
    for (size_t o = 0; o < 2; ++o) {
      ASSERT_EQ(got[o].device(), kGpu);
      // conv: sums of 8 tanh of 27-term f32 convolutions, which cancel; the algorithm cuDNN's
      // timing picks (Winograd, FFT) errs by up to about 1e-5 of the terms' size, 1 here
      expect_close(got[o].to(Device::cpu()), want[o].shape(), to_f64(want[o]), 1e-4,
                   o == 1 ? 5e-5 : 1e-6);
    }
  }
  EXPECT_EQ(gpu.replayed_runs(), 4);  // every run after the first
  EXPECT_NE(gpu.capture_status().find("replayed"), std::string::npos) << gpu.capture_status();
  EXPECT_NE(gpu.report().find("CUDA graph"), std::string::npos) << gpu.report();
}

// Outputs of a replay belong to the caller: the next replay does not write over them.
TEST(CudaCapture, OutputsOfEarlierRunsStayIntact) {
  REQUIRE_RECORDED_RUNS();
  Model m;
  auto gpu = m.g.compile(kGpu, {}, {m.out}, capture(true));
  std::vector<Array> kept, want;
  for (int run = 0; run < 4; ++run) {
    Feeds f = m.feeds(false);
    kept.push_back(gpu.run(f)[0]);
    want.push_back(kept.back().to(Device::cpu()));
  }
  for (size_t i = 0; i < kept.size(); ++i)
    expect_close(kept[i].to(Device::cpu()), want[i].shape(), to_f64(want[i]), 0, 0);
}

TEST(CudaCapture, OffGivesTheSameBits) {
  REQUIRE_RECORDED_RUNS();
  Model m;
  auto on = m.g.compile(kGpu, {}, {m.out, m.conv}, capture(true));
  auto off = m.g.compile(kGpu, {}, {m.out, m.conv}, capture(false));
  for (int run = 0; run < 3; ++run) {
    Feeds f = m.feeds(false);
    auto a = on.run(f), b = off.run(f);
    for (size_t o = 0; o < 2; ++o) {
      Array bh = b[o].to(Device::cpu());
      expect_close(a[o].to(Device::cpu()), bh.shape(), to_f64(bh), 0, 0);
    }
  }
  EXPECT_EQ(on.replayed_runs(), 2);
  EXPECT_EQ(off.replayed_runs(), 0);
  EXPECT_EQ(off.capture_status(), "off: CompileOptions::capture is off");
}

// A training step: variables updated in place by a replayed graph follow the same trajectory as
// without recording; a variable written by the host in between moves, and the run records again.
TEST(CudaCapture, TrainingStepsAndHostWritesOfVariables) {
  REQUIRE_RECORDED_RUNS();
  const Array w0 = random_array({20, 16}, f32, -0.3, 0.3), v0 = random_array({16, 4}, f32, -0.3, 0.3);
  struct Net {
    Graph g;
    Tensor x, y, w, v, loss;
    Executable exe;
    Net(const Array& w0, const Array& v0, bool rec) {
      x = g.placeholder({32, 20}, f32, "x");
      y = g.placeholder({32}, i64, "y");
      w = g.variable(w0, "w");
      v = g.variable(v0, "v");
      loss = softmax_cross_entropy(matmul(tanh(matmul(x, w)), v), y);
      auto step = optim::adam(g, {w, v}, gradients(loss, {w, v}), {.lr = 1e-2});
      exe = g.compile(kGpu, {}, {loss}, Updates(step), capture(rec));
    }
  };
  Net a(w0, v0, true), b(w0, v0, false);
  std::mt19937_64 data(seed());
  for (int s = 0; s < 12; ++s) {
    std::vector<float> xs(32 * 20);
    std::vector<int64_t> ys(32);
    std::uniform_real_distribution<float> u(-1, 1);
    for (auto& e : xs) e = u(data);
    for (auto& e : ys) e = static_cast<int64_t>(data() % 4);
    const Array xa = Array::from_vector(xs, {32, 20}), ya = Array::from_vector(ys, {32});
    const double la = a.exe.run({{a.x, xa}, {a.y, ya}})[0].to_vector<double>()[0];
    const double lb = b.exe.run({{b.x, xa}, {b.y, ya}})[0].to_vector<double>()[0];
    EXPECT_EQ(la, lb) << "step " << s;
    if (s == 5) {  // the host writes a variable: its storage moves to the host and back
      const Array w5 = random_array({20, 16}, f32, -0.3, 0.3);
      a.g.write_variable(a.w, w5);
      b.g.write_variable(b.w, w5);
    }
  }
  const Array wa = a.g.read_variable(a.w), wb = b.g.read_variable(b.w);
  expect_close(wa, wb.shape(), to_f64(wb), 0, 0);
  EXPECT_GE(a.exe.replayed_runs(), 10);
}

// Kernels that report bad inputs (an index out of range) still report them when replayed.
TEST(CudaCapture, ReplayedRunsReportBadIndices) {
  REQUIRE_RECORDED_RUNS();
  Graph g;
  auto x = g.placeholder({10, 6}, f32, "x");
  auto i = g.placeholder({5}, i64, "i");
  auto out = gather(x, i, 0) * 2.0;
  auto exe = g.compile(kGpu, {}, {out}, capture(true));
  const Array xv = random_array({10, 6}, f32);
  for (int run = 0; run < 3; ++run) {
    std::vector<int64_t> idx{0, 3, 9, 2, static_cast<int64_t>(run)};
    auto r = exe.run({{x, xv}, {i, Array::from_vector(idx, {5})}})[0].to(Device::cpu());
    std::vector<double> want;
    const auto xs = to_f64(xv);
    for (int64_t k : idx)
      for (int c = 0; c < 6; ++c) want.push_back(2 * xs[k * 6 + c]);
    expect_close(r, {5, 6}, want, 0, 0);
  }
  ASSERT_EQ(exe.replayed_runs(), 2);
  std::vector<int64_t> bad{0, 1, 12, 2, 3};
  expect_error<ValueError>([&] { exe.run({{x, xv}, {i, Array::from_vector(bad, {5})}}); },
                           {"gather", "12"});
  // and the executable keeps working
  std::vector<int64_t> good{4, 4, 4, 4, 4};
  auto r = exe.run({{x, xv}, {i, Array::from_vector(good, {5})}})[0].to_vector<float>();
  EXPECT_EQ(r[0], 2 * xv.to_vector<float>()[24]);
}

// Returned values that are feeds or constants, and a value returned twice.
TEST(CudaCapture, FeedsAndConstantsReturnedAsOutputs) {
  REQUIRE_RECORDED_RUNS();
  Graph g;
  auto x = g.placeholder({7}, f32, "x");
  const Array cv = random_array({7}, f32);
  auto c = g.constant(cv, "c");
  auto y = x * c;
  auto exe = g.compile(kGpu, {}, {x, c, y, y}, capture(true));
  for (int run = 0; run < 3; ++run) {
    const Array xv = random_array({7}, f32);
    auto r = exe.run({{x, xv}});
    expect_close(r[0].to(Device::cpu()), {7}, to_f64(xv), 0, 0);
    expect_close(r[1].to(Device::cpu()), {7}, to_f64(cv), 0, 0);
    std::vector<double> want;
    for (int k = 0; k < 7; ++k) want.push_back(static_cast<double>(xv.to_vector<float>()[k] * cv.to_vector<float>()[k]));
    expect_close(r[2].to(Device::cpu()), {7}, want, 0, 0);
    expect_close(r[3].to(Device::cpu()), {7}, want, 0, 0);
  }
  EXPECT_EQ(exe.replayed_runs(), 2);
}

// Runs whose device feeds and outputs are large for their few steps are launched step by step:
// copying them in and out of a recording would cost more than the launches it saves.
TEST(CudaCapture, FewStepsOverLargeTensorsAreNotReplayed) {
  REQUIRE_RECORDED_RUNS();
  Graph g;
  auto x = g.placeholder({1 << 22}, f32, "x");  // 16 MiB
  auto y = x * 2.0;
  auto exe = g.compile(kGpu, {}, {y}, capture(true));
  const Array xv = random_array({1 << 22}, f32);
  const Array xd = xv.to(kGpu);
  for (int run = 0; run < 3; ++run) {
    const auto r = exe.run({{x, xd}})[0].to_vector<float>();
    const auto xs = xv.to_vector<float>();
    for (size_t i = 0; i < xs.size(); i += 4099) ASSERT_EQ(r[i], 2 * xs[i]) << i;
  }
  EXPECT_EQ(exe.replayed_runs(), 0);
}

TEST(CudaCapture, CpuExecutablesSayTheyAreNotRecorded) {
  Graph g;
  auto x = g.placeholder({3}, f32, "x");
  auto exe = g.compile(Device::cpu(), {}, {x * 2.0});
  exe.run({{x, random_array({3}, f32)}});
  EXPECT_EQ(exe.replayed_runs(), 0);
  EXPECT_NE(exe.capture_status().find("cpu"), std::string::npos);
}

}  // namespace
}  // namespace kiln
