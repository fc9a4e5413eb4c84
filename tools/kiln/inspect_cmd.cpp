// `kiln inspect`: an ONNX model's inputs, outputs, opset, ops and parameters, or a kiln package's
// metadata, inputs, outputs, variables and sizes; then where the kernels run on a device.
#include <fmt/format.h>

#include <memory>

#include "tools/kiln/commands.h"
#include "tools/kiln/model_args.h"

namespace kiln::cli {

namespace {
struct InspectOptions {
  std::string model;
  std::vector<std::string> shapes;
  std::vector<std::string> values;
  std::string device;
  bool dump = false;
  PackageFlags package;
};

void inspect_model(const InspectOptions& o) {
  ModelArgs args;
  args.command = "inspect";
  args.shapes = parse_shapes(o.shapes);
  args.values = load_inputs(o.values, "--value");
  args.package = o.package;
  const PreparedModel model = prepare_model(o.model, args, pick_device(o.device));
  if (model.onnx)
    print_model_summary(*model.onnx);
  else
    print_package_summary(model.exe);
  print_placement(model.exe);
  fmt::print("intermediate memory: {:.2f} MiB\n",
             static_cast<double>(model.exe.peak_intermediate_bytes()) / (1024.0 * 1024.0));
  if (o.dump) fmt::print("program:\n{}", model.exe.dump());
}
}  // namespace

void add_inspect_command(CLI::App& app) {
  auto o = std::make_shared<InspectOptions>();
  auto* cmd = app.add_subcommand(
      "inspect",
      "Show an ONNX model's or a kiln package's inputs, outputs, ops, metadata and placement");
  cmd->add_option("model", o->model, "ONNX model (.onnx) or kiln package (.kiln)")->required();
  cmd->add_option("--shape", o->shapes,
                  "NAME=1,3,224,224: shape of an input (dim_params default to 1). ONNX only: a "
                  "package's shapes are fixed");
  cmd->add_option("--value", o->values, std::string(kValueHelp) + ". ONNX only");
  cmd->add_option("--device", o->device,
                  "cpu, cuda or cuda:N to compile (or load) for (default: KILN_DEVICE or the "
                  "first GPU)");
  cmd->add_flag("--dump", o->dump,
                "Also print the optimized program: every node with its backend, output dtypes "
                "and shapes, and memory plan");
  add_package_flags(cmd, o->package);
  cmd->callback([o] { inspect_model(*o); });
}

}  // namespace kiln::cli
