// Elementwise fusion on the CPU: a chain of eight elementwise ops (plus a broadcast row) compiled
// with and without CompileOptions::fuse_elementwise, median milliseconds per run; from 4,096
// elements (where a run's cost is its per-call overhead) to 16M.
//   kiln_bench_fusion [reps]
#include <fmt/format.h>

#include <cstdlib>

#include "bench/timing.h"
#include "kiln/kiln.h"

int main(int argc, char** argv) {
  using namespace kiln;
  const int reps = argc > 1 ? std::atoi(argv[1]) : 7;
  fmt::print("{:>10} {:>5} {:>12} {:>12} {:>8}\n", "elements", "dtype", "unfused ms", "fused ms",
             "speedup");
  for (DType t : {f32, f16})
    for (int64_t n : {int64_t{1} << 12, int64_t{1} << 16, int64_t{1} << 20, int64_t{1} << 22,
                      int64_t{1} << 24}) {
      const int64_t cols = 1024;
      Graph g;
      auto x = g.placeholder({n / cols, cols}, t, "x");
      auto b = g.placeholder({cols}, t, "b");
      auto y = tanh(x * b + 0.5) * x;                      // mul, add, tanh, mul
      auto out = clip(sigmoid(y) - relu(x), -0.25, 0.75);  // sigmoid, relu, sub, clip
      const Array xv = Array::from_vector(std::vector<float>(n, 0.3f), {n / cols, cols}).astype(t);
      const Array bv = Array::from_vector(std::vector<float>(cols, -0.7f), {cols}).astype(t);
      double ms[2];
      for (int fused = 0; fused < 2; ++fused) {
        auto exe = g.compile(Device::cpu(), {}, {out}, {.fuse_elementwise = fused == 1});
        const Feeds f{{x, xv}, {b, bv}};
        ms[fused] = bench::median_ms([&] { exe.run(f); }, reps);
      }
      fmt::print("{:>10} {:>5} {:>12.4f} {:>12.4f} {:>7.2f}x\n", n, name(t), ms[0], ms[1],
                 ms[0] / ms[1]);
    }
}
