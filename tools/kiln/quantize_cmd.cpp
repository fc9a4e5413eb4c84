// `kiln quantize`: post-training quantization (include/kiln/quantize.h) of an ONNX model or a
// kiln package, calibrated on a directory of .npy batches; with -o writes a package whose
// weights are int8, compiled for the CPU.
//
// Calibration directory: for a model with one input, one .npy file per batch (in name order),
// directly in the directory or in a subdirectory named after the input; for several inputs, one
// subdirectory per input (named after it, characters other than [A-Za-z0-9._-] as '_'), each
// holding the same number of .npy files, batch k being the k-th file of each in name order.
#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <memory>

#include "kiln/quantize.h"
#include "tools/kiln/commands.h"
#include "tools/kiln/model_args.h"

namespace kiln::cli {

namespace {
namespace fs = std::filesystem;

struct QuantizeCmdOptions {
  std::string model;
  std::string calibrate;
  std::string method = "minmax";
  double percentile = 99.99;
  bool per_tensor = false;
  bool per_channel = false;
  std::string activations = "u8";
  std::vector<std::string> exclude;
  bool quantize_outputs = false;
  bool f32_output_weights = false;
  std::vector<std::string> shapes;
  std::vector<std::string> values;
  std::string device;
  std::string output;
  bool verbose = false;
};

struct InputSpec {
  std::string name;
  Shape shape;  // -1: any
  DType dtype = f32;
};

std::vector<fs::path> npy_files(const fs::path& dir) {
  std::vector<fs::path> r;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file() && e.path().extension() == ".npy") r.push_back(e.path());
  std::sort(r.begin(), r.end());
  return r;
}

Array load_batch(const fs::path& file, const InputSpec& in, const Shape* first) {
  Array a = Array::load_npy(file.string());
  if (a.dtype() != in.dtype)
    throw DTypeError(fmt::format("[quantize] --calibrate: {} has dtype {}, input '{}' takes {}",
                                 file.string(), name(a.dtype()), in.name, name(in.dtype)));
  bool fits = a.shape().size() == in.shape.size();
  for (size_t d = 0; fits && d < in.shape.size(); ++d)
    fits = in.shape[d] < 0 || in.shape[d] == a.shape()[d];
  if (!fits)
    throw ShapeError(fmt::format("[quantize] --calibrate: {} has shape {}, input '{}' takes {}",
                                 file.string(), to_string(a.shape()), in.name,
                                 to_string(in.shape)));
  if (first && a.shape() != *first)
    throw ShapeError(fmt::format(
        "[quantize] --calibrate: {} has shape {}, the first batch of input '{}' {}: every batch "
        "of an input must have one shape",
        file.string(), to_string(a.shape()), in.name, to_string(*first)));
  return a;
}

std::vector<std::map<std::string, Array>> load_calibration(const std::string& dir,
                                                           const std::vector<InputSpec>& inputs) {
  std::error_code ec;
  if (!fs::exists(dir, ec))
    throw IoError(fmt::format("[quantize] --calibrate: '{}' does not exist", dir));
  if (!fs::is_directory(dir, ec))
    throw IoError(fmt::format("[quantize] --calibrate: '{}' is not a directory", dir));
  const std::vector<fs::path> loose = npy_files(dir);
  std::vector<std::vector<fs::path>> files;  // per input
  for (const InputSpec& in : inputs) {
    const fs::path sub = fs::path(dir) / safe_file_name(in.name);
    if (fs::is_directory(sub, ec)) {
      files.push_back(npy_files(sub));
      if (files.back().empty())
        throw IoError(fmt::format("[quantize] --calibrate: {} holds no .npy files for input '{}'",
                                  sub.string(), in.name));
    } else if (inputs.size() == 1 && !loose.empty()) {
      files.push_back(loose);
    } else if (inputs.size() == 1) {
      throw IoError(fmt::format(
          "[quantize] --calibrate: '{}' holds no .npy files (one file per batch of input '{}', "
          "or a subdirectory '{}' of them)",
          dir, in.name, safe_file_name(in.name)));
    } else {
      std::string names;
      for (const auto& i : inputs) names += (names.empty() ? "" : ", ") + i.name;
      throw IoError(fmt::format(
          "[quantize] --calibrate: '{}' has no subdirectory '{}' for input '{}': a model with "
          "several inputs ({}) takes one subdirectory per input, each with one .npy file per batch",
          dir, safe_file_name(in.name), in.name, names));
    }
  }
  for (size_t i = 1; i < files.size(); ++i)
    if (files[i].size() != files[0].size())
      throw ValueError(fmt::format(
          "[quantize] --calibrate: input '{}' has {} batches and input '{}' {}: every input needs "
          "one file per batch",
          inputs[0].name, files[0].size(), inputs[i].name, files[i].size()));
  std::vector<std::map<std::string, Array>> batches(files.empty() ? 0 : files[0].size());
  for (size_t i = 0; i < inputs.size(); ++i)
    for (size_t b = 0; b < files[i].size(); ++b) {
      const Shape* first = b == 0 ? nullptr : &batches[0].at(inputs[i].name).shape();
      batches[b][inputs[i].name] = load_batch(files[i][b], inputs[i], first);
    }
  return batches;
}

std::string mib(uintmax_t bytes) {
  return fmt::format("{:.2f} MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
}

// Cosine similarity and largest difference of two float outputs.
std::pair<double, double> compare(const Array& a, const Array& b) {
  const auto x = a.to(Device::cpu()).astype(f64).to_vector<double>();
  const auto y = b.to(Device::cpu()).astype(f64).to_vector<double>();
  double dot = 0, nx = 0, ny = 0, diff = 0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
    dot += x[i] * y[i], nx += x[i] * x[i], ny += y[i] * y[i];
    diff = std::max(diff, std::fabs(x[i] - y[i]));
  }
  return {nx > 0 && ny > 0 ? dot / std::sqrt(nx * ny) : (nx == ny ? 1.0 : 0.0), diff};
}

int steps_of(const Executable& exe, const std::string& op) {
  int n = 0;
  for (const auto& s : exe.placement()) n += s.op == op;
  return n;
}

void quantize_model(const QuantizeCmdOptions& o) {
  if (o.per_channel && o.per_tensor)
    throw ValueError("[quantize] --per-channel and --per-tensor exclude each other");
  if (o.method != "minmax" && o.method != "percentile" && o.method != "entropy")
    throw ValueError(
        fmt::format("[quantize] --method takes minmax, percentile or entropy, not '{}'", o.method));
  PtqOptions po;
  po.method = parse_calibration_method(o.method);
  po.percentile = o.percentile;
  po.per_channel = !o.per_tensor;
  if (o.activations != "u8" && o.activations != "i8")
    throw ValueError(
        fmt::format("[quantize] --activations takes u8 or i8, not '{}'", o.activations));
  po.activation_dtype = o.activations == "u8" ? u8 : i8;
  po.exclude = o.exclude;
  po.quantize_outputs = o.quantize_outputs;
  po.int8_weights_for_outputs = !o.f32_output_weights;
  po.device = pick_device(o.device);
  // refused before any work, even when nothing is left to calibrate on it
  if (po.device->kind == Device::Kind::cuda && po.device->index >= cuda_device_count())
    throw UnsupportedError(fmt::format("[quantize] --device {} is not available: {} CUDA devices",
                                       po.device->str(), cuda_device_count()));

  const bool package = is_package(o.model, "quantize");
  std::optional<onnx::Model> model;
  Executable source;
  std::vector<InputSpec> inputs;
  std::vector<std::string> output_names;
  std::map<std::string, Shape> package_shapes;
  if (package) {
    if (!o.shapes.empty() || !o.values.empty())
      throw ValueError(
          fmt::format("[quantize] --shape and --value are for ONNX models: '{}' is a "
                      "kiln package, whose shapes were fixed when it was compiled",
                      o.model));
    source = Executable::load(o.model, Device::cpu());
    for (const auto& in : source.inputs()) inputs.push_back({in.name, in.shape, in.dtype});
    for (const auto& out : package_outputs(source)) output_names.push_back(out.name);
  } else {
    // --shape is the package's shape: calibration batches keep theirs, unless the model imports
    // only with its shapes fixed
    const std::map<std::string, Shape> given = parse_shapes(o.shapes);
    const std::map<std::string, Array> values = load_inputs(o.values, "--value");
    try {
      model = import_model(o.model, {}, values, -1);
    } catch (const ShapeError& e) {
      if (given.empty())
        throw ShapeError(fmt::format("{} (fix the input shapes with --shape NAME=dims)", e.what()));
      model = import_model(o.model, given, values, -1);
    }
    std::vector<std::string> named;
    for (const auto& [n, s] : given) named.push_back(n);
    check_input_names(*model, named, "--shape");
    for (const auto& in : model->inputs) inputs.push_back({in.name, in.shape, in.dtype});
    for (const auto& out : model->outputs) output_names.push_back(out.name);
    package_shapes = concrete_shapes(*model, given);
  }
  if (o.calibrate.empty()) throw ValueError("[quantize] --calibrate DIR is required");
  const auto batches = load_calibration(o.calibrate, inputs);
  fmt::print("{} {}: {} input{}; calibration: {} batches from {}\n",
             package ? "package" : "ONNX model", o.model, inputs.size(),
             inputs.size() == 1 ? "" : "s", batches.size(), o.calibrate);
  for (const auto& in : inputs)
    fmt::print("  input {:<20} {:<5} {}\n", in.name, name(in.dtype),
               to_string(batches.at(0).at(in.name).shape()));

  QuantizedGraph q;
  if (package) {
    q = post_training_quantize(source, batches, po);
  } else {
    std::vector<Feeds> feeds;
    for (const auto& b : batches) feeds.push_back(model->feeds(b));
    q = post_training_quantize(model->graph, model->output_tensors(), feeds, po);
  }
  const PtqReport& r = q.report;
  if (o.verbose) {
    fmt::print("{}", r.str());
  } else {
    fmt::print("ops: {} quantized, {} kept float\n", r.quantized(), r.skipped());
    for (const auto& op : r.ops)
      if (!op.quantized)
        fmt::print("  {:<8} {:<32} float: {}\n", op.op, op.name, op.skipped_reason);
    fmt::print(
        "activations: {} calibrated ({}, {}{})\n", r.activations.size(),
        calibration_method_name(po.method), name(po.activation_dtype),
        po.method == CalibrationMethod::percentile ? fmt::format(", p {}", po.percentile) : "");
  }

  FeedShapes shapes;
  for (const Tensor& in : q.inputs) {
    auto it = package_shapes.find(in.name());
    if (it != package_shapes.end()) shapes.emplace_back(in, it->second);
  }
  const Executable exe = q.graph.compile(Device::cpu(), shapes, q.outputs);
  fmt::print("int8 kernels: {} quantized_conv, {} quantized_matmul (weights per {})\n",
             steps_of(exe, "quantized_conv"), steps_of(exe, "quantized_matmul"),
             po.per_channel ? "channel" : "tensor");

  // float against int8 on the first batch, when the package takes its shapes
  std::map<std::string, Array> first;
  for (const auto& in : exe.inputs())
    if (batches[0].count(in.name) && batches[0].at(in.name).shape() == in.shape)
      first[in.name] = batches[0].at(in.name);
  if (first.size() == exe.inputs().size()) {
    const std::vector<Array> qy = exe.run(first);
    const std::vector<Array> fy = package ? source.run(first) : [&] {
      FeedShapes fs;
      for (const auto& in : model->inputs) fs.emplace_back(in.tensor, first.at(in.name).shape());
      return model->graph.compile(Device::cpu(), fs, model->output_tensors())
          .run(model->feeds(first));
    }();
    for (size_t i = 0; i < qy.size() && i < fy.size(); ++i) {
      if (!is_floating(fy[i].dtype())) continue;
      const auto [cos, diff] = compare(fy[i], qy[i]);
      fmt::print("output {}: cosine {:.5f} to the float model, max |difference| {:.4g} (batch 0)\n",
                 i < output_names.size() ? output_names[i] : std::to_string(i), cos, diff);
    }
  }

  if (o.output.empty()) return;
  PackageOptions pk;
  pk.producer = "kiln quantize";
  pk.source_hash = file_hash(o.model);
  pk.output_names = output_names;
  exe.save(o.output, pk);
  uintmax_t f32_bytes = 0;
  if (package) {
    f32_bytes = fs::file_size(o.model);
  } else {  // the float model as kiln convert would write it
    const fs::path tmp = fs::path(o.output).string() + ".f32.tmp";
    FeedShapes fs32 = model->feed_shapes(package_shapes);
    model->graph.compile(Device::cpu(), fs32, model->output_tensors()).save(tmp.string(), pk);
    f32_bytes = fs::file_size(tmp);
    fs::remove(tmp);
  }
  const uintmax_t bytes = fs::file_size(o.output);
  fmt::print("package size: {} as f32, {} quantized ({:.2f}x)\n", mib(f32_bytes), mib(bytes),
             static_cast<double>(bytes) / static_cast<double>(std::max<uintmax_t>(f32_bytes, 1)));
  fmt::print("wrote {}\n", o.output);
}
}  // namespace

void add_quantize_command(CLI::App& app) {
  auto o = std::make_shared<QuantizeCmdOptions>();
  auto* cmd = app.add_subcommand(
      "quantize",
      "Post-training int8 quantization of an ONNX model or a kiln package, calibrated "
      "on .npy batches");
  cmd->add_option("model", o->model, "ONNX model or kiln package")->required();
  cmd->add_option("--calibrate", o->calibrate,
                  "Directory of .npy batches: one file per batch (one input), or one "
                  "subdirectory per input named after it")
      ->required();
  cmd->add_option("--method", o->method, "Calibration: minmax, percentile or entropy")
      ->capture_default_str();
  cmd->add_option("--percentile", o->percentile, "The percentile --method percentile keeps")
      ->capture_default_str();
  cmd->add_flag("--per-channel", o->per_channel, "One weight scale per output channel (default)");
  cmd->add_flag("--per-tensor", o->per_tensor, "One weight scale per weight tensor");
  cmd->add_option("--activations", o->activations,
                  "u8 (asymmetric, with a zero point) or i8 (symmetric)")
      ->capture_default_str();
  cmd->add_option("--exclude", o->exclude,
                  "Node name or op (conv2d, matmul, linear) to keep float");
  cmd->add_flag("--quantize-outputs", o->quantize_outputs,
                "Also quantize the ops whose results are model outputs (the logits layer stays "
                "float without)");
  cmd->add_flag("--f32-output-weights", o->f32_output_weights,
                "Keep the weights of those float output ops f32 (default: stored as int8, "
                "dequantized when run)");
  cmd->add_option("--shape", o->shapes,
                  "NAME=1,3,224,224: the package's input shape (ONNX; dims nothing fixes are 1)");
  cmd->add_option("--value", o->values, kValueHelp);
  cmd->add_option("--device", o->device,
                  "Device calibration runs on (default: the first GPU, else cpu)");
  cmd->add_option("-o,--output", o->output, "Package (.kiln) to write, compiled for the CPU");
  cmd->add_flag("-v,--verbose", o->verbose, "Print every op and activation range");
  cmd->callback([o] { quantize_model(*o); });
}

}  // namespace kiln::cli
