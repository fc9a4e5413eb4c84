// `kiln demo`: the main job. Builds a small network with the C++ API, compiles it for the default
// device, runs it and reports what it did and how long it took.
#include <fmt/format.h>

#include <chrono>

#include "kiln/kiln.h"
#include "tools/kiln/commands.h"

namespace kiln::cli {

namespace {
double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

void run_demo(int steps) {
  using clock = std::chrono::steady_clock;
  const Device dev = default_device();
  fmt::print("kiln {} demo on {}\n", version(), dev.str());
  auto t0 = clock::now();
  Graph g;
  const int64_t batch = 64, features = 256;
  auto x = g.placeholder({-1, features}, f32, "x");
  Tensor h = x;
  for (int i = 0; i < 4; ++i) h = relu(h * 0.9 + 0.1);
  fmt::print("built a graph of {} nodes in {:.2f} ms\n", g.num_nodes(), ms_since(t0));
  t0 = clock::now();
  auto exe = g.compile(dev, {{x, {batch, features}}}, {h});
  fmt::print("compiled to {} kernels, {} bytes of intermediates, in {:.2f} ms\n", exe.num_steps(),
             exe.peak_intermediate_bytes(), ms_since(t0));
  Array input = Array::zeros({batch, features}, f32);
  for (int s = 0; s < steps; ++s) {
    t0 = clock::now();
    auto out = exe.run({{x, input}});
    fmt::print("step {}: output {} in {:.3f} ms\n", s, to_string(out[0].shape()), ms_since(t0));
  }
  fmt::print("demo done\n");
}
}  // namespace

void add_demo_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("demo", "Build, compile and run a small network");
  static int steps = 5;
  cmd->add_option("--steps", steps, "Number of runs")->check(CLI::Range(1, 100000));
  cmd->callback([] { run_demo(steps); });
}

}  // namespace kiln::cli
