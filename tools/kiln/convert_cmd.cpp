// `kiln convert`: imports an ONNX model and validates it by compiling it for the CPU. Writing a
// kiln package is not available yet, so -o fails after the report.
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
  const std::map<std::string, Shape> shapes = parse_shapes(o.shapes);
  const onnx::Model model = import_model(o.model, shapes, load_inputs(o.values, "--value"), 1);
  print_model_summary(model);
  const Executable exe = model.graph.compile(
      Device::cpu(), model.feed_shapes(concrete_shapes(model, shapes)), model.output_tensors());
  print_placement(exe);
  if (!o.output.empty())
    throw UnsupportedError(
        fmt::format("[convert] packages are not available yet; the model imported and validated, "
                    "{} was not written",
                    o.output));
  fmt::print("valid: the model imported and compiled for the CPU\n");
}
}  // namespace

void add_convert_command(CLI::App& app) {
  auto o = std::make_shared<ConvertOptions>();
  auto* cmd =
      app.add_subcommand("convert", "Import an ONNX model and validate it (packages: not yet)");
  cmd->add_option("model", o->model, "ONNX model file")->required();
  cmd->add_option("-o,--output", o->output, "Package to write (not available yet: exits non-zero)");
  cmd->add_option("--shape", o->shapes,
                  "NAME=1,3,224,224: shape of an input (dim_params default to 1)");
  cmd->add_option("--value", o->values, kValueHelp);
  cmd->callback([o] { convert_model(*o); });
}

}  // namespace kiln::cli
