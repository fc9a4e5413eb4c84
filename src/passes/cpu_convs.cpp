// Convolutions on the CPU:
//   - conv -> add(., residual) -> relu, clip, hardswish, sigmoid or silu (either or both, each
//     value read only by the next) becomes one fused_conv node, whose oneDNN primitive adds the
//     residual and applies the activation as post-ops while its output is still in cache: one
//     kernel and no pass over the activations per absorbed node;
//   - a conv whose weight is a constant gets const_weight: its kernel lays the weight out for
//     oneDNN once instead of at every run.
// Only f32 convolutions in plain layout change (the ones oneDNN runs; f64 and the loops' shapes
// would gain nothing).
// And max_pool nodes whose indices nothing reads get no_indices.
#include "core/op_registry.h"
#include "passes/conv_epilogue.h"

namespace kiln {

using detail::Node;
using detail::ValueRef;

ConvEpilogue conv_epilogue(const Program& p, int32_t conv,
                           const std::function<int32_t(int32_t)>& sole_reader,
                           const std::vector<char>& taken, bool activations) {
  ConvEpilogue e;
  const auto& nodes = p.graph.nodes;
  const TensorInfo& out = nodes[conv].outputs[0];
  int32_t cur = conv;
  if (int32_t r = sole_reader(cur); r >= 0 && nodes[r].op == OpId::Add && !taken[r]) {
    const Node& add = nodes[r];
    const ValueRef other = add.inputs[0].node == cur ? add.inputs[1] : add.inputs[0];
    const TensorInfo& o = p.graph.info(other);
    if (other.node != cur && o.shape == out.shape && o.dtype == out.dtype &&
        add.outputs[0].shape == out.shape) {
      e.residual = other;
      e.absorbed.push_back(r);
      cur = r;
    }
  }
  if (int32_t r = sole_reader(cur); r >= 0 && !taken[r]) {
    const OpId op = nodes[r].op;
    if (op == OpId::Relu) {
      e.relu = true;
      e.absorbed.push_back(r);
    } else if (activations && nodes[r].inputs.size() == 1 &&
               (op == OpId::Clip || op == OpId::Hardswish || op == OpId::Sigmoid ||
                op == OpId::Silu)) {
      e.activation = r;
      e.absorbed.push_back(r);
    }
  }
  if (!e.absorbed.empty()) e.last = e.absorbed.back();
  return e;
}

void set_epilogue_attrs(const Program& p, const ConvEpilogue& e, Attrs& a) {
  a.set("relu", e.relu);
  a.set("has_residual", e.residual.has_value());
  if (e.activation < 0) return;
  const Node& act = p.graph.nodes[e.activation];
  switch (act.op) {
    case OpId::Clip:
      a.set("activation", std::string("clip"));
      a.set("act_min", act.attrs.f("min"));
      a.set("act_max", act.attrs.f("max"));
      break;
    case OpId::Hardswish:
      a.set("activation", std::string("hardswish"));
      break;
    case OpId::Sigmoid:
      a.set("activation", std::string("sigmoid"));
      break;
    default:
      a.set("activation", std::string("silu"));
  }
}

namespace {
// The convolutions whose epilogue this pass fuses: f32 in plain layout (the channels_last pass
// fused those of NHWC ones).
bool cpu_conv(const Node& n) {
  return n.op == OpId::Conv && n.outputs[0].dtype == f32 && !n.attrs.b("channels_last", false);
}
// The f32 convolutions (of either layout, fused or not) whose weight oneDNN may lay out once.
bool packable(const Node& n) {
  return (n.op == OpId::Conv || n.op == OpId::FusedConv) && n.outputs[0].dtype == f32;
}
}  // namespace

Program prepare_cpu_convs(const Program& p, bool fuse_epilogues) {
  const auto& nodes = p.graph.nodes;
  const std::vector<int32_t> reader = sole_readers(p);
  auto sole_reader = [&](int32_t id) {
    // (a node with several outputs: a reader of another output is not an epilogue)
    return nodes[id].outputs.size() == 1 && reader[id] >= 0 ? reader[id] : -1;
  };
  std::vector<char> taken(nodes.size(), 0);
  std::vector<int32_t> fused_at(nodes.size(), -1);  // last node of an epilogue -> its conv
  std::vector<ConvEpilogue> epilogue(nodes.size());
  bool any = false;
  for (size_t i = 0; i < nodes.size(); ++i) {
    any = any || packable(nodes[i]);
    if (!cpu_conv(nodes[i]) || !fuse_epilogues) continue;
    ConvEpilogue e = conv_epilogue(p, static_cast<int32_t>(i), sole_reader, taken, true);
    if (e.last < 0) continue;
    for (int32_t a : e.absorbed) taken[a] = 1;
    fused_at[e.last] = static_cast<int32_t>(i);
    epilogue[i] = std::move(e);
  }
  if (!any) return p;
  // (a conv whose weight is a constant: its kernel lays the weight out for oneDNN once)
  auto mark = [&](Attrs& a, const Node& conv) {
    if (nodes[conv.inputs[1].node].op == OpId::Constant) a.set("const_weight", true);
  };
  ProgramBuilder b(p);
  for (size_t i = 0; i < nodes.size(); ++i) {
    const auto id = static_cast<int32_t>(i);
    if (epilogue[i].last >= 0 || (taken[i] && fused_at[i] < 0)) continue;  // emitted at its end
    if (fused_at[i] < 0) {
      const int32_t c = b.copy(id);
      if (packable(nodes[i])) mark(b.graph().nodes[c].attrs, nodes[i]);
      continue;
    }
    // the conv, at its last absorbed node: every input (the residual too) exists here
    const Node& conv = nodes[fused_at[i]];
    const ConvEpilogue& e = epilogue[fused_at[i]];
    std::vector<ValueRef> in;
    for (auto v : conv.inputs) in.push_back(b.remap(v));
    if (e.residual) in.push_back(b.remap(*e.residual));
    Attrs a = conv.attrs;
    set_epilogue_attrs(p, e, a);
    mark(a, conv);
    const int32_t f = b.graph().add(OpId::FusedConv, std::move(in), std::move(a), conv.name);
    b.graph().nodes[f].origin = nodes[i].origin;
    b.map(id, {{f, 0}});
  }
  return b.finish();
}

Program drop_unread_pool_indices(const Program& p) {
  const auto& nodes = p.graph.nodes;
  std::vector<char> read(nodes.size(), 0);  // a max_pool's indices (output 1) are read
  auto mark = [&](ValueRef v) {
    if (v.index == 1 && nodes[v.node].op == OpId::MaxPool) read[v.node] = 1;
  };
  for (const Node& n : nodes)
    for (auto v : n.inputs) mark(v);
  for (auto v : p.outputs) mark(v);
  bool any = false;
  for (size_t i = 0; i < nodes.size(); ++i)
    any |= nodes[i].op == OpId::MaxPool && !read[i] && !nodes[i].attrs.b("no_indices", false);
  if (!any) return p;
  Program q = p;
  for (size_t i = 0; i < nodes.size(); ++i)
    if (nodes[i].op == OpId::MaxPool && !read[i]) q.graph.nodes[i].attrs.set("no_indices", true);
  return q;
}

namespace {
// f32 and bf16 products (the ones oneDNN runs) whose weight is a constant matrix.
bool const_weight_product(const Program& p, const Node& n) {
  if (n.op != OpId::Matmul && n.op != OpId::Linear && n.op != OpId::FusedMatmul) return false;
  if (n.outputs[0].dtype != f32 && n.outputs[0].dtype != bf16) return false;
  const ValueRef w = n.inputs[1];
  return p.graph.nodes[w.node].op == OpId::Constant && p.graph.info(w).shape.size() == 2 &&
         !n.attrs.b("const_weight", false);
}
}  // namespace

Program mark_cpu_const_weights(const Program& p) {
  const auto& nodes = p.graph.nodes;
  bool any = false;
  for (const Node& n : nodes) any = any || const_weight_product(p, n);
  if (!any) return p;
  Program q = p;
  for (size_t i = 0; i < nodes.size(); ++i)
    if (const_weight_product(p, nodes[i])) q.graph.nodes[i].attrs.set("const_weight", true);
  return q;
}

}  // namespace kiln
