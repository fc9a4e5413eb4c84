// Common-subexpression elimination: pure nodes with the same op, inputs and attributes merge.
// Small constants merge by value. Also broadcasts that do not change their input's shape go.
#include <algorithm>
#include <cstring>
#include <unordered_map>

#include "core/op_registry.h"
#include "core/sym_dim.h"
#include "passes/program.h"

namespace kiln {

using detail::Node;
using detail::ValueRef;

namespace {
constexpr size_t kMaxMergedConstantBytes = 4096;

// A node's key with its inputs `in` (remapped into the program being built).
size_t node_key(const Node& n, const std::vector<ValueRef>& in) {
  size_t h = static_cast<size_t>(n.op) * 1000003u ^ n.attrs.hash();
  for (auto v : in) h = h * 31 + static_cast<size_t>(v.node) * 7 + static_cast<size_t>(v.index);
  if (n.op == OpId::Constant) {
    const auto* p = static_cast<const unsigned char*>(n.value.data());
    for (size_t i = 0; i < n.value.nbytes(); ++i) h = h * 131 + p[i];
    h ^= static_cast<size_t>(n.value.dtype()) << 3;
    for (auto d : n.value.shape()) h = h * 17 + static_cast<size_t>(d);
  }
  return h;
}

// Whether `a` (built) is node `b` with inputs `in`.
bool same(const Node& a, const Node& b, const std::vector<ValueRef>& in) {
  if (a.op != b.op || !(a.inputs == in) || !(a.attrs == b.attrs)) return false;
  if (a.op != OpId::Constant) return a.outputs == b.outputs;
  return a.value.dtype() == b.value.dtype() && a.value.shape() == b.value.shape() &&
         std::memcmp(a.value.data(), b.value.data(), a.value.nbytes()) == 0;
}

bool mergeable(const Node& n) {
  if (n.op == OpId::Placeholder) return false;
  if (n.op == OpId::Constant) return n.value.nbytes() <= kMaxMergedConstantBytes;
  return op_def(n.op).pure;
}
}  // namespace

Program eliminate_common_subexpressions(const Program& p) {
  ProgramBuilder b(p);
  std::unordered_multimap<size_t, int32_t> seen;  // key -> new node id
  for (size_t i = 0; i < p.graph.nodes.size(); ++i) {
    const Node& src = p.graph.nodes[i];
    if (mergeable(src)) {
      std::vector<ValueRef> in = src.inputs;
      for (auto& v : in) v = b.remap(v);
      const size_t key = node_key(src, in);
      bool merged = false;
      auto range = seen.equal_range(key);
      for (auto it = range.first; it != range.second && !merged; ++it) {
        if (same(b.graph().nodes[it->second], src, in)) {
          std::vector<ValueRef> vals;
          for (size_t k = 0; k < src.outputs.size(); ++k)
            vals.push_back({it->second, static_cast<int32_t>(k)});
          b.map(static_cast<int32_t>(i), std::move(vals));
          merged = true;
        }
      }
      if (merged) continue;
      int32_t nid = b.copy(static_cast<int32_t>(i));
      seen.emplace(key, nid);
    } else {
      b.copy(static_cast<int32_t>(i));
    }
  }
  return b.finish();
}

namespace {
bool identity_broadcast(const Program& p, const Node& n) {
  if (n.op != OpId::BroadcastTo || n.inputs.empty()) return false;
  const TensorInfo& in = p.graph.info(n.inputs[0]);
  // (a symbolic dim names one expression: equal codes are equal sizes in every run)
  const bool known = std::all_of(in.shape.begin(), in.shape.end(),
                                 [](int64_t d) { return sym::is_size(d) || sym::is_symbolic(d); });
  return in.dtype == n.outputs[0].dtype && known && in.shape == n.outputs[0].shape;
}
}  // namespace

bool has_identity_broadcasts(const Program& p) {
  for (const Node& n : p.graph.nodes)
    if (identity_broadcast(p, n)) return true;
  return false;
}

Program drop_identity_broadcasts(const Program& p) {
  ProgramBuilder b(p);
  std::vector<char> output(p.graph.nodes.size(), 0);
  for (auto v : p.outputs) output[v.node] = 1;
  for (size_t i = 0; i < p.graph.nodes.size(); ++i) {
    const Node& n = p.graph.nodes[i];
    if (identity_broadcast(p, n) && !output[i])
      b.map(static_cast<int32_t>(i), {b.remap(n.inputs[0])});
    else b.copy(static_cast<int32_t>(i));
  }
  return b.finish();
}

}  // namespace kiln
