// onnx::Session's split at a node whose outputs' sizes depend on data (session_split.h).
//
// Part A holds the nodes the split node depends on (closed under their producers), the node runs
// on the host as a one-node model imported for each run's values (its outputs are constants of
// that import), and part B holds every other node. Each part is a Session of its own, so a part
// may split again or import per value. A value crossing into B from A or the node becomes a graph
// input of B: from A with the dims A's import gives it (fixed or dynamic), from the node with every
// dim dynamic, so that B compiles once for every count. Where B cannot take such dims while
// importing (a convolution's channels, say), B is imported per shape of those inputs instead.
#include "io/onnx/session_split.h"

#include <fmt/format.h>
#include <onnx/onnx_pb.h>

#include <algorithm>
#include <list>
#include <mutex>
#include <optional>
#include <set>

#include "core/errors.h"
#include "io/onnx/importer.h"
#include "io/onnx/op_table.h"
#include "io/onnx/strings.h"

namespace kiln::onnx::detail {

namespace {

// Names a node reads: its inputs and what its subgraphs read from outside them.
void outer_reads(const ::onnx::GraphProto& g, std::set<std::string>& out);
std::set<std::string> reads_of(const ::onnx::NodeProto& n) {
  std::set<std::string> r;
  for (const auto& in : n.input())
    if (!in.empty()) r.insert(in);
  for (const auto& a : n.attribute()) {
    if (a.has_g()) outer_reads(a.g(), r);
    for (const auto& sub : a.graphs()) outer_reads(sub, r);
  }
  return r;
}
void outer_reads(const ::onnx::GraphProto& g, std::set<std::string>& out) {
  std::set<std::string> local;
  for (const auto& in : g.input()) local.insert(in.name());
  for (const auto& t : g.initializer()) local.insert(t.name());
  for (const auto& n : g.node())
    for (const auto& o : n.output()) local.insert(o);
  for (const auto& n : g.node())
    for (const std::string& r : reads_of(n))
      if (!local.count(r)) out.insert(r);
}

int32_t onnx_type_of(DType t) {
  for (int32_t k = 1; k < 64; ++k)
    if (from_onnx_dtype(k) == t) return k;
  fail<UnsupportedError>("[onnx] no ONNX element type holds {}", name(t));
}

// A tensor value's declaration: dtype and rank, each dim fixed where `fixed` says, else dynamic
// (named by `params` where given).
::onnx::ValueInfoProto declare(const std::string& value, DType t, const Shape& dims,
                               const std::vector<std::string>& params) {
  ::onnx::ValueInfoProto v;
  v.set_name(value);
  auto* tt = v.mutable_type()->mutable_tensor_type();
  tt->set_elem_type(onnx_type_of(t));
  auto* s = tt->mutable_shape();
  for (size_t i = 0; i < dims.size(); ++i) {
    auto* d = s->add_dim();
    if (dims[i] >= 0) d->set_dim_value(dims[i]);
    else if (i < params.size() && !params[i].empty()) d->set_dim_param(params[i]);
  }
  return v;
}

std::string serialize(const ::onnx::ModelProto& m) {
  std::string s;
  if (!m.SerializeToString(&s)) fail<FormatError>("[onnx] a part of the split model is too large");
  return s;
}

// The options of a part: what names its graph inputs.
SessionOptions options_for(const SessionOptions& o, const std::set<std::string>& inputs) {
  SessionOptions p = o;
  auto keep = [&](auto& m) {
    for (auto it = m.begin(); it != m.end();)
      it = inputs.count(it->first) ? std::next(it) : m.erase(it);
  };
  keep(p.import.input_shapes);
  keep(p.import.input_values);
  keep(p.import.sequence_inputs);
  for (auto it = p.import.absent_inputs.begin(); it != p.import.absent_inputs.end();)
    it = inputs.count(*it) ? std::next(it) : p.import.absent_inputs.erase(it);
  return p;
}

// Sessions by a key of shapes, least recently used going first; `dropped` counts the imports of
// those that went.
struct SessionsByShape {
  std::list<std::pair<std::string, std::shared_ptr<Session>>> list;  // most recent first
  int64_t dropped = 0;
  std::shared_ptr<Session> find(const std::string& key) {
    auto it = std::find_if(list.begin(), list.end(), [&](const auto& e) { return e.first == key; });
    if (it == list.end()) return nullptr;
    list.splice(list.begin(), list, it);
    return list.front().second;
  }
  std::shared_ptr<Session> add(const std::string& key, Session s, size_t keep) {
    list.emplace_front(key, std::make_shared<Session>(std::move(s)));
    while (list.size() > std::max<size_t>(keep, 1)) {
      dropped += list.back().second->imports();
      list.pop_back();
    }
    return list.front().second;
  }
};

}  // namespace

class SplitModel {
 public:
  ::onnx::ModelProto proto;  // the whole model
  Device device;
  SessionOptions options;
  int node = -1;                      // the split node's index among the graph's nodes
  std::vector<int> a_nodes, b_nodes;  // in the graph's order
  std::optional<Session> a;
  std::vector<std::string> a_inputs, a_outputs;
  std::vector<std::string> outputs;        // the graph's, in order
  std::map<std::string, Shape> node_dims;  // the node's outputs' dims known without the data
  bool strings = false;  // the node reads or makes strings: run_string_node runs it

  mutable std::mutex mu;              // (builds the node's and B's sessions at the first run)
  SessionsByShape n_by_shape;         // the node's one-node models by the shapes of their inputs
  std::vector<std::string> n_inputs;  // the node's inputs that are graph inputs of its model
  bool b_none = false;                // every output comes from A, the node or the feeds
  std::vector<std::string> b_inputs, b_outputs;
  std::shared_ptr<Session> b_dynamic;
  bool b_per_shape = false;
  SessionsByShape b_by_shape;

  // A model of `nodes` of the graph with these inputs (declared) and outputs (names), and the
  // initializers the nodes read.
  std::string part(const std::vector<int>& nodes, const std::vector<::onnx::ValueInfoProto>& ins,
                   const std::vector<std::string>& outs) const {
    ::onnx::ModelProto m = proto;
    auto* g = m.mutable_graph();
    g->clear_node();
    g->clear_input();
    g->clear_output();
    g->clear_initializer();
    g->clear_value_info();
    std::set<std::string> read;
    for (int i : nodes) {
      *g->add_node() = proto.graph().node(i);
      for (const std::string& r : reads_of(proto.graph().node(i))) read.insert(r);
    }
    for (const std::string& o : outs) read.insert(o);
    for (const auto& t : proto.graph().initializer())
      if (read.count(t.name())) *g->add_initializer() = t;
    for (const auto& v : ins) *g->add_input() = v;
    for (const std::string& o : outs) g->add_output()->set_name(o);
    return serialize(m);
  }

  const ::onnx::ValueInfoProto* graph_input(const std::string& name) const {
    for (const auto& in : proto.graph().input())
      if (in.name() == name) return &in;
    return nullptr;
  }
  bool initializer(const std::string& name) const {
    for (const auto& t : proto.graph().initializer())
      if (t.name() == name) return true;
    return false;
  }

  // The declaration of a value crossing into the node's model or B, from this run's value of it:
  // with every dim dynamic (`exact` false, a value the node makes), with the dims A's import
  // gives it (a value A makes), or with its shape (`exact`).
  ::onnx::ValueInfoProto crossing(const std::string& name, const kiln::onnx::Value& v,
                                  bool exact) const {
    if (v.is_string) {  // (read on the host by B's first node: B splits there again)
      ::onnx::ValueInfoProto d = declare(name, i64, Shape(v.string_shape.size(), -1), {});
      d.mutable_type()->mutable_tensor_type()->set_elem_type(::onnx::TensorProto::STRING);
      return d;
    }
    if (v.is_sequence || v.is_none)
      fail<UnsupportedError>(
          "[onnx] value '{}' is {}: a model split at a data-dependent node passes only tensors "
          "between its parts",
          name, v.is_sequence ? "a sequence" : "an optional without a value");
    Shape dims = exact ? v.tensor.shape() : Shape(v.tensor.shape().size(), -1);
    std::vector<std::string> params;
    if (auto it = node_dims.find(name);
        !exact && it != node_dims.end() && it->second.size() == dims.size())
      dims = it->second;
    const bool from_a = std::count(a_outputs.begin(), a_outputs.end(), name) > 0;
    if (!exact && from_a && a)
      if (const auto model = a->model())
        for (const ValueInfo& o : model->outputs)
          if (o.name == name && o.shape.size() == dims.size()) {
            dims = o.shape;
            params = o.dim_params;
          }
    return declare(name, v.tensor.dtype(), dims, params);
  }

  // The node's one-node model for inputs of these shapes (each input fixed to its shape: an op
  // such as RoiAlign needs X's dims while importing), whose session imports it for each run's
  // values of the inputs it needs (its outputs are constants of that import).
  std::shared_ptr<Session> node_for(const std::map<std::string, kiln::onnx::Value>& vals) {
    const auto& nd = proto.graph().node(node);
    std::set<std::string> input_names;
    if (n_inputs.empty())
      for (const auto& in : nd.input())
        if (!in.empty() && !initializer(in) && input_names.insert(in).second)
          n_inputs.push_back(in);
    input_names.insert(n_inputs.begin(), n_inputs.end());
    std::string key;
    std::vector<::onnx::ValueInfoProto> ins;
    for (const std::string& in : n_inputs) {
      auto it = vals.find(in);
      if (it == vals.end()) fail<ValueError>("[onnx] input '{}' has no feed", in);
      ins.push_back(crossing(in, it->second, true));
      key += in + str(it->second.tensor.shape()) + "|";
    }
    if (auto s = n_by_shape.find(key)) return s;
    std::vector<std::string> outs;
    for (const auto& o : nd.output())
      if (!o.empty()) outs.push_back(o);
    const std::string bytes = part({node}, ins, outs);
    SessionOptions o = options_for(options, input_names);
    o.import.input_shapes.clear();
    o.split_at_data_dependent_nodes = false;  // (imported per value)
    return n_by_shape.add(
        key, Session::from_bytes(bytes.data(), bytes.size(), Device::cpu(), std::move(o)),
        options.max_imports);
  }

  // B's inputs and outputs; b_none when there is nothing left to run.
  void plan_b(const std::map<std::string, kiln::onnx::Value>& vals) {
    std::set<std::string> produced;
    for (int i : b_nodes)
      for (const auto& o : proto.graph().node(i).output()) produced.insert(o);
    std::set<std::string> need;
    for (int i : b_nodes)
      for (const std::string& r : reads_of(proto.graph().node(i)))
        if (!produced.count(r)) need.insert(r);
    for (const std::string& o : outputs)
      if (!vals.count(o)) {
        b_outputs.push_back(o);
        if (!produced.count(o)) need.insert(o);
      }
    b_none = b_outputs.empty();
    for (const std::string& r : need)
      if (!initializer(r)) b_inputs.push_back(r);
  }

  std::string b_bytes(const std::map<std::string, kiln::onnx::Value>& vals, bool exact) const {
    std::vector<::onnx::ValueInfoProto> ins;
    for (const std::string& in : b_inputs) {
      if (const auto* gi = graph_input(in)) ins.push_back(*gi);
      else ins.push_back(crossing(in, vals.at(in), exact));
    }
    return part(b_nodes, ins, b_outputs);
  }

  std::shared_ptr<Session> b_for(const std::map<std::string, kiln::onnx::Value>& vals) {
    std::set<std::string> names(b_inputs.begin(), b_inputs.end());
    if (!b_per_shape) {
      if (b_dynamic) return b_dynamic;
      try {
        const std::string bytes = b_bytes(vals, false);
        b_dynamic = std::make_shared<Session>(
            Session::from_bytes(bytes.data(), bytes.size(), device, options_for(options, names)));
        return b_dynamic;
      } catch (const InputValuesNeeded&) {
        throw;
      } catch (const Error&) {
        // (a dim that B must know while importing: one import per shape; a model B cannot
        // import at all fails there again, with the same error)
        b_per_shape = true;
      }
    }
    std::string key;
    for (const std::string& in : b_inputs)
      if (auto it = vals.find(in); it != vals.end() && !graph_input(in))
        key += in + str(it->second.tensor.shape()) + "|";
    if (auto s = b_by_shape.find(key)) return s;
    const std::string bytes = b_bytes(vals, true);
    return b_by_shape.add(
        key, Session::from_bytes(bytes.data(), bytes.size(), device, options_for(options, names)),
        options.max_imports);
  }
};

std::shared_ptr<SplitModel> split_model(const std::vector<uint8_t>& bytes, const std::string& node,
                                        const std::vector<Shape>& output_dims, Device device,
                                        const SessionOptions& options) {
  auto m = std::make_shared<SplitModel>();
  if (!m->proto.ParseFromArray(bytes.data(), static_cast<int>(bytes.size())))
    fail<FormatError>("[onnx] not an ONNX model: the protobuf does not parse");
  const auto& g = m->proto.graph();
  for (int i = 0; i < g.node_size(); ++i)
    if (g.node(i).output_size() && g.node(i).output(0) == node) m->node = i;
  if (m->node < 0) return nullptr;  // (in a subgraph)
  m->device = device;
  m->options = options;
  m->strings = first_string_node(m->proto) == node;
  const auto& made_by_node = g.node(m->node).output();
  for (int k = 0; k < made_by_node.size() && k < static_cast<int>(output_dims.size()); ++k)
    m->node_dims[made_by_node[k]] = output_dims[static_cast<size_t>(k)];
  for (const auto& o : g.output()) m->outputs.push_back(o.name());
  // A: the nodes the split node depends on, through their producers
  std::map<std::string, int> producer;
  for (int i = 0; i < g.node_size(); ++i)
    for (const auto& o : g.node(i).output())
      if (!o.empty()) producer[o] = i;
  std::vector<char> in_a(static_cast<size_t>(g.node_size()), 0);
  std::vector<int> todo{m->node};
  while (!todo.empty()) {
    const int i = todo.back();
    todo.pop_back();
    for (const std::string& r : reads_of(g.node(i)))
      if (auto it = producer.find(r); it != producer.end() && !in_a[it->second]) {
        in_a[it->second] = 1;
        todo.push_back(it->second);
      }
  }
  if (in_a[m->node]) fail<FormatError>("[onnx] the graph has a cycle through node '{}'", node);
  for (int i = 0; i < g.node_size(); ++i) {
    if (i == m->node) continue;
    (in_a[i] ? m->a_nodes : m->b_nodes).push_back(i);
  }
  if (m->a_nodes.empty()) return m;
  // A's inputs: the graph inputs its nodes read; its outputs: what it makes that the node, B or
  // the graph's outputs read
  std::set<std::string> made, read_a, read_rest;
  for (int i : m->a_nodes) {
    for (const auto& o : g.node(i).output()) made.insert(o);
    for (const std::string& r : reads_of(g.node(i))) read_a.insert(r);
  }
  for (int i = 0; i < g.node_size(); ++i)
    if (!in_a[i])
      for (const std::string& r : reads_of(g.node(i))) read_rest.insert(r);
  for (const std::string& o : m->outputs) read_rest.insert(o);
  std::vector<::onnx::ValueInfoProto> ins;
  std::set<std::string> names;
  for (const auto& in : g.input())
    if (read_a.count(in.name()) && !m->initializer(in.name())) {
      ins.push_back(in);
      names.insert(in.name());
      m->a_inputs.push_back(in.name());
    }
  for (const std::string& o : made)
    if (read_rest.count(o)) m->a_outputs.push_back(o);
  const std::string a = m->part(m->a_nodes, ins, m->a_outputs);
  m->a.emplace(Session::from_bytes(a.data(), a.size(), device, options_for(options, names)));
  return m;
}

namespace {
// The node, on the host: its inputs are read there (a device value is copied).
void run_node_part(SplitModel& m, const ::onnx::NodeProto& nd, Session& node,
                   std::map<std::string, kiln::onnx::Value>& vals) {
  std::map<std::string, Array> host;
  for (const std::string& name : m.n_inputs) {
    auto it = vals.find(name);
    if (it == vals.end()) fail<ValueError>("[onnx] input '{}' has no feed", name);
    if (it->second.is_sequence || it->second.is_none || it->second.is_string)
      fail<UnsupportedError>("[onnx] value '{}' of a data-dependent node is not a tensor", name);
    host[name] = it->second.tensor.to(Device::cpu());
  }
  const std::vector<Array> made = node.run(host);
  size_t k = 0;
  for (const auto& o : nd.output())
    if (!o.empty()) vals[o] = kiln::onnx::Value::of(made.at(k++));
}

// A node of strings, run by run_string_node; its initializers read from the model.
void run_string_part(SplitModel& m, const ::onnx::NodeProto& nd,
                     std::map<std::string, kiln::onnx::Value>& vals) {
  std::vector<kiln::onnx::Value> inits;  // (those the node reads; reserved: pointers stay put)
  inits.reserve(static_cast<size_t>(nd.input_size()));
  std::vector<const kiln::onnx::Value*> in;
  for (const auto& name : nd.input()) {
    if (name.empty()) {
      in.push_back(nullptr);
      continue;
    }
    if (auto it = vals.find(name); it != vals.end()) {
      in.push_back(&it->second);
      continue;
    }
    const ::onnx::TensorProto* init = nullptr;
    for (const auto& t : m.proto.graph().initializer())
      if (t.name() == name) init = &t;
    if (!init) fail<ValueError>("[onnx] input '{}' has no feed", name);
    inits.push_back(
        init->data_type() == ::onnx::TensorProto::STRING
            ? strings_of(*init)
            : kiln::onnx::Value::of(read_tensor(*init, m.options.import.external_data_dir)));
    in.push_back(&inits.back());
  }
  std::vector<kiln::onnx::Value> out = run_string_node(nd, in);
  for (int k = 0; k < nd.output_size() && k < static_cast<int>(out.size()); ++k)
    if (!nd.output(k).empty()) vals[nd.output(k)] = std::move(out[static_cast<size_t>(k)]);
}
}  // namespace

std::vector<kiln::onnx::Value> run_split(SplitModel& m,
                                         const std::map<std::string, kiln::onnx::Value>& feeds) {
  std::map<std::string, kiln::onnx::Value> vals = feeds;
  if (m.a) {
    std::map<std::string, kiln::onnx::Value> in;
    for (const std::string& name : m.a_inputs)
      if (auto it = feeds.find(name); it != feeds.end()) in.emplace(name, it->second);
    std::vector<kiln::onnx::Value> out = m.a->run_values(in);
    for (size_t k = 0; k < out.size(); ++k) vals[m.a_outputs[k]] = std::move(out[k]);
  }
  std::shared_ptr<Session> b, node;
  const auto& nd = m.proto.graph().node(m.node);
  if (m.strings) {
    run_string_part(m, nd, vals);
  } else {
    {
      std::lock_guard<std::mutex> l(m.mu);
      node = m.node_for(vals);
    }
    run_node_part(m, nd, *node, vals);
  }
  {
    std::lock_guard<std::mutex> l(m.mu);
    if (m.b_outputs.empty() && !m.b_none) m.plan_b(vals);
    if (!m.b_none) b = m.b_for(vals);
  }
  if (b) {
    std::map<std::string, kiln::onnx::Value> in;
    for (const std::string& name : m.b_inputs) {
      auto it = vals.find(name);
      if (it == vals.end()) continue;  // (a missing feed: B's session names it)
      // (moved where no graph output reads it: a string value is not copied)
      const bool output = std::count(m.outputs.begin(), m.outputs.end(), name) > 0;
      kiln::onnx::Value v = output ? it->second : std::move(it->second);
      if (!v.is_sequence && !v.is_none && !v.is_string && v.tensor.device() != m.device)
        v.tensor = v.tensor.to(m.device);
      in.emplace(name, std::move(v));
    }
    std::vector<kiln::onnx::Value> out = b->run_values(in);
    for (size_t j = 0; j < out.size(); ++j) vals[m.b_outputs[j]] = std::move(out[j]);
  }
  std::vector<kiln::onnx::Value> result;
  for (size_t k = 0; k < m.outputs.size(); ++k) {
    const std::string& o = m.outputs[k];
    auto it = vals.find(o);
    if (it == vals.end()) fail<FormatError>("[onnx] graph output '{}' is not produced", o);
    // (moved out where no later output is the same value)
    const bool again = std::find(m.outputs.begin() + static_cast<std::ptrdiff_t>(k) + 1,
                                 m.outputs.end(), o) != m.outputs.end();
    kiln::onnx::Value v = again ? it->second : std::move(it->second);
    if (!v.is_sequence && !v.is_none && !v.is_string && v.tensor.device() != m.device)
      v.tensor = v.tensor.to(m.device);
    result.push_back(std::move(v));
  }
  return result;
}

const std::vector<std::string>& split_output_names(const SplitModel& m) { return m.outputs; }

namespace {
// Calls f on each part's session made so far (under m.mu).
template <typename F> void each_part(const SplitModel& m, F&& f) {
  if (m.a) f(*m.a);
  for (const auto& [key, s] : m.n_by_shape.list) f(*s);
  if (m.b_dynamic) f(*m.b_dynamic);
  for (const auto& [key, s] : m.b_by_shape.list) f(*s);
}
}  // namespace

int64_t split_imports(const SplitModel& m) {
  std::lock_guard<std::mutex> l(m.mu);
  int64_t n = m.b_by_shape.dropped + m.n_by_shape.dropped;
  each_part(m, [&](const Session& s) { n += s.imports(); });
  return n;
}

size_t split_kept(const SplitModel& m) {
  std::lock_guard<std::mutex> l(m.mu);
  size_t n = 0;
  each_part(m, [&](const Session& s) { n += s.kept(); });
  return n;
}

std::vector<std::string> split_value_inputs(const SplitModel& m) {
  std::lock_guard<std::mutex> l(m.mu);
  std::vector<std::string> r;
  // (the model's inputs among the parts' value inputs; the node's session reads all of its own)
  each_part(m, [&](const Session& s) {
    for (const auto& [key, node] : m.n_by_shape.list)
      if (&s == node.get()) return;
    for (const std::string& n : s.value_inputs())
      if (m.graph_input(n) && std::find(r.begin(), r.end(), n) == r.end()) r.push_back(n);
  });
  return r;
}

std::shared_ptr<const Model> split_first_model(const SplitModel& m) {
  return m.a ? m.a->model() : nullptr;
}

}  // namespace kiln::onnx::detail
