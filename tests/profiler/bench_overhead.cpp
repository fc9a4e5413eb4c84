// Per-op overhead of the profiler: 1000 dependent adds on a 1-element f32 tensor (optimize=off,
// so every add is a kernel), timed with the profiler off, on, and off again, in alternating rounds.
//
//   kiln_bench_profiler [cpu|cuda] [reps]
//
// Off, a run tests once whether it is profiled (RunProfile::begin loads one atomic flag); the step
// loop is instantiated without profiler code (src/runtime/executable.cpp). The benchmark times that
// test on its own and as a share of a run; the two "off" rows bound the noise of the timings.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

#include "kiln/kiln.h"
#include "runtime/profiler_run.h"

using namespace kiln;

namespace {
constexpr int kOps = 1000;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
}  // namespace

int main(int argc, char** argv) {
  const std::string dev_name = argc > 1 ? argv[1] : "cpu";
  const int reps = argc > 2 ? std::atoi(argv[2]) : 200;
  const Device device = dev_name == "cpu" ? Device::cpu() : Device::cuda(0);
  Graph g;
  auto x = g.placeholder({1}, f32, "x");
  const float one_value = 1.0f, zero = 0.0f;
  auto one = g.constant(Array::from_data(&one_value, {1}, f32), "one");
  Tensor h = x;
  for (int i = 0; i < kOps; ++i) h = h + one;
  CompileOptions c;
  c.optimize = false;
  c.capture = false;
  auto exe = g.compile(device, {}, {h}, c);
  Array xv = Array::from_data(&zero, {1}, f32).to(device);
  auto time_us_per_op = [&] {
    std::vector<double> t;
    for (int i = 0; i < reps; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      auto out = exe.run({{x, xv}});
      out[0].to(Device::cpu());
      t.push_back(
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
          kOps);
    }
    return median(t);
  };
  for (int i = 0; i < 20; ++i) exe.run({{x, xv}});  // warm
  // rounds of off, on, off: the best median of each (a loaded machine only adds time)
  double off1 = 1e30, on = 1e30, off2 = 1e30;
  size_t spans = 0;
  for (int round = 0; round < 5; ++round) {
    off1 = std::min(off1, time_us_per_op());
    Profiler::start();
    on = std::min(on, time_us_per_op());
    spans = Profiler::stop().spans.size();
    off2 = std::min(off2, time_us_per_op());
  }
  fmt::print("per-op overhead on {}, {} dependent adds, best of 5 medians of {} runs:\n",
             device.str(), kOps, reps);
  fmt::print("  profiler off: {:.4f} us per op\n", off1);
  fmt::print("  profiler on:  {:.4f} us per op ({} spans a round, {:+.1f}%)\n", on, spans,
             100 * (on / off1 - 1));
  // the off cost on its own: the test every run makes
  constexpr int kTests = 10'000'000;
  size_t held = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kTests; ++i)
    held += prof::RunProfile::begin(device, nullptr, nullptr) != nullptr;
  const double test_ns =
      std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() /
      kTests;
  fmt::print("  off, its cost: {:.2f} ns per run ({} held) = {:.5f}% of a run of {} ops\n",
             test_ns, held, 100 * test_ns / (1000 * off1 * kOps), kOps);
  fmt::print("  off again:    {:.4f} us per op ({:+.2f}% from the first)\n", off2,
             100 * (off2 / off1 - 1));
  return 0;
}
