// fuse_elementwise: connected groups of elementwise nodes of one output shape, whose intermediate
// values no node outside the group reads and no output names, become one fused_elementwise node
// (program format: src/ops/fused_elementwise.h). Inputs that broadcast to the shape stay inputs.
#include <algorithm>
#include <map>

#include "core/op_registry.h"
#include "ops/fused_elementwise.h"
#include "passes/program.h"
#include "runtime/executable_impl.h"
#include "runtime/run_kernel.h"

namespace kiln {

using detail::Node;
using detail::ValueRef;

namespace {
struct Group {
  std::vector<int32_t> members;  // node ids in topological order; the last is the root
  std::vector<ValueRef> inputs;  // values read from outside, in first-read order
  fused::Program program;
};

// Builds the program of a group (members sorted); false when it needs too many inputs.
bool build_program(const Program& p, Group& g) {
  const auto& nodes = p.graph.nodes;
  std::map<int32_t, int32_t> slot_of_member;
  std::vector<ValueRef>& ins = g.inputs;
  for (int32_t m : g.members)
    for (ValueRef v : nodes[m].inputs)
      if (!slot_of_member.count(v.node) && std::find(ins.begin(), ins.end(), v) == ins.end() &&
          std::find(g.members.begin(), g.members.end(), v.node) == g.members.end())
        ins.push_back(v);
  if (ins.size() > static_cast<size_t>(fused::kMaxInputs)) return false;
  g.program.num_inputs = static_cast<int>(ins.size());
  int32_t next = g.program.num_inputs;
  for (int32_t m : g.members) {
    const Node& n = nodes[m];
    fused::Instr in;
    in.op = n.op;
    in.dtype = n.outputs[0].dtype;
    fused::pack_params(n.op, n.attrs, in);
    int32_t* ops[3] = {&in.a, &in.b, &in.c};
    for (size_t j = 0; j < n.inputs.size(); ++j) {
      const ValueRef v = n.inputs[j];
      auto it = slot_of_member.find(v.node);
      *ops[j] = it != slot_of_member.end()
                    ? it->second
                    : static_cast<int32_t>(std::find(ins.begin(), ins.end(), v) - ins.begin());
    }
    g.program.instrs.push_back(in);
    slot_of_member[m] = next++;
  }
  return true;
}
}  // namespace

Program fuse_elementwise(const Program& p, Backend target) {
  const auto& nodes = p.graph.nodes;
  const size_t n = nodes.size();
  // reads of each node's output 0 (fusable nodes have one output), outputs counting as reads
  // from outside; "late" nodes depend on an assign (order_assignments runs them last), and a
  // group never mixes late and early nodes, so no read of a variable moves past its assign
  std::vector<int> reads(n, 0);
  std::vector<char> escapes(n, 0), late(n, 0);
  for (size_t i = 0; i < n; ++i) {
    late[i] = op_def(nodes[i].op).writes_variable;
    for (ValueRef v : nodes[i].inputs) {
      ++reads[v.node];
      late[i] = late[i] || late[v.node];
    }
  }
  for (ValueRef v : p.outputs) escapes[v.node] = 1;
  // an op the target has no kernel for stays a node of its own (placement falls back for it)
  const KernelEntry* fused_kernel = find_kernel(OpId::FusedElementwise, target);
  auto fusable = [&](int32_t i) {
    const Node& nd = nodes[i];
    fused::Instr tmp;
    if (fused::arity(nd.op) == 0 || nd.outputs.size() != 1 ||
        nd.inputs.size() != static_cast<size_t>(fused::arity(nd.op)) ||
        !fused::pack_params(nd.op, nd.attrs, tmp) || !fused_kernel)
      return false;
    const KernelEntry* k = find_kernel(nd.op, target);
    std::vector<TensorInfo> in;
    for (ValueRef v : nd.inputs) in.push_back(p.graph.info(v));
    return k && k->handles(kernel_dtype(*k, nd, in)) && fused_kernel->handles(nd.outputs[0].dtype);
  };

  std::vector<int32_t> group_of(n, -1);
  std::vector<Group> groups;
  for (int32_t r = static_cast<int32_t>(n) - 1; r >= 0; --r) {
    if (group_of[r] >= 0 || !fusable(r)) continue;
    const Shape& shape = nodes[r].outputs[0].shape;
    std::vector<int32_t> members{r};
    auto in_group = [&](int32_t q) {
      return std::find(members.begin(), members.end(), q) != members.end();
    };
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t k = 0; k < members.size() && members.size() < fused::kMaxInstrs; ++k)
        for (ValueRef v : nodes[members[k]].inputs) {
          const int32_t q = v.node;
          if (in_group(q) || group_of[q] >= 0 || escapes[q] || late[q] != late[r] || !fusable(q) ||
              nodes[q].outputs[0].shape != shape)
            continue;
          int from_group = 0;
          for (int32_t m : members)
            for (ValueRef u : nodes[m].inputs) from_group += u.node == q;
          if (from_group != reads[q]) continue;
          members.push_back(q);
          changed = true;
        }
    }
    if (members.size() < 2) continue;
    std::sort(members.begin(), members.end());
    Group g;
    g.members = members;
    if (!build_program(p, g)) continue;
    for (int32_t m : members) group_of[m] = static_cast<int32_t>(groups.size());
    groups.push_back(std::move(g));
  }
  if (groups.empty()) return p;

  ProgramBuilder b(p);
  for (size_t i = 0; i < n; ++i) {
    const auto id = static_cast<int32_t>(i);
    if (group_of[i] < 0) {
      b.copy(id);
      continue;
    }
    const Group& g = groups[group_of[i]];
    if (g.members.back() != id) continue;  // the node is placed where its root was
    std::vector<ValueRef> ins;
    for (ValueRef v : g.inputs) ins.push_back(b.remap(v));
    const int32_t f = b.graph().add(OpId::FusedElementwise, std::move(ins),
                                    fused::encode(g.program), nodes[i].name);
    b.graph().nodes[f].origin = nodes[i].origin;
    b.map(id, {{f, 0}});
  }
  return b.finish();
}

}  // namespace kiln
