#include "passes/program.h"

#include <cmath>

#include "core/element_limit.h"
#include "core/errors.h"
#include "core/op_registry.h"
#include "core/sym_dim.h"
#include "runtime/custom_op.h"

namespace kiln {

using detail::Node;
using detail::ValueRef;

int32_t ProgramBuilder::copy(int32_t id) {
  Node n = src_.graph.nodes[id];
  for (auto& v : n.inputs) v = remap(v);
  int32_t nid = out_.graph.add_inferred(std::move(n));
  std::vector<ValueRef> vals;
  for (size_t i = 0; i < out_.graph.nodes[nid].outputs.size(); ++i)
    vals.push_back({nid, static_cast<int32_t>(i)});
  map_[id] = std::move(vals);
  return nid;
}

Program ProgramBuilder::finish() {
  out_.outputs.clear();
  for (auto v : src_.outputs) out_.outputs.push_back(remap(v));
  out_.num_returned = src_.num_returned;
  return std::move(out_);
}

std::vector<int32_t> sole_readers(const Program& p) {
  const auto& nodes = p.graph.nodes;
  std::vector<int32_t> reader(nodes.size(), -1);
  for (size_t i = 0; i < nodes.size(); ++i)
    for (auto v : nodes[i].inputs)
      reader[v.node] = reader[v.node] == -1 ? static_cast<int32_t>(i) : -2;
  for (auto v : p.outputs) reader[v.node] = -2;
  return reader;
}

bool scalar_constant(const Program& p, ValueRef v, double& c) {
  const detail::Node& n = p.graph.nodes[v.node];
  if (n.op != OpId::Constant || !n.value.valid() || n.value.numel() != 1 ||
      !is_floating(n.value.dtype()))
    return false;
  c = n.value.astype(f64).to_vector<double>()[0];
  return std::isfinite(c);
}

Program extract_program(const detail::GraphImpl& g, const std::vector<ValueRef>& targets) {
  std::vector<char> needed(g.nodes.size(), 0);
  for (auto t : targets) needed[t.node] = 1;
  for (int i = static_cast<int>(g.nodes.size()) - 1; i >= 0; --i)
    if (needed[i])
      for (auto v : g.nodes[i].inputs) needed[v.node] = 1;
  Program src;
  src.graph = g;  // ProgramBuilder reads from a Program
  src.outputs = targets;
  src.num_returned = targets.size();
  for (size_t i = 0; i < src.graph.nodes.size(); ++i) src.graph.nodes[i].origin = static_cast<int32_t>(i);
  ProgramBuilder b(src);
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (needed[i]) b.copy(static_cast<int32_t>(i));
  return b.finish();
}

namespace {
// Nodes that specialize_shapes computes on the host: those whose values size something (they feed
// a value input, OpDef::value_attrs), small, pure, with one output and every input a constant.
constexpr int64_t kMaxShapeValue = int64_t{1} << 16;

void make_constant(Node& n, Array value) {
  n.op = OpId::Constant;
  n.inputs.clear();
  n.attrs = Attrs{};
  n.outputs = {{value.shape(), value.dtype()}};
  n.value = std::move(value);
}

// Which nodes a value input reads, directly or through other nodes.
std::vector<char> feeding_values(const detail::GraphImpl& g) {
  std::vector<char> r(g.nodes.size(), 0);
  for (size_t i = g.nodes.size(); i-- > 0;) {
    const Node& n = g.nodes[i];
    const size_t k = n.attrs.b("from_values", false) ? op_def(n.op).value_attrs.size() : 0;
    for (size_t j = 0; j < n.inputs.size(); ++j)
      if (r[i] || j + k >= n.inputs.size()) r[n.inputs[j].node] = 1;
  }
  return r;
}

bool computable(const detail::GraphImpl& g, const Node& n) {
  if (!op_def(n.op).pure || detail::is_custom(n.op) || n.outputs.size() != 1 || n.inputs.empty())
    return false;
  if (!is_static(n.outputs[0].shape) || numel(n.outputs[0].shape) > kMaxShapeValue) return false;
  for (auto v : n.inputs)
    if (g.nodes[v.node].op != OpId::Constant) return false;
  return true;
}

bool int_attr(const Attrs& a, const char* key) {
  for (const auto& [k, v] : a.items())
    if (k == key) return std::holds_alternative<int64_t>(v);
  return false;
}

// Writes the values of a node's value inputs (OpDef::value_attrs) into its attributes once they
// are constants: a 0-d value as a float (an int where the attribute is one), a 1-d one as ints.
void write_values(const detail::GraphImpl& g, Node& n) {
  const auto& keys = op_def(n.op).value_attrs;
  const size_t first = n.inputs.size() - keys.size();
  for (size_t k = 0; k < keys.size(); ++k)
    if (g.nodes[n.inputs[first + k].node].op != OpId::Constant) return;
  for (size_t k = 0; k < keys.size(); ++k) {
    const Array& v = g.nodes[n.inputs[first + k].node].value;
    if (v.rank() == 0 && int_attr(n.attrs, keys[k]))  // (topk's k, one_hot's depth)
      n.attrs.set(keys[k], v.astype(i64).to_vector<int64_t>().at(0));
    else if (v.rank() == 0) n.attrs.set(keys[k], v.astype(f64).to_vector<double>().at(0));
    else n.attrs.set(keys[k], v.astype(i64).to_vector<int64_t>());
  }
  n.inputs.resize(first);
  n.attrs.set("from_values", false);
}
}  // namespace

bool specialize_shapes(Program& p, const std::vector<std::pair<int32_t, Shape>>& shapes,
                       bool allow_dynamic, const NodeEvaluator* eval) {
  bool all_static = true;
  const std::vector<char> feeds_values = feeding_values(p.graph);
  for (size_t i = 0; i < p.graph.nodes.size(); ++i) {
    Node& n = p.graph.nodes[i];
    if (n.op == OpId::Placeholder) {
      Shape& s = n.outputs[0].shape;
      for (auto& [origin, shape] : shapes) {
        if (origin != n.origin) continue;
        bool ok = shape.size() == s.size();
        for (size_t i = 0; ok && i < s.size(); ++i) ok = s[i] < 0 || s[i] == shape[i];
        for (size_t i = 0; ok && i < shape.size(); ++i) ok = shape[i] >= 0 || allow_dynamic;
        if (!ok)
          fail<ShapeError>("[compile] placeholder '{}' declared with shape {} cannot take shape {}",
                           n.name, str(s), str(shape));
        for (size_t i = 0; i < s.size(); ++i) s[i] = shape[i] >= 0 ? shape[i] : s[i];
      }
      if (!is_static(s) && !allow_dynamic)
        fail<ShapeError>("[compile] placeholder '{}' has dynamic shape {}: give its shape when "
                         "compiling",
                         n.name, str(s));
      all_static = all_static && is_static(s);
      continue;
    }
    if (n.op == OpId::Constant || n.op == OpId::Variable) continue;
    // an attribute shape read from the last input's shape: written in once that is static
    if (n.attrs.b("shape_like", false) && is_static(p.graph.info(n.inputs.back()).shape)) {
      n.attrs.set("shape", p.graph.info(n.inputs.back()).shape).set("shape_like", false);
      n.inputs.pop_back();
    }
    if (n.attrs.b("from_values", false)) write_values(p.graph, n);
    std::vector<TensorInfo> in;
    for (auto v : n.inputs) in.push_back(p.graph.info(v));
    if (const auto resolve = op_def(n.op).resolve_static) {
      bool all = true;
      for (const TensorInfo& t : in) all = all && is_static(t.shape);
      if (all) resolve(n.attrs, in);
    }
    InferContext ctx{n.op, n.attrs, in, &n.bodies};
    n.outputs = infer_node(ctx);
    for (const TensorInfo& o : n.outputs)  // (a size computed from shapes may be anything)
      if (!within_element_limit(o.shape))
        fail<ShapeError>("[{}] (node %{}) output of shape {} has more than 2^59 elements",
                         op_name(n.op), i, str(o.shape));
    if (n.op == OpId::ShapeOf && is_static(in[0].shape)) {
      const Shape& s = in[0].shape;
      make_constant(n, Array::from_vector(std::vector<int64_t>(s.begin(), s.end()),
                                          {static_cast<int64_t>(s.size())}));
    } else if (eval && feeds_values[i] && computable(p.graph, n)) {
      std::vector<Array> values;
      for (auto v : n.inputs) values.push_back(p.graph.nodes[v.node].value);
      make_constant(n, (*eval)(n, values).at(0));
    }
  }
  if (all_static && !allow_dynamic)
    for (size_t i = 0; i < p.graph.nodes.size(); ++i) {
      const Node& n = p.graph.nodes[i];
      if (n.op == OpId::ShapeOf || n.attrs.b("from_values", false))
        fail<ShapeError>(
            "[compile] {} (node %{}) takes {} from a value computed from the run's data, not from "
            "shapes alone: kiln needs it before the run starts (compute it from shape_of, "
            "constants and integer arithmetic)",
            op_name(n.op), i,
            n.op == OpId::ShapeOf ? "its input's shape"
                                  : fmt::format("attribute {}", op_def(n.op).value_attrs.at(0)));
    }
  return all_static;
}

Program order_assignments(const Program& p) {
  const auto& nodes = p.graph.nodes;
  std::vector<char> late(nodes.size(), 0);
  bool any = false;
  for (size_t i = 0; i < nodes.size(); ++i) {
    late[i] = op_def(nodes[i].op).writes_variable;
    for (auto v : nodes[i].inputs) late[i] = late[i] || late[v.node];
    any = any || late[i];
  }
  if (!any) return p;
  ProgramBuilder b(p);
  for (int pass = 0; pass < 2; ++pass)
    for (size_t i = 0; i < nodes.size(); ++i)
      if (late[i] == pass) b.copy(static_cast<int32_t>(i));
  return b.finish();
}

void verify_program(const Program& p, const std::string& after_pass) {
  const auto& nodes = p.graph.nodes;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    for (auto v : n.inputs)
      if (v.node < 0 || v.node >= static_cast<int32_t>(i) || v.index < 0 ||
          v.index >= static_cast<int32_t>(nodes[v.node].outputs.size()))
        fail<Error>("[verify] after {}: node %{} ({}) reads invalid value %{}:{}", after_pass, i,
                    op_name(n.op), v.node, v.index);
    if (n.op == OpId::Placeholder || n.op == OpId::Constant || n.op == OpId::Variable) continue;
    std::vector<TensorInfo> in;
    for (auto v : n.inputs) in.push_back(p.graph.info(v));
    InferContext ctx{n.op, n.attrs, in, &n.bodies};
    // (a symbolic program's nodes may know dims that their inference alone leaves unknown)
    const auto inferred = infer_node(ctx);
    bool same = inferred.size() == n.outputs.size();
    for (size_t k = 0; same && k < inferred.size(); ++k) {
      const Shape &a = inferred[k].shape, &b = n.outputs[k].shape;
      same = inferred[k].dtype == n.outputs[k].dtype && a.size() == b.size();
      for (size_t d = 0; same && d < a.size(); ++d)
        same = a[d] == b[d] || ((a[d] == kDynamic || sym::is_symbolic(a[d])) &&
                                sym::is_symbolic(b[d]));  // (instantiate checks these)
    }
    if (!same)
      fail<Error>("[verify] after {}: node %{} ({}) has stale shapes", after_pass, i,
                  op_name(n.op));
  }
  for (auto v : p.outputs)
    if (v.node < 0 || v.node >= static_cast<int32_t>(nodes.size()))
      fail<Error>("[verify] after {}: output refers to missing node %{}", after_pass, v.node);
}

}  // namespace kiln
