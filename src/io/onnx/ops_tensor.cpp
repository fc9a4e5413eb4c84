// ONNX tensor ops: shapes, constants, reshaping, slicing, indexing, sorting.
#include <onnx/onnx_pb.h>

#include <cstring>
#include <limits>
#include <numeric>
#include <optional>

#include "core/graph_impl.h"
#include "io/onnx/map_util.h"
#include "kiln/executable.h"
#include "kiln/ops/rearrange.h"

namespace kiln::onnx::detail {

// Input i is computed from shapes alone (shape_of, constants and ops on them), so the runtime
// computes it when a run's shapes are known. A value that reads an input's data is not: the
// mappings then ask for it while importing (NodeContext::ints names the input and --value).
bool from_shapes(NodeContext& c, int i) {
  const Tensor t = c.input(i);
  const auto& nodes = t.graph_impl()->nodes;
  std::vector<int32_t> todo{t.node_id()};
  std::vector<char> seen(nodes.size(), 0);
  while (!todo.empty()) {
    const int32_t id = todo.back();
    todo.pop_back();
    if (seen[id]) continue;
    seen[id] = 1;
    const OpId op = nodes[id].op;
    if (op == OpId::Placeholder || op == OpId::Variable) return false;
    if (op == OpId::ShapeOf || op == OpId::Constant) continue;
    for (auto v : nodes[id].inputs) todo.push_back(v.node);
  }
  return true;
}

namespace {

Shape static_shape(NodeContext& c, const Tensor& x, const char* why) {
  Shape s = x.shape();
  if (!is_static(s))
    c.unsupported(
        fmt::format("{} needs the static shape of '{}', which is {}; give the model's "
                    "inputs static shapes",
                    why, c.proto().input(0), str(s)));
  return s;
}

// A shape input the runtime computes: not known while importing, computed from shapes.
bool run_time_shape(NodeContext& c, int i) { return !c.constant(i) && from_shapes(c, i); }

Outs constant_op(NodeContext& c) {
  if (c.has_attr("value")) return {known(c, c.attr_tensor("value"))};
  if (c.has_attr("value_float"))
    return {known(c, Array::scalar(c.attr_float("value_float", 0)))};
  if (c.has_attr("value_floats")) {
    auto v = c.attr_floats("value_floats");
    return {known(c, Array::from_vector(v, {static_cast<int64_t>(v.size())}))};
  }
  if (c.has_attr("value_int")) return {known(c, Array::scalar<int64_t>(c.attr_int("value_int", 0)))};
  if (c.has_attr("value_ints")) return {known_ints(c, c.attr_ints("value_ints"))};
  c.unsupported("only tensor, float(s) and int(s) values are supported");
}

// A shape with dynamic dims is computed when a run's shapes are known (shape_of), and so is the
// arithmetic on it; a static one is known while importing.
Outs shape_op(NodeContext& c) {
  const Tensor x = c.input(0);
  const Shape s = x.shape();
  const int64_t r = static_cast<int64_t>(s.size());
  int64_t start = c.attr_int("start", 0), end = c.attr_int("end", r);
  if (start < 0) start += r;
  if (end < 0) end += r;
  start = std::clamp<int64_t>(start, 0, r);
  end = std::clamp<int64_t>(end, start, r);
  if (!is_static(s)) return {slice(shape_of(x), {start}, {end})};
  return {known_ints(c, Shape(s.begin() + start, s.begin() + end))};
}

Outs size_op(NodeContext& c) {
  const Tensor x = c.input(0);
  if (!is_static(x.shape())) return {prod(shape_of(x))};
  return {known(c, Array::scalar<int64_t>(numel(x.shape())))};
}

Outs reshape_op(NodeContext& c) {
  Tensor x = c.input(0);
  const bool allow_zero = c.attr_int("allowzero", 0) != 0;
  if (c.version() >= 5 && run_time_shape(c, 1)) return {reshape_to(x, c.input(1), !allow_zero)};
  Shape target = c.version() < 5 ? c.attr_ints("shape") : c.ints(1);
  for (size_t i = 0; i < target.size(); ++i)
    if (target[i] == 0 && !allow_zero) {
      if (static_cast<int>(i) >= x.rank()) c.fail("a 0 in the shape has no input dim to copy");
      target[i] = x.dim(static_cast<int>(i));
      if (target[i] < 0) return {reshape_to(x, c.input(1), true)};  // a dynamic dim to copy
    }
  return {reshape(x, target)};
}

Outs flatten_op(NodeContext& c) {
  Tensor x = c.input(0);
  const int64_t axis = c.attr_int("axis", 1);
  const int a = static_cast<int>(axis < 0 ? axis + x.rank() : axis);  // in [-r, r]
  if (a < 0 || a > x.rank()) c.fail(fmt::format("axis {} is out of range for rank {}", axis, x.rank()));
  const Shape s = x.shape();
  int64_t outer = 1;
  for (int i = 0; i < a; ++i) {
    if (s[i] < 0) return {reshape(x, {-1, numel(Shape(s.begin() + a, s.end()))})};
    outer *= s[i];
  }
  return {reshape(x, {outer, -1})};
}

Outs transpose_op(NodeContext& c) { return {transpose(c.input(0), c.attr_ints("perm"))}; }

std::vector<int64_t> axes_of(NodeContext& c, int input_since, int input) {
  if (c.version() < input_since) return c.attr_ints("axes");
  return c.has_input(input) ? c.ints(input) : std::vector<int64_t>{};
}

Outs squeeze_op(NodeContext& c) { return {squeeze(c.input(0), axes_of(c, 13, 1))}; }

Outs unsqueeze_op(NodeContext& c) {
  auto axes = axes_of(c, 13, 1);
  Tensor x = c.input(0);
  const int rank = x.rank() + static_cast<int>(axes.size());
  for (auto& a : axes) a = axis_of(c, a, rank);
  std::sort(axes.begin(), axes.end());
  return {expand_dims(x, axes)};
}

Outs concat_op(NodeContext& c) {
  std::vector<Tensor> xs;
  for (int i = 0; i < c.num_inputs(); ++i)
    if (c.has_input(i)) xs.push_back(c.input(i));
  return {concat(xs, c.required_int("axis"))};
}

Outs split_op(NodeContext& c) {
  Tensor x = c.input(0);
  const int64_t axis = axis_of(c, c.attr_int("axis", 0), x.rank());
  std::vector<int64_t> sizes =
      c.version() < 13 ? c.attr_ints("split") : (c.has_input(1) ? c.ints(1) : std::vector<int64_t>{});
  const int64_t n = x.dim(static_cast<int>(axis));
  if (sizes.empty()) {
    const int64_t parts = c.version() >= 18 && c.has_attr("num_outputs")
                              ? c.attr_int("num_outputs", 1)
                              : c.num_outputs();
    if (n < 0) return split(x, parts, axis);
    // ONNX 18: the last chunk is smaller when the dim does not divide evenly
    const int64_t chunk = (n + parts - 1) / parts;
    for (int64_t left = n; left > 0; left -= chunk) sizes.push_back(std::min(chunk, left));
    while (static_cast<int64_t>(sizes.size()) < parts) sizes.push_back(0);
  }
  return split(x, sizes, axis);
}

Outs slice_op(NodeContext& c) {
  Tensor x = c.input(0);
  std::vector<int64_t> starts, ends, axes, steps;
  if (c.version() < 10) {
    starts = c.attr_ints("starts");
    ends = c.attr_ints("ends");
    axes = c.attr_ints("axes");
  } else {
    if (c.has_input(3)) axes = c.ints(3);
    if (c.has_input(4)) steps = c.ints(4);
    if ((run_time_shape(c, 1) || run_time_shape(c, 2)) && from_shapes(c, 1) &&
        from_shapes(c, 2)) {  // bounds computed from shapes
      for (auto& a : axes) a = axis_of(c, a, x.rank());
      return {slice(x, c.input(1), c.input(2), steps, axes)};
    }
    starts = c.ints(1);
    ends = c.ints(2);
  }
  if (axes.empty()) {
    axes.resize(starts.size());
    std::iota(axes.begin(), axes.end(), 0);
  }
  for (auto& a : axes) a = axis_of(c, a, x.rank());
  return {slice(x, starts, ends, steps, axes)};
}

Outs gather_op(NodeContext& c) { return {gather(c.input(0), c.input(1), c.attr_int("axis", 0))}; }
Outs gather_elements_op(NodeContext& c) {
  return {gather_elements(c.input(0), c.input(1), c.attr_int("axis", 0))};
}

Outs scatter_elements_op(NodeContext& c) {
  return {scatter_elements(c.input(0), c.input(1), c.input(2), c.attr_int("axis", 0),
                           reduction_of(c))};
}

Outs expand_op(NodeContext& c) {
  Tensor x = c.input(0);
  if (run_time_shape(c, 1)) return {expand(x, c.input(1))};
  const Shape want = c.ints(1);
  Shape out;
  if (!broadcast_shapes(x.shape(), want, out))
    c.fail(fmt::format("shape {} does not broadcast with {}", str(x.shape()), str(want)));
  return {broadcast_to(x, out)};
}

Outs tile_op(NodeContext& c) {
  if (run_time_shape(c, 1)) return {tile(c.input(0), c.input(1))};  // repeats computed from shapes
  return {tile(c.input(0), c.ints(1))};
}

// ONNX pads (begins of `axes`, then their ends) computed in the graph, as kiln's (begin, end) per
// dim: a gather from the value with a zero appended for the dims not in axes.
Tensor computed_pads(NodeContext& c, const std::vector<int64_t>& axes, int rank) {
  const int64_t n = static_cast<int64_t>(axes.size());
  const Tensor zero = c.graph().constant(Array::from_vector(std::vector<int64_t>{0}, {1}));
  const Tensor padded = concat({cast(c.input(1), i64), zero}, 0);
  std::vector<int64_t> index(2 * rank, 2 * n);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t a = axis_of(c, axes[i], rank);
    index[2 * a] = i;
    index[2 * a + 1] = i + n;
  }
  return gather(padded, c.graph().constant(Array::from_vector(index, {2 * rank})), 0);
}

// Wrap padding by pads computed in the graph (kiln's order): along each axis, the last `begin`
// elements before x and the first `end` after it, with bounds computed from x's run-time size.
Tensor wrap_pad(NodeContext& c, Tensor x, const Tensor& pads, const std::vector<int64_t>& axes) {
  const Tensor zero = c.graph().constant(Array::from_vector(std::vector<int64_t>{0}, {1}));
  for (int64_t axis : axes) {
    const int64_t a = axis_of(c, axis, x.rank());
    const Tensor b = slice(pads, {2 * a}, {2 * a + 1}), e = slice(pads, {2 * a + 1}, {2 * a + 2});
    const Tensor n = slice(shape_of(x), {a}, {a + 1});
    x = concat({slice(x, n - b, n, {}, {a}), x, slice(x, zero, e, {}, {a})}, a);
  }
  return x;
}

Outs pad_op(NodeContext& c) {
  Tensor x = c.input(0);
  const int rank = x.rank();
  const bool computed = c.version() >= 11 && run_time_shape(c, 1);  // pads computed from shapes
  std::vector<int64_t> onnx_pads =
      c.version() < 11 ? c.attr_ints("pads") : (computed ? std::vector<int64_t>{} : c.ints(1));
  double value = c.version() < 11 ? c.attr_float("value", 0.0f) : 0.0;
  if (c.version() >= 11 && c.has_input(2)) value = c.doubles(2).at(0);
  std::vector<int64_t> axes;
  if (c.version() >= 18 && c.has_input(3)) axes = c.ints(3);
  if (axes.empty()) {
    axes.resize(rank);
    std::iota(axes.begin(), axes.end(), 0);
  }
  const size_t n = axes.size();
  const std::string mode = c.attr_string("mode", "constant");
  PadKind kind = PadKind::constant;
  if (mode == "reflect") kind = PadKind::reflect;
  else if (mode == "edge") kind = PadKind::edge;
  else if (mode != "constant" && mode != "wrap") c.unsupported(fmt::format("mode '{}'", mode));
  if (computed) {
    if (c.input(1).rank() != 1 || c.input(1).dim(0) != static_cast<int64_t>(2 * n))
      c.fail(fmt::format("pads has shape {}; {} axes need {} values", str(c.input(1).shape()), n,
                         2 * n));
    const Tensor pads = computed_pads(c, axes, rank);
    if (mode == "wrap") return {wrap_pad(c, x, pads, axes)};
    return {pad(x, pads, kind, value)};
  }
  if (onnx_pads.size() != 2 * n)
    c.fail(fmt::format("pads has {} values; {} axes need {}", onnx_pads.size(), n, 2 * n));
  std::vector<int64_t> pads(2 * rank, 0);  // kiln: (begin, end) per dim
  for (size_t i = 0; i < n; ++i) {
    const int64_t a = axis_of(c, axes[i], rank);
    pads[2 * a] = onnx_pads[i];
    pads[2 * a + 1] = onnx_pads[i + n];
  }
  if (mode == "wrap") {  // circular: each side takes the opposite end's elements
    for (int a = 0; a < rank; ++a) {
      const int64_t b = pads[2 * a], e = pads[2 * a + 1], n = x.dim(a);
      if (b == 0 && e == 0) continue;
      if (b < 0 || e < 0 || (n >= 0 && (b > n || e > n)))
        c.unsupported(
            fmt::format("wrap pads {} and {} of dim {} of size {}: each must be in [0, the "
                        "dim's size]",
                        b, e, a, n));
      std::vector<Tensor> parts;  // (the last b by Python slicing: a dynamic dim too)
      if (b) parts.push_back(slice(x, {-b}, {std::numeric_limits<int64_t>::max()}, {}, {a}));
      parts.push_back(x);
      if (e) parts.push_back(slice(x, {0}, {e}, {}, {a}));
      x = concat(parts, a);
    }
    return {x};
  }
  return {pad(x, pads, kind, value)};
}

Outs constant_of_shape(NodeContext& c) {
  Array v = c.has_attr("value") ? c.attr_tensor("value") : Array::scalar(0.0f);
  if (v.numel() != 1) c.fail("value must hold one element");
  const double x = v.astype(f64).to_vector<double>()[0];
  if (run_time_shape(c, 0)) return {full(c.input(0), x, v.dtype())};
  return {full(c.graph(), c.ints(0), x, v.dtype())};
}

// (opset 27 adds stash_type, the precision of start + i · delta for 16-bit floats: kiln computes
// it in f32, stash_type 1, the default)
Outs range_op(NodeContext& c) {
  const DType t = c.input(0).dtype();
  if (c.attr_int("stash_type", 1) != 1 && (t == f16 || t == bf16))
    c.unsupported("stash_type other than 1 (float32)");
  if ((run_time_shape(c, 0) || run_time_shape(c, 1) || run_time_shape(c, 2)) && from_shapes(c, 0) &&
      from_shapes(c, 1) && from_shapes(c, 2))
    return {arange(c.input(0), c.input(1), c.input(2), t)};
  const double start = c.doubles(0).at(0), limit = c.doubles(1).at(0), delta = c.doubles(2).at(0);
  if (delta == 0) c.fail("delta is 0");
  const int64_t n = std::max<int64_t>(0, static_cast<int64_t>(std::ceil((limit - start) / delta)));
  return {arange(c.graph(), start, start + static_cast<double>(n) * delta - delta / 2, delta, t)};
}

Outs one_hot_op(NodeContext& c) {
  Tensor idx = c.input(0), values = c.input(2);
  if (values.rank() != 1 || values.dim(0) != 2) c.fail("values must hold (off, on)");
  // depth: a number, or a value computed from shapes (then the new axis is dynamic)
  std::optional<Tensor> depth_value;
  int64_t d = 0;
  if (run_time_shape(c, 1)) {
    if (numel(c.input(1).shape()) != 1) c.fail("depth must hold one value");
    depth_value = reshape(cast(c.input(1), i64), Shape{});
  } else {
    const auto depth = c.doubles(1);
    if (depth.size() != 1) c.fail("depth must hold one value");
    d = static_cast<int64_t>(depth[0]);
  }
  // ONNX: negative indices count from the end
  if (is_signed(idx.dtype())) {
    Tensor idx64 = cast(idx, i64);
    const Tensor n = depth_value ? *depth_value : scalar_of(idx64, d);
    idx = where(less(idx64, scalar_of(idx64, 0)), add(idx64, n), idx64);
  }
  const int64_t axis = c.attr_int("axis", -1);
  auto hot_of = [&](double on, double off) {
    return depth_value ? one_hot(idx, *depth_value, axis, values.dtype(), on, off)
                       : one_hot(idx, d, axis, values.dtype(), on, off);
  };
  if (const Array* v = c.constant(2)) {
    const auto vals = v->astype(f64).to_vector<double>();
    return {hot_of(vals[1], vals[0])};
  }
  // values known only at run time: off + hot * (on - off)
  Tensor hot = hot_of(1, 0);
  Tensor off = reshape(slice(values, {0}, {1}), {}), on = reshape(slice(values, {1}, {2}), {});
  return {add(off, mul(hot, sub(on, off)))};
}

Outs topk_op(NodeContext& c) {
  const int64_t axis = c.attr_int("axis", -1);
  const bool largest = c.attr_int("largest", 1) != 0;
  if (c.version() >= 10 && run_time_shape(c, 1)) {  // k computed from shapes
    auto [v, i] = topk(c.input(0), c.input(1), axis, largest);
    return {v, i};
  }
  const int64_t k = c.version() < 10 ? c.required_int("k") : c.ints(1).at(0);
  auto [v, i] = topk(c.input(0), k, axis, largest);
  return {v, i};
}

Outs eye_like(NodeContext& c) {
  const Shape s = static_shape(c, c.input(0), "EyeLike");
  if (s.size() != 2) c.fail("the input must be 2-D");
  const int64_t k = c.attr_int("k", 0);
  DType t = c.input(0).dtype();
  if (c.has_attr("dtype")) {
    auto d = from_onnx_dtype(static_cast<int32_t>(c.attr_int("dtype", 1)));
    if (!d) c.unsupported("dtype");
    t = *d;
  }
  Array a = Array::zeros(s, f64);
  double* p = a.data<double>();
  for (int64_t i = 0; i < s[0]; ++i)
    if (i + k >= 0 && i + k < s[1]) p[i * s[1] + i + k] = 1;
  return {known(c, a.astype(t))};
}

// Trilu: x where j - i >= k (upper) or <= k (lower), zeros elsewhere; the mask a constant when
// k and the last two dims are known while importing, else computed at run time from them.
Outs trilu_op(NodeContext& c) {
  Tensor x = c.input(0);
  if (x.rank() < 2) c.fail("the input needs rank >= 2");
  const bool upper = c.attr_int("upper", 1) != 0;
  if ((c.has_input(1) && !c.constant(1)) || x.dim(-1) < 0 || x.dim(-2) < 0) {
    const Tensor s = shape_of(x);
    const int64_t r = x.rank();
    const Tensor i = reshape(positions(c, slice(s, {r - 2}, {r - 1})), {-1, 1});
    const Tensor j = reshape(positions(c, slice(s, {r - 1}, {r})), {1, -1});
    const Tensor k = c.has_input(1) ? reshape(cast(c.input(1), i64), Shape{}) : known_ints(c, {0});
    const Tensor keep = upper ? greater_equal(j - i, k) : less_equal(j - i, k);
    return {where(keep, x, scalar_of(x, 0))};
  }
  const Shape s = x.shape();
  const int64_t k = c.has_input(1) ? c.ints(1).at(0) : 0;
  const int64_t rows = s[s.size() - 2], cols = s[s.size() - 1];
  Array mask = Array::zeros({rows, cols}, boolean);
  auto* m = static_cast<uint8_t*>(mask.data());
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) m[i * cols + j] = upper ? j - i >= k : j - i <= k;
  return {where(known(c, mask), x, scalar_of(x, 0))};
}

Outs depth_to_space_op(NodeContext& c) {
  const std::string mode = c.attr_string("mode", "DCR");
  if (mode != "DCR" && mode != "CRD") c.fail(fmt::format("unknown mode '{}'", mode));
  return {depth_to_space(c.input(0), c.required_int("blocksize"),
                         {mode == "CRD" ? SpaceDepthMode::crd : SpaceDepthMode::dcr, false})};
}

// (opset 28 adds mode; before it the layout is DCR's)
Outs space_to_depth_op(NodeContext& c) {
  const std::string mode = c.attr_string("mode", "DCR");
  if (mode != "DCR" && mode != "CRD") c.fail(fmt::format("unknown mode '{}'", mode));
  return {space_to_depth(c.input(0), c.required_int("blocksize"),
                         {mode == "CRD" ? SpaceDepthMode::crd : SpaceDepthMode::dcr, false})};
}

// The first value of a known optional input, or `fallback` when the input is absent.
double first_value(NodeContext& c, int i, double fallback) {
  if (!c.has_input(i)) return fallback;
  const auto v = c.doubles(i);
  if (v.size() != 1) c.fail(fmt::format("input {} must hold one value, got {}", i, v.size()));
  return v[0];
}

// The number of selected boxes is data-dependent: the node folds on known boxes and scores (kiln
// runs non_max_suppression on the CPU while importing and keeps selected[:count]).
Outs non_max_suppression_op(NodeContext& c) {
  NonMaxSuppressionOptions o;
  const int64_t max_out = static_cast<int64_t>(first_value(c, 2, 0));
  o.iou_threshold = first_value(c, 3, 0);
  if (c.has_input(4)) o.score_threshold = first_value(c, 4, 0);
  o.center_point_box = c.attr_int("center_point_box", 0) != 0;
  for (int i : {0, 1})
    if (!c.constant(i))
      c.needs_data(
          {0, 1},
          fmt::format("input {} ('{}') must be known while importing: the number of selected "
                      "boxes (the output's shape) depends on the data (kiln::non_max_suppression "
                      "gives a fixed-size result and a count instead)",
                      i, c.proto().input(i)),
          {{-1, 3}});
  Graph g;
  auto [sel, count] =
      non_max_suppression(kiln::constant(g, *c.constant(0)), kiln::constant(g, *c.constant(1)),
                          std::max<int64_t>(max_out, 0), o);
  CompileOptions opts;
  opts.optimize = false;
  opts.num_threads = 1;
  const auto r = g.compile(Device::cpu(), {}, {sel, count}, opts).run(Feeds{});
  const int64_t k = r[1].to(Device::cpu()).astype(i64).to_vector<int64_t>().at(0);
  auto rows = r[0].to(Device::cpu()).to_vector<int64_t>();
  rows.resize(static_cast<size_t>(3 * k));
  return {known(c, Array::from_vector(rows, {k, 3}))};
}

Outs compress_op(NodeContext& c) {
  if (!c.constant(1))
    c.needs_data(
        {1},
        "input 1 (the condition) must be known while importing: the output's size is "
        "its count of trues",
        {c.has_attr("axis") ? data_dim(c.input(0).shape(), c.attr_int("axis", 0)) : Shape{-1}});
  const auto cond = c.ints(1);
  Tensor x = c.input(0);
  std::vector<int64_t> idx;
  for (size_t i = 0; i < cond.size(); ++i)
    if (cond[i]) idx.push_back(static_cast<int64_t>(i));
  if (!c.has_attr("axis")) x = reshape(x, {-1});
  const int64_t axis = c.has_attr("axis") ? axis_of(c, c.attr_int("axis", 0), x.rank()) : 0;
  return {gather(x, known_ints(c, idx), axis)};
}

Outs nonzero_op(NodeContext& c) {
  const Array* a = c.constant(0);
  if (!a)
    c.needs_data({0},
                 "input 0 must be known while importing: the output's size is its number of "
                 "nonzeros",
                 {{c.input(0).rank(), -1}});
  const Shape s = a->shape();
  const auto v = a->astype(f64).to_vector<double>();
  std::vector<int64_t> hits;
  for (size_t i = 0; i < v.size(); ++i)
    if (v[i] != 0) hits.push_back(static_cast<int64_t>(i));
  const int64_t r = static_cast<int64_t>(s.size()), n = static_cast<int64_t>(hits.size());
  Array out = Array::zeros({r, n}, i64);
  auto* o = out.data<int64_t>();
  const auto strides = contiguous_strides(s);
  for (int64_t j = 0; j < n; ++j)
    for (int64_t d = 0; d < r; ++d) o[d * n + j] = (hits[j] / strides[d]) % s[d];
  return {known(c, out)};
}

}  // namespace

void add_tensor_ops(std::vector<OpEntry>& t) {
  t.insert(t.end(), {
                        {"Constant", 1, constant_op},
                        {"Shape", 1, shape_op},
                        {"Size", 1, size_op},
                        {"Reshape", 1, reshape_op},
                        {"Flatten", 1, flatten_op},
                        {"Transpose", 1, transpose_op},
                        {"Squeeze", 1, squeeze_op},
                        {"Unsqueeze", 1, unsqueeze_op},
                        {"Concat", 4, concat_op},
                        {"Split", 2, split_op},
                        {"Slice", 1, slice_op},
                        {"Gather", 1, gather_op},
                        {"GatherElements", 11, gather_elements_op},
                        {"ScatterElements", 11, scatter_elements_op},
                        {"Scatter", 9, scatter_elements_op},
                        {"Expand", 8, expand_op},
                        {"Tile", 6, tile_op},
                        {"Pad", 2, pad_op},
                        {"ConstantOfShape", 9, constant_of_shape},
                        {"Range", 11, range_op},
                        {"Range", 27, range_op},
                        {"OneHot", 9, one_hot_op},
                        {"TopK", 1, topk_op},
                        {"EyeLike", 9, eye_like},
                        {"Trilu", 14, trilu_op},
                        {"DepthToSpace", 1, depth_to_space_op},
                        {"SpaceToDepth", 1, space_to_depth_op},
                        {"SpaceToDepth", 28, space_to_depth_op},
                        {"NonMaxSuppression", 10, non_max_suppression_op},
                        {"Compress", 9, compress_op},
                        {"NonZero", 9, nonzero_op},
                    });
}

}  // namespace kiln::onnx::detail
