// Post-training quantization (include/kiln/quantize.h): prepare the float program (variables
// frozen, constants and batch norms folded), choose the ops to quantize and the activations to
// calibrate, run the calibration batches, and rewrite the program into QDQ form:
//   x -> quantize -> dequantize -> op(., dequantize(int8 weight)) (+ bias) (+ residual)
//     (relu or gelu)
//     -> quantize -> dequantize -> ...
// Every reader of a calibrated value reads its dequantized copy, so that the quantize after each
// chain is the only reader of the chain's end, as fuse_quant requires.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "core/errors.h"
#include "core/op_registry.h"
#include "passes/program.h"
#include "quant/calibration.h"
#include "runtime/executable_impl.h"
#include "runtime/run_kernel.h"

namespace kiln {

using detail::Node;
using detail::ValueRef;

const char* calibration_method_name(CalibrationMethod m) {
  switch (m) {
    case CalibrationMethod::minmax:
      return "minmax";
    case CalibrationMethod::percentile:
      return "percentile";
    case CalibrationMethod::entropy:
      return "entropy";
  }
  return "?";
}

CalibrationMethod parse_calibration_method(const std::string& name) {
  for (auto m :
       {CalibrationMethod::minmax, CalibrationMethod::percentile, CalibrationMethod::entropy})
    if (name == calibration_method_name(m)) return m;
  fail<ValueError>(
      "[post_training_quantize] unknown calibration method '{}' (minmax, percentile, "
      "entropy)",
      name);
}

int PtqReport::quantized() const {
  return static_cast<int>(
      std::count_if(ops.begin(), ops.end(), [](auto& o) { return o.quantized; }));
}
int PtqReport::skipped() const { return static_cast<int>(ops.size()) - quantized(); }

std::string PtqReport::str() const {
  std::string r = fmt::format("calibration: {} over {} batches\n", calibration_method_name(method),
                              calibration_batches);
  r += fmt::format("ops: {} quantized, {} kept float\n", quantized(), skipped());
  for (const auto& o : ops) {
    if (o.quantized)
      r += fmt::format("  {:<8} {:<32} int8, weights per {}\n", o.op, o.name,
                       o.per_channel ? "channel" : "tensor");
    else
      r += fmt::format("  {:<8} {:<32} float: {}\n", o.op, o.name, o.skipped_reason);
  }
  r += fmt::format("activations: {}\n", activations.size());
  for (const auto& a : activations)
    r += fmt::format(
        "  {:<40} seen [{:.4g}, {:.4g}]  range [{:.4g}, {:.4g}]  scale {:.4g}  {} zp {}\n", a.name,
        a.min, a.max, a.lo, a.hi, a.scale, name(a.dtype), a.zero_point);
  r += fmt::format("quantized weights: {} bytes as f32, {} bytes as int8 with their scales\n",
                   weight_bytes_f32, weight_bytes_int8);
  return r;
}

namespace ptq {
namespace {

constexpr const char* kWho = "[post_training_quantize]";

bool is_output(const Program& p, ValueRef v) {
  return std::find(p.outputs.begin(), p.outputs.end(), v) != p.outputs.end();
}

// Variables become constants of their current value, every constant moves to the host, and
// constants and batch norms fold, as compiling would: the weights are then constants of the ops.
void prepare(Program& p, const std::function<Array(const Node&)>& variable_value) {
  for (Node& n : p.graph.nodes) {
    if (op_def(n.op).writes_variable)
      fail<ValueError>(
          "{} the graph assigns a variable (node '{}'): quantization takes an "
          "inference graph",
          kWho, n.name);
    if (n.op == OpId::Variable) {
      n.value = variable_value(n).to(Device::cpu()).copy();
      n.op = OpId::Constant;
    } else if (n.op == OpId::Constant) {
      n.value = n.value.to(Device::cpu());
    }
  }
  p = fold_constants(p, evaluate_node_cpu);
  p = fold_batch_norms(p);
  p = eliminate_common_subexpressions(p);
  p = eliminate_dead_code(p);
}

struct Candidate {
  int32_t node = -1;
  size_t info = 0;      // index in report.ops
  int weight_axis = 0;  // the output-channel axis of the weight
  ValueRef x, y;        // the activation read, the end of the chain fuse_quant absorbs
};

class Planner {
 public:
  Planner(const Program& p, const PtqOptions& o, PtqReport& report)
      : p_(p), o_(o), report_(report), readers_(p.graph.nodes.size()) {
    for (size_t i = 0; i < p.graph.nodes.size(); ++i)
      for (auto v : p.graph.nodes[i].inputs) readers_[v.node].push_back(static_cast<int32_t>(i));
    for (auto v : p.outputs) readers_[v.node].push_back(-1);
  }

  void plan() {
    for (size_t i = 0; i < p_.graph.nodes.size(); ++i) consider(static_cast<int32_t>(i));
    // the chains, in a second sweep: whether an add belongs to a chain depends on the candidates
    for (Candidate& c : candidates) {
      c.y = chain_end(c);
      QuantizedOpInfo& info = report_.ops[c.info];
      if (!o_.quantize_outputs && is_output(p_, c.y)) {
        // fuse_quant needs the quantize after the chain: without it the op would run in float
        // on dequantized values, so it stays float (with int8 weights: a linear reads them through
        // quantized_weight_linear, other ops through a dequantize when run)
        info.quantized = false;
        info.per_channel = o_.int8_weights_for_outputs && o_.per_channel;
        info.int8_weights = o_.int8_weights_for_outputs;
        info.skipped_reason =
            info.int8_weights
                ? "its result is a returned value, kept float with int8 weights "
                  "(quantize_outputs quantizes it)"
                : "its result is a returned value, kept float (quantize_outputs quantizes it)";
        if (info.int8_weights) weights_only.push_back(c);
        continue;
      }
      observe(c.x);
      observe(c.y);
      kept.push_back(c);
    }
    candidates = std::move(kept);
  }

  std::vector<Candidate> kept;
  std::vector<Candidate> weights_only;  // float ops whose weights are stored as int8

  std::vector<Candidate> candidates;
  std::vector<ValueRef> observed;  // the activations to calibrate, in program order of discovery

 private:
  const Node& node(ValueRef v) const { return p_.graph.nodes[v.node]; }
  const TensorInfo& info(ValueRef v) const { return p_.graph.info(v); }
  bool constant(ValueRef v) const { return node(v).op == OpId::Constant; }

  void observe(ValueRef v) {
    if (std::find(observed.begin(), observed.end(), v) == observed.end()) observed.push_back(v);
  }

  static std::string kind_of(const Node& n, const TensorInfo& x) {
    if (n.op == OpId::Matmul) return "matmul";
    if (n.op == OpId::Linear) return "linear";
    if (n.op == OpId::Conv)
      return fmt::format("conv{}d", x.shape.size() >= 2 ? x.shape.size() - 2 : 0);
    return "";
  }

  void consider(int32_t id) {
    const Node& n = p_.graph.nodes[id];
    if (n.inputs.size() < 2) return;
    const std::string kind = kind_of(n, info(n.inputs[0]));
    if (kind.empty() || std::find(o_.ops.begin(), o_.ops.end(), kind) == o_.ops.end()) return;
    QuantizedOpInfo qi;
    qi.name = n.name.empty() ? fmt::format("{}%{}", kind, id) : n.name;
    qi.op = kind;
    auto skip = [&](std::string why) {
      qi.skipped_reason = std::move(why);
      report_.ops.push_back(qi);
    };
    const auto& ex = o_.exclude;
    if (std::find(ex.begin(), ex.end(), qi.name) != ex.end() ||
        std::find(ex.begin(), ex.end(), n.name) != ex.end() ||
        std::find(ex.begin(), ex.end(), kind) != ex.end())
      return skip("excluded");
    for (auto v : n.inputs)
      if (info(v).dtype != f32)
        return skip(fmt::format("an input is {}, not f32", name(info(v).dtype)));
    const ValueRef x = n.inputs[0], w = n.inputs[1];
    const size_t wrank = n.op == OpId::Conv ? 4 : 2;
    if (!constant(w) || info(w).shape.size() != wrank)
      return skip(n.op == OpId::Matmul
                      ? "the second operand is not a constant rank-2 weight (a product of two "
                        "activations stays float)"
                      : "the weight is not a constant");
    if (constant(x)) return skip("the input is a constant");
    qi.quantized = true;
    qi.per_channel = o_.per_channel;
    Candidate c;
    c.node = id;
    c.info = report_.ops.size();
    c.weight_axis = n.op == OpId::Matmul ? 1 : 0;
    c.x = x;
    report_.ops.push_back(qi);
    candidates.push_back(c);
    is_candidate_.insert(id);
  }

  // The only reader of v (a node with one output), or -1.
  int32_t single_reader(ValueRef v) const {
    const auto& r = readers_[v.node];
    if (r.size() != 1 || r[0] < 0 || node(v).outputs.size() != 1) return -1;
    return r[0];
  }

  // Follows fuse_quant's chain forward: (+ bias) (+ residual) for matmul and linear, (+ residual)
  // for convolutions (whose bias is an input), then the activation; each value read only by the
  // next step.
  ValueRef chain_end(const Candidate& c) {
    const Node& op = p_.graph.nodes[c.node];
    ValueRef cur{c.node, 0};
    const Shape out = info(cur).shape;
    bool bias = op.op == OpId::Conv || (op.op == OpId::Linear && op.attrs.b("has_bias", false));
    bool residual = false;
    for (int step = 0; step < 2; ++step) {
      const int32_t r = single_reader(cur);
      if (r < 0 || p_.graph.nodes[r].op != OpId::Add || claimed_.count(r)) break;
      const Node& add = p_.graph.nodes[r];
      if (add.inputs[0] == add.inputs[1] || add.outputs[0].shape != out) break;
      const int side = add.inputs[0] == cur ? 0 : 1;
      const ValueRef other = add.inputs[1 - side];
      // fuse_quant tries the first operand as the chain first: another candidate there owns it
      if (side == 1 && is_candidate_.count(other.node) && info(other).shape == out) break;
      if (info(other).dtype != f32) break;
      const Shape& os = info(other).shape;
      if (!bias && os.size() == 1 && !out.empty() && os[0] == out.back()) {
        bias = true;
      } else if (!residual && os == out) {
        residual = true;
      } else {
        break;
      }
      claimed_.insert(r);
      cur = {r, 0};
    }
    // then relu or gelu (fuse_quant fuses either)
    const int32_t r = single_reader(cur);
    if (r >= 0 && (p_.graph.nodes[r].op == OpId::Relu || p_.graph.nodes[r].op == OpId::Gelu))
      cur = {r, 0};
    return cur;
  }

  const Program& p_;
  const PtqOptions& o_;
  PtqReport& report_;
  std::vector<std::vector<int32_t>> readers_;  // reader node ids, -1 for a program output
  std::set<int32_t> is_candidate_, claimed_;
};

std::string value_name(const Program& p, ValueRef v) {
  const Node& n = p.graph.nodes[v.node];
  if (n.op == OpId::Placeholder) return fmt::format("input {}", n.name);
  const std::string base = n.name.empty() ? fmt::format("{}%{}", op_name(n.op), v.node) : n.name;
  return n.outputs.size() > 1 ? fmt::format("{}:{}", base, v.index) : base;
}

// Batches by program placeholder id.
using Batch = std::map<int32_t, Array>;

// Runs the float program on every batch with the observed values as targets; calls `see` with
// each observed value (on the host) of each batch.
void run_calibration(const Program& p, const std::vector<ValueRef>& observed,
                     const std::vector<Batch>& batches, Device device,
                     const std::function<void(size_t, const Array&)>& see) {
  Graph g;
  g.impl().nodes = p.graph.nodes;
  std::vector<Tensor> targets;
  for (auto v : observed) targets.emplace_back(&g.impl(), v.node, v.index);
  FeedShapes shapes;
  for (const auto& [id, a] : batches[0]) shapes.emplace_back(Tensor(&g.impl(), id, 0), a.shape());
  const Executable exe = g.compile(device, shapes, targets);
  for (const Batch& b : batches) {
    Feeds feeds;
    for (const auto& [id, a] : b) feeds.emplace_back(Tensor(&g.impl(), id, 0), a);
    const std::vector<Array> outs = exe.run(feeds);
    for (size_t k = 0; k < outs.size(); ++k) see(k, outs[k].to(Device::cpu()));
  }
}

// Checks that every batch feeds every placeholder the program reads, with batch 0's shapes.
void check_batches(const Program& p, const std::vector<Batch>& batches) {
  if (batches.empty()) fail<ValueError>("{} no calibration batches", kWho);
  for (size_t i = 0; i < p.graph.nodes.size(); ++i) {
    const Node& n = p.graph.nodes[i];
    if (n.op != OpId::Placeholder) continue;
    for (size_t b = 0; b < batches.size(); ++b) {
      auto it = batches[b].find(static_cast<int32_t>(i));
      if (it == batches[b].end())
        fail<ValueError>("{} calibration batch {} gives no value for input '{}'", kWho, b, n.name);
      const Array& a = it->second;
      if (a.dtype() != n.outputs[0].dtype)
        fail<DTypeError>("{} calibration batch {}: input '{}' takes {}, the batch gives {}", kWho,
                         b, n.name, name(n.outputs[0].dtype), name(a.dtype()));
      const Shape& first = batches[0].at(static_cast<int32_t>(i)).shape();
      if (a.shape() != first)
        fail<ShapeError>(
            "{} calibration batch {}: input '{}' has shape {}, batch 0 has {}: every "
            "batch must have the same shapes",
            kWho, b, n.name, str(a.shape()), str(first));
      const Shape& declared = n.outputs[0].shape;
      bool fits = declared.size() == a.shape().size();
      for (size_t d = 0; fits && d < declared.size(); ++d)
        fits = declared[d] < 0 || declared[d] == a.shape()[d];
      if (!fits)
        fail<ShapeError>("{} calibration batch {}: input '{}' takes shape {}, the batch gives {}",
                         kWho, b, n.name, str(declared), str(a.shape()));
    }
  }
}

struct QuantWeight {
  Array q, scale, zero_point;
};

// Symmetric i8 (in [-127, 127]), one scale per index of `axis` or one for the tensor.
QuantWeight quantize_weight(const Array& w, int axis, bool per_channel) {
  const Shape& s = w.shape();
  const std::vector<float> v = w.to_vector<float>();
  int64_t inner = 1;  // elements of one channel index in a row
  for (size_t d = static_cast<size_t>(axis) + 1; d < s.size(); ++d) inner *= s[d];
  const int64_t channels = s[static_cast<size_t>(axis)];
  const int64_t nscale = per_channel ? channels : 1;
  std::vector<double> amax(static_cast<size_t>(nscale), 0.0);
  auto channel_of = [&](int64_t i) { return per_channel ? (i / inner) % channels : 0; };
  for (int64_t i = 0; i < static_cast<int64_t>(v.size()); ++i) {
    double& a = amax[static_cast<size_t>(channel_of(i))];
    a = std::max(a, std::fabs(static_cast<double>(v[static_cast<size_t>(i)])));
  }
  std::vector<float> scale(amax.size());
  for (size_t c = 0; c < amax.size(); ++c)
    scale[c] = amax[c] > 0 ? static_cast<float>(amax[c] / 127.0) : 1.0f;
  std::vector<int8_t> q(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const double r = std::nearbyint(
        static_cast<double>(v[i]) /
        static_cast<double>(scale[static_cast<size_t>(channel_of(static_cast<int64_t>(i)))]));
    q[i] = static_cast<int8_t>(std::clamp(r, -127.0, 127.0));
  }
  const Shape ss = per_channel ? Shape{channels} : Shape{};
  return {Array::from_vector(q, s), Array::from_vector(scale, ss),
          Array::from_vector(std::vector<int8_t>(scale.size(), 0), ss)};
}

ValueRef add_constant(Program& out, Array value, std::string name) {
  Node c;
  c.op = OpId::Constant;
  c.outputs = {{value.shape(), value.dtype()}};
  c.value = std::move(value);
  c.name = std::move(name);
  return {out.graph.add_inferred(std::move(c)), 0};
}

Array scalar_of(int64_t v, DType t) {
  return t == u8 ? Array::scalar(static_cast<uint8_t>(v)) : Array::scalar(static_cast<int8_t>(v));
}

QuantizedGraph quantize_program(Program p, const std::vector<Batch>& batches, const PtqOptions& o) {
  if (o.activation_dtype != u8 && o.activation_dtype != i8)
    fail<DTypeError>("{} activations are u8 (asymmetric) or i8 (symmetric), not {}", kWho,
                     name(o.activation_dtype));
  if (!(o.percentile > 50 && o.percentile <= 100))
    fail<ValueError>("{} the percentile must be in (50, 100], got {}", kWho, o.percentile);
  if (o.histogram_bins < 256 || o.histogram_bins > (1 << 20))
    fail<ValueError>("{} histogram_bins must be in [256, 2^20], got {}", kWho, o.histogram_bins);
  for (const std::string& op : o.ops)
    if (op != "conv2d" && op != "matmul" && op != "linear")
      fail<ValueError>("{} cannot quantize op '{}' (conv2d, matmul, linear)", kWho, op);
  check_batches(p, batches);

  QuantizedGraph result;
  PtqReport& report = result.report;
  report.method = o.method;
  report.calibration_batches = static_cast<int64_t>(batches.size());
  Planner planner(p, o, report);
  planner.plan();
  const std::vector<ValueRef>& observed = planner.observed;

  // calibration: the range, then (percentile, entropy) a histogram over it
  std::vector<Observer> obs(observed.size());
  const Device device = o.device ? *o.device : default_device();
  auto floats = [](const Array& a) { return a.dtype() == f32 ? a : a.astype(f32); };
  if (!observed.empty()) {
    run_calibration(p, observed, batches, device, [&](size_t k, const Array& a) {
      const Array f = floats(a);
      obs[k].observe_range(f.data<float>(), f.numel());
    });
    if (o.method != CalibrationMethod::minmax) {
      const bool abs = o.method == CalibrationMethod::entropy || o.activation_dtype == i8;
      for (auto& ob : obs) ob.start_histogram(o.histogram_bins, abs);
      run_calibration(p, observed, batches, device, [&](size_t k, const Array& a) {
        const Array f = floats(a);
        obs[k].observe_histogram(f.data<float>(), f.numel());
      });
    }
  }
  std::map<ValueRef, size_t> observed_at;
  for (size_t k = 0; k < observed.size(); ++k) {
    observed_at[observed[k]] = k;
    ActivationRange r;
    r.name = value_name(p, observed[k]);
    r.min = obs[k].min(), r.max = obs[k].max();
    std::tie(r.lo, r.hi) = choose_range(obs[k], o.method, o.percentile, o.activation_dtype);
    const QParams q = activation_qparams(r.lo, r.hi, o.activation_dtype);
    r.scale = static_cast<float>(q.scale);
    r.zero_point = q.zero_point;
    r.dtype = o.activation_dtype;
    report.activations.push_back(r);
  }
  // a max pool's result shares its calibrated input's parameters (its values are some of the
  // input's): then fuse_quant pools the int8 data and no requantize is left between
  for (size_t k = 0; k < observed.size(); ++k) {
    const Node& n = p.graph.nodes[observed[k].node];
    if (n.op != OpId::MaxPool || observed[k].index != 0) continue;
    const auto in = std::find(observed.begin(), observed.end(), n.inputs[0]);
    if (in == observed.end()) continue;
    const ActivationRange& from = report.activations[static_cast<size_t>(in - observed.begin())];
    ActivationRange& r = report.activations[k];
    r.lo = from.lo, r.hi = from.hi, r.scale = from.scale, r.zero_point = from.zero_point;
  }

  // the rewrite
  const auto& nodes = p.graph.nodes;
  std::map<int32_t, const Candidate*> candidate_at;
  for (const Candidate& c : planner.candidates) candidate_at[c.node] = &c;
  for (const Candidate& c : planner.weights_only) candidate_at[c.node] = &c;
  Program out;
  std::vector<std::vector<ValueRef>> map(nodes.size());
  std::map<ValueRef, ValueRef> float_of;  // calibrated values: the float value itself
  std::map<int32_t, ValueRef> weight_of;  // weight constants: their dequantize
  const Attrs per_tensor{{"axis", int64_t{0}}, {"block_size", int64_t{0}}};
  for (size_t i = 0; i < nodes.size(); ++i) {
    Node n = nodes[i];
    for (auto& v : n.inputs) v = map[v.node][v.index];
    if (auto it = candidate_at.find(static_cast<int32_t>(i)); it != candidate_at.end()) {
      const Candidate& c = *it->second;
      const int32_t wid = nodes[i].inputs[1].node;
      if (!weight_of.count(wid)) {
        const Node& wn = nodes[wid];
        const std::string base = wn.name.empty() ? fmt::format("weight%{}", wid) : wn.name;
        QuantWeight qw = quantize_weight(wn.value, c.weight_axis, o.per_channel);
        report.weight_bytes_f32 += static_cast<int64_t>(wn.value.nbytes());
        report.weight_bytes_int8 +=
            static_cast<int64_t>(qw.q.nbytes() + qw.scale.nbytes() + qw.zero_point.nbytes());
        const ValueRef q = add_constant(out, qw.q, base + ".int8");
        const ValueRef s = add_constant(out, qw.scale, base + ".scale");
        const ValueRef z = add_constant(out, qw.zero_point, base + ".zero_point");
        const Attrs a{{"axis", int64_t{o.per_channel ? c.weight_axis : 0}},
                      {"block_size", int64_t{0}}};
        weight_of[wid] = {out.graph.add(OpId::Dequantize, {q, s, z}, a, base + ".dequantize"), 0};
      }
      n.inputs[1] = weight_of.at(wid);
    }
    const int32_t nid = out.graph.add_inferred(std::move(n));
    std::vector<ValueRef> vals;
    for (size_t k = 0; k < nodes[i].outputs.size(); ++k) {
      const ValueRef old{static_cast<int32_t>(i), static_cast<int32_t>(k)};
      const ValueRef now{nid, static_cast<int32_t>(k)};
      auto at = observed_at.find(old);
      if (at == observed_at.end()) {
        vals.push_back(now);
        continue;
      }
      const ActivationRange& r = report.activations[at->second];
      const std::string qn = r.name.starts_with("input ") ? r.name.substr(6) : r.name;
      const ValueRef s =
          add_constant(out, Array::scalar(static_cast<float>(r.scale)), qn + ".scale");
      const ValueRef z = add_constant(out, scalar_of(r.zero_point, r.dtype), qn + ".zero_point");
      const int32_t q = out.graph.add(OpId::Quantize, {now, s, z}, per_tensor, qn + ".quantize");
      const int32_t dq =
          out.graph.add(OpId::Dequantize, {{q, 0}, s, z}, per_tensor, qn + ".dequantize");
      float_of[old] = now;
      vals.push_back({dq, 0});
    }
    map[i] = std::move(vals);
  }
  for (auto v : p.outputs) {
    auto f = float_of.find(v);
    out.outputs.push_back(f != float_of.end() ? f->second : map[v.node][v.index]);
  }
  out.num_returned = p.num_returned;
  out = eliminate_dead_code(out);

  result.graph.impl().nodes = std::move(out.graph.nodes);
  detail::GraphImpl* g = &result.graph.impl();
  for (size_t i = 0; i < g->nodes.size(); ++i) {
    g->nodes[i].origin = -1;
    if (g->nodes[i].op == OpId::Placeholder)
      result.inputs.emplace_back(g, static_cast<int32_t>(i), 0);
  }
  for (size_t i = 0; i < out.num_returned; ++i)
    result.outputs.emplace_back(g, out.outputs[i].node, out.outputs[i].index);
  return result;
}

}  // namespace
}  // namespace ptq

QuantizedGraph post_training_quantize(const Graph& graph, const std::vector<Tensor>& outputs,
                                      const std::vector<Feeds>& calibration,
                                      const PtqOptions& options) {
  if (outputs.empty()) fail<ValueError>("{} no outputs given", ptq::kWho);
  std::vector<ValueRef> outs;
  for (const Tensor& t : outputs) {
    if (t.graph_impl() != &graph.impl())
      fail<ValueError>("{} output '{}' belongs to another graph", ptq::kWho,
                       t.valid() ? t.name() : "");
    outs.push_back({t.node_id(), t.output_index()});
  }
  Program p = extract_program(graph.impl(), outs);
  p.num_returned = outs.size();
  ptq::prepare(p, [](const Node& n) { return n.value; });
  // feeds by placeholder: program placeholders keep their graph node id as origin
  std::map<int32_t, int32_t> by_origin;
  for (size_t i = 0; i < p.graph.nodes.size(); ++i)
    if (p.graph.nodes[i].op == OpId::Placeholder)
      by_origin[p.graph.nodes[i].origin] = static_cast<int32_t>(i);
  std::vector<ptq::Batch> batches;
  for (size_t b = 0; b < calibration.size(); ++b) {
    ptq::Batch batch;
    for (const auto& [t, a] : calibration[b]) {
      if (t.graph_impl() != &graph.impl())
        fail<ValueError>("{} calibration batch {} feeds a tensor of another graph", ptq::kWho, b);
      auto it = by_origin.find(t.node_id());
      if (it != by_origin.end()) batch[it->second] = a;  // others are not read
    }
    batches.push_back(std::move(batch));
  }
  return ptq::quantize_program(std::move(p), batches, options);
}

QuantizedGraph post_training_quantize(const Executable& model,
                                      const std::vector<std::map<std::string, Array>>& calibration,
                                      const PtqOptions& options) {
  Program p = model.impl().program;
  p.outputs.resize(p.num_returned);  // updates only assign, which prepare refuses
  std::set<std::string> inputs;
  std::string names;
  for (const Node& n : p.graph.nodes)
    if (n.op == OpId::Placeholder && inputs.insert(n.name).second)
      names += (names.empty() ? "" : ", ") + n.name;
  ptq::prepare(p, [&model](const Node& n) { return model.read_variable(n.name); });
  std::map<std::string, int32_t> by_name;  // the inputs the outputs read
  for (size_t i = 0; i < p.graph.nodes.size(); ++i)
    if (p.graph.nodes[i].op == OpId::Placeholder)
      by_name[p.graph.nodes[i].name] = static_cast<int32_t>(i);
  std::vector<ptq::Batch> batches;
  for (size_t b = 0; b < calibration.size(); ++b) {
    ptq::Batch batch;
    for (const auto& [n, a] : calibration[b]) {
      if (!inputs.count(n))
        fail<ValueError>(
            "{} calibration batch {} has input '{}', which the model does not take "
            "(inputs: {})",
            ptq::kWho, b, n, names);
      if (auto it = by_name.find(n); it != by_name.end()) batch[it->second] = a;
    }
    batches.push_back(std::move(batch));
  }
  return ptq::quantize_program(std::move(p), batches, options);
}

}  // namespace kiln
