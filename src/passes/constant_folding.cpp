// Constant folding: a pure node whose inputs are all constants is evaluated at compile time and
// replaced by a Constant. Generators without inputs (full, arange) are only folded into readers.
// A large dequantize of int8 constants (weights stored as int8, such as post-training
// quantization's float classifier) stays a node: the program, and packages made from it, keep
// the int8 data; a linear reading it runs as quantized_weight_linear (fuse_quant, which runs
// first), other readers get it dequantized when run. A node that expands its inputs (an output
// over 1 MiB and over 4x their bytes: a broadcast, a gather of a table by a constant index of
// the batch's shape) stays a node too: computing it when run costs about what reading the
// folded copy would, and the copy would be made, hashed and held for every shape compiled.
#include <algorithm>

#include "core/op_registry.h"
#include "passes/program.h"

namespace kiln {

using detail::Node;
using detail::ValueRef;

namespace {
constexpr size_t kMaxFoldedBytes = size_t{64} << 20;
constexpr size_t kKeptInt8Bytes = size_t{256} << 10;  // dequantized size from which int8 stays
constexpr size_t kExpandedBytes = size_t{1} << 20;    // output size from which expansions stay

bool keeps_int8(const Program& p, const Node& n, size_t out_bytes) {
  if (n.op != OpId::Dequantize || out_bytes < kKeptInt8Bytes) return false;
  const Node& q = p.graph.nodes[n.inputs[0].node];
  const DType t = q.outputs[n.inputs[0].index].dtype;
  return q.op == OpId::Constant && (t == i8 || t == u8);
}
}  // namespace

Program fold_constants(const Program& p, const NodeEvaluator& eval) {
  const auto& nodes = p.graph.nodes;
  // evaluable[i]: node i is constant-evaluable; folds[i]: it is replaced by constants
  std::vector<char> evaluable(nodes.size(), 0), folds(nodes.size(), 0);
  bool any = false;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    if (n.op == OpId::Constant) {
      evaluable[i] = 1;
      continue;
    }
    bool can = n.op != OpId::Placeholder && op_def(n.op).pure;
    for (auto v : n.inputs) can = can && evaluable[v.node];
    size_t bytes = 0, in_bytes = 0;
    for (auto& o : n.outputs) bytes += static_cast<size_t>(numel(o.shape)) * size_of(o.dtype);
    for (auto v : n.inputs) {
      const TensorInfo& t = p.graph.info(v);
      in_bytes += static_cast<size_t>(std::max<int64_t>(numel(t.shape), 0)) * size_of(t.dtype);
    }
    const bool expands = !n.inputs.empty() && bytes > kExpandedBytes && bytes > 4 * in_bytes;
    can = can && bytes <= kMaxFoldedBytes && !expands && !keeps_int8(p, n, bytes);
    // generators stay as nodes but may still feed folding (evaluated when a reader folds: the
    // expansion rule is for nodes with inputs, so a sum of ones of a shape still folds)
    evaluable[i] = can;
    folds[i] = can && !n.inputs.empty();
    any = any || folds[i];
  }
  if (!any) return p;
  // const_values[i]: outputs of node i once evaluated
  std::vector<std::vector<Array>> const_values(nodes.size());
  ProgramBuilder b(p);
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    if (n.op == OpId::Constant) const_values[i] = {n.value};
    if (!folds[i]) {
      b.copy(static_cast<int32_t>(i));
      continue;
    }
    std::vector<Array> in;
    for (auto v : n.inputs) {
      if (const_values[v.node].empty()) const_values[v.node] = eval(nodes[v.node], {});
      in.push_back(const_values[v.node][v.index]);
    }
    const_values[i] = eval(n, in);
    std::vector<ValueRef> vals;
    for (size_t k = 0; k < n.outputs.size(); ++k) {
      Node c;
      c.op = OpId::Constant;
      c.outputs = {n.outputs[k]};
      c.value = const_values[i][k];
      c.name = n.name;
      vals.push_back({b.graph().add_inferred(std::move(c)), 0});
    }
    b.map(static_cast<int32_t>(i), std::move(vals));
  }
  return b.finish();
}

}  // namespace kiln
