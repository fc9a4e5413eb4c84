// `kiln run`: imports an ONNX model (or loads a kiln package), runs it once on the given .npy
// inputs (random ones for inputs not given) and writes every output as OUTPUT_DIR/NAME.npy.
#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <set>

#include "tools/kiln/commands.h"
#include "tools/kiln/model_args.h"

namespace kiln::cli {

namespace {
struct RunOptions {
  std::string model;
  std::vector<std::string> inputs;
  std::vector<std::string> shapes;
  std::vector<std::string> values;
  std::string output_dir = ".";
  std::string device;
  uint64_t seed = 0;
  PackageFlags package;
};

void run_model(const RunOptions& o) {
  ModelArgs args;
  args.command = "run";
  args.inputs = load_inputs(o.inputs);
  args.shapes = parse_shapes(o.shapes);
  for (const auto& [n, a] : args.inputs) args.shapes[n] = a.shape();
  args.values = load_inputs(o.values, "--value");
  args.package = o.package;
  const Device device = pick_device(o.device);
  const PreparedModel model = prepare_model(o.model, args, device);
  const std::map<std::string, Array> inputs = complete_inputs(model, args.inputs, o.seed);
  print_inputs(model, args.inputs);

  const auto t0 = std::chrono::steady_clock::now();
  std::vector<Array> outputs = model.run(inputs);
  for (Array& a : outputs) a = a.to(Device::cpu());
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();

  std::filesystem::create_directories(o.output_dir);
  std::set<std::string> used;
  for (size_t i = 0; i < outputs.size(); ++i) {
    const std::string& out_name = model.outputs.at(i).name;
    std::string file = safe_file_name(out_name);
    if (!used.insert(file).second) used.insert(file = fmt::format("{}_{}", file, i));
    const std::string path = (std::filesystem::path(o.output_dir) / (file + ".npy")).string();
    outputs[i].save_npy(path);
    fmt::print("{:<24} {:<5} {:<20} -> {}\n", out_name, name(outputs[i].dtype()),
               to_string(outputs[i].shape()), path);
  }
  if (const PackageInfo* p = model.exe.package_info(); p && p->replanned)
    fmt::print("note: compiled for {}, placed and planned again for {}\n", p->compiled_for,
               device.str());
  fmt::print("ran on {} in {:.3f} ms ({} {:.3f} ms)\n", device.str(), ms, model.prepare_what(),
             model.prepare_ms);
}
}  // namespace

void add_run_command(CLI::App& app) {
  auto o = std::make_shared<RunOptions>();
  auto* cmd = app.add_subcommand("run",
                                 "Run an ONNX or Core ML model or a kiln package on .npy inputs "
                                 "and write its outputs as .npy");
  cmd->add_option(
         "model", o->model,
         "ONNX model (.onnx), Core ML model (.mlpackage, .mlmodel) or kiln package (.kiln)")
      ->required();
  cmd->add_option("--input,-i", o->inputs,
                  "NAME=FILE.npy: an input's value (its shape fixes an ONNX model's dim_params); "
                  "inputs not given are random");
  cmd->add_option("--shape", o->shapes,
                  "NAME=1,3,224,224: shape of an input (checked against its .npy; dim_params "
                  "default to 1). ONNX only: a package's shapes are fixed");
  cmd->add_option("--value", o->values, std::string(kValueHelp) + ". ONNX only");
  cmd->add_option("--output-dir,-o", o->output_dir,
                  "Directory the outputs are written to (NAME.npy)")
      ->capture_default_str();
  cmd->add_option("--device", o->device,
                  "cpu, cuda or cuda:N (default: KILN_DEVICE or the first GPU)");
  cmd->add_option("--seed", o->seed, "Seed of the random inputs")->capture_default_str();
  add_package_flags(cmd, o->package);
  cmd->callback([o] { run_model(*o); });
}

}  // namespace kiln::cli
