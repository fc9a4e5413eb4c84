// `kiln inspect`: an ONNX model's inputs, outputs, opset, ops and parameters, and where its
// kernels run once compiled for a device.
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
};

void inspect_model(const InspectOptions& o) {
  const std::map<std::string, Shape> shapes = parse_shapes(o.shapes);
  const onnx::Model model = import_model(o.model, shapes, load_inputs(o.values, "--value"), 1);
  print_model_summary(model);
  const Device device = pick_device(o.device);
  const Executable exe = model.graph.compile(
      device, model.feed_shapes(concrete_shapes(model, shapes)), model.output_tensors());
  print_placement(exe);
  fmt::print("intermediate memory: {:.2f} MiB\n",
             static_cast<double>(exe.peak_intermediate_bytes()) / (1024.0 * 1024.0));
}
}  // namespace

void add_inspect_command(CLI::App& app) {
  auto o = std::make_shared<InspectOptions>();
  auto* cmd =
      app.add_subcommand("inspect", "Show an ONNX model's inputs, outputs, ops and placement");
  cmd->add_option("model", o->model, "ONNX model file")->required();
  cmd->add_option("--shape", o->shapes,
                  "NAME=1,3,224,224: shape of an input (dim_params default to 1)");
  cmd->add_option("--value", o->values, kValueHelp);
  cmd->add_option("--device", o->device,
                  "cpu, cuda or cuda:N to compile for (default: KILN_DEVICE or the first GPU)");
  cmd->callback([o] { inspect_model(*o); });
}

}  // namespace kiln::cli
