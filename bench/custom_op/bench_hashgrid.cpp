// Hash-grid encoding (examples/custom_op/hashgrid.h) as a custom op against the same function
// composed from built-in ops: the time of one training step (encoding, a 2-layer MLP, MSE, Adam
// on the table and the weights), median over repetitions.
//   kiln_bench_hashgrid [--device cpu|cuda] [--points N] [--levels L] [--log2-table T] [--reps R]
//                       [--lib path to the hashgrid op library]
// Prints one line per variant and the speedup; results go to bench/RESULTS.md.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>

#include "bench/timing.h"
#include "examples/custom_op/hashgrid.h"

using namespace kiln;

namespace {

Array uniform(std::mt19937& rng, const Shape& s, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(static_cast<size_t>(numel(s)));
  for (auto& e : v) e = d(rng);
  return Array::from_vector(v, s);
}

double step_ms(Device dev, const hashgrid::Config& cfg, int64_t n, bool custom, int reps) {
  std::mt19937 rng(3);
  const int64_t enc = cfg.levels * cfg.features, hidden = 64;
  Graph g;
  Tensor x = g.placeholder({n, 2}, f32, "x");
  Tensor target = g.placeholder({n, 3}, f32, "target");
  Tensor table =
      g.variable(uniform(rng, {cfg.levels, cfg.table_size, cfg.features}, -1e-4f, 1e-4f), "table");
  Tensor w1 = g.variable(uniform(rng, {enc, hidden}, -0.3f, 0.3f), "w1");
  Tensor w2 = g.variable(uniform(rng, {hidden, 3}, -0.3f, 0.3f), "w2");
  Tensor e =
      custom ? hashgrid::encode_custom(x, table, cfg) : hashgrid::encode_composed(x, table, cfg);
  Tensor loss = mse(sigmoid(matmul(relu(matmul(e, w1)), w2)), target);
  const std::vector<Tensor> vars = {table, w1, w2};
  auto step = optim::adam(g, vars, gradients(loss, vars), {.lr = 1e-2});
  auto exe = g.compile(dev, {}, {loss}, step);
  const Feeds feeds = {{x, uniform(rng, {n, 2}, 0, 1).to(dev)},
                       {target, uniform(rng, {n, 3}, 0, 1).to(dev)}};
  return bench::median_ms([&] { exe.run(feeds); }, reps);
}

}  // namespace

int main(int argc, char** argv) {
  std::string device = "cpu", lib = KILN_HASHGRID_LIB;
  int64_t n = 1 << 14;
  int reps = 10;
  hashgrid::Config cfg;
  cfg.levels = 16;
  cfg.table_size = int64_t{1} << 15;
  cfg.base_resolution = 16;
  cfg.per_level_scale = 1.38;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--device")
      device = v;
    else if (k == "--points")
      n = std::stoll(v);
    else if (k == "--levels")
      cfg.levels = std::stoll(v);
    else if (k == "--log2-table")
      cfg.table_size = int64_t{1} << std::stoi(v);
    else if (k == "--reps")
      reps = std::stoi(v);
    else if (k == "--lib")
      lib = v;
  }
  try {
    load_op_library(lib);
    const Device dev = device == "cuda" ? Device::cuda(0) : Device::cpu();
    std::printf("hashgrid training step on %s: %lld points, %lld levels, table 2^%d x %lld\n",
                dev.str().c_str(), static_cast<long long>(n), static_cast<long long>(cfg.levels),
                static_cast<int>(std::log2(cfg.table_size)), static_cast<long long>(cfg.features));
    const double c = step_ms(dev, cfg, n, true, reps);
    std::printf("  custom op   %9.3f ms/step\n", c);
    const double b = step_ms(dev, cfg, n, false, reps);
    std::printf("  built-ins   %9.3f ms/step\n", b);
    std::printf("  speedup     %9.1fx\n", b / c);
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
