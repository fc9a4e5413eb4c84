// What a CPU fallback costs a GPU model, and what a custom kernel saves: the MLP-Softshrink Adam
// step (784-256(Softshrink)-10, batch 256, f32) profiled three ways on one device:
//   built-in    the built-in softshrink and its CUDA kernel;
//   fallback    the built-in softshrink with its CUDA kernel dropped, so it runs on the CPU with a
//               copy each way (the GPU idles meanwhile);
//   custom op   my.softshrink from the softshrink op library, its kernel on kiln's stream.
// For each: the step time and the GPU idle gaps of at least 10 us within a step (docs/profiling.md),
// split into those a softshrink caused and those where the GPU outran the host's encoding (an
// unrecorded run of small kernels; profiled runs are never replayed as CUDA graphs).
//
//   kiln_bench_softshrink_profile [--device cpu|cuda] [--trace-dir DIR] [--library PATH]
//
// The library is examples/custom_op's softshrink op library (its build path by default).
//
// Exits non-zero when the fallback causes no gap, or the custom op (on a GPU) causes one.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/op_id.h"
#include "kiln/custom_op.h"
#include "kiln/kernel.h"
#include "kiln/kiln.h"

using namespace kiln;

namespace {
constexpr int64_t kBatch = 256, kIn = 784, kHidden = 256, kClasses = 10;
constexpr int kRuns = 20;

Array uniform(std::mt19937& rng, const Shape& s, float bound) {
  std::uniform_real_distribution<float> d(-bound, bound);
  Array a = Array::empty(s, f32);
  for (int64_t i = 0; i < a.numel(); ++i) a.data<float>()[i] = d(rng);
  return a;
}

struct Variant {
  double step_ms = 0;
  std::vector<IdleGap> gaps;  // caused by an op (not by the host's encoding)
  std::vector<IdleGap> host_gaps;
  Profile profile;
};

// One compile and kRuns profiled steps after a warm-up; `custom`: my.softshrink.
Variant profile_step(const Device& dev, bool custom) {
  std::mt19937 rng(7);
  Graph g;
  auto x = g.placeholder({kBatch, kIn}, f32, "x");
  auto y = g.placeholder({kBatch}, i64, "y");
  const float b1 = 1.0f / std::sqrt(float(kIn)), b2 = 1.0f / std::sqrt(float(kHidden));
  auto w1 = g.variable(uniform(rng, {kHidden, kIn}, b1), "w1");
  auto c1 = g.variable(uniform(rng, {kHidden}, b1), "b1");
  auto w2 = g.variable(uniform(rng, {kClasses, kHidden}, b2), "w2");
  auto c2 = g.variable(uniform(rng, {kClasses}, b2), "b2");
  Tensor h = linear(x, w1, c1);
  h = custom ? custom_op1("my.softshrink", {h}, {{"lambda", 0.5}}) : softshrink(h, 0.5);
  auto loss = softmax_cross_entropy(linear(h, w2, c2), y);
  std::vector<Tensor> params{w1, c1, w2, c2};
  auto step = optim::adam(g, params, gradients(loss, params), {.lr = 1e-3});
  CompileOptions opts;
  opts.capture = false;  // a recorded run is replayed without per-op timing
  auto exe = g.compile(dev, {}, {loss}, step, opts);
  Array xv = uniform(rng, {kBatch, kIn}, 1.0f).to(dev);
  Array labels = Array::empty({kBatch}, i64);
  for (int64_t i = 0; i < kBatch; ++i) labels.data<int64_t>()[i] = (i * 7919) % kClasses;
  Array yv = labels.to(dev);
  for (int i = 0; i < 3; ++i) exe.run({{x, xv}, {y, yv}})[0].to(Device::cpu());
  Variant v;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kRuns; ++i) exe.run({{x, xv}, {y, yv}})[0].to(Device::cpu());
  v.step_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() /
      kRuns;
  Profiler::start();
  for (int i = 0; i < kRuns; ++i) exe.run({{x, xv}, {y, yv}})[0].to(Device::cpu());
  v.profile = Profiler::stop();
  for (IdleGap& gap : v.profile.idle_gaps(10))
    (gap.cause.rfind("waiting for the host", 0) == 0 ? v.host_gaps : v.gaps).push_back(gap);
  return v;
}

void print(const char* name, const Variant& v, const std::string& trace_dir) {
  double idle = 0, host_idle = 0;
  for (const IdleGap& gap : v.gaps) idle += gap.dur_us;
  for (const IdleGap& gap : v.host_gaps) host_idle += gap.dur_us;
  fmt::print(
      "{:<10} {:8.3f} ms a step; idle gaps >= 10 us in {} steps: {:3} caused by ops ({:.1f} us a "
      "step), {:3} waiting for the host's encoding ({:.1f} us a step)\n",
      name, v.step_ms, kRuns, v.gaps.size(), idle / kRuns, v.host_gaps.size(), host_idle / kRuns);
  if (!v.gaps.empty())
    fmt::print("           first gap: {:.1f} us, {}\n", v.gaps.front().dur_us, v.gaps.front().cause);
  if (!trace_dir.empty()) {
    std::string file = std::string(name);
    std::replace(file.begin(), file.end(), ' ', '_');
    v.profile.save(trace_dir + "/softshrink_" + file + ".json");
  }
}
}  // namespace

int main(int argc, char** argv) {
  std::string device = "cpu", trace_dir, library = KILN_SOFTSHRINK_LIB;
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (i + 1 >= argc || (flag != "--device" && flag != "--trace-dir" && flag != "--library")) {
      fmt::print(stderr, "usage: {} [--device cpu|cuda] [--trace-dir DIR] [--library PATH]\n",
                 argv[0]);
      return 2;
    }
    (flag == "--device" ? device : flag == "--trace-dir" ? trace_dir : library) = argv[i + 1];
  }
  try {
    load_op_library(library);
    const Device dev = device == "cuda" ? Device::cuda(0) : Device::cpu();
    fmt::print("MLP 784-256(Softshrink)-10 Adam step, batch 256, f32, on {}, {} profiled steps\n",
               dev.str(), kRuns);
    const Variant builtin = profile_step(dev, false);
    const Variant custom = profile_step(dev, true);
    print("built-in", builtin, trace_dir);
    print("custom op", custom, trace_dir);
    if (dev.kind == Device::Kind::cpu) return 0;  // no device track, no gaps
    // the built-in kernels first (a lookup registers them), then the CUDA one dropped
    OpId op{};
    op_from_name("softshrink", op);
    (void)find_kernel(op, Backend::cuda);
    register_kernel(op, Backend::cuda, KernelEntry{});
    const Variant fallback = profile_step(dev, false);
    print("fallback", fallback, trace_dir);
    if (fallback.gaps.empty() || !custom.gaps.empty()) {
      fmt::print(stderr, "FAILED: expected gaps with the fallback and none with the custom op\n");
      return 1;
    }
  } catch (const Error& e) {
    fmt::print(stderr, "{}\n", e.what());
    return 1;
  }
  return 0;
}
