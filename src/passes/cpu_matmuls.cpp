// fuse_cpu_matmul_epilogues (CPU, f32): a matmul whose B is a matrix, or a linear, followed by a
// chain of elementwise steps, each value read only by the next, becomes one fused_matmul node:
//   - add or mul with an operand of the product's shape or a row of it (a bias, a residual, the
//     other half of a gated unit);
//   - relu, gelu (either form), sigmoid, silu or tanh.
// Its kernel applies the steps as post-ops of oneDNN's primitive while the product's tiles are
// still in registers and cache: one kernel and no pass over the output per step. A linear's bias
// becomes the first step. A value an assign writes into a variable is not taken in (its
// elementwise node writes it into the variable's own storage). Reshapes that keep the last dim may
// stand between the steps (a 2-D product reshaped back to the batch's dims, as dynamo writes Gemm):
// the fused node then reads x reshaped to the last one's leading dims. At most kMaxMatmulSteps
// steps; a product with nothing to absorb stays as it is.
#include "core/graph_impl.h"
#include "core/op_registry.h"
#include "ops/linalg_params.h"
#include "passes/program.h"

namespace kiln {

using detail::Node;
using detail::ValueRef;

namespace {

struct Epilogue {
  Shape out;  // the last absorbed node's output shape
  std::vector<MatmulStep> steps;
  std::vector<ValueRef> operands;  // one per add or mul step, in order
  std::vector<int32_t> absorbed;   // the absorbed nodes, in order (the last one ends it)
};

// The product whose epilogue may be fused: f32, B (input 1) a matrix.
bool fusable_product(const Program& p, const Node& n) {
  if ((n.op != OpId::Matmul && n.op != OpId::Linear) || n.outputs.size() != 1 ||
      n.outputs[0].dtype != f32 || n.inputs.size() < 2)
    return false;
  const Shape& a = p.graph.info(n.inputs[0]).shape;
  const Shape& b = p.graph.info(n.inputs[1]).shape;
  return !a.empty() && b.size() == 2 && n.outputs[0].shape.size() == std::max<size_t>(a.size(), 1);
}

// Whether `o` (shape) is the output's shape or a row of it (every dim 1 but the last, N or 1).
bool operand_fits(const Shape& o, const Shape& out) {
  if (o == out) return true;
  if (o.size() > out.size()) return false;
  for (size_t d = 0; d + 1 < o.size(); ++d)
    if (o[d] != 1) return false;
  return o.empty() || o.back() == 1 || o.back() == out.back();
}

std::optional<MatmulStep> activation_step(const Node& n) {
  if (n.inputs.size() != 1) return std::nullopt;
  switch (n.op) {
    case OpId::Relu:
      return MatmulStep::relu;
    case OpId::Gelu:
      return n.attrs.str("approximate", "none") == "tanh" ? MatmulStep::gelu_tanh
                                                          : MatmulStep::gelu;
    case OpId::Sigmoid:
      return MatmulStep::sigmoid;
    case OpId::Silu:
      return MatmulStep::silu;
    case OpId::Tanh:
      return MatmulStep::tanh;
    default:
      return std::nullopt;
  }
}

}  // namespace

Program fuse_cpu_matmul_epilogues(const Program& p) {
  const auto& nodes = p.graph.nodes;
  const std::vector<int32_t> reader = sole_readers(p);
  // values an assign writes into a variable: the elementwise node that makes one writes it where
  // the variable lives (memory planning), which a product's epilogue would not
  std::vector<char> assigned(nodes.size(), 0);
  for (const Node& n : nodes)
    if (op_def(n.op).writes_variable)
      for (size_t k = 1; k < n.inputs.size(); ++k) assigned[n.inputs[k].node] = 1;
  auto sole_reader = [&](int32_t id) {
    return nodes[id].outputs.size() == 1 && reader[id] >= 0 ? reader[id] : -1;
  };
  std::vector<Epilogue> found(nodes.size());
  std::vector<int32_t> ends_at(nodes.size(), -1);  // last absorbed node -> its product
  std::vector<char> taken(nodes.size(), 0);
  bool any = false;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    if (!fusable_product(p, n)) continue;
    Epilogue e;
    e.out = n.outputs[0].shape;
    if (n.op == OpId::Linear && n.attrs.b("has_bias", false)) {
      e.steps.push_back(MatmulStep::add);
      e.operands.push_back(n.inputs[2]);
    }
    const size_t own = e.steps.size();
    for (int32_t cur = static_cast<int32_t>(i);
         e.steps.size() < static_cast<size_t>(kMaxMatmulSteps);) {
      const int32_t r = sole_reader(cur);
      if (r < 0 || taken[r] || assigned[r]) break;
      const Node& s = nodes[r];
      const Shape& so = s.outputs[0].shape;
      if (s.op == OpId::Reshape && s.inputs.size() == 1 && !so.empty() &&
          so.back() == e.out.back()) {
        e.out = so;  // (not a step: the fused node's output takes the shape)
        e.absorbed.push_back(r);
        cur = r;
        continue;
      }
      if (so != e.out || s.outputs[0].dtype != f32) break;
      if (const auto act = activation_step(s)) {
        e.steps.push_back(*act);
      } else if ((s.op == OpId::Add || s.op == OpId::Mul) && s.inputs.size() == 2 &&
                 (s.inputs[0].node == cur) != (s.inputs[1].node == cur)) {
        const ValueRef o = s.inputs[0].node == cur ? s.inputs[1] : s.inputs[0];
        const TensorInfo& oi = p.graph.info(o);
        if (oi.dtype != f32 || !operand_fits(oi.shape, e.out)) break;
        e.steps.push_back(s.op == OpId::Add ? MatmulStep::add : MatmulStep::mul);
        e.operands.push_back(o);
      } else {
        break;
      }
      e.absorbed.push_back(r);
      cur = r;
    }
    // (reshapes after the last step stay out)
    while (!e.absorbed.empty() && nodes[e.absorbed.back()].op == OpId::Reshape) {
      e.absorbed.pop_back();
      e.out = e.absorbed.empty() ? n.outputs[0].shape : nodes[e.absorbed.back()].outputs[0].shape;
    }
    if (e.steps.size() == own) continue;
    for (int32_t a : e.absorbed) taken[a] = 1;
    ends_at[e.absorbed.back()] = static_cast<int32_t>(i);
    found[i] = std::move(e);
    any = true;
  }
  if (!any) return p;
  ProgramBuilder b(p);
  for (size_t i = 0; i < nodes.size(); ++i) {
    const auto id = static_cast<int32_t>(i);
    if (!found[i].absorbed.empty() || (taken[i] && ends_at[i] < 0)) continue;  // at its end
    if (ends_at[i] < 0) {
      b.copy(id);
      continue;
    }
    // the product, at its last absorbed node: every operand exists here
    const Node& prod = nodes[ends_at[i]];
    const Epilogue& e = found[ends_at[i]];
    ValueRef x = b.remap(prod.inputs[0]);
    if (e.out != prod.outputs[0].shape) {  // x reshaped to the output's leading dims
      Shape xs = e.out;
      xs.back() = p.graph.info(prod.inputs[0]).shape.back();
      x = {b.graph().add(OpId::Reshape, {x}, {{"shape", xs}}), 0};
    }
    std::vector<ValueRef> in{x, b.remap(prod.inputs[1])};
    for (ValueRef o : e.operands) in.push_back(b.remap(o));
    std::vector<int64_t> steps;
    for (MatmulStep s : e.steps) steps.push_back(static_cast<int64_t>(s));
    Attrs a{{"transpose_b", prod.op == OpId::Linear}};
    a.set("epilogue", steps);
    if (prod.attrs.b("tf32", false)) a.set("tf32", true);
    const int32_t f = b.graph().add(OpId::FusedMatmul, std::move(in), std::move(a), prod.name);
    b.graph().nodes[f].origin = nodes[i].origin;
    b.map(id, {{f, 0}});
  }
  return b.finish();
}

}  // namespace kiln
