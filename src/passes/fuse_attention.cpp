// fuse_attention: attention as exporters write it, softmax(s · q kᵀ + mask) v (ONNX's MatMul,
// Mul/Div by constants, Transpose, Add, Softmax, MatMul), becomes one
// scaled_dot_product_attention node: one fused kernel instead of two products, a scale and mask
// pass, a softmax and the (Lq, Lk) scores in memory. Matched: a softmax over the last dim (its
// NaNs optionally replaced by zeros) whose input is [the product times/over scalar constants]
// [+ a float mask], the product of q (times scalar constants) and k with its last two dims
// swapped (k, or its transpose, times scalar constants); the intermediate values have no other
// reader. q, k and v share their dtype and batch dims. The only difference: a query whose every
// key is masked with -inf gets zeros instead of NaN (as the NaN-replacing form writes it).
#include <cmath>

#include "core/graph_impl.h"
#include "passes/program.h"

namespace kiln {

using detail::Node;
using detail::ValueRef;

namespace {

struct Match {
  ValueRef q, k, v;
  std::vector<int64_t> k_perm;  // k is this transpose of the value `k` (empty: k itself)
  std::optional<ValueRef> mask;
  double scale = 1.0;
};

class Matcher {
 public:
  explicit Matcher(const Program& p) : p_(p), nodes_(p.graph.nodes), reads_(nodes_.size(), 0) {
    for (const Node& n : nodes_)
      for (ValueRef v : n.inputs) ++reads_[v.node];
    for (ValueRef v : p.outputs) reads_[v.node] += 2;  // a returned value is never "single"
  }

  // The attention ending in matmul node `id`, if it is one.
  std::optional<Match> at(int32_t id) const {
    const Node& out = nodes_[id];
    if (out.op != OpId::Matmul || out.inputs.size() != 2) return std::nullopt;
    ValueRef probs = out.inputs[0];
    int probs_reads = 1;
    // where(isnan(p), 0, p): a query that sees no key gets zeros (as the fused kernel gives)
    if (const Node& w = nodes_[probs.node]; w.op == OpId::Where && single(probs)) {
      double zero = 1;
      const Node& isnan = nodes_[w.inputs[0].node];
      if (isnan.op != OpId::IsNan || !single(w.inputs[0]) || isnan.inputs[0] != w.inputs[2] ||
          !scalar_constant(w.inputs[1], zero) || zero != 0)
        return std::nullopt;
      probs = w.inputs[2];
      probs_reads = 2;
    }
    const Node& sm = nodes_[probs.node];
    const int64_t rank = static_cast<int64_t>(info(probs).shape.size());
    if (sm.op != OpId::Softmax || probs.index != 0 || reads_[probs.node] != probs_reads ||
        rank < 3)
      return std::nullopt;
    if (const int64_t axis = sm.attrs.i("axis"); axis != rank - 1 && axis != -1)
      return std::nullopt;
    Match m;
    ValueRef x = sm.inputs[0];
    // [+ mask]: the operand whose chain ends in the product
    if (nodes_[x.node].op == OpId::Add && single(x)) {
      const Node& add = nodes_[x.node];
      for (int side : {0, 1}) {
        double s = 1.0;
        const ValueRef base = peel(add.inputs[side], s, true);
        if (nodes_[base.node].op == OpId::Matmul && single(base)) {
          m.mask = add.inputs[1 - side];
          x = add.inputs[side];
          break;
        }
      }
      if (!m.mask) return std::nullopt;
    }
    const ValueRef prod = peel(x, m.scale, true);
    const Node& mm = nodes_[prod.node];
    if (mm.op != OpId::Matmul || !single(prod) || mm.inputs.size() != 2) return std::nullopt;
    m.q = peel(mm.inputs[0], m.scale, false);
    if (!untranspose(peel(mm.inputs[1], m.scale, false), m)) return std::nullopt;
    m.k = peel(m.k, m.scale, false);
    m.v = out.inputs[1];
    if (!compatible(m)) return std::nullopt;
    return m;
  }

 private:
  const TensorInfo& info(ValueRef v) const { return p_.graph.info(v); }
  bool single(ValueRef v) const { return v.index == 0 && reads_[v.node] == 1; }

  bool scalar_constant(ValueRef v, double& c) const { return kiln::scalar_constant(p_, v, c); }

  // v without its multiplications and divisions by scalar constants (folded into `scale`);
  // `only_single`: each peeled node must have no other reader (it goes away).
  ValueRef peel(ValueRef v, double& scale, bool only_single) const {
    for (;;) {
      const Node& n = nodes_[v.node];
      if (v.index != 0 || n.inputs.size() != 2 || (only_single && !single(v))) return v;
      double c = 0;
      const DType t = n.outputs[0].dtype;
      if (n.op == OpId::Mul && scalar_constant(n.inputs[1], c) && info(n.inputs[0]).dtype == t &&
          info(n.inputs[0]).shape == n.outputs[0].shape) {
        scale *= c;
        v = n.inputs[0];
      } else if (n.op == OpId::Mul && scalar_constant(n.inputs[0], c) &&
                 info(n.inputs[1]).dtype == t && info(n.inputs[1]).shape == n.outputs[0].shape) {
        scale *= c;
        v = n.inputs[1];
      } else if (n.op == OpId::Div && scalar_constant(n.inputs[1], c) && c != 0 &&
                 info(n.inputs[0]).dtype == t && info(n.inputs[0]).shape == n.outputs[0].shape) {
        scale /= c;
        v = n.inputs[0];
      } else {
        return v;
      }
    }
  }

  // k (into m.k and m.k_perm) where kt is k with its last two dims swapped: a transpose of x
  // (k is x, or x under the transpose's permutation with its last two entries swapped: an
  // exporter that goes from (B, L, H, E) to kᵀ in one transpose), or a reshape that merges the
  // leading dims, a 3-D transpose and a reshape back
  bool untranspose(ValueRef kt, Match& m) const {
    const Node& n = nodes_[kt.node];
    if (kt.index != 0 || n.inputs.size() != 1) return false;
    if (n.op == OpId::Transpose) {
      std::vector<int64_t> perm = n.attrs.ints("perm");
      const size_t r = perm.size();
      if (r < 3) return false;
      std::swap(perm[r - 2], perm[r - 1]);
      bool identity = true;
      for (size_t i = 0; i < r; ++i) identity = identity && perm[i] == static_cast<int64_t>(i);
      m.k = n.inputs[0];
      if (!identity) m.k_perm = perm;
      return true;
    }
    const std::optional<ValueRef> k = merged_transpose(kt);
    if (k) m.k = *k;
    return k.has_value();
  }

  std::optional<ValueRef> merged_transpose(ValueRef kt) const {
    const Node& n = nodes_[kt.node];
    if (n.op != OpId::Reshape) return std::nullopt;
    const Node& t = nodes_[n.inputs[0].node];
    if (t.op != OpId::Transpose || n.inputs[0].index != 0 || t.inputs.size() != 1 ||
        !swaps_last_two(t) || info(t.inputs[0]).shape.size() != 3)
      return std::nullopt;
    const Node& r = nodes_[t.inputs[0].node];
    if (r.op != OpId::Reshape || t.inputs[0].index != 0 || r.inputs.size() != 1)
      return std::nullopt;
    const Shape &x = info(r.inputs[0]).shape, &y = info(kt).shape, &m = info(t.inputs[0]).shape;
    const size_t rank = x.size();
    if (rank < 3 || y.size() != rank || m[1] != x[rank - 2] || m[2] != x[rank - 1])
      return std::nullopt;
    for (size_t i = 0; i + 2 < rank; ++i)
      if (y[i] != x[i]) return std::nullopt;
    if (y[rank - 2] != x[rank - 1] || y[rank - 1] != x[rank - 2]) return std::nullopt;
    return r.inputs[0];
  }

  static bool swaps_last_two(const Node& tr) {
    const auto& perm = tr.attrs.ints("perm");
    const auto r = static_cast<int64_t>(perm.size());
    if (r < 2) return false;
    for (int64_t i = 0; i < r - 2; ++i)
      if (perm[i] != i) return false;
    return perm[r - 2] == r - 1 && perm[r - 1] == r - 2;
  }

  // q (..., Lq, E), k (..., Lk, E), v (..., Lk, Ev) of one float dtype and the same batch dims;
  // a float mask of that dtype, or a bool one
  bool compatible(const Match& m) const {
    const TensorInfo &q = info(m.q), &v = info(m.v);
    TensorInfo k = info(m.k);
    if (!m.k_perm.empty()) {
      if (m.k_perm.size() != k.shape.size()) return false;
      Shape permuted;
      for (int64_t d : m.k_perm) permuted.push_back(k.shape[d]);
      k.shape = permuted;
    }
    if (q.dtype != k.dtype || q.dtype != v.dtype || !is_floating(q.dtype)) return false;
    const size_t r = q.shape.size();
    if (r < 3 || k.shape.size() != r || v.shape.size() != r) return false;
    for (size_t i = 0; i + 2 < r; ++i)
      if (q.shape[i] != k.shape[i] || q.shape[i] != v.shape[i]) return false;
    if (q.shape[r - 1] != k.shape[r - 1] || k.shape[r - 2] != v.shape[r - 2]) return false;
    if (m.mask) {  // of q's dtype, broadcasting to the scores (..., Lq, Lk)
      const TensorInfo& mask = info(*m.mask);
      if (mask.dtype != q.dtype || mask.shape.size() > r) return false;
      Shape scores = q.shape;
      scores[r - 1] = k.shape[r - 2];
      for (size_t i = 0; i < mask.shape.size(); ++i) {
        const int64_t md = mask.shape[mask.shape.size() - 1 - i], sd = scores[r - 1 - i];
        if (md != sd && md != 1) return false;
      }
    }
    return std::isfinite(m.scale) && m.scale != 0;
  }

  const Program& p_;
  const std::vector<Node>& nodes_;
  std::vector<int> reads_;
};

}  // namespace

Program fuse_attention(const Program& p) {
  const Matcher matcher(p);
  std::vector<std::optional<Match>> found(p.graph.nodes.size());
  bool any = false;
  for (size_t i = 0; i < p.graph.nodes.size(); ++i) {
    found[i] = matcher.at(static_cast<int32_t>(i));
    any = any || found[i].has_value();
  }
  if (!any) return p;
  ProgramBuilder b(p);
  for (size_t i = 0; i < p.graph.nodes.size(); ++i) {
    const auto id = static_cast<int32_t>(i);
    if (!found[i]) {
      b.copy(id);
      continue;
    }
    const Match& m = *found[i];
    ValueRef k = b.remap(m.k);
    if (!m.k_perm.empty()) k = {b.graph().add(OpId::Transpose, {k}, {{"perm", m.k_perm}}), 0};
    std::vector<ValueRef> in{b.remap(m.q), k, b.remap(m.v)};
    if (m.mask) in.push_back(b.remap(*m.mask));
    Attrs a{{"causal", false}, {"has_mask", m.mask.has_value()}};
    a.set("scale", m.scale);
    const int32_t n = b.graph().add(OpId::ScaledDotProductAttention, std::move(in), std::move(a),
                                    p.graph.nodes[i].name);
    b.graph().nodes[n].origin = p.graph.nodes[i].origin;
    b.map(id, {{n, 0}});
  }
  return b.finish();
}

}  // namespace kiln
