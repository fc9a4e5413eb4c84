// hoist_casts: a cast that narrows a float (f32 -> bf16, say) and reads a chain of reshapes and
// transposes moves to the chain's start, so the chain moves the narrow values (half the bytes)
// and the cast can join the elementwise group that made the values (fuse_elementwise), instead of
// running as a kernel of its own. Where the chain's start is itself a widening cast of a value of
// the narrow type (autocast's f32 copy of a bf16 product), the narrow value is read directly and
// no cast is left. Exact: casts commute with moving elements, and widening then narrowing back
// gives the value itself.
#include "core/graph_impl.h"
#include "passes/program.h"

namespace kiln {

using detail::Node;
using detail::ValueRef;

namespace {
bool moves_elements(const Node& n) {
  return (n.op == OpId::Reshape || n.op == OpId::Transpose) && n.inputs.size() == 1 &&
         n.outputs.size() == 1;
}
}  // namespace

Program hoist_casts(const Program& p) {
  const auto& nodes = p.graph.nodes;
  const size_t n = nodes.size();
  std::vector<int> reads(n, 0);
  std::vector<char> escapes(n, 0);
  for (const Node& nd : nodes)
    for (ValueRef v : nd.inputs) ++reads[v.node];
  for (ValueRef v : p.outputs) escapes[v.node] = 1;
  // low[i]: the dtype node i's chain moves once the cast is hoisted; hoisted[i]: a cast whose
  // value becomes its chain's last value
  std::vector<int> low(n, -1);
  std::vector<char> hoisted(n, 0);
  for (size_t i = 0; i < n; ++i) {
    const Node& c = nodes[i];
    if (c.op != OpId::Cast || c.inputs.size() != 1) continue;
    const DType to = c.outputs[0].dtype, from = p.graph.info(c.inputs[0]).dtype;
    if (!is_floating(to) || !is_floating(from) || size_of(to) >= size_of(from)) continue;
    auto joins = [&](int32_t u) {
      return moves_elements(nodes[u]) && reads[u] == 1 && !escapes[u] && low[u] < 0;
    };
    int32_t u = c.inputs[0].node;
    if (!joins(u)) continue;
    for (; joins(u); u = nodes[u].inputs[0].node) low[u] = static_cast<int>(to);
    hoisted[i] = 1;
  }
  ProgramBuilder b(p);
  for (size_t i = 0; i < n; ++i) {
    const auto id = static_cast<int32_t>(i);
    if (hoisted[i]) {
      b.map(id, {b.remap(nodes[i].inputs[0])});
      continue;
    }
    if (low[i] < 0) {
      b.copy(id);
      continue;
    }
    const auto to = static_cast<DType>(low[i]);
    Node nd = nodes[i];
    ValueRef in = b.remap(nd.inputs[0]);
    if (low[nd.inputs[0].node] < 0) {  // the chain's start: narrow here
      const Node& src = b.graph().nodes[in.node];
      if (src.op == OpId::Cast && b.graph().info(src.inputs[0]).dtype == to)
        in = src.inputs[0];
      else
        in = {b.graph().add(OpId::Cast, {in}, {{"dtype", to}}), 0};
    }
    nd.inputs = {in};
    nd.outputs[0].dtype = to;
    b.map(id, {{b.graph().add_inferred(std::move(nd)), 0}});
  }
  return b.finish();
}

}  // namespace kiln
