// Symbolic shape inference for every op: each harness case built again on placeholders whose
// dims are all dynamic, made symbolic (symbolize: each dim a symbol), must give the op's outputs
// dims that are sizes or expressions of the symbols, never unknown, and each must evaluate, with
// every symbol taking the size the static build of the case fed, to the dim the static build
// inferred. The ops without a symbolic rule yet are listed with the reason; the test fails for an
// op missing from the list and for a listed op that passes (so the list stays true).
#include <fmt/format.h>

#include <map>

#include "backend_ops/harness.h"
#include "core/op_registry.h"
#include "core/sym_dim.h"
#include "passes/program.h"

namespace kiln::harness {
namespace {

// Ops whose inference leaves a dim unknown on symbolic inputs, and why.
const std::map<OpId, const char*>& no_symbolic_rule() {
  static const std::map<OpId, const char*> ops = {
      // the number of boxes kept depends on the data
      {OpId::NonMaxSuppression, "its output's length depends on the boxes and scores"},
      // shape functions are user code: they see dynamic dims as -1, and what they give back
      // stays unknown
      {OpId::Custom, "a custom op's shape function sees -1 for a dynamic dim"},
      {OpId::CustomImpure, "a custom op's shape function sees -1 for a dynamic dim"},
      // built on dynamic dims, its batch dims are not broadcast, so the program differs from
      // the static build's (tests/backend_ops/dynamic_dims.cpp lists it too)
      {OpId::TriangularSolve, "batch dims broadcast along dims dynamic when built"},
  };
  return ops;
}

std::vector<int32_t> nodes_of(const Program& p, OpId op) {
  std::vector<int32_t> r;
  for (size_t i = 0; i < p.graph.nodes.size(); ++i)
    if (p.graph.nodes[i].op == op) r.push_back(static_cast<int32_t>(i));
  return r;
}

Program program_of(const Case& c) {
  std::vector<detail::ValueRef> outs;
  for (const Tensor& t : c.outs) outs.push_back({t.node_id(), t.output_index()});
  return extract_program(c.g.impl(), outs);
}

// What is wrong with the symbolic inference of case `i` ("" when right, "n/a" when the case does
// not apply or cannot be built on dynamic dims).
std::string check_case(const OpCases& oc, DType t, int i) {
  Case fixed, dyn;
  dyn.dynamic_inputs = true;
  try {
    if (!oc.build(fixed, t, i) || !oc.build(dyn, t, i)) return "n/a";
  } catch (const std::exception&) {
    return "n/a";  // (tests/backend_ops/dynamic_dims.cpp lists the ops that need static dims)
  }
  if (dyn.feeds.size() != fixed.feeds.size()) return "n/a";
  const Program want = program_of(fixed);
  Program got = program_of(dyn);
  try {
    symbolize(got);
  } catch (const std::exception& e) {
    return std::string("symbolic inference threw: ") + e.what();
  }
  // each symbol takes the size the static build fed
  std::map<std::string, int64_t> sizes;
  for (size_t k = 0; k < dyn.feeds.size(); ++k) {
    const int32_t id = dyn.feeds[k].first.node_id();
    const Shape& fed = fixed.feeds[k].second.shape();
    for (const detail::Node& n : got.graph.nodes) {
      if (n.op != OpId::Placeholder || n.origin != id) continue;
      const Shape& s = n.outputs[0].shape;
      if (s.size() != fed.size()) return "n/a";
      for (size_t d = 0; d < s.size(); ++d)
        if (sym::is_symbolic(s[d])) sizes[sym::str(s[d])] = fed[d];
    }
  }
  auto value = [&](const std::string& name) {
    auto it = sizes.find(name);
    return it == sizes.end() ? kDynamic : it->second;
  };
  const auto in_want = nodes_of(want, oc.op), in_got = nodes_of(got, oc.op);
  if (in_want.size() != in_got.size() || in_got.empty()) return "n/a";
  for (size_t j = 0; j < in_got.size(); ++j) {
    const auto &w = want.graph.nodes[in_want[j]].outputs, &g = got.graph.nodes[in_got[j]].outputs;
    if (w.size() != g.size()) return "n/a";
    for (size_t k = 0; k < g.size(); ++k) {
      if (!is_static(w[k].shape) || w[k].shape.size() != g[k].shape.size()) return "n/a";
      for (size_t d = 0; d < g[k].shape.size(); ++d) {
        const int64_t s = g[k].shape[d];
        if (s < 0 && !sym::is_symbolic(s))
          return fmt::format("output {} has shape {}: dim {} is unknown", k, sym::str(g[k].shape),
                             d);
        if (sym::evaluate(s, value) != w[k].shape[d])
          return fmt::format(
              "output {} has symbolic shape {}, which is {} for the fed sizes, "
              "not {}",
              k, sym::str(g[k].shape), sym::evaluate(s, value), to_string(w[k].shape));
      }
    }
  }
  return {};
}

TEST(SymbolicDims, EveryOpInfersSymbolicShapes) {
  expect_listed_failures(check_case, no_symbolic_rule(), "ops without a symbolic rule", 100);
}

}  // namespace
}  // namespace kiln::harness
