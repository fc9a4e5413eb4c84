// `kiln convert`: imports an ONNX or Core ML model, validates it by compiling it for the CPU, and
// with -o writes the compiled executable as a kiln package (Executable::save). Dims that no --shape
// fixes stay dynamic in the package.
#include <fmt/format.h>

#include <memory>
#include <random>

#include "tools/kiln/commands.h"
#include "tools/kiln/model_args.h"

namespace kiln::cli {

namespace {
struct ConvertOptions {
  std::string model;
  std::string output;
  std::vector<std::string> shapes;
  std::vector<std::string> values;
  std::vector<std::string> inputs;
  bool warm_up = false;
};

// One run before saving, so that the package stores the weights the CPU's kernels lay out on a
// first run (docs/package-format.md, LAID OUT): on the --input arrays, random ones for the others.
void warm_up(const Executable& exe, const std::map<std::string, Array>& given) {
  if (exe.is_dynamic()) {
    fmt::print(
        "warm-up: skipped: a dynamic package lays its weights out per shape as it runs (fix "
        "every dynamic dim with --shape to store them)\n");
    return;
  }
  std::vector<std::string> names, given_names;
  for (const auto& in : exe.inputs()) names.push_back(in.name);
  for (const auto& [name, a] : given) given_names.push_back(name);
  check_input_names(names, given_names, "--input");
  std::mt19937_64 rng(0);
  std::map<std::string, Array> feeds = given;
  for (const auto& in : exe.inputs())
    if (!feeds.count(in.name)) feeds[in.name] = random_array(in.shape, in.dtype, rng);
  try {
    exe.run(feeds);
    fmt::print("warm-up: one run; the package stores the weights it laid out\n");
  } catch (const Error& e) {
    fmt::print("warm-up: the run failed, the package stores no laid-out weights: {}\n", e.what());
  }
}

void convert_model(const ConvertOptions& o) {
  if (is_package(o.model, "convert"))
    throw ValueError(
        fmt::format("[convert] '{}' is already a kiln package: convert takes an ONNX "
                    "or Core ML model (run, inspect and bench take the package itself)",
                    o.model));
  const std::map<std::string, Shape> shapes = parse_shapes(o.shapes);
  const auto values = load_inputs(o.values, "--value");
  // dim_params stay dynamic where the importer can keep them so, else they are 1
  const onnx::Model model = [&] {
    try {
      return import_model(o.model, shapes, values, -1);
    } catch (const UnsupportedError& e) {
      fmt::print("dims without --shape are 1: {}\n", e.what());
      return import_model(o.model, shapes, values, 1);
    }
  }();
  print_model_summary(model);
  // validated at the shapes given, dims left dynamic taken as 1
  const Executable check = model.graph.compile(
      Device::cpu(), model.feed_shapes(concrete_shapes(model, shapes)), model.output_tensors());
  print_placement(check);
  fmt::print("valid: the model imported and compiled for the CPU\n");
  // the package keeps the dims no --shape fixed dynamic: it runs any shape they allow
  const Executable exe =
      model.graph.compile(Device::cpu(), model.feed_shapes(shapes), model.output_tensors());
  if (exe.is_dynamic())
    fmt::print(
        "dynamic: dims without --shape stay dynamic; the package specializes itself for "
        "each set of input shapes it runs\n");
  if (o.output.empty()) return;
  if (o.warm_up) warm_up(exe, load_inputs(o.inputs, "--input"));
  PackageOptions po;
  po.producer = "kiln convert";
  po.source_hash = file_hash(o.model);
  po.laid_out_weights = o.warm_up;
  for (const auto& out : model.outputs) po.output_names.push_back(out.name);
  exe.save(o.output, po);
  fmt::print("wrote {}\n", o.output);
}
}  // namespace

void add_convert_command(CLI::App& app) {
  auto o = std::make_shared<ConvertOptions>();
  auto* cmd = app.add_subcommand(
      "convert", "Import an ONNX or Core ML model, validate it, and write a kiln package");
  cmd->add_option("model", o->model, "ONNX model file")->required();
  cmd->add_option("-o,--output", o->output, "Package (.kiln) to write, compiled for the CPU");
  cmd->add_option("--shape", o->shapes,
                  "NAME=1,3,224,224: shape of an input (without it, its dim_params stay dynamic)");
  cmd->add_option("--value", o->values, kValueHelp);
  cmd->add_flag("--warm-up", o->warm_up,
                "Run the package once before writing it, so that it stores the weights the CPU "
                "laid out for its kernels (a first run after loading then skips that)");
  cmd->add_option("--input", o->inputs,
                  "NAME=FILE.npy: an input for --warm-up's run (random values for the others)");
  cmd->callback([o] { convert_model(*o); });
}

}  // namespace kiln::cli
