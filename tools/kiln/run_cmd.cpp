// `kiln run`: imports an ONNX model, runs it once on the given .npy inputs and writes every
// output as OUTPUT_DIR/NAME.npy.
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
};

void run_model(const RunOptions& o) {
  std::map<std::string, Array> arrays = load_inputs(o.inputs);
  std::map<std::string, Shape> shapes = parse_shapes(o.shapes);
  for (const auto& [n, a] : arrays) shapes[n] = a.shape();
  const onnx::Model model = import_model(o.model, shapes, load_inputs(o.values, "--value"), -1);
  std::vector<std::string> names;
  for (const auto& [n, a] : arrays) names.push_back(n);
  check_input_names(model, names, "--input");
  for (const auto& in : model.inputs)
    if (!arrays.count(in.name))
      throw ValueError(fmt::format("[run] missing --input {}=FILE.npy ({} {})", in.name,
                                   name(in.dtype), describe_shape(in.shape, in.dim_params)));
  const Feeds feeds = model.feeds(arrays);

  const Device device = pick_device(o.device);
  const Executable exe = model.graph.compile(
      device, model.feed_shapes(concrete_shapes(model, shapes)), model.output_tensors());
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<Array> outputs = exe.run(feeds);
  for (Array& a : outputs) a = a.to(Device::cpu());
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();

  std::filesystem::create_directories(o.output_dir);
  std::set<std::string> used;
  for (size_t i = 0; i < outputs.size(); ++i) {
    const std::string& out_name = model.outputs[i].name;
    std::string file = safe_file_name(out_name);
    if (!used.insert(file).second) used.insert(file = fmt::format("{}_{}", file, i));
    const std::string path = (std::filesystem::path(o.output_dir) / (file + ".npy")).string();
    outputs[i].save_npy(path);
    fmt::print("{:<24} {:<5} {:<20} -> {}\n", out_name, name(outputs[i].dtype()),
               to_string(outputs[i].shape()), path);
  }
  fmt::print("ran on {} in {:.3f} ms\n", device.str(), ms);
}
}  // namespace

void add_run_command(CLI::App& app) {
  auto o = std::make_shared<RunOptions>();
  auto* cmd =
      app.add_subcommand("run", "Run an ONNX model on .npy inputs and write its outputs as .npy");
  cmd->add_option("model", o->model, "ONNX model file")->required();
  cmd->add_option("--input,-i", o->inputs,
                  "NAME=FILE.npy for every model input (its shape fixes dim_params)");
  cmd->add_option("--shape", o->shapes,
                  "NAME=1,3,224,224: shape of an input (checked against its .npy)");
  cmd->add_option("--value", o->values, kValueHelp);
  cmd->add_option("--output-dir,-o", o->output_dir,
                  "Directory the outputs are written to (NAME.npy)")
      ->capture_default_str();
  cmd->add_option("--device", o->device,
                  "cpu, cuda or cuda:N (default: KILN_DEVICE or the first GPU)");
  cmd->callback([o] { run_model(*o); });
}

}  // namespace kiln::cli
