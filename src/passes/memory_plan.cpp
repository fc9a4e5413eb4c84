#include "passes/memory_plan.h"

#include <algorithm>
#include <map>

#include "core/op_registry.h"

namespace kiln {

using detail::Node;
using detail::ValueRef;
using Where = ValueSlot::Where;

namespace {
constexpr size_t kAlign = 64;
size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

size_t bytes_of(const TensorInfo& t) { return static_cast<size_t>(numel(t.shape)) * size_of(t.dtype); }

// Elementwise nodes: output element i depends on input element i only (for inputs of the output's
// size), so the output may share storage with such an input.
bool elementwise(const Node& n) {
  const OpDef& def = op_def(n.op);
  return n.outputs.size() == 1 &&
         (n.op == OpId::FusedElementwise || (def.inplace_input >= 0 && def.pure));
}

// node -> the variable whose storage its output 0 takes: the elementwise node that makes a
// variable's next value (an optimizer's update, a batch norm's running statistics) writes it where
// the variable lives, so the variable's assign copies nothing. Only where nothing after that node
// reads the variable's old value (the assign itself aside), the variable has one assign, and the
// old value is not returned.
std::vector<int32_t> updates_in_place(const Program& p) {
  const auto& nodes = p.graph.nodes;
  std::vector<int32_t> into(nodes.size(), -1);
  // the variable whose storage each node's output 0 is (the variable, and views of it)
  std::vector<int32_t> storage_of(nodes.size(), -1);
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    if (n.op == OpId::Variable)
      storage_of[i] = static_cast<int32_t>(i);
    else if (op_def(n.op).alias_input0 && !n.inputs.empty() && n.inputs[0].index == 0)
      storage_of[i] = storage_of[n.inputs[0].node];
  }
  std::map<int32_t, int> assigns, last_read;
  std::vector<char> returned(nodes.size(), 0);
  for (size_t k = 0; k < p.num_returned; ++k)
    if (p.outputs[k].index == 0 && storage_of[p.outputs[k].node] >= 0)
      returned[storage_of[p.outputs[k].node]] = 1;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    if (op_def(n.op).writes_variable) {
      ++assigns[n.inputs[0].node];
      continue;
    }
    for (const ValueRef v : n.inputs)
      if (v.index == 0 && storage_of[v.node] >= 0)
        last_read[storage_of[v.node]] = static_cast<int>(i);
  }
  for (const Node& a : nodes) {
    if (a.op != OpId::Assign) continue;
    const int32_t var = a.inputs[0].node;
    const ValueRef val = a.inputs[1];
    const Node& up = nodes[val.node];
    if (nodes[var].op != OpId::Variable || assigns[var] != 1 || returned[var] || val.index != 0 ||
        !elementwise(up) || up.outputs[0].dtype != nodes[var].outputs[0].dtype ||
        up.outputs[0].shape != nodes[var].outputs[0].shape || into[val.node] >= 0)
      continue;
    if (auto it = last_read.find(var); it != last_read.end() && it->second > val.node) continue;
    into[val.node] = var;
  }
  return into;
}

// First-fit allocator over [0, top) with coalescing free blocks.
class Arena {
 public:
  size_t alloc(size_t n) {
    n = std::max(align_up(n), kAlign);
    auto best = free_.end();
    for (auto it = free_.begin(); it != free_.end(); ++it)
      if (it->second >= n && (best == free_.end() || it->second < best->second)) best = it;
    if (best != free_.end()) {
      size_t off = best->first, sz = best->second;
      free_.erase(best);
      if (sz > n) free_[off + n] = sz - n;
      return off;
    }
    // extend, merging a free block that ends at top
    if (!free_.empty()) {
      auto last = std::prev(free_.end());
      if (last->first + last->second == top_) {
        size_t off = last->first;
        free_.erase(last);
        top_ = off + n;
        return off;
      }
    }
    size_t off = top_;
    top_ += n;
    return off;
  }
  void release(size_t off, size_t n) {
    n = std::max(align_up(n), kAlign);
    auto it = free_.emplace(off, n).first;
    auto next = std::next(it);
    if (next != free_.end() && it->first + it->second == next->first) {
      it->second += next->second;
      free_.erase(next);
    }
    if (it != free_.begin()) {
      auto prev = std::prev(it);
      if (prev->first + prev->second == it->first) {
        prev->second += it->second;
        free_.erase(it);
      }
    }
  }
  size_t top() const { return top_; }

 private:
  std::map<size_t, size_t> free_;
  size_t top_ = 0;
};
}  // namespace

MemoryPlan plan_memory(const Program& p, const MemoryPlanOptions& opts) {
  const auto& nodes = p.graph.nodes;
  MemoryPlan plan;
  plan.slots.resize(nodes.size());
  for (size_t i = 0; i < nodes.size(); ++i) plan.slots[i].resize(nodes[i].outputs.size());

  for (size_t k = 0; k < p.num_returned; ++k) {
    ValueSlot& s = plan.slots[p.outputs[k].node][p.outputs[k].index];
    if (s.where == Where::none) s = {Where::output, 0, static_cast<int>(k), -1};
  }

  // Storage groups: one per arena buffer; aliases and in-place outputs join their input's group.
  struct Group {
    size_t bytes = 0;
    int last_use = -1;
    size_t offset = 0;
    bool placed = false;
  };
  std::vector<Group> groups;
  std::vector<int> last_use_of_node(nodes.size(), -1);
  auto group_of = [&](ValueRef v) { return plan.slots[v.node][v.index].storage; };
  const std::vector<int32_t> into =
      opts.in_place ? updates_in_place(p) : std::vector<int32_t>(nodes.size(), -1);

  // last reader of each value's group is computed after grouping; first assign groups
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    const OpDef& def = op_def(n.op);
    for (size_t o = 0; o < n.outputs.size(); ++o) {
      ValueSlot& s = plan.slots[i][o];
      if (n.op == OpId::Placeholder) { s.where = Where::feed; s.index = static_cast<int>(i); continue; }
      if (n.op == OpId::Constant || n.op == OpId::Variable) {
        s.where = Where::constant;  // read where it lives
        s.index = static_cast<int>(i);
        continue;
      }
      if (s.where == Where::output) continue;
      if (o == 0 && into[i] >= 0) {  // a variable's next value, made where the variable lives
        s.where = Where::constant;
        s.index = into[i];
        continue;
      }
      if (o == 0 && def.alias_input0) {
        const ValueSlot& in = plan.slots[n.inputs[0].node][n.inputs[0].index];
        if (in.where != Where::output) {  // outputs are returned, so views of them copy
          s = in;
          continue;
        }
      }
      s.where = Where::arena;
      s.storage = static_cast<int>(groups.size());
      groups.push_back({bytes_of(n.outputs[o]), -1, 0, false});
    }
  }
  // liveness of each group
  for (size_t i = 0; i < nodes.size(); ++i) {
    for (auto v : nodes[i].inputs) {
      int g = group_of(v);
      if (g >= 0) groups[g].last_use = std::max(groups[g].last_use, static_cast<int>(i));
    }
    for (size_t o = 0; o < nodes[i].outputs.size(); ++o) {
      int g = plan.slots[i][o].storage;
      if (g >= 0) groups[g].last_use = std::max(groups[g].last_use, static_cast<int>(i));
    }
  }

  if (!opts.reuse) {
    size_t top = 0;
    for (auto& g : groups) {
      g.offset = top;
      top += std::max(align_up(g.bytes), kAlign);
    }
    plan.arena_bytes = top;
    plan.num_buffers = static_cast<int>(groups.size());
  } else {
    // in place: output 0 of an elementwise op takes over an input group that dies at this node
    std::vector<int> redirect(groups.size());
    for (size_t g = 0; g < groups.size(); ++g) redirect[g] = static_cast<int>(g);
    auto root = [&](int g) {
      while (redirect[g] != g) g = redirect[g];
      return g;
    };
    if (opts.in_place) {
      for (size_t i = 0; i < nodes.size(); ++i) {
        const Node& n = nodes[i];
        int k = op_def(n.op).inplace_input;
        const bool residual =
            opts.residual_in_place && n.op == OpId::FusedConv && n.attrs.b("has_residual", false);
        if (residual) k = static_cast<int>(n.inputs.size()) - 1;
        if (k < 0 || k >= static_cast<int>(n.inputs.size()) || n.outputs.empty()) continue;
        ValueSlot& out = plan.slots[i][0];
        const ValueSlot& in = plan.slots[n.inputs[k].node][n.inputs[k].index];
        if (out.where != Where::arena || in.where != Where::arena) continue;
        int gi = root(in.storage), go = root(out.storage);
        if (gi == go || groups[gi].last_use != static_cast<int>(i)) continue;
        // (a convolution must not write over what it reads: the residual is no other input)
        bool shared = false;
        for (int j = 0; residual && j < k; ++j) {
          const ValueSlot& o = plan.slots[n.inputs[j].node][n.inputs[j].index];
          shared = shared || (o.where == Where::arena && root(o.storage) == gi);
        }
        if (shared) continue;
        if (groups[gi].bytes != groups[go].bytes) continue;
        // the input must not be read by a later input slot of another group sharing this step
        redirect[go] = gi;
        groups[gi].last_use = std::max(groups[gi].last_use, groups[go].last_use);
      }
      for (auto& row : plan.slots)
        for (auto& s : row)
          if (s.storage >= 0) s.storage = root(s.storage);
    }
    // place groups in the order they are defined, free after their last use
    std::vector<std::vector<int>> dying(nodes.size());
    for (size_t g = 0; g < groups.size(); ++g)
      if (root(static_cast<int>(g)) == static_cast<int>(g) && groups[g].last_use >= 0)
        dying[groups[g].last_use].push_back(static_cast<int>(g));
    Arena arena;
    int buffers = 0;
    for (size_t i = 0; i < nodes.size(); ++i) {
      for (auto& s : plan.slots[i]) {
        if (s.where != Where::arena || groups[s.storage].placed) continue;
        Group& g = groups[s.storage];
        g.offset = arena.alloc(g.bytes);
        g.placed = true;
        ++buffers;
      }
      for (int g : dying[i]) arena.release(groups[g].offset, groups[g].bytes);
    }
    plan.arena_bytes = arena.top();
    plan.num_buffers = buffers;
  }
  for (auto& row : plan.slots)
    for (auto& s : row)
      if (s.where == Where::arena) s.offset = groups[s.storage].offset;
  return plan;
}

}  // namespace kiln
