// ONNX import: parse the ModelProto, check every op and dtype first (one error lists all that
// kiln lacks), then map nodes in topological order, folding what is known while importing.
#include "io/onnx/importer.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <onnx/onnx_pb.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <filesystem>
#include <memory>
#include <set>

#include "core/errors.h"
#include "io/file.h"
#include "io/model_feeds.h"
#include "io/onnx/op_table.h"
#include "io/onnx/strings.h"
#include "kiln/executable.h"
#include "kiln/ops/elementwise.h"

namespace kiln::onnx {
namespace detail {

namespace {

bool default_domain(const std::string& d) { return d.empty() || d == "ai.onnx"; }

// A shape of more than 2^59 elements (2^62 bytes of f64) could never be allocated, and counting
// its elements or bytes would overflow: refused where the model declares or computes it.
void check_elements(const Shape& shape, const std::string& what) {
  constexpr uint64_t kMaxElements = uint64_t{1} << 59;
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (d <= 0) continue;
    if (static_cast<uint64_t>(d) > kMaxElements / n)
      fail<FormatError>("[onnx] {} has shape {}: more than 2^59 elements", what, str(shape));
    n *= static_cast<uint64_t>(d);
  }
}

std::string node_label(const ::onnx::NodeProto& n) {
  if (!n.name().empty()) return n.name();
  return n.output_size() ? n.output(0) : std::string("<unnamed>");
}

// Re-throws a kiln error raised while mapping a node with the node named, keeping its type.
template <typename F>
void with_node_context(const ::onnx::NodeProto& n, F&& f) {
  auto context = [&](const Error& e) {
    const std::string what = e.what();
    if (what.rfind("[onnx]", 0) == 0) return what;
    return fmt::format("[onnx] node '{}' ({}): {}", node_label(n), n.op_type(), what);
  };
  try {
    f();
  } catch (const ShapeError& e) {
    throw ShapeError(context(e));
  } catch (const DTypeError& e) {
    throw DTypeError(context(e));
  } catch (const InputValuesNeeded& e) {
    throw InputValuesNeeded(context(e), e.inputs, e.node, e.values, e.output_dims);
  } catch (const UnsupportedError& e) {
    throw UnsupportedError(context(e));
  } catch (const ValueError& e) {
    throw ValueError(context(e));
  } catch (const FormatError& e) {
    throw FormatError(context(e));
  } catch (const IoError& e) {
    throw IoError(context(e));
  } catch (const Error&) {
    throw;
  } catch (const std::logic_error& e) {  // a malformed node (an attribute or list too short)
    throw FormatError(fmt::format("[onnx] node '{}' ({}) is malformed: {}", node_label(n),
                                  n.op_type(), e.what()));
  }
}

// Node indices in an order where every input is produced before it is read.
std::vector<int> topological_order(const ::onnx::GraphProto& g,
                                   const std::set<std::string>& known) {
  const int n = g.node_size();
  std::map<std::string, int> producer;
  for (int i = 0; i < n; ++i)
    for (const auto& o : g.node(i).output())
      if (!o.empty()) producer[o] = i;
  std::vector<int> order, state(n, 0);  // 0 new, 1 visiting, 2 done
  std::vector<std::pair<int, int>> stack;
  for (int root = 0; root < n; ++root) {
    if (state[root]) continue;
    stack.push_back({root, 0});
    state[root] = 1;
    while (!stack.empty()) {
      auto& [i, next] = stack.back();
      const auto& node = g.node(i);
      if (next < node.input_size()) {
        const std::string& in = node.input(next++);
        if (in.empty() || known.count(in)) continue;
        auto it = producer.find(in);
        if (it == producer.end())
          fail<FormatError>("[onnx] node '{}' ({}) reads '{}', which no node, input or "
                            "initializer produces",
                            node_label(node), node.op_type(), in);
        if (state[it->second] == 1)
          fail<FormatError>("[onnx] the graph has a cycle through node '{}' ({})",
                            node_label(node), node.op_type());
        if (state[it->second] == 0) {
          state[it->second] = 1;
          stack.push_back({it->second, 0});
        }
        continue;
      }
      state[i] = 2;
      order.push_back(i);
      stack.pop_back();
    }
  }
  return order;
}

}  // namespace

Importer::Importer(const ::onnx::ModelProto& model, const ImportOptions& options)
    : proto_(model), options_(options) {}

const Value* Importer::find(const std::string& name) const {
  auto it = values_.find(name);
  return it == values_.end() ? nullptr : &it->second;
}

Value Importer::value_of(const Tensor& t) const {
  auto it = known_.find({t.graph_impl(), t.node_id(), t.output_index()});
  return {t, it == known_.end() ? std::nullopt : std::optional<Array>(it->second), std::nullopt};
}

Tensor Importer::constant(const Array& value) {
  Tensor t = model_.graph.constant(value);
  known_[{t.graph_impl(), t.node_id(), t.output_index()}] = value;
  return t;
}

int64_t Importer::opset_of(const ::onnx::NodeProto& node) const {
  if (default_domain(node.domain())) return model_.opset;
  for (const auto& o : proto_.opset_import())
    if (o.domain() == node.domain()) return o.version();
  return 0;
}

Array Importer::tensor(const ::onnx::TensorProto& t) const {
  return read_tensor(t, options_.external_data_dir);
}

void Importer::check_supported(const ::onnx::GraphProto& g) {
  // op type -> (opset, node names); everything kiln lacks is reported at once
  std::map<std::string, std::pair<std::string, std::vector<std::string>>> missing;
  std::vector<const ::onnx::NodeProto*> nodes;
  std::vector<const ::onnx::GraphProto*> graphs{&g};
  while (!graphs.empty()) {  // the graph and every subgraph (If branches, Loop bodies)
    const auto* sub = graphs.back();
    graphs.pop_back();
    for (const auto& node : sub->node()) {
      nodes.push_back(&node);
      for (const auto& a : node.attribute()) {
        if (a.has_g()) graphs.push_back(&a.g());
        for (const auto& gg : a.graphs()) graphs.push_back(&gg);
      }
    }
  }
  for (const auto* np : nodes) {
    const auto& node = *np;
    ++model_.op_histogram[default_domain(node.domain()) ? node.op_type()
                                                         : node.domain() + "." + node.op_type()];
    std::string key = op_key(node), why;
    if (find_entry(key, opset_of(node), nullptr)) continue;
    if (!default_domain(node.domain())) {
      why = opset_of(node)
                ? fmt::format("domain {} opset {}", node.domain(), opset_of(node))
                : fmt::format("domain {}, which the model does not import", node.domain());
    } else if (model_.opset == 0) {
      why = "the model imports no default-domain opset";
    } else {
      why = schema_versions(node.op_type()).empty() ? std::string("not an ONNX op")
                                                    : fmt::format("opset {}", model_.opset);
    }
    auto& m = missing[key];
    m.first = why;
    m.second.push_back(node_label(node));
  }
  std::vector<std::string> dtypes;
  auto check_dtype = [&](int32_t t, const std::string& what) {
    if (!from_onnx_dtype(t))
      dtypes.push_back(fmt::format("{} ({})", what, onnx_dtype_name(t)));
  };
  for (const auto& in : g.input()) {
    const ::onnx::TypeProto* t = &in.type();
    if (t->has_optional_type()) t = &t->optional_type().elem_type();
    if (t->has_sequence_type()) t = &t->sequence_type().elem_type();
    if (!t->has_tensor_type()) {
      dtypes.push_back(fmt::format(
          "input '{}' (not a tensor, a sequence of tensors or an optional of those)", in.name()));
      continue;
    }
    check_dtype(t->tensor_type().elem_type(), fmt::format("input '{}'", in.name()));
  }
  for (const auto& t : g.initializer()) check_dtype(t.data_type(), fmt::format("initializer '{}'", t.name()));
  if (missing.empty() && dtypes.empty()) return;
  std::string msg = "[onnx] the model uses what kiln does not support:";
  for (const auto& [op, info] : missing) {
    std::string nodes;
    for (size_t i = 0; i < info.second.size() && i < 5; ++i)
      nodes += (i ? ", " : "") + info.second[i];
    if (info.second.size() > 5) nodes += fmt::format(", and {} more", info.second.size() - 5);
    msg += fmt::format("\n  op {} ({}): {}", op, info.first, nodes);
  }
  for (const auto& d : dtypes) msg += fmt::format("\n  element type of {}", d);
  throw UnsupportedError(msg);
}

void Importer::add_inputs(const ::onnx::GraphProto& g) {
  for (const auto& init : g.initializer()) {
    if (init.name().empty()) fail<FormatError>("[onnx] an initializer has no name");
    Array a = tensor(init);
    model_.parameter_count += a.numel();
    model_.parameter_bytes += static_cast<int64_t>(a.nbytes());
    values_[init.name()] = {model_.graph.constant(a, init.name()), a};
  }
  std::set<std::string> given;
  for (const auto& in : g.input()) {
    if (values_.count(in.name())) continue;  // an initializer listed as an input
    const ::onnx::TypeProto* type = &in.type();
    if (type->has_optional_type()) {  // an optional: absent, or its element as an input
      if (options_.absent_inputs.count(in.name())) {
        values_[in.name()] = {Tensor{}, std::nullopt, std::nullopt, true};
        given.insert(in.name());
        continue;
      }
      type = &type->optional_type().elem_type();
    }
    if (type->has_sequence_type()) {
      add_sequence_input(in, *type);
      given.insert(in.name());
      continue;
    }
    const auto& tt = type->tensor_type();
    if (auto it = options_.input_values.find(in.name()); it != options_.input_values.end()) {
      Array a = it->second.to(Device::cpu());
      const DType want = *from_onnx_dtype(tt.elem_type());
      if (a.dtype() != want)
        fail<DTypeError>("[onnx] input '{}' takes {}; its given value is {}", in.name(),
                         name(want), name(a.dtype()));
      if (tt.has_shape() && tt.shape().dim_size() != a.rank())
        fail<ShapeError>("[onnx] input '{}' has rank {}; its given value has shape {}", in.name(),
                         tt.shape().dim_size(), str(a.shape()));
      values_[in.name()] = {constant(a), a};
      model_.fixed_inputs.push_back(in.name());
      given.insert(in.name());
      continue;
    }
    ValueInfo info;
    info.name = in.name();
    info.dtype = *from_onnx_dtype(tt.elem_type());
    if (!tt.has_shape())
      fail<UnsupportedError>("[onnx] input '{}' has no shape; kiln needs every input's rank",
                             in.name());
    for (const auto& d : tt.shape().dim()) {
      info.shape.push_back(d.has_dim_value() ? d.dim_value() : options_.default_dim);
      info.dim_params.push_back(d.has_dim_param() ? d.dim_param() : "");
      if (d.has_dim_value() && d.dim_value() < 0)
        fail<FormatError>("[onnx] input '{}' has a negative dim {}", in.name(), d.dim_value());
    }
    if (auto it = options_.input_shapes.find(in.name()); it != options_.input_shapes.end()) {
      const Shape& s = it->second;
      if (s.size() != info.shape.size())
        fail<ShapeError>("[onnx] input '{}' has rank {} ({}); the given shape {} has rank {}",
                         in.name(), info.shape.size(), str(info.shape), str(s), s.size());
      for (size_t i = 0; i < s.size(); ++i) {
        const bool fixed = tt.shape().dim(static_cast<int>(i)).has_dim_value();
        if (fixed && s[i] != info.shape[i])
          fail<ShapeError>("[onnx] input '{}' has shape {}; the given shape {} differs in dim {}",
                           in.name(), str(info.shape), str(s), i);
        info.shape[i] = s[i];
      }
      given.insert(in.name());
    }
    check_elements(info.shape, fmt::format("input '{}'", info.name));
    // a dim left dynamic keeps its dim_param as its name: inputs that share it agree at run time
    std::vector<DimSpec> named;
    for (size_t i = 0; i < info.shape.size(); ++i)
      if (info.shape[i] < 0 && !info.dim_params[i].empty()) {
        std::string n = info.dim_params[i];
        std::replace(n.begin(), n.end(), '\n', ' ');
        named.push_back({static_cast<int>(i), std::move(n)});
      }
    info.tensor = model_.graph.placeholder(info.shape, info.dtype, info.name, named);
    values_[info.name] = {info.tensor, std::nullopt};
    model_.inputs.push_back(std::move(info));
  }
  for (const auto& [name, shape] : options_.input_shapes)
    if (!given.count(name))
      fail<ValueError>("[onnx] the model has no input '{}' (a shape was given for it)", name);
  for (const auto& [name, value] : options_.input_values)
    if (!given.count(name))
      fail<ValueError>("[onnx] the model has no input '{}' (a value was given for it)", name);
  for (const auto& [name, shapes] : options_.sequence_inputs)
    if (!given.count(name) || !values_.at(name).sequence)
      fail<ValueError>(
          "[onnx] the model has no sequence input '{}' (element shapes were given "
          "for it)",
          name);
  for (const std::string& name : options_.absent_inputs)
    if (!given.count(name) || !values_.at(name).absent)
      fail<ValueError>("[onnx] the model has no optional input '{}' (it was given as absent)",
                       name);
}

void Importer::add_sequence_input(const ::onnx::ValueInfoProto& in, const ::onnx::TypeProto& type) {
  auto it = options_.sequence_inputs.find(in.name());
  if (it == options_.sequence_inputs.end())
    throw InputValuesNeeded(
        fmt::format("[onnx] input '{}' is a sequence: kiln needs its length and element shapes "
                    "while importing (ImportOptions::sequence_inputs)",
                    in.name()),
        {in.name()});
  const auto& tt = type.sequence_type().elem_type().tensor_type();
  Sequence seq;
  seq.dtype = *from_onnx_dtype(tt.elem_type());
  for (size_t k = 0; k < it->second.size(); ++k) {
    ValueInfo info;
    info.name = fmt::format("{}[{}]", in.name(), k);
    info.dtype = seq.dtype;
    info.shape = it->second[k];
    info.sequence = in.name();
    if (tt.has_shape() && tt.shape().dim_size() != static_cast<int>(info.shape.size()))
      fail<ShapeError>(
          "[onnx] sequence input '{}' holds tensors of rank {}; element {} has shape {}", in.name(),
          tt.shape().dim_size(), k, str(info.shape));
    info.dim_params.assign(info.shape.size(), "");
    check_elements(info.shape, fmt::format("input '{}'", info.name));
    info.tensor = model_.graph.placeholder(info.shape, info.dtype, info.name);
    seq.items.push_back(info.tensor);
    model_.inputs.push_back(std::move(info));
  }
  values_[in.name()] = {Tensor{}, std::nullopt, std::move(seq)};
}

std::vector<Value> Importer::inline_values(const ::onnx::GraphProto& g,
                                           const std::vector<Value>& inputs) {
  if (g.input_size() != static_cast<int>(inputs.size()))
    fail<FormatError>("[onnx] the body '{}' declares {} inputs, not {}", g.name(), g.input_size(),
                      inputs.size());
  for (int k = 0; k < g.input_size(); ++k) values_[g.input(k).name()] = inputs[k];
  for (const auto& init : g.initializer()) {
    Array a = tensor(init);
    values_[init.name()] = {constant(a), a};
  }
  std::set<std::string> known;
  for (const auto& [name, v] : values_) known.insert(name);
  for (int i : topological_order(g, known)) add_node(g.node(i));
  std::vector<Value> outs;
  for (const auto& o : g.output()) {
    const Value* v = find(o.name());
    if (!v || !v->defined())
      fail<FormatError>("[onnx] subgraph output '{}' is not produced", o.name());
    outs.push_back(*v);
  }
  return outs;
}

std::vector<Tensor> Importer::inline_graph(const ::onnx::GraphProto& g) {
  return inline_body(g, {});
}

std::vector<Tensor> Importer::inline_body(const ::onnx::GraphProto& g,
                                          const std::vector<Tensor>& inputs) {
  std::vector<Value> in;
  for (const Tensor& t : inputs) in.push_back({t, std::nullopt, std::nullopt});
  std::vector<Tensor> outs;
  int k = 0;
  for (const Value& v : inline_values(g, in)) {
    if (v.sequence || v.absent)
      fail<UnsupportedError>(
          "[onnx] subgraph output '{}' is {}, which kiln holds only while importing: here it "
          "would cross a loop or branch run on the device",
          g.output(k).name(), v.sequence ? "a sequence" : "an optional without a value");
    outs.push_back(v.tensor);
    ++k;
  }
  return outs;
}

bool Importer::reads_outer_sequence(const ::onnx::GraphProto& g) const {
  std::set<std::string> local;
  for (const auto& in : g.input()) local.insert(in.name());
  for (const auto& n : g.node())
    for (const auto& o : n.output()) local.insert(o);
  for (const auto& n : g.node()) {
    for (const auto& in : n.input())
      if (!in.empty() && !local.count(in)) {
        const Value* v = find(in);
        if (v && v->sequence) return true;
      }
    for (const auto& a : n.attribute()) {
      if (a.has_g() && reads_outer_sequence(a.g())) return true;
      for (const auto& sub : a.graphs())
        if (reads_outer_sequence(sub)) return true;
    }
  }
  return false;
}

namespace {
void index_producers(const ::onnx::GraphProto& g,
                     std::map<std::string, const ::onnx::NodeProto*>& producer) {
  for (const auto& n : g.node()) {
    for (const auto& o : n.output())
      if (!o.empty()) producer[o] = &n;
    for (const auto& a : n.attribute()) {
      if (a.has_g()) index_producers(a.g(), producer);
      for (const auto& sub : a.graphs()) index_producers(sub, producer);
    }
  }
}
}  // namespace

std::vector<std::string> Importer::graph_inputs_behind(const std::string& name) {
  const auto& g = proto_.graph();
  if (producer_.empty()) index_producers(g, producer_);
  std::set<std::string> inits, seen{name}, found;
  for (const auto& t : g.initializer()) inits.insert(t.name());
  std::vector<std::string> todo{name};
  while (!todo.empty()) {
    const std::string v = todo.back();
    todo.pop_back();
    found.insert(v);
    auto it = producer_.find(v);
    if (it == producer_.end()) continue;
    for (const auto& in : it->second->input())
      if (!in.empty() && seen.insert(in).second) todo.push_back(in);
  }
  std::vector<std::string> out;
  for (const auto& in : g.input())
    if (found.count(in.name()) && !inits.count(in.name())) out.push_back(in.name());
  return out;
}

void Importer::add_node(const ::onnx::NodeProto& node) {
  int version = 0;
  const OpEntry* entry = find_entry(op_key(node), opset_of(node), &version);
  KILN_ASSERT(entry);
  for (const auto& in : node.input())
    if (!in.empty() && !values_.at(in).defined())
      fail<UnsupportedError>("[onnx] node '{}' ({}) reads '{}', an output kiln's mapping of its "
                             "producer does not compute",
                             node_label(node), node.op_type(), in);
  NodeContext ctx(*this, node, version);
  std::vector<Tensor> outs;
  with_node_context(node, [&] { outs = entry->map(ctx); });
  // (CastLike reads only the dtype of its second input)
  bool all_known = true;
  for (int i = 0; i < node.input_size(); ++i) {
    const std::string& in = node.input(i);
    const bool dtype_only = node.op_type() == "CastLike" && i == 1;
    if (!in.empty() && !dtype_only && !values_.at(in).data) all_known = false;
  }
  std::vector<std::string> produced;
  for (int i = 0; i < node.output_size(); ++i) {
    const std::string& name = node.output(i);
    if (name.empty()) continue;
    Value v;
    if (auto it = pending_.find(name); it != pending_.end()) {
      v.sequence = std::move(it->second);
      pending_.erase(it);
    } else if (absent_.erase(name)) {
      v.absent = true;
    } else if (i < static_cast<int>(outs.size()) && outs[i].valid()) {
      check_elements(outs[i].shape(), fmt::format("node '{}' ({}) output '{}'", node_label(node),
                                                  node.op_type(), name));
      v.tensor = outs[i];
      if (auto it = known_.find({outs[i].graph_impl(), outs[i].node_id(), outs[i].output_index()});
          it != known_.end())
        v.data = it->second;
      produced.push_back(name);
    }
    values_[name] = std::move(v);
  }
  if (node.op_type() == "Constant")
    for (const auto& name : produced) {
      model_.parameter_count += values_[name].data ? values_[name].data->numel() : 0;
      model_.parameter_bytes += values_[name].data ? static_cast<int64_t>(values_[name].data->nbytes()) : 0;
    }
  // (an If's branch reads values its node does not list as inputs; dequantized weights stay int8
  // for the fuse_quant pass)
  if (all_known && node.op_type() != "If" && node.op_type() != "DequantizeLinear")
    with_node_context(node, [&] { fold(produced); });
}

// Computes values whose inputs are all known (shape arithmetic, constant subgraphs) on the CPU.
void Importer::fold(const std::vector<std::string>& names) {
  constexpr int64_t kMaxFold = int64_t{1} << 22;
  std::vector<std::string> todo;
  std::vector<Tensor> targets;
  int64_t total = 0;
  for (const auto& name : names) {
    Value& v = values_[name];
    if (v.data) continue;
    if (v.tensor.graph_impl() != &model_.graph.impl()) return;  // a value of a body
    const Shape s = v.tensor.shape();
    if (!is_static(s)) return;
    total += numel(s);
    todo.push_back(name);
    targets.push_back(v.tensor);
  }
  if (todo.empty() || total > kMaxFold) return;
  CompileOptions opts;
  opts.optimize = false;
  opts.num_threads = 1;
  const auto results = model_.graph.compile(Device::cpu(), {}, targets, opts).run(Feeds{});
  for (size_t i = 0; i < todo.size(); ++i) {
    Array a = results[i].to(Device::cpu());
    values_[todo[i]] = {constant(a), a};
  }
}

Model Importer::run() {
  if (!proto_.has_graph() || proto_.opset_import_size() == 0)
    fail<FormatError>("[onnx] not an ONNX model: it has no graph or no opset_import");
  model_.ir_version = proto_.ir_version();
  model_.producer = proto_.producer_name() +
                    (proto_.producer_version().empty() ? "" : " " + proto_.producer_version());
  model_.opset = -1;
  for (const auto& o : proto_.opset_import())
    if (default_domain(o.domain())) model_.opset = o.version();
  // (a model of other domains' ops alone may import none; an opset older than 7 imports where
  // kiln maps its ops' schemas of then: the op table says which, and the rest are reported)
  if (model_.opset < 0) model_.opset = 0;
  const auto& g = proto_.graph();
  // strings, which kiln's arrays do not hold, are read and made on the host by onnx::Session
  if (const std::string node = first_string_node(proto_); !node.empty())
    throw InputValuesNeeded(
        fmt::format("[onnx] node '{}' reads or makes strings, which kiln's arrays do not hold: "
                    "onnx::Session runs such nodes on the host",
                    node),
        {}, node);
  check_supported(g);
  add_inputs(g);
  std::set<std::string> known;
  for (const auto& [name, v] : values_) known.insert(name);
  for (int i : topological_order(g, known)) add_node(g.node(i));
  for (const auto& out : g.output()) {
    const Value* v = find(out.name());
    if (!v) fail<FormatError>("[onnx] graph output '{}' is not produced by any node", out.name());
    if (v->sequence) {
      add_sequence_output(out.name(), *v->sequence);
      continue;
    }
    if (v->absent) {
      model_.graph_outputs.push_back({out.name(), false, true, f32, model_.outputs.size(), 0});
      continue;
    }
    if (!v->tensor.valid())
      fail<UnsupportedError>("[onnx] graph output '{}' is an output kiln's mapping does not compute",
                             out.name());
    ValueInfo info;
    info.name = out.name();
    info.tensor = v->tensor;
    const ::onnx::TypeProto& type =
        out.type().has_optional_type() ? out.type().optional_type().elem_type() : out.type();
    if (type.has_tensor_type()) {
      const auto dt = from_onnx_dtype(type.tensor_type().elem_type());
      if (dt && *dt != info.tensor.dtype()) info.tensor = cast(info.tensor, *dt);
      for (const auto& d : type.tensor_type().shape().dim())
        info.dim_params.push_back(d.has_dim_param() ? d.dim_param() : "");
    }
    info.dtype = info.tensor.dtype();
    info.shape = info.tensor.shape();
    model_.graph_outputs.push_back({info.name, false, false, info.dtype, model_.outputs.size(), 1});
    model_.outputs.push_back(std::move(info));
  }
  return std::move(model_);
}

void Importer::add_sequence_output(const std::string& name, const Sequence& seq) {
  model_.graph_outputs.push_back(
      {name, true, false, seq.dtype, model_.outputs.size(), seq.items.size()});
  for (size_t k = 0; k < seq.items.size(); ++k) {
    ValueInfo info;
    info.name = fmt::format("{}[{}]", name, k);
    info.tensor = seq.items[k];
    info.dtype = info.tensor.dtype();
    info.shape = info.tensor.shape();
    info.dim_params.assign(info.shape.size(), "");
    info.sequence = name;
    model_.outputs.push_back(std::move(info));
  }
}

}  // namespace detail

namespace {

Model import_parsed(::onnx::ModelProto& model, const ImportOptions& options) {
  detail::Importer imp(model, options);
  return imp.run();
}

void check_size(uint64_t size) {
  if (size > static_cast<uint64_t>(INT_MAX))
    fail<UnsupportedError>("[onnx] the model is {} bytes; protobuf reads at most 2 GiB (keep "
                           "large weights in external data)",
                           size);
}

// Parses a model from `in` (the whole of a `size`-byte input).
::onnx::ModelProto parse(google::protobuf::io::CodedInputStream& in, uint64_t size) {
  ::onnx::ModelProto model;
  in.SetRecursionLimit(64);
  if (!model.ParseFromCodedStream(&in) || !in.ConsumedEntireMessage())
    fail<FormatError>("[onnx] not an ONNX model: the protobuf does not parse ({} bytes)", size);
  return model;
}

// A regular file read in order with pread, a chunk at a time, for protobuf's parser: a 475 MB
// model is parsed without a buffer of its size (whose page faults and copy cost a quarter of its
// import). A file that changes size while it is read gives a short read, and the parse fails.
class FileChunks : public google::protobuf::io::CopyingInputStream {
 public:
  explicit FileChunks(const io::RegularFile& f) : f_(f) {}
  int Read(void* buffer, int size) override {
    const size_t n = f_.read_at(buffer, static_cast<size_t>(size), offset_);
    offset_ += n;
    if (n == 0 && errno != 0) return -1;
    return static_cast<int>(n);
  }

 private:
  const io::RegularFile& f_;
  uint64_t offset_ = 0;
};

}  // namespace

Model import_bytes(const void* data, size_t size, const ImportOptions& options) {
  check_size(size);
  google::protobuf::io::CodedInputStream in(static_cast<const uint8_t*>(data),
                                            static_cast<int>(size));
  ::onnx::ModelProto model = parse(in, size);
  return import_parsed(model, options);
}

Model import(const std::string& path, const ImportOptions& options) {
  // a regular file only (a directory, a FIFO or a device such as /dev/zero would never end)
  const io::RegularFile f(path, "[onnx]", "'" + path + "'");
  check_size(f.size());
  ImportOptions opts = options;
  if (opts.external_data_dir.empty()) {
    const auto dir = std::filesystem::path(path).parent_path();
    opts.external_data_dir = dir.empty() ? "." : dir.string();
  }
  try {
    FileChunks chunks(f);
    google::protobuf::io::CopyingInputStreamAdaptor stream(&chunks, 1 << 20);
    google::protobuf::io::CodedInputStream in(&stream);
    ::onnx::ModelProto model = parse(in, f.size());
    if (static_cast<uint64_t>(in.CurrentPosition()) != f.size())
      fail<FormatError>("[onnx] not an ONNX model: the protobuf does not parse ({} bytes)",
                        f.size());
    return import_parsed(model, opts);
  } catch (const FormatError& e) {
    throw FormatError(fmt::format("{} (file '{}')", e.what(), path));
  }
}

std::vector<Tensor> Model::output_tensors() const {
  std::vector<Tensor> r;
  for (const auto& o : outputs) r.push_back(o.tensor);
  return r;
}

Feeds Model::feeds(const std::map<std::string, Array>& by_name) const {
  return io::feeds_by_name(inputs, by_name, "[onnx]", [this](const std::string& n) {
    return std::find(fixed_inputs.begin(), fixed_inputs.end(), n) != fixed_inputs.end();
  });
}

FeedShapes Model::feed_shapes(const std::map<std::string, Shape>& by_name) const {
  return io::shapes_by_name(inputs, by_name);
}

}  // namespace kiln::onnx
