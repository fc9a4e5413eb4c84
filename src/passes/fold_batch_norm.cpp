// Inference batch norm folded into the convolution before it: conv(x, W, b) followed by
// batch_norm(mean, var, gamma, beta) with constant parameters becomes conv(x, W', b') with
//   scale = gamma / sqrt(var + eps),  W'[o] = W[o] * scale[o],  b' = (b - mean) * scale + beta,
// computed in double on the host. The conv's output must have no other reader, so nothing else
// sees the unnormalized values. One kernel and one pass over the activations less per pair.
#include <algorithm>
#include <cmath>

#include "core/op_registry.h"
#include "passes/program.h"

namespace kiln {

using detail::Node;
using detail::ValueRef;

namespace {
bool is_constant(const Program& p, ValueRef v) { return p.graph.nodes[v.node].op == OpId::Constant; }

// The conv node a batch-norm node `bn` can be folded into, or -1.
int32_t foldable_conv(const Program& p, const Node& bn, const std::vector<int>& readers) {
  const ValueRef x = bn.inputs[0];
  const Node& conv = p.graph.nodes[x.node];
  if (conv.op != OpId::Conv || readers[x.node] != 1) return -1;
  for (size_t i = 1; i < conv.inputs.size(); ++i)
    if (!is_constant(p, conv.inputs[i])) return -1;
  for (size_t i = 1; i < bn.inputs.size(); ++i)
    if (!is_constant(p, bn.inputs[i])) return -1;
  const DType t = conv.outputs[0].dtype;
  if (t != f32 && t != f64 && t != f16 && t != bf16) return -1;
  for (auto v : conv.inputs)
    if (p.graph.info(v).dtype != t) return -1;
  return x.node;
}

Array constant_like(const std::vector<double>& v, const Shape& shape, DType t) {
  return Array::from_vector(v, shape).astype(t);
}
}  // namespace

Program fold_batch_norms(const Program& p) {
  const auto& nodes = p.graph.nodes;
  // readers of each node's outputs (program outputs count as readers)
  std::vector<int> readers(nodes.size(), 0);
  for (const Node& n : nodes)
    for (auto v : n.inputs) ++readers[v.node];
  for (auto v : p.outputs) ++readers[v.node];
  std::vector<int32_t> conv_of(nodes.size(), -1);  // batch norm -> its conv
  std::vector<char> folded(nodes.size(), 0);       // convs that move into their batch norm
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (nodes[i].op != OpId::BatchNorm) continue;
    const int32_t c = foldable_conv(p, nodes[i], readers);
    if (c < 0) continue;
    conv_of[i] = c;
    folded[c] = 1;
  }
  if (std::find(folded.begin(), folded.end(), 1) == folded.end()) return p;  // none to fold
  ProgramBuilder b(p);
  for (size_t i = 0; i < nodes.size(); ++i) {
    const auto id = static_cast<int32_t>(i);
    if (folded[i]) continue;  // emitted at its batch norm, its only reader
    if (conv_of[i] < 0) {
      b.copy(id);
      continue;
    }
    const Node& bn = nodes[i];
    const Node& conv = nodes[conv_of[i]];
    const DType t = conv.outputs[0].dtype;
    const bool has_w = bn.attrs.b("has_weight", false), has_b = bn.attrs.b("has_bias", false);
    const double eps = bn.attrs.f("eps");
    auto values = [&](size_t k) { return nodes[bn.inputs[k].node].value.to_vector<double>(); };
    const std::vector<double> mean = values(1), var = values(2);
    const std::vector<double> gamma = has_w ? values(3) : std::vector<double>(mean.size(), 1.0);
    const std::vector<double> beta =
        has_b ? values(has_w ? 4 : 3) : std::vector<double>(mean.size(), 0.0);
    const Array& w0 = nodes[conv.inputs[1].node].value;
    std::vector<double> w = w0.to_vector<double>();
    const size_t channels = mean.size(), per = w.size() / std::max<size_t>(channels, 1);
    std::vector<double> scale(channels), bias(channels, 0.0);
    if (conv.attrs.b("has_bias", false)) bias = nodes[conv.inputs[2].node].value.to_vector<double>();
    for (size_t o = 0; o < channels; ++o) {
      scale[o] = gamma[o] / std::sqrt(var[o] + eps);
      bias[o] = (bias[o] - mean[o]) * scale[o] + beta[o];
      for (size_t j = 0; j < per; ++j) w[o * per + j] *= scale[o];
    }
    auto add_constant = [&](Array a, const std::string& name) {
      Node c;
      c.op = OpId::Constant;
      c.outputs = {{a.shape(), a.dtype()}};
      c.value = std::move(a);
      c.name = name;
      return ValueRef{b.graph().add_inferred(std::move(c)), 0};
    };
    const ValueRef wv = add_constant(constant_like(w, w0.shape(), t), conv.name + ".folded_weight");
    const ValueRef bv = add_constant(constant_like(bias, {static_cast<int64_t>(channels)}, t),
                                     conv.name + ".folded_bias");
    Attrs attrs = conv.attrs;
    attrs.set("has_bias", true);
    const int32_t nid = b.graph().add(OpId::Conv, {b.remap(conv.inputs[0]), wv, bv}, attrs, bn.name);
    b.graph().nodes[nid].origin = bn.origin;
    b.map(id, {{nid, 0}});
  }
  return b.finish();
}

}  // namespace kiln
