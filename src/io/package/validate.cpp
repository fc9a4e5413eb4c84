#include "io/package/validate.h"

#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <exception>
#include <map>

#include "core/errors.h"
#include "core/op_registry.h"
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
constexpr uint64_t kMaxBytes = uint64_t{1} << 62;

uint64_t bytes_of(const TensorInfo& t) {
  return static_cast<uint64_t>(numel(t.shape)) * size_of(t.dtype);
}

// The inputs an op takes: [lo, hi]; false for an op without a rule here (which no package may
// then use: every op of op_list.inc needs one, a test checks). Ops with optional inputs record
// them as bool attributes has_<name> (ops::add_optional), which inference and kernels read to
// index their inputs.
bool arity_rule(OpId op, const Attrs& attrs, int& lo, int& hi) {
  auto opt = [&](const char* key) { return attrs.b(key, false) ? 1 : 0; };
  lo = hi = 1;
  switch (op) {
    case OpId::Placeholder: case OpId::Constant: case OpId::Full: case OpId::Arange:
    case OpId::Variable: case OpId::RandomPhiloxState:
      lo = hi = 0;
      return true;
    case OpId::Neg: case OpId::Abs: case OpId::Sign: case OpId::Exp: case OpId::Log:
    case OpId::Log1p: case OpId::Expm1: case OpId::Sqrt: case OpId::Rsqrt: case OpId::Reciprocal:
    case OpId::Sin: case OpId::Cos: case OpId::Tanh: case OpId::Sigmoid: case OpId::Relu:
    case OpId::LeakyRelu: case OpId::Elu: case OpId::Selu: case OpId::Gelu: case OpId::Silu:
    case OpId::Softplus: case OpId::Softshrink: case OpId::Hardshrink: case OpId::Hardswish:
    case OpId::Hardsigmoid: case OpId::Erf: case OpId::Floor: case OpId::Ceil: case OpId::Round:
    case OpId::Clip: case OpId::Tan: case OpId::Asin: case OpId::Acos: case OpId::Atan:
    case OpId::Sinh: case OpId::Cosh: case OpId::Asinh: case OpId::Acosh: case OpId::Atanh:
    case OpId::LogicalNot: case OpId::Cast: case OpId::IsNan: case OpId::IsInf:
    case OpId::BitwiseNot: case OpId::AdaptiveAvgPool: case OpId::AdaptiveAvgPoolGrad:
    case OpId::Sum: case OpId::Mean: case OpId::Max: case OpId::Min: case OpId::Prod:
    case OpId::Argmax: case OpId::Argmin: case OpId::Logsumexp: case OpId::Variance:
    case OpId::NormL1: case OpId::NormL2: case OpId::Cumsum: case OpId::Softmax:
    case OpId::LogSoftmax: case OpId::Dropout: case OpId::Transpose: case OpId::Pad:
    case OpId::BroadcastTo: case OpId::Flip: case OpId::OneHot: case OpId::Topk: case OpId::Sort:
    case OpId::Argsort: case OpId::CoordinateAlongAxis: case OpId::Tile: case OpId::Slice:
    case OpId::Split: case OpId::Reshape: case OpId::MaxPool: case OpId::AvgPool:
    case OpId::AvgPoolGrad: case OpId::Resize: case OpId::AllReduce: case OpId::CollectiveWait:
    case OpId::RandomUniform: case OpId::RandomNormal: case OpId::RandomTruncatedNormal:
    case OpId::RandomBernoulli: case OpId::RandomDropoutMask: case OpId::RandomInteger:
    case OpId::DepthToSpace: case OpId::SpaceToDepth: case OpId::Roll:
      return true;
    case OpId::Concat: case OpId::Custom: case OpId::CustomImpure:
      hi = INT_MAX;
      return true;
    case OpId::FusedElementwise:  // its inference checks the program against the inputs
      hi = 32;
      return true;
    case OpId::Where: case OpId::ScatterElements: case OpId::ScatterNd:
      lo = hi = 3;
      return true;
    case OpId::Conv: case OpId::ConvTranspose: case OpId::Linear:
      lo = hi = 2 + opt("has_bias");
      return true;
    case OpId::LayerNorm: case OpId::InstanceNorm: case OpId::GroupNorm:
      lo = hi = 1 + opt("has_weight") + opt("has_bias");
      return true;
    case OpId::RmsNorm:
      lo = hi = 1 + opt("has_weight");
      return true;
    case OpId::BatchNorm:
      lo = hi = 3 + opt("has_weight") + opt("has_bias");
      return true;
    case OpId::BatchNormTrain:
      lo = hi = 1 + opt("has_weight") + opt("has_bias");
      return true;
    case OpId::BatchNormTrainGrad:
      lo = hi = 4 + opt("has_weight");
      return true;
    case OpId::Lstm:
      lo = hi = 3 + opt("has_b") + opt("has_seq_lens") + opt("has_h0") + opt("has_c0") +
                opt("has_p");
      return true;
    case OpId::Gru: case OpId::Rnn:
      lo = hi = 3 + opt("has_b") + opt("has_seq_lens") + opt("has_h0");
      return true;
    case OpId::RnnGrad:  // x, w, r, the optional ones, reserve, dy, dh[, dc]
      lo = hi = 6 + opt("has_seq_lens") + opt("has_h0") + opt("has_c0") + opt("has_p") +
                (attrs.i("cell", 0) == 0 ? 1 : 0);
      return true;
    case OpId::ScaledDotProductAttention:
      lo = hi = 3 + opt("has_mask");
      return true;
    case OpId::ScaledDotProductAttentionGrad:
      lo = hi = 5 + opt("has_mask");
      return true;
    case OpId::Cholesky:
      return true;
    case OpId::TriangularSolve:
      lo = hi = 2;
      return true;
    case OpId::Assign: case OpId::Add: case OpId::Sub: case OpId::Mul: case OpId::Div:
    case OpId::Pow: case OpId::Maximum: case OpId::Minimum: case OpId::Mod: case OpId::Equal:
    case OpId::NotEqual: case OpId::Less: case OpId::LessEqual: case OpId::Greater:
    case OpId::GreaterEqual: case OpId::LogicalAnd: case OpId::LogicalOr: case OpId::LogicalXor:
    case OpId::BitwiseAnd: case OpId::BitwiseOr: case OpId::BitwiseXor: case OpId::BitShift:
    case OpId::Matmul: case OpId::ConvGradWeight: case OpId::MaxPoolGrad: case OpId::Gather:
    case OpId::GatherElements: case OpId::HammingDistance: case OpId::SoftmaxCrossEntropy:
    case OpId::Nll: case OpId::Mse: case OpId::GatherNd: case OpId::GridSample:
    case OpId::Embedding: case OpId::EmbeddingGrad: case OpId::MaskedFill:
    case OpId::NonMaxSuppression:
      lo = hi = 2;
      return true;
    // quantization (src/ops/quant.cpp): x, scale, zero_point
    case OpId::Quantize: case OpId::Dequantize: case OpId::FakeQuantize:
    case OpId::DequantizeAdaptiveAvgPool:
      lo = hi = 3;
      return true;
    case OpId::QuantizedMatmul:
      lo = hi = 8 + opt("has_bias") + opt("has_residual");
      return true;
    case OpId::QuantizedWeightLinear:
      lo = hi = 4 + opt("has_bias");
      return true;
    case OpId::QuantizedConv:  // a quantized residual brings its scale and zero point
      lo = hi = 8 + opt("has_bias") + opt("has_residual") +
                2 * (opt("has_residual") && opt("quantized_residual"));
      return true;
  }
  return false;
}

// Inference and kernels trust attributes that op builders made: before inference sees a stored
// node, its attributes are held to what builders give, where inference would otherwise index,
// divide or overflow with them. Integers are bounded so that products of a dim and an attribute
// fit in 64 bits.
constexpr int64_t kMaxDim = int64_t{1} << 40;       // dims and most integer attributes
constexpr int64_t kMaxGeometry = int64_t{1} << 20;  // strides, pads, kernels, groups, repeats

std::string check_attrs(const Node& n, const std::vector<TensorInfo>& in) {
  const Attrs& a = n.attrs;
  for (auto& [key, v] : a.items()) {
    const bool slice_bounds = n.op == OpId::Slice && (key == "starts" || key == "stops");
    // seeds and random_integer's bounds span all of int64
    const bool any_int = key == "seed" || n.op == OpId::RandomInteger;
    if (auto* x = std::get_if<int64_t>(&v); x && !any_int && (*x > kMaxDim || *x < -kMaxDim))
      return fmt::format("attribute {} = {} is out of range", key, *x);
    if (auto* x = std::get_if<std::vector<int64_t>>(&v); x && !slice_bounds)
      for (int64_t e : *x)
        if (e > kMaxDim || e < -kMaxDim)
          return fmt::format("attribute {} holds {}, out of range", key, e);
    if (auto* x = std::get_if<double>(&v); x && !std::isfinite(*x) && n.op == OpId::Arange)
      return fmt::format("attribute {} = {} is not finite", key, *x);
    if (auto* x = std::get_if<std::vector<double>>(&v))
      for (double e : *x)
        if (!std::isfinite(e)) return fmt::format("attribute {} holds {}", key, e);
  }
  const size_t rank = in.empty() ? 0 : in[0].shape.size();
  auto sized = [&](const char* key, size_t want, int64_t lo, int64_t hi) -> std::string {
    if (!a.has(key)) return {};
    const auto& v = a.ints(key);
    if (v.size() != want)
      return fmt::format("attribute {} has {} values; {} expected", key, v.size(), want);
    for (int64_t e : v)
      if (e < lo || e > hi)
        return fmt::format("attribute {} holds {}, outside [{}, {}]", key, e, lo, hi);
    return {};
  };
  std::string why;
  switch (n.op) {
    case OpId::Conv:
    case OpId::ConvTranspose:
    case OpId::ConvGradWeight: {
      if (rank < 3 || rank > 5 || (n.op != OpId::ConvGradWeight && in[1].shape.size() != rank))
        return "convolution inputs of ranks other than 3 to 5, or of two ranks";
      const size_t nd = rank - 2;
      for (const char* k : {"stride", "dilation", "output_padding"})
        if (!(why = sized(k, nd, 0, kMaxGeometry)).empty()) return why;
      if (!(why = sized("pads", 2 * nd, 0, kMaxGeometry)).empty()) return why;
      if (a.i("groups") < 1 || a.i("groups") > kMaxGeometry) return "groups out of range";
      return {};
    }
    case OpId::QuantizedConv: {
      if (rank != 4 || in[3].shape.size() != 4) return "quantized_conv inputs of rank other than 4";
      for (const char* k : {"stride", "dilation"})
        if (!(why = sized(k, 2, 1, kMaxGeometry)).empty()) return why;
      if (!(why = sized("pads", 4, 0, kMaxGeometry)).empty()) return why;
      if (a.i("groups") < 1 || a.i("groups") > kMaxGeometry) return "groups out of range";
      return {};
    }
    case OpId::MaxPool:
    case OpId::AvgPool:
    case OpId::AvgPoolGrad: {
      const size_t nd = a.ints("kernel").size();
      if (!(why = sized("kernel", nd, 1, kMaxGeometry)).empty()) return why;
      for (const char* k : {"stride", "dilation"})
        if (!(why = sized(k, nd, 1, kMaxGeometry)).empty()) return why;
      return sized("pads", 2 * nd, 0, kMaxGeometry);
    }
    case OpId::Tile:
      return sized("reps", rank, 0, kMaxGeometry);
    case OpId::Slice:
      if (!(why = sized("starts", rank, INT64_MIN, INT64_MAX)).empty()) return why;
      if (!(why = sized("stops", rank, INT64_MIN, INT64_MAX)).empty()) return why;
      if (!(why = sized("steps", rank, -kMaxDim, kMaxDim)).empty()) return why;
      for (int64_t e : a.ints("steps"))
        if (e == 0) return "a slice step of 0";
      return {};
    case OpId::Split:
      if (a.ints("sizes").empty() && a.i("parts") < 1) return "split into fewer than 1 part";
      for (int64_t e : a.ints("sizes"))
        if (e < 0) return "a negative split size";
      return {};
    case OpId::Reshape: {
      const auto& shape = a.ints("shape");
      uint64_t prod = 1;
      for (int64_t d : shape) {
        if (d < -1) return fmt::format("reshape to a dim of {}", d);
        if (d > 0) prod = static_cast<uint64_t>(d) > kMaxBytes / prod ? kMaxBytes : prod * d;
      }
      if (prod >= kMaxBytes) return "reshape to too many elements";
      if (a.has("input_dims"))
        return sized("input_dims", shape.size(), -1, static_cast<int64_t>(rank) - 1);
      return {};
    }
    case OpId::Arange: {
      const double step = a.f("step"), count = std::ceil((a.f("stop") - a.f("start")) / step);
      if (step == 0 || !(count < static_cast<double>(kMaxDim))) return "arange of too many values";
      return {};
    }
    default:
      return {};
  }
}

std::string infos(const std::vector<TensorInfo>& v) {
  std::string s;
  for (auto& t : v) s += (s.empty() ? "" : ", ") + std::string(name(t.dtype)) + str(t.shape);
  return "[" + s + "]";
}
}  // namespace

bool arity(OpId op, const Attrs& attrs, int& lo, int& hi) { return arity_rule(op, attrs, lo, hi); }

std::string check_shape(const TensorInfo& info) {
  if (info.shape.size() > 64) return fmt::format("rank {} is above 64", info.shape.size());
  for (int64_t d : info.shape)
    if (d > kMaxDim) return fmt::format("shape {} has a dim above 2^40", str(info.shape));
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
    if (!arity(n.op, n.attrs, lo, hi)) return "the op cannot be loaded from packages yet";
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
    if (std::string why = check_attrs(n, in); !why.empty()) return why;
    out = def.infer(InferContext{n.op, n.attrs, in});
  } catch (const std::exception& e) {
    return fmt::format("inputs {} and attributes ({}) are rejected: {}", infos(in),
                       n.attrs.to_string(), e.what());
  }
  if (out != n.outputs)
    return fmt::format("outputs {} differ from {} that inputs {} give", infos(n.outputs),
                       infos(out), infos(in));
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
    if (n.op == OpId::Assign && st.backend != target)
      return fmt::format("assign %{} must run on {}", i, backend_name(target));
    const KernelEntry* kernel = find_kernel(n.op, st.backend);
    if (!kernel)
      return fmt::format("no {} kernel for %{} ({})", backend_name(st.backend), i, op_name(n.op));
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
