#include "passes/program.h"

#include "core/errors.h"
#include "core/op_registry.h"

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

bool specialize_shapes(Program& p, const std::vector<std::pair<int32_t, Shape>>& shapes,
                       bool allow_dynamic) {
  bool all_static = true;
  for (auto& n : p.graph.nodes) {
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
    std::vector<TensorInfo> in;
    for (auto v : n.inputs) in.push_back(p.graph.info(v));
    InferContext ctx{n.op, n.attrs, in};
    n.outputs = infer_node(ctx);
  }
  return all_static;
}

Program order_assignments(const Program& p) {
  const auto& nodes = p.graph.nodes;
  std::vector<char> late(nodes.size(), 0);
  bool any = false;
  for (size_t i = 0; i < nodes.size(); ++i) {
    late[i] = nodes[i].op == OpId::Assign;
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
    InferContext ctx{n.op, n.attrs, in};
    if (infer_node(ctx) != n.outputs)
      fail<Error>("[verify] after {}: node %{} ({}) has stale shapes", after_pass, i,
                  op_name(n.op));
  }
  for (auto v : p.outputs)
    if (v.node < 0 || v.node >= static_cast<int32_t>(nodes.size()))
      fail<Error>("[verify] after {}: output refers to missing node %{}", after_pass, v.node);
}

}  // namespace kiln
