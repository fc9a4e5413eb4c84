#include "io/package/validate.h"

#include <fmt/format.h>

#include <climits>
#include <exception>

#include "core/errors.h"
#include "core/op_registry.h"

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
constexpr uint64_t kMaxBytes = uint64_t{1} << 62;

uint64_t bytes_of(const TensorInfo& t) {
  return static_cast<uint64_t>(numel(t.shape)) * size_of(t.dtype);
}

// The inputs an op takes: [lo, hi]. Ops with optional inputs record them as bool attributes
// has_<name> (ops::add_optional), which inference and kernels read to index their inputs.
void arity(const Node& n, int& lo, int& hi) {
  auto opt = [&](const char* key) { return n.attrs.b(key, false) ? 1 : 0; };
  lo = hi = 1;
  switch (n.op) {
    case OpId::Placeholder: case OpId::Constant: case OpId::Full: case OpId::Arange:
    case OpId::Variable:
      lo = hi = 0;
      return;
    case OpId::Concat:
      hi = INT_MAX;
      return;
    case OpId::Where: case OpId::ScatterElements:
      lo = hi = 3;
      return;
    case OpId::Conv: case OpId::ConvTranspose: case OpId::Linear:
      lo = hi = 2 + opt("has_bias");
      return;
    case OpId::LayerNorm: case OpId::InstanceNorm: case OpId::GroupNorm:
      lo = hi = 1 + opt("has_weight") + opt("has_bias");
      return;
    case OpId::RmsNorm:
      lo = hi = 1 + opt("has_weight");
      return;
    case OpId::BatchNorm:
      lo = hi = 3 + opt("has_weight") + opt("has_bias");
      return;
    case OpId::BatchNormTrain:
      lo = hi = 1 + opt("has_weight") + opt("has_bias");
      return;
    case OpId::BatchNormTrainGrad:
      lo = hi = 4 + opt("has_weight");
      return;
    case OpId::Assign: case OpId::Add: case OpId::Sub: case OpId::Mul: case OpId::Div:
    case OpId::Pow: case OpId::Maximum: case OpId::Minimum: case OpId::Mod: case OpId::Equal:
    case OpId::NotEqual: case OpId::Less: case OpId::LessEqual: case OpId::Greater:
    case OpId::GreaterEqual: case OpId::LogicalAnd: case OpId::LogicalOr: case OpId::LogicalXor:
    case OpId::BitwiseAnd: case OpId::BitwiseOr: case OpId::BitwiseXor: case OpId::BitShift:
    case OpId::Matmul: case OpId::ConvGradWeight: case OpId::MaxPoolGrad: case OpId::Gather:
    case OpId::GatherElements: case OpId::HammingDistance: case OpId::SoftmaxCrossEntropy:
    case OpId::Nll: case OpId::Mse:
      lo = hi = 2;
      return;
    default:
      return;
  }
}

std::string infos(const std::vector<TensorInfo>& v) {
  std::string s;
  for (auto& t : v) s += (s.empty() ? "" : ", ") + std::string(name(t.dtype)) + str(t.shape);
  return "[" + s + "]";
}
}  // namespace

std::string check_shape(const TensorInfo& info) {
  if (info.shape.size() > 64) return fmt::format("rank {} is above 64", info.shape.size());
  uint64_t n = size_of(info.dtype);
  for (int64_t d : info.shape) {
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
    arity(n, lo, hi);
  } catch (const std::exception& e) {
    return e.what();
  }
  const int count = static_cast<int>(n.inputs.size());
  if (count < lo || count > hi)
    return lo == hi ? fmt::format("has {} inputs; the op takes {}", count, lo)
                    : fmt::format("has {} inputs; the op takes {} to {}", count, lo, hi);
  if (n.op == OpId::Placeholder || n.op == OpId::Constant || n.op == OpId::Variable)
    return n.outputs.size() == 1 ? std::string()
                                 : fmt::format("has {} outputs instead of 1", n.outputs.size());
  if (n.op == OpId::Assign && g.nodes[n.inputs[0].node].op != OpId::Variable)
    return fmt::format("assigns to %{}, which is not a variable", n.inputs[0].node);
  const OpDef& def = op_def(n.op);
  if (!def.infer) return "the op has no shape inference";
  std::vector<TensorInfo> in;
  for (auto v : n.inputs) in.push_back(g.info(v));
  std::vector<TensorInfo> out;
  try {
    out = def.infer(InferContext{n.op, n.attrs, in});
  } catch (const std::exception& e) {
    return fmt::format("inputs {} and attributes ({}) are rejected: {}", infos(in),
                       n.attrs.to_string(), e.what());
  }
  if (out != n.outputs)
    return fmt::format("outputs {} differ from {} that inputs {} give", infos(n.outputs), infos(out),
                       infos(in));
  return {};
}

std::string check_plan(const Program& p, const MemoryPlan& plan) {
  const auto& nodes = p.graph.nodes;
  if (plan.slots.size() != nodes.size()) return "one row of slots per node expected";
  const auto n_nodes = static_cast<int64_t>(nodes.size());
  auto slot = [&](ValueRef v) -> const ValueSlot& { return plan.slots[v.node][v.index]; };
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
        if (s.index < 0 || s.index >= n_nodes) return fmt::format("{} names node %{}", what, s.index);
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
      // only a view of input 0 may live in a feed or constant (its kernel does not copy then)
      const ValueSlot& in = n.inputs.empty() ? s : slot(n.inputs[0]);
      if (!op_def(n.op).alias_input0 || o != 0 || n.inputs.empty() || in.where != s.where ||
          in.index != s.index)
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
    if (n.op == OpId::Assign && st.backend != target)
      return fmt::format("assign %{} must run on {}", i, backend_name(target));
    const KernelEntry* kernel = find_kernel(n.op, st.backend);
    if (!kernel) return fmt::format("no {} kernel for %{} ({})", backend_name(st.backend), i, op_name(n.op));
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
