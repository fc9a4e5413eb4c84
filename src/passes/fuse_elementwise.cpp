// fuse_elementwise: connected groups of elementwise nodes of one output shape, whose intermediate
// values no node outside the group reads and no output names, become one fused_elementwise node
// (program format: src/ops/fused_elementwise.h). Inputs that broadcast to the shape stay inputs.
#include <algorithm>
#include <functional>
#include <map>
#include <optional>
#include <set>

#include "core/op_registry.h"
#include "ops/fused_elementwise.h"
#include "passes/program.h"
#include "runtime/env.h"
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

namespace {
// Whether node i is an elementwise op a fused node can run on `target` (an op the target has no
// kernel for stays a node of its own: placement falls back for it).
bool fusable_node(const Program& p, int32_t i, Backend target) {
  const Node& nd = p.graph.nodes[i];
  const KernelEntry* fused_kernel = find_kernel(OpId::FusedElementwise, target);
  fused::Instr tmp;
  if (fused::arity(nd.op) == 0 || nd.outputs.size() != 1 ||
      nd.inputs.size() != static_cast<size_t>(fused::arity(nd.op)) ||
      !fused::pack_params(nd.op, nd.attrs, tmp) || !fused_kernel)
    return false;
  const KernelEntry* k = find_kernel(nd.op, target);
  std::vector<TensorInfo> in;
  for (ValueRef v : nd.inputs) in.push_back(p.graph.info(v));
  for (const TensorInfo& t : in)
    if (is_narrow(t.dtype)) return false;  // (a narrow type's casts run their own kernel)
  return k && k->handles(kernel_dtype(*k, nd, in)) && fused_kernel->handles(nd.outputs[0].dtype);
}

// Nodes that depend on an assign ("late": order_assignments runs them last). A group never mixes
// late and early nodes, so no read of a variable moves past its assign.
std::vector<char> late_nodes(const Program& p) {
  const auto& nodes = p.graph.nodes;
  std::vector<char> late(nodes.size(), 0);
  for (size_t i = 0; i < nodes.size(); ++i) {
    late[i] = op_def(nodes[i].op).writes_variable;
    for (ValueRef v : nodes[i].inputs) late[i] = late[i] || late[v.node];
  }
  return late;
}

// Phase 2 (group_small): below this many elements a kernel's time is its launch, not its bytes.
constexpr int64_t kSmall = 16384;

// An operand while a group's program is put together: a value from outside the group, or the
// result of an instruction of the program.
struct Ref {
  ValueRef outside{-1, 0};
  int32_t instr = -1;
};
struct Op {
  fused::Instr in;
  Ref operand[3];
};
// A member's value as a program over values from outside the group: the members it reads are
// computed again inside it (small values: cheaper than a launch).
struct Expanded {
  std::vector<ValueRef> inputs;
  fused::Program program;
};

// The instructions of node `i` (an elementwise op, or a fused node's program) appended to `ops`,
// its operands resolved by `operand`; the index of its result. False where a node's program does
// not decode (it cannot be a member).
template <typename F>
int32_t append_node(const Program& p, int32_t i, std::vector<Op>& ops, F&& operand) {
  const Node& n = p.graph.nodes[i];
  if (n.op != OpId::FusedElementwise) {
    Op op;
    op.in.op = n.op;
    op.in.dtype = n.outputs[0].dtype;
    fused::pack_params(n.op, n.attrs, op.in);
    for (size_t j = 0; j < n.inputs.size(); ++j) op.operand[j] = operand(n.inputs[j]);
    ops.push_back(op);
    return static_cast<int32_t>(ops.size()) - 1;
  }
  std::vector<DType> types;
  for (ValueRef v : n.inputs) types.push_back(p.graph.info(v).dtype);
  const fused::Program prog = fused::decode(n.attrs, types);
  std::vector<Ref> inputs;  // (resolving them may append the members they come from)
  for (ValueRef v : n.inputs) inputs.push_back(operand(v));
  const auto base = static_cast<int32_t>(ops.size());
  for (const fused::Instr& in : prog.instrs) {
    Op op;
    op.in = in;
    for (int j = 0; j < fused::arity(in.op); ++j) {
      const int32_t v = in.operand(j);
      op.operand[j] = v < prog.num_inputs ? inputs[v] : Ref{{-1, 0}, base + v - prog.num_inputs};
    }
    ops.push_back(op);
  }
  return static_cast<int32_t>(ops.size()) - 1;
}

// The program of `ops` up to `last` (its inputs numbered first, in first-use order).
Expanded finish(const std::vector<Op>& ops) {
  Expanded e;
  auto input = [&](ValueRef v) {
    auto it = std::find(e.inputs.begin(), e.inputs.end(), v);
    if (it != e.inputs.end()) return static_cast<int32_t>(it - e.inputs.begin());
    e.inputs.push_back(v);
    return static_cast<int32_t>(e.inputs.size()) - 1;
  };
  for (const Op& op : ops)
    for (int j = 0; j < fused::arity(op.in.op); ++j)
      if (op.operand[j].instr < 0) input(op.operand[j].outside);
  e.program.num_inputs = static_cast<int>(e.inputs.size());
  for (const Op& op : ops) {
    fused::Instr in = op.in;
    int32_t* slots[3] = {&in.a, &in.b, &in.c};
    for (int j = 0; j < 3; ++j)
      *slots[j] = j >= fused::arity(in.op)   ? -1
                  : op.operand[j].instr >= 0 ? e.program.num_inputs + op.operand[j].instr
                                             : input(op.operand[j].outside);
    e.program.instrs.push_back(in);
  }
  return e;
}

// Groups of small elementwise nodes (every value at most kSmall elements, every input of a
// node's own size or a single value) as one fused_elementwise node of several parts (one kernel
// launch): nodes independent of each other, and chains whose values are also read elsewhere (a
// member read by another is computed again inside it). Nodes in topological order join the open
// group until a node outside it reads one of its values; the group takes the place of its last
// member, so every reader of its outputs comes after it and every input before.
Program group_small(const Program& p, Backend target) {
  const auto& nodes = p.graph.nodes;
  const std::vector<char> late = late_nodes(p);
  auto fusable = [&](int32_t i) { return fusable_node(p, i, target); };
  const auto n = static_cast<int32_t>(nodes.size());
  // a variable's next value stays a node of its own: memory planning writes it where the variable
  // lives (updates_in_place), which a node of several outputs does not
  std::vector<char> assigned(n, 0);
  for (const Node& nd : nodes)
    if (op_def(nd.op).writes_variable)
      for (ValueRef v : nd.inputs) assigned[v.node] = 1;
  auto small = [&](int32_t i) {
    const Node& nd = nodes[i];
    if (nd.outputs.size() != 1 || !is_static(nd.outputs[0].shape) || assigned[i]) return false;
    if (nd.op == OpId::FusedElementwise ? fused::is_group(nd.attrs) : !fusable(i)) return false;
    const int64_t size = numel(nd.outputs[0].shape);
    if (size < 1 || size > kSmall) return false;
    for (ValueRef v : nd.inputs) {
      const Shape& s = p.graph.info(v).shape;
      if (!is_static(s) || (numel(s) != size && numel(s) != 1)) return false;
    }
    return true;
  };
  std::vector<char> escapes(n, 0);
  for (ValueRef v : p.outputs) escapes[v.node] = 1;
  std::vector<int32_t> group_of(n, -1);
  std::vector<std::vector<int32_t>> groups;
  std::vector<std::vector<Expanded>> parts;        // per group: one per member read after it
  std::vector<std::vector<int32_t>> part_members;  // the member each part gives
  std::vector<int32_t> open;                       // members of the open group
  std::map<int32_t, Expanded> expanded;            // theirs
  auto in_open = [&](int32_t q) { return std::find(open.begin(), open.end(), q) != open.end(); };
  // each node's readers (nodes reading any of its outputs)
  std::vector<std::vector<int32_t>> readers(n);
  for (int32_t r = 0; r < n; ++r)
    for (ValueRef v : nodes[r].inputs) readers[v.node].push_back(r);
  // the open group ends: its members read outside it (or outputs) become parts, in chunks of
  // members taken in order that keep within a node's parts and inputs (each chunk takes the
  // place of its last member: a later chunk computes what it reads of an earlier one again)
  auto close = [&]() {
    std::vector<int32_t> chunk, pm;
    std::vector<Expanded> ps;
    std::set<ValueRef> inputs;
    auto emit = [&]() {
      if (chunk.size() >= 2 && !ps.empty()) {
        for (int32_t m : chunk) group_of[m] = static_cast<int32_t>(groups.size());
        groups.push_back(chunk);
        parts.push_back(std::move(ps));
        part_members.push_back(std::move(pm));
      }
      chunk.clear();
      ps.clear();
      pm.clear();
      inputs.clear();
    };
    for (int32_t m : open) {
      bool read = escapes[m];
      for (int32_t r : readers[m]) read = read || !in_open(r);
      if (read) {
        const Expanded& e = expanded.at(m);
        std::set<ValueRef> more = inputs;
        more.insert(e.inputs.begin(), e.inputs.end());
        if (ps.size() + 1 > static_cast<size_t>(fused::kMaxParts) ||
            more.size() > static_cast<size_t>(fused::kMaxInputs))
          emit();
        inputs.insert(e.inputs.begin(), e.inputs.end());
        ps.push_back(e);
        pm.push_back(m);
      }
      chunk.push_back(m);
    }
    emit();
    open.clear();
    expanded.clear();
  };
  for (int32_t i = 0; i < n; ++i) {
    bool reads_open = false;
    for (ValueRef v : nodes[i].inputs) reads_open = reads_open || in_open(v.node);
    const bool fits = small(i) && (open.empty() || late[i] == late[open.front()]);
    std::optional<Expanded> e;
    if (fits) {
      std::vector<Op> ops;
      std::map<int32_t, int32_t> done;  // member -> its result in ops
      std::function<Ref(ValueRef)> operand = [&](ValueRef v) -> Ref {
        if (!in_open(v.node)) return Ref{v, -1};
        auto it = done.find(v.node);
        if (it == done.end()) it = done.emplace(v.node, append_node(p, v.node, ops, operand)).first;
        return Ref{{-1, 0}, it->second};
      };
      append_node(p, i, ops, operand);
      if (ops.size() <= static_cast<size_t>(fused::kMaxInstrs)) e = finish(ops);
      if (e && e->inputs.size() > static_cast<size_t>(fused::kMaxInputs)) e.reset();
    }
    if (!e) {
      if (reads_open) close();
      continue;
    }
    open.push_back(i);
    expanded.emplace(i, std::move(*e));
  }
  close();
  if (groups.empty()) return p;

  ProgramBuilder b(p);
  for (int32_t i = 0; i < n; ++i) {
    if (group_of[i] < 0) {
      b.copy(i);
      continue;
    }
    const auto gi = static_cast<size_t>(group_of[i]);
    if (groups[gi].back() != i) continue;  // the group takes its last member's place
    std::vector<ValueRef> ins;
    std::vector<fused::Part> fparts;
    for (const Expanded& e : parts[gi]) {
      fused::Part part;
      part.program = e.program;
      for (ValueRef v : e.inputs) {
        const ValueRef to = b.remap(v);
        auto it = std::find(ins.begin(), ins.end(), to);
        if (it == ins.end()) it = ins.insert(ins.end(), to);
        part.inputs.push_back(static_cast<int32_t>(it - ins.begin()));
      }
      fparts.push_back(std::move(part));
    }
    // (one part: a plain program over the group's inputs, in its order)
    const Attrs attrs =
        fparts.size() == 1 ? fused::encode(fparts[0].program) : fused::encode_group(fparts);
    const int32_t f = b.graph().add(OpId::FusedElementwise, std::move(ins), attrs, nodes[i].name);
    b.graph().nodes[f].origin = nodes[i].origin;
    for (size_t k = 0; k < part_members[gi].size(); ++k)
      b.map(part_members[gi][k], {{f, static_cast<int32_t>(k)}});
  }
  return b.finish();
}
}  // namespace

Program fuse_elementwise(const Program& p, Backend target, FusePhases phases) {
  const bool small = phases != FusePhases::chains && env::fuse_groups();
  if (phases == FusePhases::small_groups) return small ? group_small(p, target) : p;
  const auto& nodes = p.graph.nodes;
  const size_t n = nodes.size();
  // reads of each node's output 0 (fusable nodes have one output), outputs counting as reads
  // from outside; late nodes (late_nodes) stay apart from early ones
  std::vector<int> reads(n, 0);
  std::vector<char> escapes(n, 0);
  const std::vector<char> late = late_nodes(p);
  for (size_t i = 0; i < n; ++i)
    for (ValueRef v : nodes[i].inputs) ++reads[v.node];
  for (ValueRef v : p.outputs) escapes[v.node] = 1;
  auto fusable = [&](int32_t i) { return fusable_node(p, i, target); };

  std::vector<int32_t> group_of(n, -1);
  std::vector<Group> groups;
  // (then groups of small values: group_small, on the program this phase gives)
  auto then_small = [&](const Program& q) { return small ? group_small(q, target) : q; };
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
  if (groups.empty()) return then_small(p);

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
  return then_small(b.finish());
}

}  // namespace kiln
