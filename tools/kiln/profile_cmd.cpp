// `kiln profile`: imports and compiles an ONNX model (or loads a kiln package), runs it a few
// times under the profiler and prints the summary: top ops, copies, CPU fallbacks and GPU idle
// gaps; --trace writes the Chrome trace, --html the self-contained report.
#include <fmt/format.h>

#include <memory>

#include "kiln/kernel.h"
#include "kiln/op_catalog.h"
#include "kiln/profiler.h"
#include "tools/kiln/commands.h"
#include "tools/kiln/model_args.h"

namespace kiln::cli {

namespace {
struct ProfileOptions {
  std::string model;
  std::string trace, html;
  int runs = 3;
  int warmup = 1;
  std::vector<std::string> inputs, shapes, values, cpu_ops;
  std::string device;
  uint64_t seed = 0;
  double gap_us = 10;
  PackageFlags package;
};

void profile_model(const ProfileOptions& o) {
  if (o.runs < 1) throw ValueError("[profile] --runs must be at least 1");
  if (o.warmup < 0) throw ValueError("[profile] --warmup must not be negative");
  if (!(o.gap_us >= 0)) throw ValueError("[profile] --gap-us must not be negative");
  if (!o.html.empty() && (o.html.size() < 5 || o.html.compare(o.html.size() - 5, 5, ".html") != 0))
    throw ValueError(
        fmt::format("[profile] --html takes a path ending in .html, got '{}'", o.html));
  // ops forced onto the CPU: their CUDA kernels are dropped for this process
  for (const std::string& op : o.cpu_ops) {
    OpId id{};
    if (!op_from_name(op, id))
      throw ValueError(fmt::format("[profile] --cpu-op: no op named '{}' (see `kiln ops`)", op));
    (void)find_kernel(id, Backend::cuda);  // the built-in kernels first, or they would return
    register_kernel(id, Backend::cuda, KernelEntry{});
  }
  ModelArgs args;
  args.command = "profile";
  args.inputs = load_inputs(o.inputs);
  args.shapes = parse_shapes(o.shapes);
  for (const auto& [n, a] : args.inputs) args.shapes[n] = a.shape();
  args.values = load_inputs(o.values, "--value");
  args.package = o.package;
  const Device device = pick_device(o.device);

  if (Profiler::active()) Profiler::stop();  // KILN_PROFILE: this command writes its own
  ProfileScope scope;                        // compile (or load) and the runs
  const PreparedModel model = prepare_model(o.model, args, device);
  const auto feeds = complete_inputs(model, args.inputs, o.seed);
  const auto run = model.bind(feeds);
  for (int i = 0; i < o.warmup + o.runs; ++i) {
    std::vector<Array> out = run();
    for (Array& a : out) a = a.to(Device::cpu());
  }
  Profile p = scope.stop();
  if (o.warmup > 0) {  // the profile keeps the compile and the last --runs runs
    const int64_t first = o.warmup;
    std::vector<ProfileSpan> kept;
    for (auto& s : p.spans) {
      if (s.run >= 0 && s.run < first) continue;
      if (s.run >= 0) s.run -= first;
      kept.push_back(std::move(s));
    }
    p.spans = std::move(kept);
  }
  fmt::print("{} on {}: {} {:.3f} ms, {} profiled runs after {} warmup\n", o.model, device.str(),
             model.prepare_what(), model.prepare_ms, o.runs, o.warmup);
  print_placement(model.exe);
  fmt::print("{}", p.summary(o.gap_us));
  if (!o.trace.empty()) {
    p.save(o.trace);
    fmt::print("wrote the trace to {} (open it in https://ui.perfetto.dev or chrome://tracing)\n",
               o.trace);
  }
  if (!o.html.empty()) {
    p.save(o.html);
    fmt::print("wrote the report to {}\n", o.html);
  }
}
}  // namespace

void add_profile_command(CLI::App& app) {
  auto o = std::make_shared<ProfileOptions>();
  auto* cmd = app.add_subcommand(
      "profile",
      "Profile an ONNX or Core ML model or a kiln package: op times, copies, CPU fallbacks, "
      "GPU idle gaps; Chrome trace and HTML report");
  cmd->add_option(
         "model", o->model,
         "ONNX model (.onnx), Core ML model (.mlpackage, .mlmodel) or kiln package (.kiln)")
      ->required();
  cmd->add_option("--trace", o->trace,
                  "Write the Chrome trace-event JSON here (Perfetto, chrome://tracing)");
  cmd->add_option("--html", o->html, "Write the self-contained HTML timeline here (.html)");
  cmd->add_option("--runs,-n", o->runs, "Profiled runs")->capture_default_str();
  cmd->add_option("--warmup,-w", o->warmup,
                  "Runs first whose spans are dropped (the compile is kept)")
      ->capture_default_str();
  cmd->add_option("--input,-i", o->inputs,
                  "NAME=FILE.npy: use this input instead of random values");
  cmd->add_option("--shape", o->shapes,
                  "NAME=1,3,224,224: shape of a random input (dim_params default to 1). ONNX "
                  "only: a package's shapes are fixed");
  cmd->add_option("--value", o->values, std::string(kValueHelp) + ". ONNX only");
  cmd->add_option("--cpu-op", o->cpu_ops,
                  "OP: run this op on the CPU (its GPU kernel is not used), to see what a "
                  "fallback costs; repeatable");
  cmd->add_option("--gap-us", o->gap_us, "Smallest GPU idle gap the summary lists")
      ->capture_default_str();
  cmd->add_option("--device", o->device,
                  "cpu, cuda or cuda:N (default: KILN_DEVICE or the first GPU)");
  cmd->add_option("--seed", o->seed, "Seed of the random inputs")->capture_default_str();
  add_package_flags(cmd, o->package);
  cmd->callback([o] { profile_model(*o); });
}

}  // namespace kiln::cli
