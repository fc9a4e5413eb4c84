// Helpers of the model commands (see model_args.h).
#include "tools/kiln/model_args.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
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
  // every product of dims must fit in an int64 with room for the bytes of an element (a larger
  // shape could never be allocated, and its element count would overflow)
  constexpr uint64_t kMaxElements = uint64_t{1} << 58;
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (d == 0) continue;
    if (static_cast<uint64_t>(d) > kMaxElements / n)
      throw ValueError(fmt::format("[{}] dims '{}' make more than 2^58 elements", option, dims));
    n *= static_cast<uint64_t>(d);
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

void check_input_names(const std::vector<std::string>& inputs,
                       const std::vector<std::string>& names, const std::string& option) {
  for (const std::string& n : names) {
    if (std::find(inputs.begin(), inputs.end(), n) != inputs.end()) continue;
    std::string known;
    for (const auto& in : inputs) known += (known.empty() ? "" : ", ") + in;
    throw ValueError(fmt::format("[{}] the model has no input '{}' (inputs: {})", option, n,
                                 known.empty() ? "none" : known));
  }
}

void check_input_names(const onnx::Model& model, const std::vector<std::string>& names,
                       const std::string& option) {
  std::vector<std::string> inputs;
  for (const auto& in : model.inputs) inputs.push_back(in.name);
  check_input_names(inputs, names, option);
}

namespace {
// A Core ML model as the commands take an imported model (inputs, outputs, op histogram); its
// kind and opset go in `producer`.
onnx::Model from_coreml(coreml::Model&& m) {
  onnx::Model r;
  r.graph = std::move(m.graph);
  auto infos = [](const std::vector<coreml::ValueInfo>& vs) {
    std::vector<onnx::ValueInfo> out;
    for (const auto& v : vs) {
      onnx::ValueInfo o;
      o.name = v.name;
      o.tensor = v.tensor;
      o.dtype = v.dtype;
      o.shape = v.shape;
      o.dim_params.assign(v.shape.size(), "");
      out.push_back(std::move(o));
    }
    return out;
  };
  r.inputs = infos(m.inputs);
  r.outputs = infos(m.outputs);
  for (size_t k = 0; k < r.outputs.size(); ++k)
    r.graph_outputs.push_back({r.outputs[k].name, false, false, r.outputs[k].dtype, k, 1});
  r.producer = fmt::format("Core ML {} (specification {}{}{})", m.kind, m.spec_version,
                           m.opset.empty() ? "" : ", opset ", m.opset);
  r.parameter_count = m.parameter_count;
  r.parameter_bytes = m.parameter_bytes;
  r.op_histogram = std::move(m.op_histogram);
  return r;
}
}  // namespace

onnx::Model import_model(const std::string& path, const std::map<std::string, Shape>& shapes,
                         const std::map<std::string, Array>& values, int64_t default_dim) {
  if (is_coreml(path)) {
    if (!values.empty())
      throw ValueError(
          fmt::format("--value '{}': a Core ML model takes no input values while "
                      "importing (that is for ONNX models)",
                      values.begin()->first));
    coreml::ImportOptions options;
    options.input_shapes = shapes;
    return from_coreml(coreml::import(path, options));
  }
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

std::vector<std::string> dim_names(const Executable::IoInfo& in) {
  std::vector<std::string> r(in.shape.size());
  for (const DimSpec& d : in.dims) r[d.axis] = d.name;
  return r;
}

std::string describe_shape(const Shape& shape, const std::vector<std::string>& dim_params) {
  std::string r = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) r += ", ";
    const std::string dim = shape[i] < 0 ? "?" : std::to_string(shape[i]);
    if (i < dim_params.size() && !dim_params[i].empty()) r += dim_params[i] + "=" + dim;
    else r += dim;
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

bool is_coreml(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const std::string ext = fs::path(path).extension().string();
  if (ext == ".mlpackage" || ext == ".mlmodel") return true;
  return fs::is_directory(path, ec) && fs::exists(fs::path(path) / "Manifest.json", ec);
}

bool is_package(const std::string& path, const std::string& command) {
  std::error_code ec;
  if (is_coreml(path)) return false;
  if (std::filesystem::is_directory(path, ec))
    throw IoError(fmt::format("[{}] '{}' is a directory, not a model file", command, path));
  std::ifstream f(path, std::ios::binary);
  if (!f)
    throw IoError(fmt::format("[{}] cannot open '{}': {}", command, path, std::strerror(errno)));
  char head[8] = {};
  f.read(head, sizeof head);
  // a package cut short inside its magic counts too: the reader then says it is truncated
  if (is_package_magic(head, static_cast<size_t>(f.gcount()))) return true;
  return std::filesystem::path(path).extension() == ".kiln";
}

void add_package_flags(CLI::App* cmd, PackageFlags& flags) {
  cmd->add_flag("--strict", flags.strict,
                "Package only: fail when it was compiled for another kind of device instead of "
                "placing and planning it again");
  cmd->add_flag("--no-verify-weights", flags.no_verify_weights,
                "Package only: skip the checksums of constants and variables (faster load; the "
                "manifest is always checked)");
}

std::vector<Executable::IoInfo> package_outputs(const Executable& exe) {
  std::vector<Executable::IoInfo> r = exe.outputs();
  for (size_t i = 0; i < r.size(); ++i)
    if (r[i].name.empty()) r[i].name = fmt::format("output{}", i);
  return r;
}

namespace {
double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// "5,4" (as --shape takes it; "scalar" for a 0-d shape).
std::string dims_arg(const Shape& s) {
  std::string r;
  for (int64_t d : s) r += (r.empty() ? "" : ",") + std::to_string(d);
  return r.empty() ? "scalar" : r;
}

// A dynamic package's inputs take concrete shapes for this command: those of --input arrays and
// --shape, then dims that share a name with a given dim, then 1 (or the range's minimum). The
// executable checks the constraints when it runs.
void choose_dynamic_shapes(PreparedModel& m, const ModelArgs& a, const std::string& path) {
  std::map<std::string, std::pair<Shape, const char*>> given;
  for (const auto& [n, s] : a.shapes) given[n] = {s, "--shape"};
  for (const auto& [n, arr] : a.inputs) given[n] = {arr.shape(), "--input"};
  std::vector<std::string> names;
  for (const auto& in : m.inputs) names.push_back(in.name);
  std::map<std::string, int64_t> named;
  for (auto& in : m.inputs) {
    auto it = given.find(in.name);
    if (it == given.end()) continue;
    const auto& [s, option] = it->second;
    bool fits = s.size() == in.shape.size();
    for (size_t d = 0; fits && d < s.size(); ++d) fits = in.shape[d] < 0 || in.shape[d] == s[d];
    if (!fits)
      throw ShapeError(fmt::format("[{}] {} {}: shape {} does not fit the input {} of '{}'",
                                   a.command, option, in.name, to_string(s),
                                   describe_shape(in.shape, dim_names(in)), path));
    for (const DimSpec& d : in.dims)
      if (!d.name.empty()) named.emplace(d.name, s[d.axis]);
    in.shape = s;
  }
  for (const auto& [n, g] : given) check_input_names(names, {n}, g.second);
  for (auto& in : m.inputs) {
    if (given.count(in.name)) continue;
    for (const DimSpec& d : in.dims)
      if (in.shape[d.axis] < 0)
        in.shape[d.axis] = named.count(d.name) ? named[d.name] : std::max<int64_t>(1, d.min);
    for (int64_t& d : in.shape) d = d < 0 ? 1 : d;
  }
}

PreparedModel load_package(const std::string& path, const ModelArgs& a, Device device) {
  const std::string& cmd = a.command;
  if (!a.values.empty())
    throw ValueError(fmt::format(
        "[{}] --value is for ONNX models: '{}' is a kiln package, whose input values and shapes "
        "were fixed when it was compiled",
        cmd, path));
  LoadOptions lo;
  lo.strict = a.package.strict;
  lo.verify_weights = !a.package.no_verify_weights;
  PreparedModel m;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    m.exe = Executable::load(path, device, lo);
  } catch (const UnsupportedError& e) {
    std::string msg = e.what();
    const std::string api = "LoadOptions::strict";
    if (const size_t at = msg.find(api); at != std::string::npos)
      msg.replace(at, api.size(), "--strict");
    throw UnsupportedError(msg);
  }
  m.prepare_ms = ms_since(t0);
  m.inputs = m.exe.inputs();
  m.outputs = package_outputs(m.exe);
  if (m.exe.is_dynamic()) {
    choose_dynamic_shapes(m, a, path);
    for (const auto& [n, arr] : a.inputs)
      for (const auto& in : m.inputs)
        if (in.name == n && arr.dtype() != in.dtype)
          throw DTypeError(
              fmt::format("[{}] --input {}: the array has dtype {}, the package input {}",
                          a.command, n, name(arr.dtype()), name(in.dtype)));
    return m;
  }
  std::vector<std::string> names;
  for (const auto& in : m.inputs) names.push_back(in.name);
  auto compiled = [&](const std::string& n, const char* option) -> const Executable::IoInfo& {
    check_input_names(names, {n}, option);
    return *std::find_if(m.inputs.begin(), m.inputs.end(),
                         [&](const auto& i) { return i.name == n; });
  };
  for (const auto& [n, s] : a.shapes) {
    if (a.inputs.count(n)) continue;  // the array's shape, checked below
    const Executable::IoInfo& in = compiled(n, "--shape");
    if (s != in.shape)
      throw ValueError(fmt::format(
          "[{}] --shape {}={}: '{}' is a kiln package compiled for {} {}; a package's shapes are "
          "fixed when it is compiled (kiln convert --shape {}={})",
          cmd, n, dims_arg(s), path, n, to_string(in.shape), n, dims_arg(s)));
  }
  for (const auto& [n, arr] : a.inputs) {
    const Executable::IoInfo& in = compiled(n, "--input");
    if (arr.shape() != in.shape)
      throw ShapeError(fmt::format(
          "[{}] --input {}: the array has shape {}, but '{}' is a kiln package compiled for {} {}; "
          "a package's shapes are fixed when it is compiled (kiln convert --shape {}={})",
          cmd, n, to_string(arr.shape()), path, n, to_string(in.shape), n, dims_arg(arr.shape())));
    if (arr.dtype() != in.dtype)
      throw DTypeError(fmt::format("[{}] --input {}: the array has dtype {}, the package input {}",
                                   cmd, n, name(arr.dtype()), name(in.dtype)));
  }
  return m;
}

PreparedModel import_and_compile(const std::string& path, const ModelArgs& a, Device device) {
  const std::string& cmd = a.command;
  if (a.package.strict || a.package.no_verify_weights)
    throw ValueError(fmt::format("[{}] {} is for kiln packages, and '{}' is an imported model", cmd,
                                 a.package.strict ? "--strict" : "--no-verify-weights", path));
  PreparedModel m;
  const auto t0 = std::chrono::steady_clock::now();
  // an --input array of an input whose value the import needs (a Reshape's shape taken as a
  // graph input) is that value, as --value would give it
  std::map<std::string, Array> values = a.values;
  std::map<std::string, Shape> shapes = a.shapes;
  for (;;) {
    try {
      for (const auto& [n, v] : values) shapes.erase(n);
      m.onnx = import_model(path, shapes, values, a.default_dim);
      m.coreml = is_coreml(path);
      break;
    } catch (const onnx::InputValuesNeeded& e) {
      bool added = false;
      for (const std::string& n : e.inputs)
        if (!values.count(n) && a.inputs.count(n)) added = values.emplace(n, a.inputs.at(n)).second;
      if (!added) throw;
    } catch (const FormatError& e) {
      const std::string msg = e.what();
      if (msg.find("not an ONNX model") == std::string::npos) throw;
      throw FormatError(fmt::format(
          "[{}] '{}' is neither a kiln package (it does not start with \"KILNPKG\") nor an ONNX "
          "model: {}",
          cmd, path, msg));
    }
  }
  const onnx::Model& model = *m.onnx;
  std::vector<std::string> given;
  for (const auto& [n, arr] : a.inputs)
    if (!values.count(n)) given.push_back(n);
  check_input_names(model, given, "--input");
  const std::map<std::string, Shape> concrete = concrete_shapes(model, shapes);
  m.exe = model.graph.compile(device, model.feed_shapes(concrete), model.output_tensors());
  m.prepare_ms = ms_since(t0);
  for (const auto& in : model.inputs) m.inputs.push_back({in.name, concrete.at(in.name), in.dtype});
  const auto outs = m.exe.outputs();
  for (size_t i = 0; i < model.outputs.size() && i < outs.size(); ++i)
    m.outputs.push_back({model.outputs[i].name, outs[i].shape, outs[i].dtype});
  return m;
}
}  // namespace

PreparedModel prepare_model(const std::string& path, const ModelArgs& args, Device device) {
  return is_package(path, args.command) ? load_package(path, args, device)
                                        : import_and_compile(path, args, device);
}

namespace {
// An imported model's feeds, checked by its importer's rules (and named in its messages: a Core
// ML model's errors say [coreml])
Feeds feeds_of(const PreparedModel& m, const std::map<std::string, Array>& by_name) {
  if (!m.coreml) return m.onnx->feeds(by_name);
  coreml::Model inputs;
  for (const auto& in : m.onnx->inputs) {
    coreml::ValueInfo v;
    v.name = in.name;
    v.tensor = in.tensor;
    v.dtype = in.dtype;
    v.shape = in.shape;
    inputs.inputs.push_back(std::move(v));
  }
  return inputs.feeds(by_name);
}
}  // namespace

std::vector<Array> PreparedModel::run(const std::map<std::string, Array>& by_name) const {
  return onnx ? exe.run(feeds_of(*this, by_name)) : exe.run(by_name);
}

std::function<std::vector<Array>()> PreparedModel::bind(
    const std::map<std::string, Array>& by_name) const {
  if (onnx) return [this, feeds = feeds_of(*this, by_name)] { return exe.run(feeds); };
  return [this, by_name] { return exe.run(by_name); };
}

std::map<std::string, Array> complete_inputs(const PreparedModel& model,
                                             const std::map<std::string, Array>& given,
                                             uint64_t seed) {
  std::map<std::string, Array> r = given;
  std::mt19937_64 rng(seed);
  // random values are drawn as doubles, then converted: both must fit in this machine's memory
  const uint64_t memory = static_cast<uint64_t>(::sysconf(_SC_PHYS_PAGES)) *
                          static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  for (const auto& in : model.inputs) {
    if (r.count(in.name)) continue;
    const auto n = static_cast<uint64_t>(numel(in.shape));
    if (n > memory / (sizeof(double) + size_of(in.dtype)))
      throw ValueError(fmt::format(
          "[random inputs] input '{}' is {} {}: its random values would not fit in this "
          "machine's {} bytes of memory (give it with --input NAME=FILE.npy)",
          in.name, name(in.dtype), to_string(in.shape), memory));
    r[in.name] = random_array(in.shape, in.dtype, rng);
  }
  return r;
}

void print_inputs(const PreparedModel& model, const std::map<std::string, Array>& given) {
  for (const auto& in : model.inputs)
    fmt::print("  input {:<20} {:<5} {}{}\n", in.name, name(in.dtype), to_string(in.shape),
               given.count(in.name) ? " (given)" : " (random)");
}

void print_model_summary(const onnx::Model& model) {
  if (model.opset == 0 && model.ir_version == 0)  // (a Core ML model: from_coreml)
    fmt::print("{}\n", model.producer);
  else
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

namespace {
std::string bytes_str(uint64_t bytes) {
  if (bytes < 1024) return fmt::format("{} bytes", bytes);
  if (bytes < 1024 * 1024) return fmt::format("{:.1f} KiB", static_cast<double>(bytes) / 1024.0);
  return fmt::format("{:.2f} MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
}

}  // namespace

void print_package_summary(const Executable& exe) {
  const PackageInfo* p = exe.package_info();
  if (!p) throw ValueError("[inspect] the executable was not loaded from a package");
  fmt::print("kiln package {}: format version {}, written by kiln {}\n", p->path, p->format_version,
             p->kiln_version.empty() ? "(unknown)" : p->kiln_version);
  fmt::print("producer {}, source hash {}\n", p->producer.empty() ? "(none)" : p->producer,
             p->source_hash.empty() ? "(none)" : p->source_hash);
  if (p->replanned)
    fmt::print("compiled for {}, loaded for {}: placed and planned again\n", p->compiled_for,
               exe.device().str());
  else
    fmt::print("compiled for {}, loaded for {} as compiled\n", p->compiled_for, exe.device().str());
  if (p->laid_out_weights > 0)
    fmt::print("laid-out weights: {} for {}, {}\n", p->laid_out_weights, p->laid_out_for,
               p->laid_out_taken == p->laid_out_weights
                   ? "taken by this load"
                   : "not this load's (its first run lays the weights out)");
  fmt::print("inputs:\n");
  for (const auto& in : exe.inputs()) {
    std::string ranges;
    for (const DimSpec& d : in.dims)
      if (d.min != 0 || d.max >= 0)
        ranges += fmt::format(" {}{} in [{}, {}]", d.name.empty() ? "dim " : "",
                              d.name.empty() ? std::to_string(d.axis) : d.name, d.min,
                              d.max < 0 ? "inf" : std::to_string(d.max));
    fmt::print("  {:<24} {:<5} {}{}\n", in.name, name(in.dtype),
               describe_shape(in.shape, dim_names(in)), ranges);
  }
  if (exe.is_dynamic())
    fmt::print("dynamic: each new set of input shapes compiles a specialization when it runs\n");
  fmt::print("outputs:\n");
  for (const auto& out : package_outputs(exe))
    fmt::print("  {:<24} {:<5} {}\n", out.name, name(out.dtype), to_string(out.shape));
  std::vector<std::pair<std::string, Array>> variables;
  uint64_t variable_bytes = 0;
  for (const std::string& v : exe.variable_names()) {
    variables.emplace_back(v, exe.read_variable(v));
    variable_bytes += variables.back().second.nbytes();
  }
  if (variables.empty()) fmt::print("variables: none\n");
  else fmt::print("variables: {} ({})\n", variables.size(), bytes_str(variable_bytes));
  for (const auto& [v, value] : variables)
    fmt::print("  {:<24} {:<5} {}\n", v, name(value.dtype()), to_string(value.shape()));
  std::map<std::string, std::map<std::string, int>> per_op;  // op -> backend -> kernels
  for (const auto& s : exe.placement()) per_op[s.op][s.backend]++;
  fmt::print("kernels per op:\n");
  for (const auto& [op, backends] : per_op) {
    std::string where;
    for (const auto& [b, n] : backends)
      where += fmt::format("{}{} on {}", where.empty() ? "" : ", ", n, b);
    fmt::print("  {:<24} {}\n", op, where);
  }

  fmt::print("file: {} bytes: data sections {}, manifest {}\n", p->file_bytes,
             bytes_str(p->data_bytes), bytes_str(p->manifest_bytes));
}

void print_placement(const Executable& exe) {
  if (exe.is_dynamic() && exe.num_steps() == 0) {  // nothing specialized yet
    fmt::print("{}: kernels are placed per set of input shapes when they first run\n",
               exe.device().str());
    return;
  }
  const auto steps = exe.placement();
  std::map<std::string, int> per_backend;
  for (const auto& s : steps) per_backend[s.backend]++;
  fmt::print("{} {}: {} kernels", exe.package_info() ? "planned for" : "compiled for",
             exe.device().str(), steps.size());
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

std::string file_hash(const std::string& path) {
  uint64_t h = 1469598103934665603ull;
  auto add = [&h](const char* p, size_t n) {
    for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<unsigned char>(p[i])) * 1099511628211ull;
  };
  auto add_file = [&](const std::string& file) {
    std::ifstream f(file, std::ios::binary);
    char buf[1 << 16];
    while (f.read(buf, sizeof buf) || f.gcount() > 0) add(buf, static_cast<size_t>(f.gcount()));
  };
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(path, ec)) {
    add_file(path);
  } else {  // a package directory (.mlpackage): its files' names and bytes in name order
    std::vector<fs::path> files;
    for (const auto& e : fs::recursive_directory_iterator(path, ec))
      if (e.is_regular_file()) files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (const auto& f : files) {
      const std::string rel = fs::relative(f, path).generic_string();
      add(rel.data(), rel.size() + 1);
      add_file(f.string());
    }
  }
  return fmt::format("fnv1a64:{:016x}", h);
}

}  // namespace kiln::cli
