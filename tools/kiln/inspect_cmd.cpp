// `kiln inspect`: an ONNX model's inputs, outputs, opset, ops and parameters, or a kiln package's
// metadata, inputs, outputs, variables and sizes; then where the kernels run on a device.
#include <fmt/format.h>

#include <memory>
#include <nlohmann/json.hpp>

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
  bool json = false;
  PackageFlags package;
};

using Json = nlohmann::ordered_json;

Json io_json(const std::string& name, DType dtype, const Shape& shape) {
  return {{"name", name}, {"dtype", kiln::name(dtype)}, {"shape", shape}};
}

// What the text report says, as one JSON object (docs/cli.md lists the keys).
Json inspect_json(const std::string& path, const PreparedModel& model) {
  Json j;
  j["path"] = path;
  Json inputs = Json::array(), outputs = Json::array();
  if (const onnx::Model* m = model.onnx ? &*model.onnx : nullptr) {
    j["format"] = is_coreml(path) ? "coreml" : "onnx";
    j["opset"] = m->opset;
    j["ir_version"] = m->ir_version;
    j["producer"] = m->producer;
    for (const auto& in : m->inputs) {
      inputs.push_back(io_json(in.name, in.dtype, in.shape));
      inputs.back()["dim_params"] = in.dim_params;
    }
    for (const auto& out : m->outputs) {
      outputs.push_back(io_json(out.name, out.dtype, out.shape));
      outputs.back()["dim_params"] = out.dim_params;
    }
    j["inputs"] = inputs;
    j["outputs"] = outputs;
    j["parameters"] = {{"count", m->parameter_count}, {"bytes", m->parameter_bytes}};
    j["op_histogram"] = m->op_histogram;
  } else {
    const PackageInfo& p = *model.exe.package_info();
    j["format"] = "kiln-package";
    j["format_version"] = p.format_version;
    j["kiln_version"] = p.kiln_version;
    j["producer"] = p.producer;
    j["source_hash"] = p.source_hash;
    j["compiled_for"] = p.compiled_for;
    j["replanned"] = p.replanned;
    j["laid_out_weights"] = {
        {"count", p.laid_out_weights}, {"taken", p.laid_out_taken}, {"for", p.laid_out_for}};
    for (const auto& in : model.inputs) inputs.push_back(io_json(in.name, in.dtype, in.shape));
    for (const auto& out : model.outputs)
      outputs.push_back(io_json(out.name, out.dtype, out.shape));
    j["inputs"] = inputs;
    j["outputs"] = outputs;
    j["variables"] = Json::array();
    for (const std::string& v : model.exe.variable_names()) {
      const Array value = model.exe.read_variable(v);
      j["variables"].push_back(io_json(v, value.dtype(), value.shape()));
      j["variables"].back()["bytes"] = value.nbytes();
    }
    j["sizes"] = {{"file", p.file_bytes}, {"data", p.data_bytes}, {"manifest", p.manifest_bytes}};
  }
  j["device"] = model.exe.device().str();
  std::map<std::string, int> per_backend;
  std::map<std::string, std::map<std::string, int>> per_op;
  Json fallbacks = Json::array();
  const auto steps = model.exe.placement();
  for (const auto& s : steps) {
    per_backend[s.backend]++;
    per_op[s.op][s.backend]++;
    if (!s.fallback_reason.empty())
      fallbacks.push_back({{"node", s.node}, {"op", s.op}, {"reason", s.fallback_reason}});
  }
  j["kernels"] = steps.size();
  j["kernels_per_backend"] = per_backend;
  j["kernels_per_op"] = per_op;
  j["cpu_fallbacks"] = fallbacks;
  j["intermediate_bytes"] = model.exe.peak_intermediate_bytes();
  return j;
}

void inspect_model(const InspectOptions& o) {
  ModelArgs args;
  args.command = "inspect";
  args.shapes = parse_shapes(o.shapes);
  args.values = load_inputs(o.values, "--value");
  args.package = o.package;
  const PreparedModel model = prepare_model(o.model, args, pick_device(o.device));
  if (o.json) {
    Json j = inspect_json(o.model, model);
    if (o.dump) j["program"] = model.exe.dump();
    fmt::print("{}\n", j.dump(2));
    return;
  }
  if (model.onnx) print_model_summary(*model.onnx);
  else print_package_summary(model.exe);
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
      "Show an ONNX or Core ML model's or a kiln package's inputs, outputs, ops, metadata and "
      "placement");
  cmd->add_option(
         "model", o->model,
         "ONNX model (.onnx), Core ML model (.mlpackage, .mlmodel) or kiln package (.kiln)")
      ->required();
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
  cmd->add_flag("--json", o->json, "Print the report as one JSON object");
  add_package_flags(cmd, o->package);
  cmd->callback([o] { inspect_model(*o); });
}

}  // namespace kiln::cli
