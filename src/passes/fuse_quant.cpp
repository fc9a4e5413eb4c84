// dequantize -> matmul / linear / conv (+ bias) (+ residual) (+ relu | gelu) -> quantize becomes
// one quantized_matmul or quantized_conv node, whose kernels accumulate the integer product
// exactly and requantize once: int8 data never round-trips through float memory. Matched from each
// quantize backwards:
//   quantize(y, y_scale 0-d, y_zp 0-d i8/u8)
//   y   = relu(t) | gelu(t) | t              (read only here; gelu in either approximation)
//   t   = add(t', residual) | add(t', bias)  (at most one of each, either operand order; read
//         only here; a matmul's bias is (N), a conv's (O, 1, 1) or (1, O, 1, 1))
//   t'  = matmul(da, dw) with dw (K, N) | linear(da, dw[, bias]) with dw (N, K)
//       | conv(da, dw[, bias]) over 2 spatial dims with dw (O, C/groups, kh, kw)  (read only here)
//   da  = dequantize(a i8/u8, 0-d scale, 0-d zp)
//   dw  = dequantize(w i8/u8, 0-d or per-output-channel scale)  (the dequantizes may have other
//         readers)
// Everything float is f32. The fused node is within 1 LSB of the graph it replaces. A conv's
// residual that is a per-tensor dequantize enters as its int8 tensor, scale and zero point
// (quantized_residual), dequantized inside the kernel to the same f32 values.
//
// Max pooling moves before a per-tensor dequantize whose scale is a positive constant:
// max_pool(dequantize(q)) = dequantize(max_pool(q)), bit for bit and with the same indices (the
// dequantize is increasing and one to one), so the pool reads and writes int8 (a ResNet stem's
// output, a quarter of the bytes) and only its smaller result is dequantized. When the pool's
// indices are not read, it gets no_indices (kernels may leave them unwritten); when the pool is
// quantized again with the dequantize's own scale and zero point (post-training quantization
// gives a max pool its input's), the dequantize and that quantize go: quantize(dequantize(q)) is
// q for the same parameters ((q - zp) s / s rounds back to q - zp).
//
// A float linear(x, dequantize(w (N, K) i8/u8, 0-d or per-row scale)[, bias]) that no quantize
// follows (post-training quantization's classifier, whose result is returned) becomes
// quantized_weight_linear: it reads the int8 weights and dequantizes them on the way. A 2-D
// adaptive_avg_pool of a per-tensor dequantize becomes dequantize_adaptive_avg_pool, which reads
// the int8 data (no f32 copy of it is written).
#include <algorithm>
#include <cmath>
#include <string>

#include "core/op_registry.h"
#include "passes/program.h"

namespace kiln {

using detail::Node;
using detail::ValueRef;

namespace {

struct Match {
  int32_t quantize = -1;
  std::vector<int32_t> absorbed;  // the float nodes the fused node replaces
  ValueRef a, a_scale, a_zp, w, w_scale, w_zp;
  std::optional<ValueRef> bias, residual;
  bool channel_bias = false;  // the bias add broadcasts along dim 1 (conv), else the last dim
  bool transpose_w = false, relu = false;
  std::string gelu;            // "erf" or "tanh" when a gelu is absorbed
  const Node* conv = nullptr;  // the conv node of a quantized_conv match
};

class Matcher {
 public:
  explicit Matcher(const Program& p)
      : p_(p), readers_(p.graph.nodes.size(), 0), second_read_(p.graph.nodes.size(), 0) {
    for (const Node& n : p.graph.nodes)
      for (auto v : n.inputs) ++readers_[v.node], second_read_[v.node] |= v.index == 1;
    for (auto v : p.outputs) ++readers_[v.node], second_read_[v.node] |= v.index == 1;
  }

  std::optional<Match> match(int32_t qid) const {
    const Node& q = node(qid);
    if (q.op != OpId::Quantize || !is_f32(q.inputs[0]) || !scalar_param(q, 1)) return {};
    Match m;
    m.quantize = qid;
    ValueRef cur = q.inputs[0];
    if (single(cur) && node(cur).op == OpId::Relu) {
      m.relu = true;
      m.absorbed.push_back(cur.node);
      cur = node(cur).inputs[0];
    } else if (single(cur) && node(cur).op == OpId::Gelu) {
      m.gelu = node(cur).attrs.str("approximate", "none") == "tanh" ? "tanh" : "erf";
      m.absorbed.push_back(cur.node);
      cur = node(cur).inputs[0];
    }
    const Shape& out = info(cur).shape;
    for (int adds = 0; adds < 2 && single(cur) && node(cur).op == OpId::Add; ++adds) {
      const Node& add = node(cur);
      bool took = false;
      for (int side = 0; side < 2 && !took; ++side) {
        const ValueRef main = add.inputs[side], other = add.inputs[1 - side];
        const OpId mo = node(main).op;
        if (!(mo == OpId::Add || mo == OpId::Matmul || mo == OpId::Linear || mo == OpId::Conv) ||
            !is_f32(other) || info(main).shape != out)
          continue;
        const Shape& os = info(other).shape;
        // (one of the output's shape is a residual, also for a conv's (1, O, 1, 1) output)
        const bool channel = out.size() == 4 && os != out &&
                             (os == Shape{out[1], 1, 1} || os == Shape{1, out[1], 1, 1});
        if (!m.bias && os.size() == 1 && !out.empty() && os[0] == out.back()) {
          m.bias = other;
        } else if (!m.bias && channel) {
          m.bias = other;
          m.channel_bias = true;
        } else if (!m.residual && os == out) {
          m.residual = other;
        } else {
          continue;
        }
        m.absorbed.push_back(cur.node);
        cur = main;
        took = true;
      }
      if (!took) break;
    }
    if (!single(cur) || !is_f32(cur) || info(cur).shape != out) return {};
    const Node& mm = node(cur);
    if (mm.op == OpId::Conv) return match_conv(m, cur);
    if (m.channel_bias) return {};
    if (mm.op == OpId::Linear) {
      m.transpose_w = true;
      if (mm.attrs.b("has_bias", false)) {
        if (m.bias || !is_f32(mm.inputs[2])) return {};
        m.bias = mm.inputs[2];
      }
    } else if (mm.op != OpId::Matmul) {
      return {};
    }
    m.absorbed.push_back(cur.node);
    const Node &da = node(mm.inputs[0]), &dw = node(mm.inputs[1]);
    if (da.op != OpId::Dequantize || dw.op != OpId::Dequantize || !is_f32(mm.inputs[0]) ||
        !is_f32(mm.inputs[1]) || !int8(da.inputs[0]) || !int8(dw.inputs[0]) || !scalar_param(da, 1))
      return {};
    const Shape& ws = info(dw.inputs[0]).shape;
    if (ws.size() != 2) return {};
    const Shape& wscale = info(dw.inputs[1]).shape;
    const int64_t n = m.transpose_w ? ws[0] : ws[1];
    const bool per_channel = wscale.size() == 1 && wscale[0] == n &&
                             dw.attrs.i("block_size") == 0 &&
                             dw.attrs.i("axis") == (m.transpose_w ? 0 : 1);
    if (!(scalar_param(dw, 1) || (per_channel && is_f32(dw.inputs[1])))) return {};
    m.a = da.inputs[0], m.a_scale = da.inputs[1], m.a_zp = da.inputs[2];
    m.w = dw.inputs[0], m.w_scale = dw.inputs[1], m.w_zp = dw.inputs[2];
    return m;
  }

 private:
  // The conv end of a chain: conv(dequantize(x), dequantize(w)[, bias]) over 2 spatial dims.
  std::optional<Match> match_conv(Match m, ValueRef cur) const {
    const Node& cv = node(cur);
    const Shape& out = info(cur).shape;
    if (out.size() != 4) return {};
    if (m.bias && !m.channel_bias) return {};  // (W) broadcasts along the width, not channels
    if (cv.attrs.b("has_bias", false)) {
      if (m.bias || !is_f32(cv.inputs[2])) return {};
      m.bias = cv.inputs[2];
    }
    m.absorbed.push_back(cur.node);
    const Node &dx = node(cv.inputs[0]), &dw = node(cv.inputs[1]);
    if (dx.op != OpId::Dequantize || dw.op != OpId::Dequantize || !is_f32(cv.inputs[0]) ||
        !is_f32(cv.inputs[1]) || !int8(dx.inputs[0]) || !int8(dw.inputs[0]) || !scalar_param(dx, 1))
      return {};
    const Shape& ws = info(dw.inputs[0]).shape;
    if (ws.size() != 4) return {};
    const Shape& wscale = info(dw.inputs[1]).shape;
    const bool per_channel = wscale.size() == 1 && wscale[0] == ws[0] &&
                             dw.attrs.i("block_size") == 0 && dw.attrs.i("axis") == 0 &&
                             info(dw.inputs[2]).shape == wscale && int8(dw.inputs[2]);
    if (!(scalar_param(dw, 1) || (per_channel && is_f32(dw.inputs[1])))) return {};
    m.a = dx.inputs[0], m.a_scale = dx.inputs[1], m.a_zp = dx.inputs[2];
    m.w = dw.inputs[0], m.w_scale = dw.inputs[1], m.w_zp = dw.inputs[2];
    m.conv = &cv;
    return m;
  }

  const Node& node(ValueRef v) const { return p_.graph.nodes[v.node]; }
  const Node& node(int32_t id) const { return p_.graph.nodes[id]; }

 public:
  // n = max_pool(dequantize(...)) as above, the scale a constant > 0 (finite).
  bool pools_int8(const Node& n) const {
    if (n.op != OpId::MaxPool || n.inputs.size() != 1 || !per_tensor_dequantize(n.inputs[0]))
      return false;
    const Node& s = node(node(n.inputs[0]).inputs[1]);
    if (s.op != OpId::Constant || s.value.numel() != 1) return false;
    const double v = s.value.to_vector<double>()[0];
    return v > 0 && std::isfinite(v);
  }

  // Whether output 1 (a max pool's indices) of node `id` is read.
  bool second_output_read(int32_t id) const { return second_read_[id] != 0; }

  // q = quantize(pool, s, z) of a pools_int8 pool with the same (constant) parameters as its
  // dequantize and q's dtype that of the dequantized data: q is the pool's int8 result.
  bool requantizes_pool(const Node& q) const {
    if (q.op != OpId::Quantize || q.inputs.size() != 3 || q.inputs[0].index != 0 ||
        !pools_int8(node(q.inputs[0])))
      return false;
    const Node& dq = node(node(q.inputs[0]).inputs[0]);
    if (q.attrs.i("block_size") != 0 || !scalar_param(q, 1) ||
        q.outputs[0].dtype != info(dq.inputs[0]).dtype)
      return false;
    auto same = [&](ValueRef a, ValueRef b) {
      if (a == b) return true;
      const Node &x = node(a), &y = node(b);
      return x.op == OpId::Constant && y.op == OpId::Constant &&
             x.value.dtype() == y.value.dtype() && x.value.numel() == 1 && y.value.numel() == 1 &&
             x.value.to_vector<double>() == y.value.to_vector<double>();
    };
    const double s = node(dq.inputs[1]).value.to_vector<double>()[0];
    return same(q.inputs[1], dq.inputs[1]) && same(q.inputs[2], dq.inputs[2]) && s >= 1e-30;
  }

  // n = linear(x f32, dequantize(w (N, K) i8/u8, 0-d or per-row f32 scale)[, bias]) in f32:
  // quantized_weight_linear reads w as it is.
  bool weight_linear(const Node& n) const {
    if (n.op != OpId::Linear || n.outputs.size() != 1 || !is_f32(n.inputs[0]) ||
        n.outputs[0].dtype != f32 || (n.attrs.b("has_bias", false) && !is_f32(n.inputs[2])))
      return false;
    const Node& dw = node(n.inputs[1]);
    if (dw.op != OpId::Dequantize || !is_f32(n.inputs[1]) || !int8(dw.inputs[0]) ||
        dw.attrs.i("block_size") != 0)
      return false;
    const Shape &ws = info(dw.inputs[0]).shape, &scale = info(dw.inputs[1]).shape;
    if (ws.size() != 2) return false;
    return scalar_param(dw, 1) || (scale == Shape{ws[0]} && dw.attrs.i("axis") == 0 &&
                                   is_f32(dw.inputs[1]) && info(dw.inputs[2]).shape == scale);
  }

  // n = adaptive_avg_pool(dequantize(q (N, C, H, W), 0-d scale and zero point), (oh, ow)).
  bool dequantized_pool(const Node& n) const {
    return n.op == OpId::AdaptiveAvgPool && n.inputs.size() == 1 &&
           layout_of(n.op, n.attrs) == Layout::plain && n.attrs.ints("output_size").size() == 2 &&
           info(n.inputs[0]).shape.size() == 4 && per_tensor_dequantize(n.inputs[0]);
  }

  // v = dequantize(q i8/u8, 0-d f32 scale, 0-d zero point), whole tensor.
  bool per_tensor_dequantize(ValueRef v) const {
    const Node& n = node(v);
    return n.op == OpId::Dequantize && n.outputs.size() == 1 && is_f32(v) && int8(n.inputs[0]) &&
           scalar_param(n, 1) && n.attrs.i("block_size") == 0;
  }

 private:
  const TensorInfo& info(ValueRef v) const { return p_.graph.info(v); }
  bool single(ValueRef v) const { return readers_[v.node] == 1 && node(v).outputs.size() == 1; }
  bool is_f32(ValueRef v) const { return info(v).dtype == f32; }
  bool int8(ValueRef v) const { return info(v).dtype == i8 || info(v).dtype == u8; }
  // Input `i` of n is a 0-d f32 scale and the next a 0-d i8/u8 zero point.
  bool scalar_param(const Node& n, size_t i) const {
    return info(n.inputs[i]).shape.empty() && is_f32(n.inputs[i]) &&
           info(n.inputs[i + 1]).shape.empty() && int8(n.inputs[i + 1]);
  }

  const Program& p_;
  std::vector<int> readers_;
  std::vector<char> second_read_;
};

// Whether a node is a constant of zeros: a weight zero point of symmetric quantization
// (quantized_matmul's zero_w_zp: kernels may skip the row sums of a that it would need).
bool zero_constant(const Node& n) {
  if (n.op != OpId::Constant || n.value.device().kind != Device::Kind::cpu) return false;
  const auto* bytes = static_cast<const unsigned char*>(n.value.data());
  return std::all_of(bytes, bytes + n.value.nbytes(), [](unsigned char c) { return c == 0; });
}

}  // namespace

Program fuse_quant(const Program& p) {
  const auto& nodes = p.graph.nodes;
  const Matcher matcher(p);
  std::vector<std::optional<Match>> at(nodes.size());
  std::vector<char> absorbed(nodes.size(), 0);
  bool any = false;
  for (size_t i = 0; i < nodes.size(); ++i) {
    at[i] = matcher.match(static_cast<int32_t>(i));
    if (!at[i]) continue;
    for (int32_t a : at[i]->absorbed) absorbed[a] = 1;
    any = true;
  }
  for (const Node& n : nodes)
    any = any || matcher.pools_int8(n) || matcher.weight_linear(n) || matcher.dequantized_pool(n);
  if (!any) return p;
  ProgramBuilder b(p);
  std::vector<int32_t> int8_pool(nodes.size(), -1);  // a rewritten pool's int8 max_pool node
  for (size_t i = 0; i < nodes.size(); ++i) {
    const auto id = static_cast<int32_t>(i);
    if (absorbed[i]) continue;  // read only by the chain its quantize replaces
    if (matcher.requantizes_pool(nodes[i])) {
      b.map(id, {{int8_pool[nodes[i].inputs[0].node], 0}});
      continue;
    }
    if (matcher.pools_int8(nodes[i])) {
      const Node &pool = nodes[i], &dq = nodes[pool.inputs[0].node];
      Attrs attrs = pool.attrs;
      if (!matcher.second_output_read(id)) attrs.set("no_indices", true);
      const int32_t mp =
          b.graph().add(OpId::MaxPool, {b.remap(dq.inputs[0])}, attrs, pool.name);
      int8_pool[i] = mp;
      const int32_t d = b.graph().add(
          OpId::Dequantize, {{mp, 0}, b.remap(dq.inputs[1]), b.remap(dq.inputs[2])}, dq.attrs,
          pool.name + ".dequantize");
      b.graph().nodes[mp].origin = b.graph().nodes[d].origin = pool.origin;
      b.map(id, {{d, 0}, {mp, 1}});
      continue;
    }
    if (matcher.dequantized_pool(nodes[i])) {
      const Node &pool = nodes[i], &dq = nodes[pool.inputs[0].node];
      std::vector<ValueRef> in;
      for (const ValueRef v : dq.inputs) in.push_back(b.remap(v));
      const int32_t nid =
          b.graph().add(OpId::DequantizeAdaptiveAvgPool, in,
                        Attrs{{"output_size", pool.attrs.ints("output_size")}}, pool.name);
      b.graph().nodes[nid].origin = pool.origin;
      b.map(id, {{nid, 0}});
      continue;
    }
    if (!at[i] && matcher.weight_linear(nodes[i])) {
      const Node &lin = nodes[i], &dw = nodes[lin.inputs[1].node];
      std::vector<ValueRef> in{b.remap(lin.inputs[0])};
      for (const ValueRef v : dw.inputs) in.push_back(b.remap(v));
      const bool has_bias = lin.attrs.b("has_bias", false);
      if (has_bias) in.push_back(b.remap(lin.inputs[2]));
      const int32_t nid = b.graph().add(OpId::QuantizedWeightLinear, in,
                                        Attrs{{"has_bias", has_bias}}, lin.name);
      b.graph().nodes[nid].origin = lin.origin;
      b.map(id, {{nid, 0}});
      continue;
    }
    if (!at[i]) {
      const int32_t nid = b.copy(id);
      const Node& n = nodes[i];
      if (n.op == OpId::QuantizedMatmul && zero_constant(nodes[n.inputs[5].node]))
        b.graph().nodes[nid].attrs.set("zero_w_zp", true);
      continue;
    }
    const Match& m = *at[i];
    const Node& q = nodes[i];
    std::vector<ValueRef> in{b.remap(m.a),         b.remap(m.a_scale),  b.remap(m.a_zp),
                             b.remap(m.w),         b.remap(m.w_scale),  b.remap(m.w_zp),
                             b.remap(q.inputs[1]), b.remap(q.inputs[2])};
    Attrs attrs;
    if (m.conv) {
      for (const char* k : {"stride", "pads", "dilation"}) attrs.set(k, m.conv->attrs.ints(k));
      attrs.set("groups", m.conv->attrs.i("groups"));
    } else {
      attrs.set("transpose_w", m.transpose_w);
      if (zero_constant(nodes[m.w_zp.node])) attrs.set("zero_w_zp", true);
    }
    attrs.set("relu", m.relu);
    if (!m.gelu.empty()) attrs.set("gelu", m.gelu);
    attrs.set("has_bias", m.bias.has_value());
    attrs.set("has_residual", m.residual.has_value());
    if (m.bias) in.push_back(b.remap(*m.bias));
    if (m.residual) {
      // a conv's residual that is a per-tensor dequantize goes in as its int8 data, scale and
      // zero point: the kernel dequantizes it on the way (a quarter of the bytes, no f32 copy)
      const Node& r = nodes[m.residual->node];
      if (m.conv && matcher.per_tensor_dequantize(*m.residual)) {
        attrs.set("quantized_residual", true);
        for (const ValueRef v : r.inputs) in.push_back(b.remap(v));
      } else {
        in.push_back(b.remap(*m.residual));
      }
    }
    const OpId op = m.conv ? OpId::QuantizedConv : OpId::QuantizedMatmul;
    const int32_t nid = b.graph().add(op, in, attrs, q.name);
    b.graph().nodes[nid].origin = q.origin;
    b.map(id, {{nid, 0}});
  }
  return b.finish();
}

}  // namespace kiln
