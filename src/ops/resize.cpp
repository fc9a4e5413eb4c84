// Resampling ops of the transform family: resize (ONNX Resize, opset 19) and grid_sample (ONNX
// GridSample, opset 20). Attrs:
//   resize:  sizes (every dim of the result), scales (per dim, or empty: sizes / x dims), roi
//            (starts then ends, or empty), mode, coordinate_transformation_mode, nearest_mode,
//            cubic_coeff_a, exclude_outside, extrapolation_value, antialias
//   grid_sample:  mode ("linear" | "nearest" | "cubic"), padding_mode ("zeros" | "border" |
//                 "reflection"), align_corners; inputs x, grid (already cast to x's dtype)
// The coordinate and weight math lives in ops/resize_util.h and ops/grid_sample_util.h, shared
// with the kernels; ops/resize_params.h decodes the attributes.
// resize is linear in x (an affine map under tf_crop_and_resize's extrapolation): separable
// along the dims, so its gradient applies each resized dim's transposed weight matrix in turn
// (built from ops on the run-time sizes where a dim's size is known only when run).
#include <cmath>

#include "kiln/autodiff.h"
#include "kiln/ops/core.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/linalg.h"
#include "kiln/ops/nn.h"
#include "kiln/ops/transform.h"
#include "ops/common.h"
#include "ops/grid_sample_util.h"
#include "ops/resize_params.h"
#include "ops/resize_util.h"
#include "ops/shape_values.h"
#include "ops/transform_util.h"

namespace kiln {

using namespace ops;

namespace {
const char* kModes[] = {"nearest", "linear", "cubic"};
const char* kCoords[] = {"half_pixel",    "half_pixel_symmetric", "pytorch_half_pixel",
                         "align_corners", "asymmetric",           "tf_crop_and_resize"};
const char* kNearest[] = {"round_prefer_floor", "round_prefer_ceil", "floor", "ceil"};

std::vector<TensorInfo> infer_resize(const InferContext& ctx) {
  const TensorInfo& x = ctx.inputs[0];
  const Attrs& a = ctx.attrs;
  if (ops::from_values(ctx)) {  // sizes computed from shapes, known when they are specialized
    if (ops::value_length(ctx, 1, "sizes") != static_cast<int64_t>(x.shape.size()))
      fail<ShapeError>("[resize] the sizes value must give every dim of x shape {}", str(x.shape));
    return {{Shape(x.shape.size(), -1), x.dtype}};
  }
  const Shape& sizes = a.ints("sizes");
  const auto &scales = a.floats("scales"), &roi = a.floats("roi");
  const size_t r = x.shape.size();
  if (sizes.size() != r)
    fail<ShapeError>("[resize] sizes {} must give every dim of x shape {}", str(sizes),
                     str(x.shape));
  for (int64_t s : sizes)
    if (s < 0) fail<ShapeError>("[resize] sizes {} must be non-negative", str(sizes));
  if (!scales.empty() && scales.size() != r)
    fail<ShapeError>("[resize] {} scales for x shape {} (one per dim)", scales.size(),
                     str(x.shape));
  for (double s : scales)
    if (!(s > 0)) fail<ValueError>("[resize] scales must be positive, got {}", s);
  if (!roi.empty() && roi.size() != 2 * r)
    fail<ShapeError>("[resize] roi has {} values for x shape {} (starts and ends of every dim)",
                     roi.size(), str(x.shape));
  const int mode = resize_math::mode_from(a.str("mode"));
  if (mode < 0) fail<ValueError>("[resize] unknown mode '{}'", a.str("mode"));
  if (resize_math::coord_from(a.str("coordinate_transformation_mode")) < 0)
    fail<ValueError>("[resize] unknown coordinate_transformation_mode '{}'",
                     a.str("coordinate_transformation_mode"));
  if (resize_math::nearest_from(a.str("nearest_mode")) < 0)
    fail<ValueError>("[resize] unknown nearest_mode '{}'", a.str("nearest_mode"));
  if (mode != 0 && !kFloatTypes.has(x.dtype))
    fail<DTypeError>("[resize] {} mode needs a float dtype, got {} (shape {})", a.str("mode"),
                     name(x.dtype), str(x.shape));
  for (size_t d = 0; d < r; ++d)
    if (x.shape[d] == 0 && sizes[d] > 0)
      fail<ShapeError>("[resize] cannot resize empty dim {} of x shape {} to {}", d, str(x.shape),
                       sizes[d]);
  return {{sizes, x.dtype}};
}

const char* kGridModes[] = {"linear", "nearest", "cubic"};
const char* kPaddings[] = {"zeros", "border", "reflection"};

int index_of(const char* const* names, int n, const std::string& s) {
  for (int i = 0; i < n; ++i)
    if (s == names[i]) return i;
  return -1;
}

std::vector<TensorInfo> infer_grid_sample(const InferContext& ctx) {
  const TensorInfo &x = ctx.inputs[0], &grid = ctx.inputs[1];
  require_dtype(ctx, 0, kFloatTypes, "a float dtype");
  require_dtype(ctx, 1, kFloatTypes, "a float dtype");
  const int64_t k = static_cast<int64_t>(x.shape.size()) - 2;
  if (k < 1 || k > grid_math::kMaxSpatial || grid.shape.size() != x.shape.size() ||
      !dims_match(grid.shape.back(), k) || !dims_match(grid.shape[0], x.shape[0]))
    fail<ShapeError>("[grid_sample] x shape {} must be (N, C, 1 to {} spatial dims) and grid shape "
                     "{} (N, output dims..., {})",
                     str(x.shape), grid_math::kMaxSpatial, str(grid.shape), k);
  if (index_of(kGridModes, 3, ctx.attrs.str("mode")) < 0)
    fail<ValueError>("[grid_sample] unknown mode '{}'", ctx.attrs.str("mode"));
  if (index_of(kPaddings, 3, ctx.attrs.str("padding_mode")) < 0)
    fail<ValueError>("[grid_sample] unknown padding_mode '{}'", ctx.attrs.str("padding_mode"));
  if (grid.dtype != x.dtype)
    fail<DTypeError>("[grid_sample] grid dtype {} differs from x dtype {}", name(grid.dtype),
                     name(x.dtype));
  Shape out{x.shape[0], x.shape[1]};
  out.insert(out.end(), grid.shape.begin() + 1, grid.shape.end() - 1);
  return {{out, x.dtype}};
}

// ---- gradient

using Grads = std::vector<std::optional<Tensor>>;

// The (out, in) weight matrix of resizing `d`: row p holds the weights output p takes from each
// input element (zero where it takes the extrapolation value).
Array weight_matrix(const resize_math::Params& p, const resize_math::Dim& d) {
  std::vector<double> w(static_cast<size_t>(d.out * d.in), 0.0);
  for (int64_t o = 0; o < d.out; ++o) {
    const double xo = resize_math::source_coordinate(p, d, o);
    if (resize_math::extrapolates(p, d, xo)) continue;
    double* row = w.data() + o * d.in;
    if (p.mode == resize_math::Mode::nearest) {
      row[resize_math::nearest_index(p, d, xo)] = 1;
      continue;
    }
    const resize_math::Taps t = resize_math::make_taps(p, d, xo);
    for (int i = 0; i < t.n; ++i)
      row[resize_math::clamp_index(t.first + i, d.in)] += resize_math::tap_weight(p, d, t, i);
  }
  return Array::from_vector(w, {d.out, d.in});
}

Tensor constant_on(const Tensor& on, const Array& value) {
  detail::Node n;
  n.op = OpId::Constant;
  n.outputs = {{value.shape(), value.dtype()}};
  n.value = value;
  auto* g = on.graph_impl();
  return Tensor(g, g->add_inferred(std::move(n)), 0);
}

// ---- the gradient over sizes known only at run time: each dim's weight matrix built from ops
// on its run-time sizes, with resize_math's f64 arithmetic in its order (constant folding
// evaluates it once the shapes are specialized; past its size limit it runs with the step).

// Dim d's run-time sizes as 0-d f64 values, and the scale its coordinates use.
struct RunDim {
  Tensor in, out, scale;
  double scale_static = 1;  // the given scale (antialiasing reads it); 1 when computed
  double roi_start = 0, roi_end = 1;
};

// resize_math::source_coordinate over x = 0, 1, ..., out - 1.
Tensor source_coordinates(const resize_math::Params& p, const RunDim& d, const Tensor& x) {
  using resize_math::Coord;
  auto c = [&](double v) { return scalar_like(x, v); };
  const Tensor zero = c(0), more_than_one = greater(d.out, c(1));
  switch (p.coord) {
    case Coord::half_pixel:
      return (x + 0.5) / d.scale - 0.5;
    case Coord::half_pixel_symmetric: {
      const Tensor adjustment = d.out / (d.scale * d.in);
      return d.in / 2.0 * (1.0 - adjustment) + (x + 0.5) / d.scale - 0.5;
    }
    case Coord::pytorch_half_pixel:
      return where(more_than_one, (x + 0.5) / d.scale - 0.5, zero);
    case Coord::align_corners: {
      const Tensor len = d.in * d.scale;
      return where(logical_and(more_than_one, greater(len, c(1))), x * (d.in - 1.0) / (len - 1.0),
                   zero);
    }
    case Coord::asymmetric:
      return x / d.scale;
    case Coord::tf_crop_and_resize: {
      const double span = d.roi_end - d.roi_start;
      return where(more_than_one, x * span * (d.in - 1.0) / (d.out - 1.0),
                   span * (d.in - 1.0) / 2.0) +
             d.roi_start * (d.in - 1.0);
    }
  }
  return zero;
}

// The (out, in) weight matrix of one dim in `dtype`, as weight_matrix builds it.
Tensor run_time_weight_matrix(const resize_math::Params& p, const RunDim& d, DType dtype) {
  using resize_math::Mode;
  const Tensor out_n = cast(d.out, i64), in_n = cast(d.in, i64);
  const Tensor x = arange(scalar_like(out_n, 0), out_n, scalar_like(out_n, 1), f64);
  auto c = [&](double v) { return scalar_like(x, v); };
  const Tensor xo = source_coordinates(p, d, x);
  const Tensor f = ceil(xo) - 1.0, ratio = xo - f;
  auto row_of = [&](const Tensor& index) {  // one_hot of clamped f64 indices
    const Tensor clamped = maximum(minimum(index, d.in - 1.0), c(0));
    return one_hot(cast(clamped, i64), in_n, -1, dtype);
  };
  auto column = [&](const Tensor& v) { return expand_dims(cast(v, dtype), {1}); };
  Tensor w;
  if (p.mode == Mode::nearest) {
    // the right neighbour at ratio 1 (x_ori an integer), else as the nearest mode rounds
    using resize_math::Nearest;
    if (p.nearest == Nearest::ceil) {
      w = row_of(f + 1.0);
    } else {
      const Tensor right = p.nearest == Nearest::round_prefer_floor  ? greater(ratio, c(0.5))
                           : p.nearest == Nearest::round_prefer_ceil ? greater_equal(ratio, c(0.5))
                                                                     : greater_equal(ratio, c(1));
      w = row_of(f + cast(right, f64));
    }
  } else {
    const bool cubic = p.mode == Mode::cubic;
    const double support = p.antialias && d.scale_static < 1 ? d.scale_static : 1.0;
    const int start = static_cast<int>(std::floor(-(cubic ? 2.0 : 1.0) / support)) + 1;
    const int n = 2 - 2 * start;
    const double a = p.cubic_a;
    std::vector<Tensor> raw, index;  // each tap's weight (before normalizing) and input index
    Tensor sum;
    for (int i = 0; i < n; ++i) {
      const Tensor t = abs((static_cast<double>(start + i) - ratio) * support);
      Tensor r;
      if (!cubic) {
        r = where(less(t, c(1)), 1.0 - t, c(0));
      } else {
        const Tensor near = ((a + 2) * t - (a + 3)) * t * t + 1.0;
        const Tensor far = ((a * t - 5 * a) * t + 8 * a) * t - 4 * a;
        r = where(less_equal(t, c(1)), near, where(less(t, c(2)), far, c(0)));
      }
      const Tensor k = f + static_cast<double>(start + i);
      if (p.exclude_outside) r = where(logical_and(greater_equal(k, c(0)), less(k, d.in)), r, c(0));
      raw.push_back(r);
      index.push_back(k);
      sum = i == 0 ? r : sum + r;
    }
    for (int i = 0; i < n; ++i) {
      const Tensor tap = row_of(index[i]) * column(raw[i] / sum);
      w = i == 0 ? tap : w + tap;
    }
  }
  if (p.coord == resize_math::Coord::tf_crop_and_resize) {
    const Tensor outside = logical_or(less(xo, c(0)), greater(xo, d.in - 1.0));
    w = where(expand_dims(outside, {1}), scalar_like(w, 0), w);
  }
  return w;
}

// g (..., out_d, ...) -> (..., in_d, ...): dim d moved last, times w (out_d, in_d), moved back.
Tensor apply_transposed(const Tensor& g, const Tensor& w, int d) {
  const int r = g.rank();
  std::vector<int64_t> perm, back(r);
  for (int k = 0; k < r; ++k)
    if (k != d) perm.push_back(k);
  perm.push_back(d);
  for (int k = 0; k < r; ++k) back[perm[k]] = k;
  return permute(matmul(permute(g, perm), w), back);
}

Grads vjp_resize(const VjpContext& c) {
  const Shape in = c.inputs[0].shape(), out = c.outputs[0].shape();
  const ResizeParams rp = ResizeParams::decode(OpId::Resize, c.attrs);
  const resize_math::Params& p = rp.math;
  Tensor g = *c.cotangents[0];
  const int r = static_cast<int>(in.size());
  for (int d = 0; d < r; ++d) {
    if (in[d] >= 0 && out[d] >= 0) {  // sizes known now: a constant matrix
      const resize_math::Dim dim = rp.dim(in, out, static_cast<size_t>(d));
      if (resize_math::is_identity(p, dim)) continue;
      g = apply_transposed(g, cast_to(constant_on(g, weight_matrix(p, dim)), g.dtype()), d);
      continue;
    }
    RunDim rd;
    rd.in = cast(size_value(c.inputs[0], d), f64);
    rd.out = cast(size_value(c.outputs[0], d), f64);
    rd.scale = rp.scales.empty() ? rd.out / rd.in : scalar_like(rd.in, rp.scales[d]);
    rd.scale_static = rp.scales.empty() ? 1.0 : rp.scales[d];
    if (p.antialias && p.mode != resize_math::Mode::nearest && rp.scales.empty())
      fail<UnsupportedError>(
          "[gradients] an antialiased resize whose scale is known only at run time (dim {} of "
          "input {} to {}) has no gradient yet: its taps depend on the scale",
          d, str(in), str(out));
    if (!rp.roi.empty()) {
      rd.roi_start = rp.roi[d];
      rd.roi_end = rp.roi[d + in.size()];
    }
    g = apply_transposed(g, run_time_weight_matrix(p, rd, g.dtype()), d);
  }
  return {g.shape() == in ? g : reshape_like(g, c.inputs[0])};  // (the dims known now)
}
}  // namespace

void register_resize_ops() {
  define_op(OpId::Resize)
      .set_infer(infer_resize)
      .grad(vjp_resize)
      .inputs(1)
      .from_values({"sizes"})
      .params<ResizeParams>();
  define_op(OpId::GridSample)
      .set_infer(infer_grid_sample)
      .not_differentiable()
      .inputs(2)
      .params<GridSampleParams>();
}

namespace {
Attrs resize_attrs(const Shape& sizes, const ResizeOptions& o) {
  return {{"sizes", sizes},
          {"scales", o.scales},
          {"roi", o.roi},
          {"mode", std::string(kModes[static_cast<int>(o.mode)])},
          {"coordinate_transformation_mode",
           std::string(kCoords[static_cast<int>(o.coordinate_transformation_mode)])},
          {"nearest_mode", std::string(kNearest[static_cast<int>(o.nearest_mode)])},
          {"cubic_coeff_a", o.cubic_coeff_a},
          {"exclude_outside", o.exclude_outside},
          {"extrapolation_value", o.extrapolation_value},
          {"antialias", o.antialias}};
}
}  // namespace

Tensor resize(const Tensor& x, const Shape& sizes, const ResizeOptions& o) {
  return make_node1(OpId::Resize, {x}, resize_attrs(sizes, o));
}

Tensor resize_to(const Tensor& x, const Tensor& sizes, const ResizeOptions& o) {
  if (!sizes.valid() || !is_integer(sizes.dtype()) || sizes.rank() != 1 || sizes.dim(0) != x.rank())
    fail<ValueError>(
        "[resize] sizes must be a 1-d integer tensor with one entry per dim of x "
        "shape {}",
        str(x.shape()));
  if (const Array* v = ops::constant_value(sizes))
    return resize(x, v->astype(i64).to_vector<int64_t>(), o);
  return ops::node_from_values(OpId::Resize, {x}, resize_attrs(Shape(x.rank(), 0), o), {sizes});
}

Tensor grid_sample(const Tensor& x, const Tensor& grid, const GridSampleOptions& o) {
  return make_node1(OpId::GridSample, {x, cast_to(grid, x.dtype())},
                    {{"mode", std::string(kGridModes[static_cast<int>(o.mode)])},
                     {"padding_mode", std::string(kPaddings[static_cast<int>(o.padding_mode)])},
                     {"align_corners", o.align_corners}});
}

}  // namespace kiln
