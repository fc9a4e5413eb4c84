#include <algorithm>
#include <sstream>

#include "core/dim_specs.h"
#include "core/element_limit.h"
#include "core/errors.h"
#include "core/graph_impl.h"
#include "core/op_registry.h"
#include "kiln/executable.h"

namespace kiln {

namespace detail {

int32_t GraphImpl::add(OpId op, std::vector<ValueRef> inputs, Attrs attrs, std::string name,
                       std::vector<std::shared_ptr<const Body>> bodies) {
  const OpDef& def = op_def(op);
  if (!def.infer) fail<UnsupportedError>("[{}] op has no shape inference registered", op_name(op));
  std::vector<TensorInfo> in;
  in.reserve(inputs.size());
  for (auto v : inputs) in.push_back(info(v));
  InferContext ctx{op, attrs, in, &bodies};
  Node n;
  n.op = op;
  n.outputs = infer_node(ctx);
  if (def.decode) def.decode(op, attrs);  // (throws for attributes the kernels cannot take)
  n.inputs = std::move(inputs);
  n.attrs = std::move(attrs);
  n.name = std::move(name);
  n.bodies = std::move(bodies);
  return add_inferred(std::move(n));
}

// Element counts past kMaxElements are refused where a shape first appears, so no kernel, planner
// or allocator sees a count that wrapped.
static void check_element_count(const Node& node) {
  for (size_t k = 0; k < node.outputs.size(); ++k)
    if (!within_element_limit(node.outputs[k].shape))
      fail<ShapeError>("[{}] output {} of shape {} has more than 2^59 elements", op_name(node.op),
                       k, str(node.outputs[k].shape));
}

int32_t GraphImpl::add_inferred(Node node) {
  check_element_count(node);
  nodes.push_back(std::move(node));
  return static_cast<int32_t>(nodes.size() - 1);
}

std::vector<Tensor> make_node(OpId op, const std::vector<Tensor>& inputs, Attrs attrs,
                              std::vector<std::shared_ptr<const Body>> bodies) {
  KILN_ASSERT(!inputs.empty());
  GraphImpl* g = nullptr;
  bool mixed = false;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = inputs[i];
    if (!t.valid()) fail<ValueError>("[{}] input {} is an empty Tensor", op_name(op), i);
    if (!g) g = t.graph_impl();
    else if (g != t.graph_impl()) mixed = true;
  }
  BodyCapture* scope = mixed ? BodyCapture::current() : nullptr;
  if (mixed && !scope) {
    for (size_t i = 1; i < inputs.size(); ++i)
      if (inputs[i].graph_impl() != g)
        fail<ValueError>("[{}] input {} belongs to another graph", op_name(op), i);
  }
  std::vector<ValueRef> refs;
  refs.reserve(inputs.size());
  if (scope) g = &scope->body();
  for (const Tensor& t : inputs) {
    const Tensor v = scope ? scope->capture(t, op_name(op)) : t;
    refs.push_back({v.node_id(), v.output_index()});
  }
  int32_t id = g->add(op, std::move(refs), std::move(attrs), "", std::move(bodies));
  std::vector<Tensor> outs;
  for (size_t i = 0; i < g->nodes[id].outputs.size(); ++i)
    outs.emplace_back(g, id, static_cast<int32_t>(i));
  return outs;
}

Tensor make_node1(OpId op, const std::vector<Tensor>& inputs, Attrs attrs) {
  return make_node(op, inputs, std::move(attrs))[0];
}

std::vector<Tensor> make_source_node(GraphImpl& g, OpId op, Attrs attrs) {
  int32_t id = g.add(op, {}, std::move(attrs));
  std::vector<Tensor> outs;
  for (size_t i = 0; i < g.nodes[id].outputs.size(); ++i)
    outs.emplace_back(&g, id, static_cast<int32_t>(i));
  return outs;
}

namespace {
thread_local BodyCapture* innermost_body = nullptr;
}

BodyCapture::BodyCapture(GraphImpl& body, GraphImpl& outer)
    : body_(body), outer_(outer), parent_(innermost_body) {
  innermost_body = this;
}
BodyCapture::~BodyCapture() { innermost_body = parent_; }
BodyCapture* BodyCapture::current() { return innermost_body; }

Tensor BodyCapture::capture(const Tensor& t, const char* op) {
  if (t.graph_impl() == &body_) return t;
  Tensor v = t;
  if (t.graph_impl() != &outer_) {
    // a value of a graph around the outer one: captured into the outer body first
    if (!parent_ || &parent_->body_ != &outer_)
      fail<ValueError>(
          "[{}] an input belongs to a graph that is not the one of the body being "
          "built nor a graph around it",
          op);
    v = parent_->capture(t, op);
  }
  const ValueRef ref{v.node_id(), v.output_index()};
  for (auto& [outer, ph] : captured_)
    if (outer == ref) return Tensor(&body_, ph, 0);
  Node n;
  n.op = OpId::Placeholder;
  n.outputs = {outer_.info(ref)};
  n.name = "captured:" + outer_.nodes[ref.node].name;
  n.attrs.set("shape", n.outputs[0].shape).set("dtype", n.outputs[0].dtype);
  const int32_t id = body_.add_inferred(std::move(n));
  captured_.emplace_back(ref, id);
  return Tensor(&body_, id, 0);
}

}  // namespace detail

std::vector<TensorInfo> infer_body(const Body& b, const std::vector<TensorInfo>& operands) {
  const auto& nodes = b.graph.nodes;
  std::vector<std::vector<TensorInfo>> infos(nodes.size());
  for (size_t i = 0; i < nodes.size(); ++i) infos[i] = nodes[i].outputs;
  if (b.operands.size() != operands.size())
    fail<ValueError>("[control] a body of {} operands for a node of {}", b.operands.size(),
                     operands.size());
  for (size_t k = 0; k < b.operands.size(); ++k) {
    const int32_t ph = b.operands[k];
    if (ph < 0) continue;
    KILN_ASSERT(ph < static_cast<int32_t>(nodes.size()) && nodes[ph].op == OpId::Placeholder);
    infos[ph] = {operands[k]};
  }
  for (size_t i = 0; i < nodes.size(); ++i) {
    const detail::Node& n = nodes[i];
    if (n.inputs.empty()) continue;  // placeholders, constants, variables, sources: as built
    std::vector<TensorInfo> in;
    for (auto v : n.inputs) in.push_back(infos[v.node][v.index]);
    infos[i] = infer_node(InferContext{n.op, n.attrs, in, &n.bodies});
  }
  std::vector<TensorInfo> out;
  for (auto v : b.results) out.push_back(infos[v.node][v.index]);
  return out;
}

using detail::GraphImpl;

Shape Tensor::shape() const { return g_->info({node_, index_}).shape; }
DType Tensor::dtype() const { return g_->info({node_, index_}).dtype; }
int Tensor::rank() const { return static_cast<int>(g_->info({node_, index_}).shape.size()); }
int64_t Tensor::dim(int axis) const {
  const Shape& s = g_->info({node_, index_}).shape;
  int a = normalize_axis(axis, static_cast<int>(s.size()));
  if (a < 0) fail<ValueError>("[Tensor] axis {} out of range for shape {}", axis, str(s));
  return s[a];
}
std::string Tensor::name() const { return g_->nodes[node_].name; }
std::string Tensor::op_name() const { return kiln::op_name(g_->nodes[node_].op); }

Graph::Graph() : impl_(std::make_unique<GraphImpl>()) {}
Graph::~Graph() = default;
Graph::Graph(Graph&&) noexcept = default;
Graph& Graph::operator=(Graph&&) noexcept = default;

Tensor Graph::placeholder(const Shape& shape, DType dtype, const std::string& name) {
  for (int64_t d : shape)
    if (d < -1) fail<ShapeError>("[placeholder] '{}': bad dim {} in shape {}", name, d, str(shape));
  detail::Node n;
  n.op = OpId::Placeholder;
  n.outputs = {{shape, dtype}};
  n.name = name.empty() ? "input" + std::to_string(impl_->nodes.size()) : name;
  n.attrs.set("shape", shape).set("dtype", dtype);
  return Tensor(impl_.get(), impl_->add_inferred(std::move(n)), 0);
}

Tensor Graph::placeholder(const Shape& shape, DType dtype, const std::string& name,
                          const std::vector<DimSpec>& dims) {
  Tensor t = placeholder(shape, dtype, name);
  if (dims.empty()) return t;
  detail::Node& n = impl_->nodes[t.node_id()];
  const int rank = static_cast<int>(shape.size());
  std::vector<std::string> names(shape.size());
  std::vector<int64_t> mins(shape.size(), 0), maxs(shape.size(), -1);
  std::vector<char> given(shape.size(), 0);
  std::vector<std::vector<int64_t>> buckets(shape.size());
  for (const DimSpec& d : dims) {
    const int axis = normalize_axis(d.axis, rank);
    if (axis < 0)
      fail<ShapeError>("[placeholder] '{}': dim spec for axis {} of shape {}", n.name, d.axis,
                       str(shape));
    if (shape[axis] >= 0)
      fail<ShapeError>(
          "[placeholder] '{}': dim {} is fixed at {}; names and ranges are for "
          "dynamic (-1) dims",
          n.name, axis, shape[axis]);
    if (given[axis]) fail<ShapeError>("[placeholder] '{}': two specs for dim {}", n.name, axis);
    if (d.min < 0 || (d.max >= 0 && d.max < d.min))
      fail<ShapeError>("[placeholder] '{}': dim {} has the empty or negative range [{}, {}]",
                       n.name, axis, d.min, d.max);
    if (d.name.find('\n') != std::string::npos)
      fail<ShapeError>("[placeholder] '{}': a dim name cannot hold a line break", n.name);
    for (size_t k = 0; k < d.buckets.size(); ++k)
      if (d.buckets[k] < std::max<int64_t>(d.min, 1) || (d.max >= 0 && d.buckets[k] > d.max) ||
          (k && d.buckets[k] <= d.buckets[k - 1]))
        fail<ShapeError>(
            "[placeholder] '{}': dim {} has buckets ({}), which must ascend within its "
            "range [{}, {}] and be at least 1",
            n.name, axis, fmt::join(d.buckets, ", "), d.min, d.max);
    given[axis] = 1;
    buckets[axis] = d.buckets;
    names[axis] = d.name;
    mins[axis] = d.min;
    maxs[axis] = d.max;
  }
  detail::DimAttrs attrs{names, mins, maxs};
  if (std::any_of(buckets.begin(), buckets.end(), [](auto& b) { return !b.empty(); }))
    attrs.buckets = buckets;
  detail::set_dim_attrs(n.attrs, attrs);
  return t;
}

std::vector<DimSpec> Graph::dim_specs(const Tensor& t) const {
  if (t.graph_impl() != impl_.get() || impl_->nodes[t.node_id()].op != OpId::Placeholder)
    fail<ValueError>("[dim_specs] '{}' is not a placeholder of this graph",
                     t.valid() ? t.name() : "");
  const detail::Node& n = impl_->nodes[t.node_id()];
  return detail::dim_specs(n.attrs, n.outputs[0].shape.size());
}

namespace detail {
DimAttrs dim_attrs(const Attrs& a, size_t rank) {
  DimAttrs d{std::vector<std::string>(rank), std::vector<int64_t>(rank, 0),
             std::vector<int64_t>(rank, -1)};
  if (!a.has(kDimNames)) return d;
  d.names.assign(1, "");
  for (char c : a.str(kDimNames)) {
    if (c == '\n') d.names.emplace_back();
    else d.names.back() += c;
  }
  d.mins = a.ints(kDimMin);
  d.maxs = a.ints(kDimMax);
  if (d.names.size() != rank || d.mins.size() != rank || d.maxs.size() != rank)
    fail<ShapeError>("[placeholder] its dim names and ranges are not one per dim of its {} dims",
                     rank);
  if (a.has(kDimBucketCounts)) {
    const auto &counts = a.ints(kDimBucketCounts), &all = a.ints(kDimBuckets);
    size_t at = 0;
    bool ok = counts.size() == rank;
    for (size_t i = 0; ok && i < rank; ++i) {
      ok = counts[i] >= 0 && at + static_cast<size_t>(counts[i]) <= all.size();
      if (!ok) break;
      d.buckets.emplace_back(all.begin() + at, all.begin() + at + counts[i]);
      at += static_cast<size_t>(counts[i]);
      for (size_t k = 0; ok && k < d.buckets[i].size(); ++k)
        ok = d.buckets[i][k] >= 1 && (k == 0 || d.buckets[i][k] > d.buckets[i][k - 1]);
    }
    if (!ok || at != all.size())
      fail<ShapeError>(
          "[placeholder] its dim buckets are not ascending lists, one per dim of its "
          "{} dims",
          rank);
  }
  return d;
}

void set_dim_attrs(Attrs& a, const DimAttrs& d) {
  std::string joined;
  for (size_t i = 0; i < d.names.size(); ++i) joined += (i ? "\n" : "") + d.names[i];
  a.set(kDimNames, joined).set(kDimMin, d.mins).set(kDimMax, d.maxs);
  if (d.buckets.empty()) return;
  std::vector<int64_t> counts, all;
  for (const auto& b : d.buckets) {
    counts.push_back(static_cast<int64_t>(b.size()));
    all.insert(all.end(), b.begin(), b.end());
  }
  a.set(kDimBucketCounts, counts).set(kDimBuckets, all);
}

std::vector<DimSpec> dim_specs(const Attrs& a, size_t rank) {
  const DimAttrs d = dim_attrs(a, rank);
  std::vector<DimSpec> r;
  for (size_t axis = 0; axis < rank; ++axis)
    if (!d.names[axis].empty() || d.mins[axis] != 0 || d.maxs[axis] >= 0 ||
        (!d.buckets.empty() && !d.buckets[axis].empty()))
      r.push_back({static_cast<int>(axis), d.names[axis], d.mins[axis], d.maxs[axis],
                   d.buckets.empty() ? std::vector<int64_t>{} : d.buckets[axis]});
  return r;
}
}  // namespace detail

Tensor Graph::constant(const Array& value, const std::string& name) {
  if (!value.valid()) fail<ValueError>("[constant] empty Array");
  if (value.device().kind != Device::Kind::cpu)
    fail<UnsupportedError>("[constant] constants must be host arrays, got {}", value.device().str());
  detail::Node n;
  n.op = OpId::Constant;
  n.outputs = {{value.shape(), value.dtype()}};
  n.value = value;
  n.name = name;
  return Tensor(impl_.get(), impl_->add_inferred(std::move(n)), 0);
}

Tensor Graph::scalar(double value, DType dtype) {
  Array a = Array::scalar(value).astype(dtype);
  return constant(a);
}

size_t Graph::num_nodes() const { return impl_->nodes.size(); }

std::string Graph::dump() const {
  std::ostringstream os;
  for (size_t i = 0; i < impl_->nodes.size(); ++i) {
    const auto& n = impl_->nodes[i];
    os << "%" << i << " = " << op_name(n.op) << "(";
    for (size_t j = 0; j < n.inputs.size(); ++j) {
      os << (j ? ", " : "") << "%" << n.inputs[j].node;
      if (n.inputs[j].index) os << ":" << n.inputs[j].index;
    }
    os << ")";
    if (!n.attrs.items().empty()) os << " {" << n.attrs.to_string() << "}";
    for (auto& o : n.outputs) os << " -> " << name(o.dtype) << to_string(o.shape);
    if (!n.name.empty()) os << "  '" << n.name << "'";
    os << "\n";
  }
  return os.str();
}

}  // namespace kiln
