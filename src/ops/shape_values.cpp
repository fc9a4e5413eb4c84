// shape_of and the builders whose attributes may come from values computed from shapes: full,
// arange, reshape, expand and slice fed by tensors (ONNX's ConstantOfShape, Range, Reshape,
// Expand and Slice on computed shapes). A value known while building (a constant) is written in
// as the attribute at once; any other becomes an input the node reads when shapes are
// specialized (src/ops/shape_values.h).
#include "ops/shape_values.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "core/errors.h"
#include "kiln/ops/core.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/transform.h"
#include "ops/common.h"

namespace kiln {
namespace ops {

int64_t value_length(const InferContext& ctx, int input, const char* attr) {
  const TensorInfo& v = ctx.inputs.at(input);
  if (!is_integer(v.dtype))
    fail<DTypeError>("[{}] the {} value has dtype {}; an integer dtype is needed", ctx.name(), attr,
                     name(v.dtype));
  if (v.shape.size() != 1 || v.shape[0] < 0)
    fail<ShapeError>("[{}] the {} value must be 1-d with a static length, got shape {}", ctx.name(),
                     attr, str(v.shape));
  return v.shape[0];
}

void require_scalar_value(const InferContext& ctx, int input, const char* attr) {
  const TensorInfo& v = ctx.inputs.at(input);
  if (v.dtype == boolean)
    fail<DTypeError>("[{}] the {} value must be numeric, got bool", ctx.name(), attr);
  if (!is_static(v.shape) || numel(v.shape) != 1)
    fail<ShapeError>("[{}] the {} value must hold one element, got shape {}", ctx.name(), attr,
                     str(v.shape));
}

const Array* constant_value(const Tensor& t) {
  if (!t.valid()) return nullptr;
  const detail::Node& n = t.graph_impl()->nodes[t.node_id()];
  return n.op == OpId::Constant ? &n.value : nullptr;
}

Tensor node_from_values(OpId op, std::vector<Tensor> inputs, Attrs attrs,
                        const std::vector<Tensor>& values) {
  const auto& keys = op_def(op).value_attrs;
  KILN_ASSERT(values.size() == keys.size());
  // until the values are written in, the attributes hold zeros of their kind (for the checks of
  // stored nodes, which read them)
  for (size_t k = 0; k < keys.size(); ++k)
    if (!attrs.has(keys[k])) {
      if (values[k].rank() == 0) attrs.set(keys[k], 0.0);
      else attrs.set(keys[k], std::vector<int64_t>(values[k].dim(0), 0));
    }
  inputs.insert(inputs.end(), values.begin(), values.end());
  attrs.set("from_values", true);
  return make_node1(op, inputs, std::move(attrs));
}

std::vector<TensorInfo> infer_shape_of(const InferContext& ctx) {
  return {{{static_cast<int64_t>(ctx.inputs[0].shape.size())}, i64}};
}

namespace {
std::vector<int64_t> ints_of(const Array& a) { return a.astype(i64).to_vector<int64_t>(); }
double scalar_of(const Array& a) { return a.astype(f64).to_vector<double>().at(0); }

// Checks a value input where it is built, so a bad one names the builder, not specialization.
void check_list(const char* op, const char* attr, const Tensor& v) {
  if (!v.valid()) fail<ValueError>("[{}] the {} value is an empty Tensor", op, attr);
  if (!is_integer(v.dtype()))
    fail<DTypeError>("[{}] the {} value has dtype {}; an integer dtype is needed", op, attr,
                     name(v.dtype()));
  if (v.rank() != 1 || v.dim(0) < 0)
    fail<ShapeError>("[{}] the {} value must be 1-d with a static length, got shape {}", op, attr,
                     str(v.shape()));
}
void check_scalar(const char* op, const char* attr, const Tensor& v) {
  if (!v.valid()) fail<ValueError>("[{}] the {} value is an empty Tensor", op, attr);
  if (v.dtype() == boolean) fail<DTypeError>("[{}] the {} value must be numeric", op, attr);
  if (!is_static(v.shape()) || numel(v.shape()) != 1)
    fail<ShapeError>("[{}] the {} value must hold one element, got shape {}", op, attr,
                     str(v.shape()));
}
}  // namespace

Tensor count_value(const char* op, const char* attr, const Tensor& v) {
  check_scalar(op, attr, v);
  if (!is_integer(v.dtype()))
    fail<DTypeError>("[{}] the {} value has dtype {}; an integer dtype is needed", op, attr,
                     name(v.dtype()));
  return reshape(cast(v, i64), Shape{});
}
Tensor size_value(const Tensor& x, int64_t axis) {
  return reshape(slice(shape_of(x), {axis}, {axis + 1}), Shape{});
}
}  // namespace ops

using namespace ops;

Tensor shape_of(const Tensor& x) {
  if (!x.valid()) fail<ValueError>("[shape_of] x is an empty Tensor");
  if (is_static(x.shape())) {
    const Shape s = x.shape();
    return constant_on(*x.graph_impl(),
                       Array::from_vector(std::vector<int64_t>(s.begin(), s.end()), {x.rank()}));
  }
  return make_node1(OpId::ShapeOf, {x});
}

Tensor full(const Tensor& shape, double value, DType dtype) {
  check_list("full", "shape", shape);
  if (const Array* v = constant_value(shape))
    return full_on(*shape.graph_impl(), ints_of(*v), value, dtype);
  return node_from_values(OpId::Full, {}, {{"value", value}, {"dtype", dtype}}, {shape});
}

Tensor arange(const Tensor& start, const Tensor& stop, const Tensor& step, DType dtype) {
  for (auto [what, v] : {std::pair{"start", &start}, {"stop", &stop}, {"step", &step}})
    check_scalar("arange", what, *v);
  const Array *a = constant_value(start), *b = constant_value(stop), *c = constant_value(step);
  if (a && b && c)
    return arange_on(*start.graph_impl(), scalar_of(*a), scalar_of(*b), scalar_of(*c), dtype);
  if (dtype == boolean) fail<DTypeError>("[arange] dtype bool is not allowed");
  // 0-d values: specialize_shapes writes them in as floats
  auto scalar = [](const Tensor& v) { return v.rank() == 0 ? v : reshape(v, Shape{}); };
  return node_from_values(OpId::Arange, {},
                          {{"start", 0.0}, {"stop", 0.0}, {"step", 1.0}, {"dtype", dtype}},
                          {scalar(start), scalar(stop), scalar(step)});
}

Tensor reshape_to(const Tensor& x, const Tensor& shape, bool zero_copies) {
  check_list("reshape", "shape", shape);
  Attrs attrs{{"copy_zeros", zero_copies}};
  if (const Array* v = constant_value(shape)) {
    Shape s = ints_of(*v);
    if (!zero_copies) return reshape(x, s);
    return make_node1(OpId::Reshape, {x}, attrs.set("shape", s));
  }
  return node_from_values(OpId::Reshape, {x}, std::move(attrs), {shape});
}

Tensor expand(const Tensor& x, const Tensor& shape) {
  check_list("expand", "shape", shape);
  Attrs attrs{{"bidirectional", true}};
  if (const Array* v = constant_value(shape))
    return make_node1(OpId::BroadcastTo, {x}, attrs.set("shape", ints_of(*v)));
  return node_from_values(OpId::BroadcastTo, {x}, std::move(attrs), {shape});
}

Tensor pad(const Tensor& x, const Tensor& pads, PadKind kind, double value) {
  check_list("pad", "pads", pads);
  if (const Array* v = constant_value(pads)) return pad(x, ints_of(*v), kind, value);
  if (pads.dim(0) != 2 * static_cast<int64_t>(x.rank()))
    fail<ShapeError>("[pad] the pads value has {} entries; shape {} needs 2 per dim", pads.dim(0),
                     str(x.shape()));
  return node_from_values(OpId::Pad, {x}, {{"mode", pad_mode(kind)}, {"value", value}},
                          {cast(pads, i64)});
}

Tensor tile(const Tensor& x, const Tensor& reps) {
  check_list("tile", "reps", reps);
  if (const Array* v = constant_value(reps)) return tile(x, ints_of(*v));
  if (reps.dim(0) != static_cast<int64_t>(x.rank()))
    fail<ShapeError>("[tile] the reps value has {} entries; shape {} needs one per dim",
                     reps.dim(0), str(x.shape()));
  return node_from_values(OpId::Tile, {x}, {}, {cast(reps, i64)});
}

Tensor slice(const Tensor& x, const Tensor& starts, const Tensor& stops,
             const std::vector<int64_t>& steps, const std::vector<int64_t>& axes) {
  check_list("slice", "starts", starts);
  check_list("slice", "stops", stops);
  const int64_t n = starts.dim(0);
  if (stops.dim(0) != n)
    fail<ValueError>("[slice] starts ({} values) and stops ({} values) differ in length", n,
                     stops.dim(0));
  const Array *b = constant_value(starts), *e = constant_value(stops);
  if (b && e) return slice(x, ints_of(*b), ints_of(*e), steps, axes);
  // checks axes and steps
  const Attrs fixed =
      slice_attrs(x.shape(), std::vector<int64_t>(n, 0), std::vector<int64_t>(n, 0), steps, axes);
  std::vector<int64_t> ax = axes;
  if (ax.empty())
    for (int64_t i = 0; i < n; ++i) ax.push_back(i);
  // per dim: the given bound of the axis that names it, else the whole dim
  auto per_dim = [&](const Tensor& given, int64_t whole) {
    const Tensor v = cast(given, i64);
    std::vector<Tensor> parts;
    for (int d = 0; d < x.rank(); ++d) {
      int64_t k = -1;
      for (int64_t i = 0; i < n; ++i)
        if (resolve_axis("slice", ax[i], x.shape()) == d) k = i;
      parts.push_back(k >= 0 ? slice(v, {k}, {k + 1})
                             : constant_on(*x.graph_impl(),
                                           Array::from_vector(std::vector<int64_t>{whole}, {1})));
    }
    return parts.empty() ? v : concat(parts, 0);
  };
  const Tensor b_all = per_dim(starts, 0);
  const Tensor e_all = per_dim(stops, std::numeric_limits<int64_t>::max());
  std::vector<int64_t> none(x.rank(), 0), kept;
  for (int d = 0; d < x.rank(); ++d)
    if (std::none_of(ax.begin(), ax.end(),
                     [&](int64_t a) { return resolve_axis("slice", a, x.shape()) == d; }))
      kept.push_back(d);
  return node_from_values(
      OpId::Slice, {x},
      {{"starts", none}, {"stops", none}, {"steps", fixed.ints("steps")}, {"kept_dims", kept}},
      {b_all, e_all});
}

}  // namespace kiln
