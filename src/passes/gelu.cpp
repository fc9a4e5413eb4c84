// recognize_gelu: GELU as exporters write it out becomes one gelu node, which the backends run as
// one function (and the CPU's products take as a post-op: fuse_cpu_matmul_epilogues).
//   erf form:  x · 0.5 · (1 + erf(x / √2))                          -> gelu(x)
//   tanh form: x · 0.5 · (1 + tanh(√(2/π) · (x + 0.044715 · x³)))   -> gelu(x, approximate tanh)
// x / √2 may be x · (1/√2); x³ may be pow(x, 3) or a product of three x; the final product may
// associate its factors (x, 0.5 and the 1 + erf or 1 + tanh term) in any order, and constants
// stand on either side. Every intermediate value must have no other reader, and every constant
// must be a one-element float within 1e-6 (relative) of its value.
#include <algorithm>
#include <cmath>

#include "core/graph_impl.h"
#include "passes/program.h"

namespace kiln {

using detail::Node;
using detail::ValueRef;

namespace {

struct Found {
  ValueRef x;
  bool tanh = false;
};

class GeluMatcher {
 public:
  explicit GeluMatcher(const Program& p)
      : p_(p), nodes_(p.graph.nodes), reads_(nodes_.size(), 0), readers_(sole_readers(p)) {
    for (const Node& n : nodes_)
      for (ValueRef v : n.inputs) ++reads_[v.node];
    for (ValueRef v : p.outputs) reads_[v.node] += 2;  // a returned value is never "single"
  }

  // The gelu whose erf or tanh is node `id`, if it is one: the node that ends it (the last
  // product) and what it computes.
  std::optional<std::pair<int32_t, Found>> at(int32_t id) const {
    const Node& f = nodes_[id];
    if ((f.op != OpId::Erf && f.op != OpId::Tanh) || f.inputs.size() != 1 || !single({id, 0}))
      return std::nullopt;
    Found m;
    m.tanh = f.op == OpId::Tanh;
    const std::optional<ValueRef> x =
        m.tanh ? tanh_argument(f.inputs[0]) : erf_argument(f.inputs[0]);
    if (!x || !is_floating(info(*x).dtype)) return std::nullopt;
    m.x = *x;
    // 1 + erf or 1 + tanh
    const int32_t plus = reader(id);
    if (plus < 0 || nodes_[plus].op != OpId::Add || !single({plus, 0}) ||
        !other_is(nodes_[plus], {id, 0}, 1.0) || !same_as_x({plus, 0}, m.x))
      return std::nullopt;
    // the products up from it, until one multiplies exactly x, 0.5 and the term
    int32_t cur = plus;
    for (int depth = 0; depth < 3; ++depth) {
      const int32_t r = reader(cur);
      if (r < 0 || nodes_[r].op != OpId::Mul || !same_as_x({r, 0}, m.x)) return std::nullopt;
      std::vector<ValueRef> factors;
      flatten({r, 0}, m.x, factors, true);
      int xs = 0, terms = 0, others = 0;
      double constants = 1;
      for (ValueRef v : factors) {
        double c = 0;
        if (v == m.x) ++xs;
        else if (v == ValueRef{plus, 0}) ++terms;
        else if (scalar_constant(v, c)) constants *= c;
        else ++others;
      }
      if (xs == 1 && terms == 1 && others == 0 && near(constants, 0.5)) return std::make_pair(r, m);
      if (!single({r, 0})) return std::nullopt;
      cur = r;
    }
    return std::nullopt;
  }

 private:
  const TensorInfo& info(ValueRef v) const { return p_.graph.info(v); }
  bool single(ValueRef v) const { return v.index == 0 && reads_[v.node] == 1; }
  static bool near(double a, double b) { return std::abs(a - b) <= 1e-6 * std::abs(b); }

  // The one node that reads node id's output 0 (-1: none or several).
  int32_t reader(int32_t id) const { return single({id, 0}) ? std::max(readers_[id], -1) : -1; }

  bool scalar_constant(ValueRef v, double& c) const { return kiln::scalar_constant(p_, v, c); }

  // Whether binary node n's operand other than `v` is a scalar constant near `c`.
  bool other_is(const Node& n, ValueRef v, double c) const {
    if (n.inputs.size() != 2 || (n.inputs[0] == v) == (n.inputs[1] == v)) return false;
    double k = 0;
    return scalar_constant(n.inputs[0] == v ? n.inputs[1] : n.inputs[0], k) && near(k, c);
  }

  // Whether v has x's shape and dtype (a scalar constant broadcast to x changes neither).
  bool same_as_x(ValueRef v, ValueRef x) const {
    return info(v).shape == info(x).shape && info(v).dtype == info(x).dtype;
  }

  // The operand of binary node n other than its scalar constant near `c`, if it has one.
  std::optional<ValueRef> times(const Node& n, double c) const {
    if (n.inputs.size() != 2) return std::nullopt;
    for (int side : {0, 1}) {
      double k = 0;
      if (scalar_constant(n.inputs[side], k) && near(k, c)) return n.inputs[1 - side];
    }
    return std::nullopt;
  }

  // x where u is x / √2 or x · (1/√2) (u read only by the erf).
  std::optional<ValueRef> erf_argument(ValueRef u) const {
    const Node& n = nodes_[u.node];
    if (!single(u)) return std::nullopt;
    std::optional<ValueRef> x;
    if (n.op == OpId::Mul) x = times(n, 0.7071067811865476);
    double c = 0;
    if (n.op == OpId::Div && scalar_constant(n.inputs[1], c) && near(c, 1.4142135623730951))
      x = n.inputs[0];
    if (x && !same_as_x(u, *x)) return std::nullopt;
    return x;
  }

  // x where u is √(2/π) · (x + 0.044715 · x³) (each value read only by the next).
  std::optional<ValueRef> tanh_argument(ValueRef u) const {
    const Node& n = nodes_[u.node];
    if (!single(u) || n.op != OpId::Mul) return std::nullopt;
    const std::optional<ValueRef> inner = times(n, 0.7978845608028654);
    if (!inner || !single(*inner) || nodes_[inner->node].op != OpId::Add) return std::nullopt;
    const Node& add = nodes_[inner->node];
    for (int side : {0, 1}) {
      const ValueRef x = add.inputs[side], scaled = add.inputs[1 - side];
      const Node& s = nodes_[scaled.node];
      if (!single(scaled) || s.op != OpId::Mul || !same_as_x(u, x) || !same_as_x(scaled, x))
        continue;
      const std::optional<ValueRef> cube = times(s, 0.044715);
      if (cube && single(*cube) && is_cube(*cube, x)) return x;
    }
    return std::nullopt;
  }

  // Whether v is x³: pow(x, 3), or products (read only here) of exactly three x.
  bool is_cube(ValueRef v, ValueRef x) const {
    const Node& n = nodes_[v.node];
    double e = 0;
    if (n.op == OpId::Pow && n.inputs.size() == 2 && n.inputs[0] == x &&
        scalar_constant(n.inputs[1], e))
      return e == 3.0 && same_as_x(v, x);
    std::vector<ValueRef> factors;
    flatten(v, x, factors, false);
    if (factors.size() != 3) return false;
    for (ValueRef f : factors)
      if (f != x) return false;
    return same_as_x(v, x);
  }

  // v's factors: v itself, or where v is a product (other than x) read only by its consumer
  // (`top`: v itself may have other readers), its operands' factors.
  void flatten(ValueRef v, ValueRef x, std::vector<ValueRef>& out, bool top) const {
    const Node& n = nodes_[v.node];
    if (v == x || n.op != OpId::Mul || n.inputs.size() != 2 || v.index != 0 ||
        (!top && !single(v)) || out.size() > 8) {
      out.push_back(v);
      return;
    }
    flatten(n.inputs[0], x, out, false);
    flatten(n.inputs[1], x, out, false);
  }

  const Program& p_;
  const std::vector<Node>& nodes_;
  std::vector<int> reads_;
  std::vector<int32_t> readers_;
};

}  // namespace

Program recognize_gelu(const Program& p) {
  const auto& nodes = p.graph.nodes;
  const GeluMatcher matcher(p);
  std::vector<std::optional<Found>> ends(nodes.size());  // the last product of each gelu
  bool any = false;
  for (size_t i = 0; i < nodes.size(); ++i)
    if (auto m = matcher.at(static_cast<int32_t>(i))) {
      ends[m->first] = m->second;
      any = true;
    }
  if (!any) return p;
  // (the chain's other nodes are left unread: dead code elimination drops them)
  ProgramBuilder b(p);
  for (size_t i = 0; i < nodes.size(); ++i) {
    const auto id = static_cast<int32_t>(i);
    if (!ends[i]) {
      b.copy(id);
      continue;
    }
    Attrs a{{"approximate", std::string(ends[i]->tanh ? "tanh" : "none")}};
    const int32_t g = b.graph().add(OpId::Gelu, {b.remap(ends[i]->x)}, std::move(a), nodes[i].name);
    b.graph().nodes[g].origin = nodes[i].origin;
    b.map(id, {{g, 0}});
  }
  return b.finish();
}

}  // namespace kiln
