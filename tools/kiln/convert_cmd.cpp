// `kiln convert`: imports an ONNX model, validates it by compiling it for the CPU, and with -o
// writes the compiled executable as a kiln package (Executable::save).
#include <fmt/format.h>

#include <memory>

#include "tools/kiln/commands.h"
#include "tools/kiln/model_args.h"

namespace kiln::cli {

namespace {
struct ConvertOptions {
  std::string model;
  std::string output;
  std::vector<std::string> shapes;
  std::vector<std::string> values;
};

void convert_model(const ConvertOptions& o) {
  if (is_package(o.model, "convert"))
    throw ValueError(fmt::format("[convert] '{}' is already a kiln package: convert takes an ONNX "
                                 "model (run, inspect and bench take the package itself)",
                                 o.model));
  const std::map<std::string, Shape> shapes = parse_shapes(o.shapes);
  const onnx::Model model = import_model(o.model, shapes, load_inputs(o.values, "--value"), 1);
  print_model_summary(model);
  const Executable exe = model.graph.compile(
      Device::cpu(), model.feed_shapes(concrete_shapes(model, shapes)), model.output_tensors());
  print_placement(exe);
  fmt::print("valid: the model imported and compiled for the CPU\n");
  if (o.output.empty()) return;
  PackageOptions po;
  po.producer = "kiln convert";
  po.source_hash = file_hash(o.model);
  for (const auto& out : model.outputs) po.output_names.push_back(out.name);
  exe.save(o.output, po);
  fmt::print("wrote {}\n", o.output);
}
}  // namespace

void add_convert_command(CLI::App& app) {
  auto o = std::make_shared<ConvertOptions>();
  auto* cmd =
      app.add_subcommand("convert", "Import an ONNX model, validate it, and write a kiln package");
  cmd->add_option("model", o->model, "ONNX model file")->required();
  cmd->add_option("-o,--output", o->output, "Package (.kiln) to write, compiled for the CPU");
  cmd->add_option("--shape", o->shapes,
                  "NAME=1,3,224,224: shape of an input (dim_params default to 1)");
  cmd->add_option("--value", o->values, kValueHelp);
  cmd->callback([o] { convert_model(*o); });
}

}  // namespace kiln::cli
