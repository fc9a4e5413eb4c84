// Symbolic programs: a dynamic program's dims as expressions of its inputs' dims, and the
// concrete program of one set of feed shapes made from it without running the passes again.
#include <fmt/format.h>

#include <array>
#include <cstdlib>
#include <map>
#include <optional>
#include <unordered_map>

#include "core/dim_specs.h"
#include "core/errors.h"
#include "core/op_registry.h"
#include "core/sym_dim.h"
#include "ops/transform_util.h"
#include "passes/program.h"

namespace kiln {

using detail::Node;

namespace {

// The values of a small integer vector computed from shapes (shape_of and the integer ops on
// it), one symbolic dim or integer each. A negative integer is a literal (-1 in a reshape's
// target); nothing unknown is ever tracked.
using Values = std::optional<std::vector<int64_t>>;
constexpr int64_t kMaxTracked = 64;

bool symbolic_or_size(int64_t d) { return d >= 0 || sym::is_symbolic(d); }

Values constant_values(const Node& n) {
  const Array& v = n.value;
  if (!v.storage() || !is_integer(v.dtype()) || v.rank() > 1 || v.numel() > kMaxTracked)
    return std::nullopt;
  return v.astype(i64).to_vector<int64_t>();
}

// Integer arithmetic on plain integers (any sign), exactly as the kernels do it.
std::optional<int64_t> literal(OpId op, int64_t x, int64_t y) {
  switch (op) {
    case OpId::Add:
      return x + y;
    case OpId::Sub:
      return x - y;
    case OpId::Mul:
      return x * y;
    case OpId::Div:
      if (y == 0) return std::nullopt;
      return x / y - ((x % y != 0) && ((x < 0) != (y < 0)));  // (floor division)
    case OpId::Maximum:
      return std::max(x, y);
    case OpId::Minimum:
      return std::min(x, y);
    case OpId::Equal:
      return x == y;
    default:
      return std::nullopt;
  }
}

// a op b elementwise (one side may hold one value); nullopt where a result is not a dim.
Values arithmetic(OpId op, const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  if (a.size() != b.size() && a.size() != 1 && b.size() != 1) return std::nullopt;
  std::vector<int64_t> r(std::max(a.size(), b.size()));
  constexpr int64_t kSmall = int64_t{1} << 31;  // (plain integers: no overflow)
  for (size_t i = 0; i < r.size(); ++i) {
    const int64_t x = a[a.size() == 1 ? 0 : i], y = b[b.size() == 1 ? 0 : i];
    const bool sx = sym::is_symbolic(x), sy = sym::is_symbolic(y);
    if (!sx && !sy) {  // two integers (a -1 that means "keep this dim", say)
      const auto v =
          std::abs(x) < kSmall && std::abs(y) < kSmall ? literal(op, x, y) : std::nullopt;
      if (!v) return std::nullopt;
      r[i] = *v;
      continue;
    }
    if (op == OpId::Equal) {  // a dim against a negative integer, or two equal expressions
      if (x == y) r[i] = 1;
      else if ((sx && y < 0) || (sy && x < 0)) r[i] = 0;
      else return std::nullopt;
      continue;
    }
    if (!symbolic_or_size(x) || !symbolic_or_size(y)) return std::nullopt;
    switch (op) {
      case OpId::Add:
        r[i] = sym::add(x, y);
        break;
      case OpId::Sub:
        r[i] = sym::sub(x, y);
        break;
      case OpId::Mul:
        r[i] = sym::mul(x, y);
        break;
      case OpId::Div:
        r[i] = y > 0 ? sym::floordiv(x, y) : kDynamic;
        break;
      case OpId::Maximum:
        r[i] = sym::max(x, y);
        break;
      case OpId::Minimum:
        r[i] = sym::min(x, y);
        break;
      default:
        return std::nullopt;
    }
    if (!symbolic_or_size(r[i])) return std::nullopt;
  }
  return r;
}

// The values node n computes from its inputs' values (and shapes), when they are tracked.
Values track(const Node& n, const std::vector<const Values*>& in,
             const std::vector<TensorInfo>& info) {
  const TensorInfo& out = n.outputs[0];
  if (n.outputs.size() != 1 || !(is_integer(out.dtype) || out.dtype == boolean) ||
      out.shape.size() > 1 || numel(out.shape) < 0 || numel(out.shape) > kMaxTracked)
    return std::nullopt;
  auto all = [&] {
    for (const Values* v : in)
      if (!*v) return false;
    return true;
  };
  switch (n.op) {
    case OpId::ShapeOf: {
      for (int64_t d : info[0].shape)
        if (!symbolic_or_size(d)) return std::nullopt;
      return info[0].shape;
    }
    case OpId::Cast:
    case OpId::Reshape:
      if (n.attrs.b("from_values", false) || !*in[0]) return std::nullopt;
      return *in[0];
    case OpId::Gather: {
      if (in.size() != 2 || !all() || info[0].shape.size() != 1 ||
          normalize_axis(n.attrs.i("axis", 0), 1) != 0)
        return std::nullopt;
      const auto& v = **in[0];
      std::vector<int64_t> r;
      for (int64_t k : **in[1]) {
        if (k < 0) k += static_cast<int64_t>(v.size());
        if (k < 0 || k >= static_cast<int64_t>(v.size())) return std::nullopt;
        r.push_back(v[k]);
      }
      return r;
    }
    case OpId::Concat: {
      if (!all() || info[0].shape.size() != 1) return std::nullopt;
      std::vector<int64_t> r;
      for (const Values* v : in) r.insert(r.end(), (*v)->begin(), (*v)->end());
      return r;
    }
    case OpId::Slice: {
      if (n.attrs.b("from_values", false) || !*in[0] || info[0].shape.size() != 1)
        return std::nullopt;
      const auto& v = **in[0];
      const auto s = transform::slice_dim(static_cast<int64_t>(v.size()), n.attrs.ints("starts")[0],
                                          n.attrs.ints("stops")[0], n.attrs.ints("steps")[0]);
      std::vector<int64_t> r;
      for (int64_t k = 0; k < s.count; ++k) r.push_back(v[s.start + k * n.attrs.ints("steps")[0]]);
      return r;
    }
    case OpId::Add:
    case OpId::Sub:
    case OpId::Mul:
    case OpId::Div:
    case OpId::Maximum:
    case OpId::Minimum:
    case OpId::Equal:
      if (in.size() != 2 || !all()) return std::nullopt;
      return arithmetic(n.op, **in[0], **in[1]);
    case OpId::Full: {  // (ONNX ConstantOfShape: ones to compare a shape with)
      if (n.attrs.b("from_values", false) || n.attrs.b("shape_like", false)) return std::nullopt;
      const double v = n.attrs.f("value");
      if (v != static_cast<double>(static_cast<int64_t>(v))) return std::nullopt;
      return std::vector<int64_t>(static_cast<size_t>(numel(out.shape)), static_cast<int64_t>(v));
    }
    case OpId::Where: {  // where(cond, a, b) with every condition known
      if (in.size() != 3 || !all()) return std::nullopt;
      const auto &c = **in[0], &a = **in[1], &b = **in[2];
      const size_t len = static_cast<size_t>(numel(out.shape));
      std::vector<int64_t> r(len);
      for (size_t i = 0; i < len; ++i) {
        auto at = [&](const std::vector<int64_t>& v) -> std::optional<int64_t> {
          if (v.size() == 1) return v[0];
          if (v.size() == len) return v[i];
          return std::nullopt;
        };
        const auto ci = at(c), ai = at(a), bi = at(b);
        if (!ci || !ai || !bi || sym::is_symbolic(*ci)) return std::nullopt;
        r[i] = *ci ? *ai : *bi;
      }
      return r;
    }
    default:
      return std::nullopt;
  }
}

// Ops whose inference takes symbolic dims in the attributes they take from values: their values
// are written in (what specialize_shapes writes once they are numbers).
bool takes_symbolic_values(OpId op) {
  return op == OpId::Reshape || op == OpId::BroadcastTo || op == OpId::Full || op == OpId::Slice ||
         op == OpId::Pad || op == OpId::Tile;
}

bool write_symbolic_values(Node& n, const std::vector<Values>& values) {
  const auto& keys = op_def(n.op).value_attrs;
  const size_t first = n.inputs.size() - keys.size();
  for (size_t k = 0; k < keys.size(); ++k)
    if (!values[n.inputs[first + k].node]) return false;
  for (size_t k = 0; k < keys.size(); ++k) n.attrs.set(keys[k], *values[n.inputs[first + k].node]);
  n.inputs.resize(first);
  n.attrs.set("from_values", false);
  return true;
}

// An arange from 0-d values start, stop, step: its length when start and step are sizes.
int64_t arange_length(const Node& n, const std::vector<Values>& values) {
  const size_t first = n.inputs.size() - 3;
  std::array<int64_t, 3> v{};
  for (size_t k = 0; k < 3; ++k) {
    const Values& x = values[n.inputs[first + k].node];
    if (!x || x->size() != 1 || !symbolic_or_size((*x)[0])) return kDynamic;
    v[k] = (*x)[0];
  }
  if (v[0] < 0 || v[2] <= 0) return kDynamic;
  return sym::ceildiv(sym::sub(v[1], v[0]), v[2]);
}

std::string symbol_name(const Program& p, const Node& n, size_t dim, const std::string& given) {
  if (!given.empty()) return given;
  int same = 0;
  for (const Node& m : p.graph.nodes) same += m.op == OpId::Placeholder && m.name == n.name;
  if (!n.name.empty() && same == 1) return fmt::format("{}.{}", n.name, dim);
  return fmt::format("{}%{}.{}", n.name, n.origin, dim);
}

}  // namespace

size_t symbolize(Program& p, const std::vector<std::pair<int32_t, Shape>>* seen) {
  auto& nodes = p.graph.nodes;
  std::vector<Values> values(nodes.size());
  size_t unknown = 0;
  std::map<std::string, int64_t> sizes;  // each symbol's size in `seen`
  auto value = [&](const std::string& name) {
    auto it = sizes.find(name);
    return it == sizes.end() ? kDynamic : it->second;
  };
  auto resolve = [&](int64_t d) { return sizes.empty() ? d : sym::choose(d, value); };
  for (size_t i = 0; i < nodes.size(); ++i) {
    Node& n = nodes[i];
    if (n.op == OpId::Placeholder) {
      Shape& s = n.outputs[0].shape;
      const auto names = detail::dim_attrs(n.attrs, s.size()).names;
      for (size_t d = 0; d < s.size(); ++d) {
        if (s[d] >= 0) continue;
        s[d] = sym::symbol(symbol_name(p, n, d, d < names.size() ? names[d] : ""));
        for (auto& [origin, shape] : seen ? *seen : std::vector<std::pair<int32_t, Shape>>{})
          if (origin == n.origin && shape.size() == s.size()) sizes[sym::str(s[d])] = shape[d];
      }
      continue;
    }
    if (n.op == OpId::Constant) {
      values[i] = constant_values(n);
      continue;
    }
    if (n.op == OpId::Variable) continue;
    const bool valued = n.attrs.b("from_values", false);
    if (valued && takes_symbolic_values(n.op)) write_symbolic_values(n, values);
    std::vector<TensorInfo> in;
    std::vector<const Values*> in_values;
    for (auto v : n.inputs) {
      in.push_back(p.graph.info(v));
      in_values.push_back(&values[v.node]);
    }
    InferContext ctx{n.op, n.attrs, in, &n.bodies};
    n.outputs = infer_node(ctx);
    if (n.op == OpId::Arange && n.attrs.b("from_values", false))
      n.outputs[0].shape[0] = arange_length(n, values);
    for (TensorInfo& o : n.outputs)
      for (int64_t& d : o.shape) d = resolve(d);
    if (!n.outputs.empty()) values[i] = track(n, in_values, in);
    if (values[i])
      for (int64_t& v : *values[i]) v = resolve(v);
    for (const TensorInfo& o : n.outputs)
      for (int64_t d : o.shape) unknown += !symbolic_or_size(d);
  }
  return unknown;
}

std::string first_unknown_dim(const Program& p) {
  for (size_t i = 0; i < p.graph.nodes.size(); ++i)
    for (const TensorInfo& o : p.graph.nodes[i].outputs)
      for (int64_t d : o.shape)
        if (!symbolic_or_size(d))
          return fmt::format(
              "node %{} ({}{}) has shape {}", i, op_name(p.graph.nodes[i].op),
              p.graph.nodes[i].name.empty() ? "" : " '" + p.graph.nodes[i].name + "'",
              sym::str(o.shape));
  return {};
}

std::vector<std::pair<int32_t, Shape>> symbolic_inputs(const Program& p) {
  std::vector<std::pair<int32_t, Shape>> r;
  for (const Node& n : p.graph.nodes)
    if (n.op == OpId::Placeholder) r.emplace_back(n.origin, n.outputs[0].shape);
  return r;
}

Program instantiate(const Program& symbolic, const std::vector<std::pair<int32_t, Shape>>& inputs,
                    const std::vector<std::pair<int32_t, Shape>>& shapes,
                    const NodeEvaluator* eval) {
  // each placeholder dim's symbol takes the feed's size
  std::map<std::string, int64_t> sizes;
  std::map<int64_t, int64_t> by_code;
  for (auto& [input, dims] : inputs)
    for (auto& [origin, shape] : shapes) {
      if (origin != input || shape.size() != dims.size()) continue;
      for (size_t d = 0; d < shape.size(); ++d)
        if (sym::is_symbolic(dims[d])) by_code[dims[d]] = shape[d];
    }
  for (auto& [code, size] : by_code) sizes[sym::str(code)] = size;
  auto value = [&](const std::string& name) {
    auto it = sizes.find(name);
    return it == sizes.end() ? kDynamic : it->second;
  };
  // (each expression evaluated once: many nodes share the same few)
  std::unordered_map<int64_t, int64_t> values;
  auto concrete = [&](int64_t d) {
    if (d >= 0) return d;
    const auto [it, fresh] = values.try_emplace(d, 0);
    if (fresh) it->second = sym::evaluate(d, value);
    return it->second;
  };
  Program p = symbolic;
  for (Node& n : p.graph.nodes) {
    if (n.op == OpId::Placeholder) continue;
    for (const auto& [key, v] : n.attrs.items()) {
      const auto* ints = std::get_if<std::vector<int64_t>>(&v);
      bool any = false;
      for (size_t k = 0; ints && !any && k < ints->size(); ++k) any = sym::is_symbolic((*ints)[k]);
      if (!any) continue;
      std::vector<int64_t> r = *ints;
      for (int64_t& d : r)
        if (sym::is_symbolic(d)) d = concrete(d);
      n.attrs.set(key, r);
    }
  }
  specialize_shapes(p, shapes, /*allow_dynamic=*/false, eval);
  // what the passes assumed of the symbolic dims holds for these sizes
  for (size_t i = 0; i < p.graph.nodes.size(); ++i) {
    const auto &want = symbolic.graph.nodes[i].outputs, &got = p.graph.nodes[i].outputs;
    bool same = want.size() == got.size();
    for (size_t k = 0; same && k < want.size(); ++k) {
      same = want[k].shape.size() == got[k].shape.size();
      for (size_t d = 0; same && d < got[k].shape.size(); ++d)
        same = concrete(want[k].shape[d]) == got[k].shape[d];
    }
    if (!same)
      fail<ShapeError>(
          "[specialize] node %{} ({}) has shape {} for these feeds, where its "
          "symbolic shape is {}",
          i, op_name(p.graph.nodes[i].op), str(got.at(0).shape), sym::str(want.at(0).shape));
  }
  return p;
}

}  // namespace kiln
