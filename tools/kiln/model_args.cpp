// Helpers of the model commands (see model_args.h).
#include "tools/kiln/model_args.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <set>

namespace kiln::cli {

std::pair<std::string, std::string> split_assignment(const std::string& arg,
                                                     const std::string& option) {
  const size_t eq = arg.rfind('=');
  if (eq == std::string::npos || eq == 0)
    throw ValueError(fmt::format("[{}] expected NAME=VALUE, got '{}'", option, arg));
  return {arg.substr(0, eq), arg.substr(eq + 1)};
}

Shape parse_dims(const std::string& dims, const std::string& option) {
  Shape shape;
  if (dims.empty() || dims == "scalar") return shape;
  size_t start = 0;
  while (start <= dims.size()) {
    size_t end = dims.find_first_of(",x", start);
    if (end == std::string::npos) end = dims.size();
    const std::string part = dims.substr(start, end - start);
    const bool digits =
        !part.empty() && part.size() < 19 &&
        std::all_of(part.begin(), part.end(), [](unsigned char c) { return std::isdigit(c); });
    if (!digits)
      throw ValueError(fmt::format(
          "[{}] bad dims '{}': expected non-negative integers like 1,3,224,224", option, dims));
    shape.push_back(std::stoll(part));
    start = end + 1;
  }
  return shape;
}

std::map<std::string, Shape> parse_shapes(const std::vector<std::string>& args) {
  std::map<std::string, Shape> shapes;
  for (const std::string& a : args) {
    auto [name, dims] = split_assignment(a, "--shape");
    shapes[name] = parse_dims(dims, "--shape");
  }
  return shapes;
}

std::map<std::string, Array> load_inputs(const std::vector<std::string>& args,
                                         const std::string& option) {
  std::map<std::string, Array> inputs;
  for (const std::string& a : args) {
    auto [name, file] = split_assignment(a, option);
    if (inputs.count(name)) throw ValueError(fmt::format("[{}] '{}' is given twice", option, name));
    inputs[name] = Array::load_npy(file);
  }
  return inputs;
}

void check_input_names(const onnx::Model& model, const std::vector<std::string>& names,
                       const std::string& option) {
  for (const std::string& n : names) {
    bool found = false;
    for (const auto& in : model.inputs) found = found || in.name == n;
    if (found) continue;
    std::string known;
    for (const auto& in : model.inputs) known += (known.empty() ? "" : ", ") + in.name;
    throw ValueError(
        fmt::format("[{}] the model has no input '{}' (inputs: {})", option, n, known));
  }
}

onnx::Model import_model(const std::string& path, const std::map<std::string, Shape>& shapes,
                         const std::map<std::string, Array>& values, int64_t default_dim) {
  onnx::ImportOptions options;
  options.input_shapes = shapes;
  options.input_values = values;
  options.default_dim = default_dim;
  onnx::Model model = onnx::import(path, options);
  std::vector<std::string> names;
  for (const auto& [n, s] : shapes) names.push_back(n);
  check_input_names(model, names, "--shape");
  return model;
}

std::map<std::string, Shape> concrete_shapes(const onnx::Model& model,
                                             const std::map<std::string, Shape>& given) {
  std::map<std::string, Shape> out;
  for (const auto& in : model.inputs) {
    auto it = given.find(in.name);
    Shape s = it != given.end() ? it->second : in.shape;
    for (int64_t& d : s) d = d < 0 ? 1 : d;
    out[in.name] = s;
  }
  return out;
}

std::string describe_shape(const Shape& shape, const std::vector<std::string>& dim_params) {
  std::string r = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) r += ", ";
    const std::string dim = shape[i] < 0 ? "?" : std::to_string(shape[i]);
    if (i < dim_params.size() && !dim_params[i].empty())
      r += dim_params[i] + "=" + dim;
    else
      r += dim;
  }
  return r + ")";
}

std::string safe_file_name(const std::string& name) {
  std::string r;
  for (unsigned char c : name)
    r += (std::isalnum(c) || c == '.' || c == '_' || c == '-') ? char(c) : '_';
  for (char& c : r) {  // no hidden files, no "." or ".."
    if (c != '.') break;
    c = '_';
  }
  return r.empty() ? "_" : r;
}

Array random_array(const Shape& shape, DType dtype, std::mt19937_64& rng) {
  std::vector<double> v(static_cast<size_t>(numel(shape)));
  if (dtype == boolean) {
    std::bernoulli_distribution d(0.5);
    for (double& x : v) x = d(rng) ? 1.0 : 0.0;
  } else if (is_integer(dtype)) {
    std::uniform_int_distribution<int> d(0, 3);
    for (double& x : v) x = d(rng);
  } else {
    std::uniform_real_distribution<double> d(-1.0, 1.0);
    for (double& x : v) x = d(rng);
  }
  return Array::from_vector(v, shape).astype(dtype);
}

Device pick_device(const std::string& device) {
  return device.empty() ? default_device() : Device::parse(device);
}

void print_model_summary(const onnx::Model& model) {
  fmt::print("opset {}, ir_version {}, producer {}\n", model.opset, model.ir_version,
             model.producer.empty() ? "(none)" : model.producer);
  fmt::print("inputs:\n");
  for (const auto& in : model.inputs)
    fmt::print("  {:<24} {:<5} {}\n", in.name, name(in.dtype),
               describe_shape(in.shape, in.dim_params));
  fmt::print("outputs:\n");
  for (const auto& out : model.outputs)
    fmt::print("  {:<24} {:<5} {}\n", out.name, name(out.dtype),
               describe_shape(out.shape, out.dim_params));
  int64_t nodes = 0;
  for (const auto& [op, n] : model.op_histogram) nodes += n;
  fmt::print("parameters: {} ({:.2f} MiB)\n", model.parameter_count,
             static_cast<double>(model.parameter_bytes) / (1024.0 * 1024.0));
  fmt::print("nodes: {} ({} op types)\n", nodes, model.op_histogram.size());
  std::vector<std::pair<std::string, int64_t>> ops(model.op_histogram.begin(),
                                                   model.op_histogram.end());
  std::stable_sort(ops.begin(), ops.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  for (const auto& [op, n] : ops) fmt::print("  {:<24} {}\n", op, n);
}

void print_placement(const Executable& exe) {
  const auto steps = exe.placement();
  std::map<std::string, int> per_backend;
  for (const auto& s : steps) per_backend[s.backend]++;
  fmt::print("compiled for {}: {} kernels", exe.device().str(), steps.size());
  for (const auto& [b, n] : per_backend) fmt::print(", {} on {}", n, b);
  fmt::print("\n");
  int fallbacks = 0;
  for (const auto& s : steps) {
    if (s.fallback_reason.empty()) continue;
    if (fallbacks++ == 0) fmt::print("CPU fallbacks:\n");
    fmt::print("  node {} {}: {}\n", s.node, s.op, s.fallback_reason);
  }
  if (fallbacks == 0) fmt::print("CPU fallbacks: none\n");
}

}  // namespace kiln::cli
