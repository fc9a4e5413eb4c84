// Core ML import (include/kiln/coreml.h): the package and its specification, the ML Program's
// function mapped op by op through the op table (ops_*.cpp), inputs and outputs.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "io/coreml/mil.h"
#include "io/coreml/neural_network.h"
#include "io/file.h"
#include "io/model_feeds.h"
#include "kiln/coreml.h"
#include "kiln/ops/core.h"
#include "kiln/ops/elementwise.h"

namespace kiln::coreml {

namespace spec = ::CoreML::Specification;
using namespace detail;

namespace detail {

class Importer {
 public:
  Importer(Graph& g, Weights& w, Model& m) : g(g), weights(w), model(m) {}

  Graph& g;
  Weights& weights;
  Model& model;  // (its op histogram and parameter counts)
  std::map<std::string, Value> values;
  // outputs of ops that could not be mapped (their readers are skipped, not reported again)
  std::set<std::string> missing;

  Tensor tensor_of(Value& v, const std::string& name) {
    if (v.tensor) return *v.tensor;
    if (v.known) {
      v.tensor = constant(g, *v.known);
      return *v.tensor;
    }
    fail<UnsupportedError>("[coreml] value '{}' is a string, not a tensor", name);
  }
  Value& value(const std::string& name) {
    auto it = values.find(name);
    if (it == values.end())
      fail<FormatError>("[coreml] value '{}' is used before it is made", name);
    return it->second;
  }
  // An immediate argument's value, kept while its op maps.
  std::vector<std::unique_ptr<Value>> immediates;
  Value& immediate(const mil::Value& v, const std::string& where) {
    auto out = std::make_unique<Value>();
    if (v.has_immediatevalue() && v.immediatevalue().has_tensor() && v.type().has_tensortype() &&
        v.type().tensortype().datatype() == mil::STRING) {
      const auto& s = v.immediatevalue().tensor().strings().values();
      if (s.size() != 1) fail<UnsupportedError>("[coreml] {}: a list of strings", where);
      out->text = s[0];
    } else if (v.has_immediatevalue()) {
      if (!v.immediatevalue().has_tensor())
        fail<UnsupportedError>("[coreml] {}: only tensor values are supported", where);
      out->known = array_of(v.immediatevalue().tensor(), v.type(), where);
    } else if (v.has_blobfilevalue()) {
      const auto& t = v.type().tensortype();
      out->known = weights.read(v.blobfilevalue().filename(), v.blobfilevalue().offset(),
                                t.datatype(), shape_of(t, where));
    } else {
      fail<FormatError>("[coreml] {}: a value without data", where);
    }
    immediates.push_back(std::move(out));
    return *immediates.back();
  }

  /// Maps a block's operations in order (the function's block, or a nested one: see
  /// OpContext::block); fails with one UnsupportedError for every unmapped op type.
  void import_block(const mil::Block& block);
};

/// The names a nested block defines (its inputs and its operations' outputs) while it maps: on
/// leaving, each gets back the value it had around the block, or is forgotten. (A while_loop's
/// condition and body declare the same inputs; names made in a body are the body graph's.)
class BlockScope {
 public:
  BlockScope(Importer& imp, const mil::Block& block) : imp_(imp) {
    for (const auto& in : block.inputs()) define(in.name());
    for (const auto& op : block.operations())
      for (const auto& o : op.outputs()) define(o.name());
  }
  ~BlockScope() {
    for (auto& [name, before] : saved_) {
      if (before) imp_.values[name] = std::move(*before);
      else imp_.values.erase(name);
      imp_.missing.erase(name);
    }
  }
  BlockScope(const BlockScope&) = delete;
  BlockScope& operator=(const BlockScope&) = delete;

 private:
  void define(const std::string& name) {
    if (saved_.count(name)) return;
    auto it = imp_.values.find(name);
    saved_[name] = it == imp_.values.end() ? std::nullopt : std::optional<Value>(it->second);
  }
  Importer& imp_;
  std::map<std::string, std::optional<Value>> saved_;
};

}  // namespace detail

// ---- OpContext ----

Graph& OpContext::graph() { return imp_.g; }

std::string OpContext::where() const {
  return fmt::format("op '{}' (output '{}')", op_.type(),
                     op_.outputs_size() ? op_.outputs(0).name() : std::string("?"));
}

const mil::Argument* OpContext::arg(const std::string& name) const {
  auto it = op_.inputs().find(name);
  if (it == op_.inputs().end() || it->second.arguments_size() == 0) return nullptr;
  return &it->second;
}

// A parameter given as an attribute (the constexpr ops of iOS16 take theirs so), or null.
const mil::Value* OpContext::attr(const std::string& name) const {
  if (name == "name") return nullptr;
  auto it = op_.attributes().find(name);
  return it == op_.attributes().end() ? nullptr : &it->second;
}

bool OpContext::has(const std::string& name) const { return arg(name) || attr(name); }

const Value& OpContext::value(const std::string& name, int k) const {
  const mil::Argument* a = arg(name);
  if (!a && k == 0)
    if (const mil::Value* v = attr(name))
      return imp_.immediate(*v, where() + " parameter '" + name + "'");
  if (!a) fail("parameter '{}' is missing", name);
  if (k >= a->arguments_size()) fail("parameter '{}' has {} values", name, a->arguments_size());
  const auto& b = a->arguments(k);
  if (b.has_value()) return imp_.immediate(b.value(), where() + " parameter '" + name + "'");
  return imp_.value(b.name());
}

Tensor OpContext::in(const std::string& name) {
  const mil::Argument* a = arg(name);
  if (!a && attr(name)) {
    Value& v = imp_.immediate(*attr(name), where() + " parameter '" + name + "'");
    return imp_.tensor_of(v, name);
  }
  if (!a) fail("parameter '{}' is missing", name);
  if (a->arguments_size() != 1) fail("parameter '{}' takes one value", name);
  const auto& b = a->arguments(0);
  if (b.has_value()) {
    Value& v = imp_.immediate(b.value(), where() + " parameter '" + name + "'");
    return imp_.tensor_of(v, name);
  }
  return imp_.tensor_of(imp_.value(b.name()), b.name());
}

std::vector<Tensor> OpContext::ins(const std::string& name) {
  const mil::Argument* a = arg(name);
  if (!a) fail("parameter '{}' is missing", name);
  std::vector<Tensor> out;
  for (const auto& b : a->arguments()) {
    if (b.has_value()) {
      Value& v = imp_.immediate(b.value(), where() + " parameter '" + name + "'");
      out.push_back(imp_.tensor_of(v, name));
    } else {
      out.push_back(imp_.tensor_of(imp_.value(b.name()), b.name()));
    }
  }
  return out;
}

bool OpContext::is_known(const std::string& name) const {
  const mil::Argument* a = arg(name);
  if (!a) return attr(name) != nullptr;
  if (a->arguments_size() != 1) return false;
  const auto& b = a->arguments(0);
  if (b.has_value()) return true;
  auto it = imp_.values.find(b.name());
  return it != imp_.values.end() && (it->second.known || it->second.text);
}

Array OpContext::known(const std::string& name) {
  const Value& v = value(name);
  if (!v.known)
    kiln::fail<UnsupportedError>(
        "[coreml] {}: parameter '{}' must be known while importing (a const), and is computed "
        "by the program",
        where(), name);
  return *v.known;
}

int64_t OpContext::int_of(const std::string& name) {
  const Array a = known(name);
  if (a.numel() != 1) fail("parameter '{}' takes one value, got shape {}", name, str(a.shape()));
  return a.astype(i64).data<int64_t>()[0];
}
int64_t OpContext::int_of(const std::string& name, int64_t fallback) {
  return has(name) ? int_of(name) : fallback;
}
double OpContext::number(const std::string& name) {
  const Array a = known(name);
  if (a.numel() != 1) fail("parameter '{}' takes one value, got shape {}", name, str(a.shape()));
  return a.astype(f64).data<double>()[0];
}
double OpContext::number(const std::string& name, double fallback) {
  return has(name) ? number(name) : fallback;
}
bool OpContext::flag(const std::string& name, bool fallback) {
  return has(name) ? number(name) != 0 : fallback;
}
std::vector<int64_t> OpContext::ints(const std::string& name) {
  const Array a = known(name).astype(i64);
  const int64_t* p = a.data<int64_t>();
  return std::vector<int64_t>(p, p + a.numel());
}
std::vector<int64_t> OpContext::ints(const std::string& name,
                                     const std::vector<int64_t>& fallback) {
  return has(name) ? ints(name) : fallback;
}
std::string OpContext::text(const std::string& name) {
  const Value& v = value(name);
  if (!v.text) fail("parameter '{}' must be a string", name);
  return *v.text;
}
std::string OpContext::text(const std::string& name, const std::string& fallback) {
  return has(name) ? text(name) : fallback;
}

DType OpContext::out_dtype(int k) const {
  if (k >= op_.outputs_size()) fail("has no output {}", k);
  const auto& t = op_.outputs(k).type();
  if (!t.has_tensortype()) fail("output {} is not a tensor", k);
  return dtype_of(t.tensortype().datatype(), where());
}
Shape OpContext::out_shape(int k) const {
  if (k >= op_.outputs_size()) fail("has no output {}", k);
  const auto& t = op_.outputs(k).type();
  if (!t.has_tensortype()) fail("output {} is not a tensor", k);
  return shape_of(t.tensortype(), where());
}

void OpContext::set(int k, const Tensor& t) {
  if (k >= op_.outputs_size())
    fail("gives {} outputs, the program names {}", k + 1, op_.outputs_size());
  // the program's declared dtype wins where kiln's op gives another (an index op's i64 for the
  // program's i32)
  Tensor v = t;
  const auto& type = op_.outputs(k).type();
  if (type.has_tensortype() && type.tensortype().datatype() != mil::STRING) {
    const DType want = dtype_of(type.tensortype().datatype(), where());
    if (v.dtype() != want) v = cast(v, want);
    // the program's declared shape, where both know a dim, should be what kiln computed; the
    // declared types come from the converter's own shape inference, which has been seen to be
    // wrong (a slice_by_size from a negative begin), so kiln's shape stands and the difference
    // is a warning (KILN_LOG=warn). The window ops check theirs strictly (ops_nn.cpp).
    const Shape declared = shape_of(type.tensortype(), where());
    const Shape got = v.shape();
    bool same = declared.size() == got.size();
    for (size_t d = 0; same && d < got.size(); ++d)
      same = declared[d] < 0 || got[d] < 0 || declared[d] == got[d];
    if (!same)
      warn(fmt::format("[coreml] {}: kiln computes output {} of shape {}, the program declares {}",
                       where(), k, str(got), str(declared)));
  }
  imp_.values[op_.outputs(k).name()] = Value{v, std::nullopt, std::nullopt};
}
void OpContext::set(const std::vector<Tensor>& outs) {
  for (size_t k = 0; k < outs.size(); ++k) set(static_cast<int>(k), outs[k]);
}
void OpContext::set_known(int k, const Array& a) {
  if (k >= op_.outputs_size()) fail("has no output {}", k);
  imp_.values[op_.outputs(k).name()] = Value{std::nullopt, a, std::nullopt};
}

const mil::Block& OpContext::nested(int k) const {
  if (k < 0 || k >= op_.blocks_size())
    fail("has {} nested blocks, not {}", op_.blocks_size(), k + 1);
  return op_.blocks(k);
}

std::vector<Tensor> OpContext::block(int k, const std::vector<Tensor>& inputs) {
  const mil::Block& b = nested(k);
  if (b.inputs_size() != static_cast<int>(inputs.size()))
    fail("nested block {} declares {} inputs, not {}", k, b.inputs_size(), inputs.size());
  BlockScope scope(imp_, b);
  for (int j = 0; j < b.inputs_size(); ++j)
    imp_.values[b.inputs(j).name()] = Value{inputs[j], std::nullopt, std::nullopt};
  imp_.import_block(b);
  std::vector<Tensor> outs;
  for (const std::string& name : b.outputs())
    outs.push_back(imp_.tensor_of(imp_.value(name), name));
  return outs;
}

void OpContext::inline_block(int k) {
  const mil::Block& b = nested(k);
  if (b.inputs_size() != 0)
    fail("nested block {} declares {} inputs, not none", k, b.inputs_size());
  if (b.outputs_size() != op_.outputs_size())
    fail("nested block {} gives {} values for {} outputs", k, b.outputs_size(), op_.outputs_size());
  std::vector<Value> outs;
  {
    BlockScope scope(imp_, b);
    imp_.import_block(b);
    for (const std::string& name : b.outputs()) outs.push_back(imp_.value(name));
  }
  for (int j = 0; j < op_.outputs_size(); ++j) {
    const auto& type = op_.outputs(j).type();
    if (outs[j].tensor) {
      set(j, *outs[j].tensor);
    } else if (outs[j].known && type.has_tensortype() &&
               type.tensortype().datatype() != mil::STRING) {
      set_known(j, outs[j].known->astype(out_dtype(j)));
    } else {
      imp_.values[op_.outputs(j).name()] = outs[j];
    }
  }
}

// ---- the op table ----

namespace detail {

void report_unsupported(const std::string& what,
                        const std::map<std::string, std::vector<std::string>>& where) {
  std::string msg = "[coreml] unsupported " + what + ":";
  for (const auto& [type, names] : where) {
    msg += fmt::format(" {} (", type);
    for (size_t k = 0; k < names.size(); ++k) msg += (k ? ", " : "") + names[k];
    msg += ");";
  }
  msg.pop_back();
  fail<UnsupportedError>("{}", msg);
}

std::string color_space(const spec::ImageFeatureType& t) {
  // (an invalid color space reads as RGB, Core ML's default)
  switch (t.colorspace()) {
    case spec::ImageFeatureType_ColorSpace_GRAYSCALE:
    case spec::ImageFeatureType_ColorSpace_GRAYSCALE_FLOAT16:
      return "GRAYSCALE";
    case spec::ImageFeatureType_ColorSpace_RGB:
      return "RGB";
    case spec::ImageFeatureType_ColorSpace_BGR:
      return "BGR";
    default:
      return "RGB";
  }
}

void check_shape_names(const std::map<std::string, Shape>& shapes,
                       const std::vector<ValueInfo>& inputs) {
  for (const auto& given : shapes) {
    const std::string& name = given.first;  // (a lambda cannot capture a structured binding)
    if (std::none_of(inputs.begin(), inputs.end(),
                     [&](const ValueInfo& v) { return v.name == name; }))
      fail<ValueError>("[coreml] ImportOptions gives a shape for '{}', which is no input", name);
  }
}

const OpTable& op_table() {
  static const OpTable t = [] {
    OpTable r;
    add_constexpr_ops(r);
    add_elementwise_ops(r);
    add_nn_ops(r);
    add_tensor_ops(r);
    add_rnn_ops(r);
    add_control_ops(r);
    return r;
  }();
  return t;
}

}  // namespace detail

namespace {

// A const op's value: its `val` attribute.
Value const_value(Importer& imp, const mil::Operation& op) {
  const std::string where =
      fmt::format("op 'const' (output '{}')", op.outputs_size() ? op.outputs(0).name() : "?");
  auto it = op.attributes().find("val");
  if (it == op.attributes().end()) fail<FormatError>("[coreml] {}: has no 'val'", where);
  return imp.immediate(it->second, where);
}

// The op types of `op`'s nested blocks, at any depth, that the table does not map, each with its
// first outputs; whether there are any.
bool unmapped_nested(const mil::Operation& op, const OpTable& table,
                     std::map<std::string, std::vector<std::string>>& where) {
  bool any = false;
  for (const mil::Block& b : op.blocks())
    for (const mil::Operation& inner : b.operations()) {
      if (inner.type() != "const" && !table.count(inner.type())) {
        auto& w = where[inner.type()];
        if (w.size() < 3) w.push_back(inner.outputs_size() ? inner.outputs(0).name() : "?");
        any = true;
      }
      any = unmapped_nested(inner, table, where) || any;
    }
  return any;
}

// Whether `op` reads, itself or in its nested blocks, a value that could not be mapped.
bool reads_missing(const Importer& imp, const mil::Operation& op) {
  for (const auto& [param, arg] : op.inputs())
    for (const auto& b : arg.arguments())
      if (!b.has_value() && imp.missing.count(b.name())) return true;
  for (const mil::Block& b : op.blocks()) {
    for (const std::string& name : b.outputs())
      if (imp.missing.count(name)) return true;
    for (const mil::Operation& inner : b.operations())
      if (reads_missing(imp, inner)) return true;
  }
  return false;
}

}  // namespace

void detail::Importer::import_block(const mil::Block& block) {
  const OpTable& table = op_table();
  Model& m = model;
  std::map<std::string, std::vector<std::string>> bad;  // op type -> first outputs
  for (const mil::Operation& op : block.operations()) {
    ++m.op_histogram[op.type()];
    if (op.type() == "const") {
      if (op.outputs_size() != 1)
        fail<FormatError>("[coreml] a const op with {} outputs", op.outputs_size());
      Value v = const_value(*this, op);
      if (v.known) {
        m.parameter_count += v.known->numel();
        m.parameter_bytes += static_cast<int64_t>(v.known->nbytes());
      }
      values[op.outputs(0).name()] = std::move(v);
      continue;
    }
    // an op reading the result of one that could not be mapped is skipped, and so is a control
    // op whose blocks hold unmapped ops (those are reported)
    const bool skip = reads_missing(*this, op);
    auto it = table.find(op.type());
    if (skip || it == table.end() || (!op.blocks().empty() && unmapped_nested(op, table, bad))) {
      if (!skip && it == table.end()) {
        auto& w = bad[op.type()];
        if (w.size() < 3) w.push_back(op.outputs_size() ? op.outputs(0).name() : "?");
      }
      for (const auto& o : op.outputs()) missing.insert(o.name());
      continue;
    }
    // (a control op's mapping maps its blocks' ops while it runs: their immediate values go
    // after its own, which stay)
    const size_t mark = immediates.size();
    OpContext c(*this, op);
    it->second(c);
    immediates.resize(mark);
    if (op.type().rfind("constexpr_", 0) == 0)
      for (const auto& o : op.outputs())
        if (const Value& v = values[o.name()]; v.known) {
          m.parameter_count += v.known->numel();
          m.parameter_bytes += static_cast<int64_t>(v.known->nbytes());
        }
    for (const auto& o : op.outputs())
      if (!values.count(o.name())) c.fail("gave no value for output '{}'", o.name());
  }
  if (!bad.empty()) report_unsupported("ops", bad);
}

namespace {

const spec::FeatureDescription* described(
    const ::google::protobuf::RepeatedPtrField<spec::FeatureDescription>& list,
    const std::string& name) {
  for (const auto& d : list)
    if (d.name() == name) return &d;
  return nullptr;
}

// The sizes a flexible dim of an input may take, from the model description: its shape range, or
// the smallest and largest of its enumerated shapes (a superset of the set). Dims without either
// are absent.
std::map<size_t, std::pair<int64_t, int64_t>> dim_ranges(const spec::FeatureDescription* d) {
  std::map<size_t, std::pair<int64_t, int64_t>> r;
  if (!d || !d->type().has_multiarraytype()) return r;
  const auto& a = d->type().multiarraytype();
  if (a.has_shaperange()) {
    for (int k = 0; k < a.shaperange().sizeranges_size(); ++k) {
      const auto& range = a.shaperange().sizeranges(k);
      r[static_cast<size_t>(k)] = {static_cast<int64_t>(range.lowerbound()), range.upperbound()};
    }
  } else if (a.has_enumeratedshapes()) {
    for (const auto& shape : a.enumeratedshapes().shapes())
      for (int k = 0; k < shape.shape_size(); ++k) {
        const int64_t v = shape.shape(k);
        auto [it, fresh] = r.try_emplace(static_cast<size_t>(k), v, v);
        if (!fresh) it->second = {std::min(it->second.first, v), std::max(it->second.second, v)};
      }
  }
  return r;
}

void import_program(const spec::Model& s, const ImportOptions& options, Weights& weights,
                    Model& m) {
  const mil::Program& p = s.mlprogram();
  std::string fn = options.function;
  if (fn.empty())
    fn = s.description().defaultfunctionname().empty() ? "main"
                                                       : s.description().defaultfunctionname();
  auto it = p.functions().find(fn);
  if (it == p.functions().end()) {
    std::string names;
    for (const auto& [k, v] : p.functions()) names += (names.empty() ? "" : ", ") + k;
    fail<ValueError>("[coreml] the program has no function '{}' (it has: {})", fn, names);
  }
  const mil::Function& f = it->second;
  auto b = f.block_specializations().find(f.opset());
  if (b == f.block_specializations().end())
    fail<FormatError>("[coreml] function '{}' has no block for its opset '{}'", fn, f.opset());
  m.kind = "mlProgram";
  m.function = fn;
  m.opset = f.opset();

  Importer imp(m.graph, weights, m);
  for (const mil::NamedValueType& in : f.inputs()) {
    const std::string where = fmt::format("input '{}'", in.name());
    if (!in.type().has_tensortype())
      fail<UnsupportedError>("[coreml] {}: only tensor inputs are supported", where);
    ValueInfo info;
    info.name = in.name();
    info.dtype = dtype_of(in.type().tensortype().datatype(), where);
    info.shape = shape_of(in.type().tensortype(), where);
    const spec::FeatureDescription* d = described(s.description().input(), in.name());
    const auto ranges = dim_ranges(d);
    auto in_range = [&](size_t k, int64_t v) {
      auto it = ranges.find(k);
      return it == ranges.end() ||
             (v >= it->second.first && (it->second.second < 0 || v <= it->second.second));
    };
    if (auto fixed = options.input_shapes.find(in.name()); fixed != options.input_shapes.end()) {
      const Shape& want = fixed->second;
      bool fits = want.size() == info.shape.size();
      for (size_t k = 0; fits && k < want.size(); ++k)
        fits =
            want[k] >= 0 && (info.shape[k] < 0 || info.shape[k] == want[k]) && in_range(k, want[k]);
      if (!fits)
        fail<ShapeError>("[coreml] {} has shape {}{}; ImportOptions gives {}", where,
                         str(info.shape), ranges.empty() ? "" : " (within the model's ranges)",
                         str(want));
      info.shape = want;
    }
    if (d) {
      info.description = d->shortdescription();
      if (d->type().has_imagetype()) info.image = color_space(d->type().imagetype());
    }
    std::vector<DimSpec> specs;
    for (const auto& [k, range] : ranges)
      if (k < info.shape.size() && info.shape[k] < 0)
        specs.push_back({static_cast<int>(k), "", range.first, range.second});
    info.tensor = m.graph.placeholder(info.shape, info.dtype, in.name(), specs);
    imp.values[in.name()] = Value{info.tensor, std::nullopt, std::nullopt};
    m.inputs.push_back(std::move(info));
  }
  check_shape_names(options.input_shapes, m.inputs);

  imp.import_block(b->second);
  for (const std::string& out : b->second.outputs()) {
    ValueInfo info;
    info.name = out;
    info.tensor = imp.tensor_of(imp.value(out), out);
    info.dtype = info.tensor.dtype();
    info.shape = info.tensor.shape();
    if (const auto* d = described(s.description().output(), out))
      info.description = d->shortdescription();
    m.outputs.push_back(std::move(info));
  }
}

Model import_spec(const spec::Model& s, const ImportOptions& options) {
  Model m;
  m.spec_version = s.specificationversion();
  for (const auto& [k, v] : s.description().metadata().userdefined()) m.metadata[k] = v;
  const auto& md = s.description().metadata();
  if (!md.author().empty()) m.metadata["author"] = md.author();
  if (!md.versionstring().empty()) m.metadata["version"] = md.versionstring();
  if (!md.shortdescription().empty()) m.metadata["description"] = md.shortdescription();
  Weights weights(options.weights_dir);
  switch (s.Type_case()) {
    case spec::Model::kMlProgram:
      import_program(s, options, weights, m);
      break;
    case spec::Model::kNeuralNetwork:
    case spec::Model::kNeuralNetworkClassifier:
    case spec::Model::kNeuralNetworkRegressor:
      import_neural_network(s, options, m);
      break;
    case spec::Model::TYPE_NOT_SET:
      fail<FormatError>("[coreml] the model has no type");
    default:
      fail<UnsupportedError>("[coreml] Core ML model type {} is not supported (ML Programs are)",
                             static_cast<int>(s.Type_case()));
  }
  return m;
}

spec::Model parse(const void* data, size_t size) {
  spec::Model s;
  if (size > static_cast<size_t>(std::numeric_limits<int>::max()))
    fail<FormatError>("[coreml] a model specification of {} bytes is too large", size);
  if (!s.ParseFromArray(data, static_cast<int>(size)))
    fail<FormatError>("[coreml] not a Core ML model specification ({} bytes)", size);
  return s;
}

std::vector<char> read_all(const std::string& path, const std::string& label) {
  io::RegularFile f(path, "[coreml]", label);
  std::vector<char> data(f.size());
  if (f.read_at(data.data(), data.size(), 0) != data.size())
    fail<IoError>("[coreml] short read of {}", label);
  return data;
}

// The specification file of an .mlpackage (Manifest.json's root model item).
std::string package_model(const std::filesystem::path& dir) {
  const auto manifest = dir / "Manifest.json";
  const std::vector<char> text = read_all(manifest.string(), "'" + manifest.string() + "'");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text.begin(), text.end());
    const std::string root = j.at("rootModelIdentifier").get<std::string>();
    const std::string rel = j.at("itemInfoEntries").at(root).at("path").get<std::string>();
    if (rel.empty() || rel[0] == '/' || rel.find("..") != std::string::npos)
      fail<IoError>("[coreml] the package's model path '{}' points outside it", rel);
    return (dir / "Data" / rel).string();
  } catch (const nlohmann::json::exception& e) {
    fail<FormatError>("[coreml] '{}' is not a Core ML package manifest: {}", manifest.string(),
                      e.what());
  }
}

}  // namespace

Model import_bytes(const void* data, size_t size, const ImportOptions& options) {
  return import_spec(parse(data, size), options);
}

Model import(const std::string& path, const ImportOptions& options) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::string file = path;
  if (fs::is_directory(path, ec)) file = package_model(path);
  const std::vector<char> data = read_all(file, "'" + file + "'");
  ImportOptions o = options;
  if (o.weights_dir.empty()) o.weights_dir = fs::path(file).parent_path().string();
  if (o.weights_dir.empty()) o.weights_dir = ".";
  return import_bytes(data.data(), data.size(), o);
}

bool available() { return true; }

std::vector<std::string> supported_ops() {
  std::vector<std::string> r;
  for (const auto& [k, v] : op_table()) r.push_back(k);
  r.push_back("const");
  std::sort(r.begin(), r.end());
  r.erase(std::unique(r.begin(), r.end()), r.end());
  return r;
}

// ---- Model ----

std::vector<Tensor> Model::output_tensors() const {
  std::vector<Tensor> r;
  for (const auto& o : outputs) r.push_back(o.tensor);
  return r;
}

Feeds Model::feeds(const std::map<std::string, Array>& by_name) const {
  return io::feeds_by_name(inputs, by_name, "[coreml]", [](const std::string&) { return false; });
}

FeedShapes Model::feed_shapes(const std::map<std::string, Shape>& by_name) const {
  return io::shapes_by_name(inputs, by_name);
}

}  // namespace kiln::coreml
