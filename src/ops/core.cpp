// Placeholder, Constant, Full, Arange, Variable, Assign, ShapeOf (src/ops/shape_values.cpp builds
// it and the forms of full and arange that take their attributes from values).
//   full:   attrs shape (ints), value (float), dtype; with shape_like (bool) an input whose shape
//           (dynamic dims and all) the output takes: gradients of graphs with dynamic dims
//   arange: attrs start, stop, step (floats), dtype
//   full and arange with from_values (bool): shape, or start, stop and step, are inputs' values
//           (OpDef::value_attrs), written in when shapes are specialized
//   shape_of: x's shape as an int64 vector
//   variable: no attrs; its data lives in the node (shared by every executable of the graph)
//   assign: inputs (variable, value); writes value into the variable when the run reaches it
//           (after every other reader of the variable) and yields the variable's new value
//   assign_slice: inputs (variable, update, starts: 1-d int64, one per dim); attr variable (the
//           variable's name, for errors); writes update into the region at starts, in place
#include "kiln/ops/core.h"

#include <cmath>

#include "kiln/ops/elementwise.h"
#include "kiln/ops/transform.h"
#include "ops/common.h"
#include "ops/core_params.h"
#include "ops/shape_values.h"

namespace kiln {

using namespace ops;

namespace {
std::vector<TensorInfo> infer_placeholder(const InferContext& ctx) {
  return {{ctx.attrs.ints("shape"), ctx.attrs.dtype("dtype")}};
}
std::vector<TensorInfo> infer_constant(const InferContext& ctx) {
  fail<Error>("[constant] constants carry their own shape");  // never re-inferred
}
// With shape_like, the shape is the (last) input's: a dynamic one until shapes are specialized,
// which then writes it into attr shape and drops the input (specialize_shapes).
std::vector<TensorInfo> infer_full(const InferContext& ctx) {
  if (from_values(ctx))
    return {{Shape(value_length(ctx, 0, "shape"), -1), ctx.attrs.dtype("dtype")}};
  const Shape& s =
      ctx.attrs.b("shape_like", false) ? ctx.inputs.back().shape : ctx.attrs.ints("shape");
  return {{s, ctx.attrs.dtype("dtype")}};
}
constexpr const char* kArangeValues[] = {"start", "stop", "step"};
int64_t arange_count(double start, double stop, double step) {
  double n = std::ceil((stop - start) / step);
  return n > 0 ? static_cast<int64_t>(n) : 0;
}
std::vector<TensorInfo> infer_arange(const InferContext& ctx) {
  if (from_values(ctx)) {
    for (int i = 0; i < 3; ++i) require_scalar_value(ctx, i, kArangeValues[i]);
    return {{{-1}, ctx.attrs.dtype("dtype")}};
  }
  double start = ctx.attrs.f("start"), stop = ctx.attrs.f("stop"), step = ctx.attrs.f("step");
  if (step == 0 || !std::isfinite(start) || !std::isfinite(stop) || !std::isfinite(step))
    fail<ValueError>("[arange] needs finite start/stop and a non-zero step (got {}, {}, {})", start,
                     stop, step);
  return {{{arange_count(start, stop, step)}, ctx.attrs.dtype("dtype")}};
}
std::vector<TensorInfo> infer_assign(const InferContext& ctx) {
  const TensorInfo &var = ctx.inputs[0], &val = ctx.inputs[1];
  if (var.shape != val.shape || var.dtype != val.dtype)
    fail<ShapeError>("[assign] value {} {} does not match variable {} {}", name(val.dtype),
                     str(val.shape), name(var.dtype), str(var.shape));
  return {var};
}
// The update keeps the variable's rank and fits in it where both sizes are known; the starts are
// one int64 per dim. The result is the variable (its storage: OpDef::alias_input0).
std::vector<TensorInfo> infer_assign_slice(const InferContext& ctx) {
  const TensorInfo &var = ctx.inputs[0], &up = ctx.inputs[1], &st = ctx.inputs[2];
  if (up.dtype != var.dtype)
    fail<DTypeError>("[assign_slice] update {} does not match variable {}", name(up.dtype),
                     name(var.dtype));
  if (up.shape.size() != var.shape.size())
    fail<ShapeError>("[assign_slice] update {} has rank {}; the variable {} has rank {}",
                     str(up.shape), up.shape.size(), str(var.shape), var.shape.size());
  for (size_t d = 0; d < up.shape.size(); ++d)
    if (up.shape[d] >= 0 && var.shape[d] >= 0 && up.shape[d] > var.shape[d])
      fail<ShapeError>("[assign_slice] update {} is larger than the variable {} along dim {}",
                       str(up.shape), str(var.shape), d);
  if (st.dtype != i64)
    fail<DTypeError>("[assign_slice] starts must be int64, got {}", name(st.dtype));
  if (st.shape.size() != 1 ||
      (st.shape[0] >= 0 && st.shape[0] != static_cast<int64_t>(var.shape.size())))
    fail<ShapeError>("[assign_slice] starts {} must have shape ({},): one per dim of {}",
                     str(st.shape), var.shape.size(), str(var.shape));
  return {var};
}
// A stored arange's bounds: finite, and not too many values.
std::string check_stored_arange(const InferContext& ctx) {
  for (auto& [key, v] : ctx.attrs.items())
    if (auto* x = std::get_if<double>(&v); x && !std::isfinite(*x))
      return fmt::format("attribute {} = {} is not finite", key, *x);
  const double step = ctx.attrs.f("step");
  const double count = std::ceil((ctx.attrs.f("stop") - ctx.attrs.f("start")) / step);
  if (step == 0 || !(count < static_cast<double>(stored::kMaxDim)))
    return "arange of too many values";
  return {};
}
}  // namespace

void register_core_ops() {
  // sources: nothing to differentiate through
  define_op(OpId::Placeholder).set_infer(infer_placeholder).not_differentiable().inputs(0);
  define_op(OpId::Constant).set_infer(infer_constant).not_differentiable().inputs(0);
  define_op(OpId::Full)
      .set_infer(infer_full)
      .not_differentiable()
      .inputs(0)
      .optional_inputs({"shape_like"})
      .from_values({"shape"})
      .params<FullParams>();
  define_op(OpId::Arange)
      .set_infer(infer_arange)
      .not_differentiable()
      .inputs(0)
      .from_values({"start", "stop", "step"})
      .check_stored(check_stored_arange)
      .params<ArangeParams>();
  // a variable's value changes between runs: never folded or merged
  // resolved to a constant when shapes are specialized: no kernel runs it
  define_op(OpId::ShapeOf).set_infer(infer_shape_of).not_differentiable().inputs(1);
  define_op(OpId::Variable).set_infer(infer_constant).impure().not_differentiable().inputs(0);
  define_op(OpId::Assign).set_infer(infer_assign).writes_input0().not_differentiable().inputs(2);
  define_op(OpId::AssignSlice)
      .set_infer(infer_assign_slice)
      .writes_input0()
      .not_differentiable()
      .inputs(3);
}

Tensor constant(Graph& g, const Array& value) { return g.constant(value); }

namespace ops {
Tensor full_on(detail::GraphImpl& g, const Shape& shape, double value, DType dtype) {
  for (int64_t d : shape)
    if (d < 0) fail<ShapeError>("[full] shape {} must be static and non-negative", str(shape));
  return detail::make_source_node(g, OpId::Full,
                                  {{"shape", shape}, {"value", value}, {"dtype", dtype}})[0];
}
Tensor arange_on(detail::GraphImpl& g, double start, double stop, double step, DType dtype) {
  if (step == 0 || !std::isfinite(start) || !std::isfinite(stop) || !std::isfinite(step))
    fail<ValueError>("[arange] needs finite start/stop and a non-zero step (got {}, {}, {})", start,
                     stop, step);
  if (dtype == boolean) fail<DTypeError>("[arange] dtype bool is not allowed");
  return detail::make_source_node(
      g, OpId::Arange, {{"start", start}, {"stop", stop}, {"step", step}, {"dtype", dtype}})[0];
}
Tensor constant_on(detail::GraphImpl& g, const Array& value) {
  detail::Node n;
  n.op = OpId::Constant;
  n.outputs = {{value.shape(), value.dtype()}};
  n.value = value;
  return Tensor(&g, g.add_inferred(std::move(n)), 0);
}
}  // namespace ops

Tensor full(Graph& g, const Shape& shape, double value, DType dtype) {
  return full_on(g.impl(), shape, value, dtype);
}
Tensor zeros(Graph& g, const Shape& shape, DType dtype) { return full(g, shape, 0.0, dtype); }
Tensor ones(Graph& g, const Shape& shape, DType dtype) { return full(g, shape, 1.0, dtype); }

Tensor arange(Graph& g, double start, double stop, double step, DType dtype) {
  return arange_on(g.impl(), start, stop, step, dtype);
}

Tensor assign(const Tensor& variable, const Tensor& value) {
  if (!variable.valid() || variable.graph_impl()->nodes[variable.node_id()].op != OpId::Variable)
    fail<ValueError>("[assign] the first input must be a variable made by Graph::variable");
  Tensor v = value.dtype() == variable.dtype() ? value : cast(value, variable.dtype());
  if (v.shape() != variable.shape()) v = broadcast_to(v, variable.shape());
  return make_node1(OpId::Assign, {variable, v});
}

Tensor assign_slice(const Tensor& variable, const Tensor& update, const Tensor& starts) {
  const auto* g = variable.valid() ? variable.graph_impl() : nullptr;
  if (!g || g->nodes[variable.node_id()].op != OpId::Variable)
    fail<ValueError>("[assign_slice] the first input must be a variable made by Graph::variable");
  if (!is_integer(starts.dtype()))
    fail<DTypeError>("[assign_slice] starts must be integers, got {}", name(starts.dtype()));
  Tensor u = update.dtype() == variable.dtype() ? update : cast(update, variable.dtype());
  Tensor s = starts.dtype() == i64 ? starts : cast(starts, i64);
  Attrs a;
  a.set("variable", g->nodes[variable.node_id()].name);
  return make_node1(OpId::AssignSlice, {variable, u, s}, std::move(a));
}

Tensor assign_slice(const Tensor& variable, const Tensor& update,
                    const std::vector<int64_t>& starts) {
  if (!variable.valid()) fail<ValueError>("[assign_slice] the variable is not a valid tensor");
  const Array s = Array::from_vector<int64_t>(starts, {static_cast<int64_t>(starts.size())});
  return assign_slice(variable, update, constant_on(*variable.graph_impl(), s));
}

std::string assign_slice_range_error(const std::string& variable, const Shape& var_shape,
                                     const Shape& update, int64_t dim, int64_t start) {
  const bool known = dim >= 0 && dim < static_cast<int64_t>(var_shape.size()) &&
                     dim < static_cast<int64_t>(update.size());
  const std::string range =
      known ? fmt::format("[0, {}]", var_shape[dim] - update[dim]) : std::string("range");
  return fmt::format(
      "[assign_slice] variable '{}' {}: start {} of dim {} is out of range for an update of {} "
      "(a start must be in {})",
      variable, str(var_shape), start, dim, str(update), range);
}

Tensor scalar_like(const Tensor& x, double value) {
  KILN_ASSERT(x.valid());
  return constant_on(*x.graph_impl(), Array::scalar(value).astype(x.dtype()));  // on x's graph
}

}  // namespace kiln
