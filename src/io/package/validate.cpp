#include "io/package/validate.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <exception>
#include <map>

#include "core/errors.h"
#include "core/op_registry.h"
#include "ops/control_ops.h"
#include "runtime/run_kernel.h"

namespace kiln::package {

using detail::Node;
using detail::ValueRef;
using Where = ValueSlot::Where;

bool op_from_id(uint16_t id, OpId& out) {
  for (OpId op : kAllOps)
    if (static_cast<uint16_t>(op) == id) {
      out = op;
      return true;
    }
  return false;
}

namespace {
constexpr int64_t kMaxDim = stored::kMaxDim;
constexpr uint64_t kMaxBytes = stored::kMaxBytes;

uint64_t bytes_of(const TensorInfo& t) {
  return static_cast<uint64_t>(numel(t.shape)) * size_of(t.dtype);
}

// Inference and kernels trust attributes that op builders made: before inference sees a stored
// node, its attributes are held to what builders give, where inference would otherwise index,
// divide or overflow with them: generic bounds here, and the op's own (OpDef::stored_check).

std::string check_attrs(const Node& n, const std::vector<TensorInfo>& in) {
  const OpDef& def = op_def(n.op);
  const auto& wide = def.wide_int_attrs;
  for (auto& [key, v] : n.attrs.items()) {
    // seeds span all of int64, and the op's wide integer attributes
    const bool any_int = key == "seed" || std::find(wide.begin(), wide.end(), key) != wide.end();
    if (auto* x = std::get_if<int64_t>(&v); x && !any_int && (*x > kMaxDim || *x < -kMaxDim))
      return fmt::format("attribute {} = {} is out of range", key, *x);
    if (auto* x = std::get_if<std::vector<int64_t>>(&v); x && !any_int)
      for (int64_t e : *x)
        if (e > kMaxDim || e < -kMaxDim)
          return fmt::format("attribute {} holds {}, out of range", key, e);
    if (auto* x = std::get_if<std::vector<double>>(&v))
      for (double e : *x)
        if (!std::isfinite(e)) return fmt::format("attribute {} holds {}", key, e);
  }
  return def.stored_check ? def.stored_check(InferContext{n.op, n.attrs, in, &n.bodies})
                          : std::string();
}

std::string infos(const std::vector<TensorInfo>& v) {
  std::string s;
  for (auto& t : v) s += (s.empty() ? "" : ", ") + std::string(name(t.dtype)) + str(t.shape);
  return "[" + s + "]";
}
}  // namespace

bool arity(OpId op, const Attrs& attrs, int& lo, int& hi) {
  return op_def(op).input_range(attrs, lo, hi);
}

std::string check_shape(const TensorInfo& info, bool dynamic) {
  if (info.shape.size() > 64) return fmt::format("rank {} is above 64", info.shape.size());
  for (int64_t d : info.shape)
    if (d > kMaxDim) return fmt::format("shape {} has a dim above 2^40", str(info.shape));
  uint64_t n = size_of(info.dtype);
  for (int64_t d : info.shape) {
    if (d == -1 && dynamic) continue;
    if (d < 0) return fmt::format("shape {} has a negative dim", str(info.shape));
    if (d != 0 && n > kMaxBytes / static_cast<uint64_t>(d))
      return fmt::format("shape {} of {} is too large", str(info.shape), name(info.dtype));
    n *= static_cast<uint64_t>(d);
  }
  return {};
}

std::string check_node(const detail::GraphImpl& g, size_t i) {
  const Node& n = g.nodes[i];
  int lo = 0, hi = 0;
  try {
    if (!arity(n.op, n.attrs, lo, hi)) return "the op cannot be loaded from packages yet";
  } catch (const std::exception& e) {
    return e.what();
  }
  if (n.bodies.size() != num_bodies(n.op))
    return fmt::format("has {} bodies; the op takes {}", n.bodies.size(), num_bodies(n.op));
  for (const auto& body : n.bodies)
    if (!body) return "has an empty body";
  const int count = static_cast<int>(n.inputs.size());
  if (count < lo || count > hi)
    return lo == hi ? fmt::format("has {} inputs; the op takes {}", count, lo)
                    : fmt::format("has {} inputs; the op takes {} to {}", count, lo, hi);
  if (n.op == OpId::Placeholder || n.op == OpId::Constant || n.op == OpId::Variable)
    return n.outputs.size() == 1 ? std::string()
                                 : fmt::format("has {} outputs instead of 1", n.outputs.size());
  if (op_def(n.op).writes_variable && g.nodes[n.inputs[0].node].op != OpId::Variable)
    return fmt::format("assigns to %{}, which is not a variable", n.inputs[0].node);
  const OpDef& def = op_def(n.op);
  if (!def.infer) return "the op has no shape inference";
  std::vector<TensorInfo> in;
  for (auto v : n.inputs) in.push_back(g.info(v));
  std::vector<TensorInfo> out;
  try {
    if (std::string why = check_attrs(n, in); !why.empty()) return why;
    out = infer_node(InferContext{n.op, n.attrs, in, &n.bodies});
  } catch (const std::exception& e) {
    return fmt::format("inputs {} and attributes ({}) are rejected: {}", infos(in),
                       n.attrs.to_string(), e.what());
  }
  if (out != n.outputs)
    return fmt::format("outputs {} differ from {} that inputs {} give", infos(n.outputs),
                       infos(out), infos(in));
  return {};
}

std::string check_dim_specs(const Node& n) {
  const Attrs& a = n.attrs;
  if (!a.has("dim_names") && !a.has("dim_min") && !a.has("dim_max")) return {};
  const size_t rank = n.outputs[0].shape.size();
  try {
    const std::string& names = a.str("dim_names");
    const auto &mins = a.ints("dim_min"), &maxs = a.ints("dim_max");
    if (static_cast<size_t>(std::count(names.begin(), names.end(), '\n')) + 1 != rank ||
        mins.size() != rank || maxs.size() != rank)
      return fmt::format("dim names and ranges are not one per dim of shape {}",
                         str(n.outputs[0].shape));
    for (size_t d = 0; d < rank; ++d)
      if (mins[d] < 0 || maxs[d] < -1 || (maxs[d] >= 0 && maxs[d] < mins[d]))
        return fmt::format("dim {} has the empty or negative range [{}, {}]", d, mins[d], maxs[d]);
  } catch (const std::exception& e) {
    return e.what();
  }
  return {};
}

std::string check_plan(const Program& p, const MemoryPlan& plan) {
  const auto& nodes = p.graph.nodes;
  if (plan.slots.size() != nodes.size()) return "one row of slots per node expected";
  const auto n_nodes = static_cast<int64_t>(nodes.size());
  auto slot = [&](ValueRef v) -> const ValueSlot& { return plan.slots[v.node][v.index]; };
  // whether value v is what an assign writes into variable node `var`
  std::map<int64_t, ValueRef> assigned;
  for (const Node& n : nodes)
    if (n.op == OpId::Assign && n.inputs.size() == 2)
      assigned.emplace(n.inputs[0].node, n.inputs[1]);
  auto assigned_as = [&](ValueRef v, int64_t var) {
    auto it = assigned.find(var);
    return var >= 0 && var < static_cast<int64_t>(nodes.size()) &&
           nodes[var].op == OpId::Variable && it != assigned.end() && it->second == v;
  };
  // a slot a run reads or writes for value v
  auto check = [&](ValueRef v) -> std::string {
    const ValueSlot& s = slot(v);
    const TensorInfo& t = nodes[v.node].outputs[v.index];
    const uint64_t bytes = bytes_of(t);
    const std::string what = fmt::format("slot of %{}:{}", v.node, v.index);
    switch (s.where) {
      case Where::none:
        return what + " is empty but a run uses it";
      case Where::feed:
      case Where::constant: {
        if (s.index < 0 || s.index >= n_nodes)
          return fmt::format("{} names node %{}", what, s.index);
        const Node& src = nodes[s.index];
        const bool ok = s.where == Where::feed
                            ? src.op == OpId::Placeholder
                            : (src.op == OpId::Constant || src.op == OpId::Variable);
        if (!ok) return fmt::format("{} names %{}, a {}", what, s.index, op_name(src.op));
        if (bytes > bytes_of(src.outputs[0]))
          return fmt::format("{} needs {} bytes; %{} has {}", what, bytes, s.index,
                             bytes_of(src.outputs[0]));
        return {};
      }
      case Where::arena:
        if (s.offset % 64 != 0)
          return fmt::format("{} at arena offset {} is not 64-byte aligned", what, s.offset);
        if (s.offset > plan.arena_bytes || bytes > plan.arena_bytes - s.offset)
          return fmt::format("{} [{}, +{}) is outside the arena of {} bytes", what, s.offset, bytes,
                             plan.arena_bytes);
        return {};
      case Where::output: {
        if (s.index < 0 || static_cast<size_t>(s.index) >= p.num_returned)
          return fmt::format("{} names output {} of {}", what, s.index, p.num_returned);
        const ValueRef o = p.outputs[s.index];
        const ValueSlot& os = slot(o);
        if (os.where != Where::output || os.index != s.index)
          return fmt::format("{} names output {}, whose own slot is elsewhere", what, s.index);
        if (!(p.graph.info(o) == t))
          return fmt::format("{} names output {} of another dtype or shape", what, s.index);
        return {};
      }
    }
    return what + " has an unknown kind";
  };
  // no plan needs more than a buffer of its own for every value
  uint64_t most = 0;
  for (const Node& n : nodes)
    for (const TensorInfo& t : n.outputs) {
      const uint64_t b = std::max<uint64_t>((bytes_of(t) + 63) / 64 * 64, 64);
      most = b > UINT64_MAX - most ? UINT64_MAX : most + b;  // saturating
    }
  if (plan.arena_bytes > most)
    return fmt::format("an arena of {} bytes is more than the {} all values need", plan.arena_bytes,
                       most);
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    const auto id = static_cast<int32_t>(i);
    if (n.op == OpId::Placeholder || n.op == OpId::Constant || n.op == OpId::Variable) {
      const ValueSlot& s = plan.slots[i][0];
      const Where want = n.op == OpId::Placeholder ? Where::feed : Where::constant;
      if (s.where != want || s.index != id)
        return fmt::format("slot of source node %{} does not name the node itself", i);
      continue;
    }
    for (auto v : n.inputs)
      if (auto why = check(v); !why.empty()) return why;
    for (size_t o = 0; o < n.outputs.size(); ++o) {
      const ValueRef v{id, static_cast<int32_t>(o)};
      if (auto why = check(v); !why.empty()) return why;
      const ValueSlot& s = slot(v);
      if (s.where != Where::feed && s.where != Where::constant) continue;
      // only a view of input 0 may live in a feed or constant (its kernel does not copy then),
      // and a variable's next value where the variable's assign reads it (plan_memory)
      const ValueSlot& in = n.inputs.empty() ? s : slot(n.inputs[0]);
      const bool view = op_def(n.op).alias_input0 && o == 0 && !n.inputs.empty() &&
                        in.where == s.where && in.index == s.index;
      if (!view && !(s.where == Where::constant && o == 0 && assigned_as(v, s.index)))
        return fmt::format("%{} ({}) would write into {} %{}", i, op_name(n.op),
                           s.where == Where::feed ? "placeholder" : "constant", s.index);
    }
  }
  for (size_t k = 0; k < p.num_returned; ++k)
    if (auto why = check(p.outputs[k]); !why.empty()) return why;
  return {};
}

std::string check_steps(const Program& p, const std::vector<Step>& steps, Backend target) {
  const auto& nodes = p.graph.nodes;
  size_t k = 0;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    if (n.op == OpId::Placeholder || n.op == OpId::Constant || n.op == OpId::Variable) continue;
    if (k >= steps.size() || steps[k].node != static_cast<int32_t>(i))
      return fmt::format("step {} should run node %{}", k, i);
    const Step& st = steps[k++];
    if (st.backend != Backend::cpu && st.backend != target)
      return fmt::format("step for %{} runs on {}, not on {} or the cpu", i,
                         backend_name(st.backend), backend_name(target));
    if (op_def(n.op).writes_variable && st.backend != target)
      return fmt::format("{} %{} must run on {}", op_name(n.op), i, backend_name(target));
    const Layout layout = layout_of(n.op, n.attrs);
    const KernelEntry* kernel = find_kernel(n.op, st.backend, layout);
    if (!kernel)
      return fmt::format("no {} kernel for %{} ({}) in layout {}", backend_name(st.backend), i,
                         op_name(n.op), layout_name(layout));
    std::vector<TensorInfo> in;
    for (auto v : n.inputs) in.push_back(p.graph.info(v));
    const DType t = kernel_dtype(*kernel, n, in);
    if (!kernel->handles(t))
      return fmt::format("the {} kernel of %{} ({}) does not take {}", backend_name(st.backend), i,
                         op_name(n.op), name(t));
  }
  if (k != steps.size()) return fmt::format("{} steps for {} executed nodes", steps.size(), k);
  return {};
}

}  // namespace kiln::package
