// `kiln bench`: latency percentiles and throughput of an ONNX model or a kiln package on random
// (or given) inputs, and the time it took to import and compile (or load).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <numeric>

#include "tools/kiln/commands.h"
#include "tools/kiln/model_args.h"

namespace kiln::cli {

namespace {
struct BenchOptions {
  std::string model;
  int iterations = 100;
  int warmup = 10;
  std::vector<std::string> inputs;
  std::vector<std::string> shapes;
  std::vector<std::string> values;
  std::string device;
  uint64_t seed = 0;
  PackageFlags package;
};

// Nearest-rank percentile of sorted values.
double percentile(const std::vector<double>& sorted, double q) {
  const size_t rank = static_cast<size_t>(std::ceil(q * static_cast<double>(sorted.size())));
  return sorted[std::clamp<size_t>(rank, 1, sorted.size()) - 1];
}

void bench_model(const BenchOptions& o) {
  if (o.iterations < 1) throw ValueError("[bench] --iterations must be at least 1");
  if (o.warmup < 0) throw ValueError("[bench] --warmup must not be negative");
  ModelArgs args;
  args.command = "bench";
  args.inputs = load_inputs(o.inputs);
  args.shapes = parse_shapes(o.shapes);
  for (const auto& [n, a] : args.inputs) args.shapes[n] = a.shape();
  args.values = load_inputs(o.values, "--value");
  args.package = o.package;
  const Device device = pick_device(o.device);
  const PreparedModel model = prepare_model(o.model, args, device);
  std::map<std::string, Array> feeds = complete_inputs(model, args.inputs, o.seed);
  for (auto& [n, a] : feeds) a = a.to(device);
  const auto run = model.bind(feeds);

  using clock = std::chrono::steady_clock;
  auto run_once = [&] {
    std::vector<Array> out = run();
    // the first output on the host: the run is complete when timing stops
    if (!out.empty()) out[0].to(Device::cpu());
  };
  for (int i = 0; i < o.warmup; ++i) run_once();
  std::vector<double> ms;
  const auto start = clock::now();
  for (int i = 0; i < o.iterations; ++i) {
    const auto t0 = clock::now();
    run_once();
    ms.push_back(std::chrono::duration<double, std::milli>(clock::now() - t0).count());
  }
  const double total_s = std::chrono::duration<double>(clock::now() - start).count();
  std::sort(ms.begin(), ms.end());
  const double mean = std::accumulate(ms.begin(), ms.end(), 0.0) / static_cast<double>(ms.size());
  int64_t batch = 1;
  if (!model.inputs.empty() && !model.inputs[0].shape.empty()) batch = model.inputs[0].shape[0];

  fmt::print("{} on {}: {} iterations after {} warmup\n", o.model, device.str(), o.iterations,
             o.warmup);
  print_inputs(model, args.inputs);
  if (const PackageInfo* p = model.exe.package_info())
    fmt::print("{}: {:.3f} ms (kiln package compiled for {}{})\n", model.prepare_what(),
               model.prepare_ms, p->compiled_for, p->replanned ? ", placed and planned again" : "");
  else fmt::print("{}: {:.3f} ms\n", model.prepare_what(), model.prepare_ms);
  fmt::print("latency ms: p50 {:.3f}  p90 {:.3f}  p99 {:.3f}  mean {:.3f}  min {:.3f}\n",
             percentile(ms, 0.5), percentile(ms, 0.9), percentile(ms, 0.99), mean, ms.front());
  const double runs = static_cast<double>(o.iterations) / total_s;
  fmt::print("throughput: {:.1f} runs/s, {:.1f} items/s (batch {})\n", runs,
             runs * static_cast<double>(batch), batch);
}
}  // namespace

void add_bench_command(CLI::App& app) {
  auto o = std::make_shared<BenchOptions>();
  auto* cmd = app.add_subcommand(
      "bench", "Measure an ONNX or Core ML model's or a kiln package's latency and throughput");
  cmd->add_option(
         "model", o->model,
         "ONNX model (.onnx), Core ML model (.mlpackage, .mlmodel) or kiln package (.kiln)")
      ->required();
  cmd->add_option("--iterations,-n", o->iterations, "Timed runs")->capture_default_str();
  cmd->add_option("--warmup,-w", o->warmup, "Untimed runs first")->capture_default_str();
  cmd->add_option("--input,-i", o->inputs,
                  "NAME=FILE.npy: use this input instead of random values");
  cmd->add_option("--shape", o->shapes,
                  "NAME=1,3,224,224: shape of a random input (dim_params default to 1). ONNX "
                  "only: a package's shapes are fixed");
  cmd->add_option("--value", o->values, std::string(kValueHelp) + ". ONNX only");
  cmd->add_option("--device", o->device,
                  "cpu, cuda or cuda:N (default: KILN_DEVICE or the first GPU)");
  cmd->add_option("--seed", o->seed, "Seed of the random inputs")->capture_default_str();
  add_package_flags(cmd, o->package);
  cmd->callback([o] { bench_model(*o); });
}

}  // namespace kiln::cli
