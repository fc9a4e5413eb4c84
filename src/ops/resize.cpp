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
// along the dims, so its gradient applies each resized dim's transposed weight matrix in turn.
#include "kiln/autodiff.h"
#include "kiln/ops/elementwise.h"
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

Grads vjp_resize(const VjpContext& c) {
  if (c.attrs.b("from_values", false))
    fail<UnsupportedError>(
        "[gradients] resize to sizes computed from shapes has no gradient "
        "rule yet");
  const Shape in = transform::static_input_shape(c);
  const Shape out = c.outputs[0].shape();
  const ResizeParams rp = ResizeParams::decode(OpId::Resize, c.attrs);
  const resize_math::Params& p = rp.math;
  Tensor g = *c.cotangents[0];
  const int r = static_cast<int>(in.size());
  for (int d = 0; d < r; ++d) {
    const resize_math::Dim dim = rp.dim(in, out, static_cast<size_t>(d));
    if (resize_math::is_identity(p, dim)) continue;
    // g (..., out_d, ...) -> (..., in_d, ...): move d last, multiply by W_d, move it back
    std::vector<int64_t> perm;
    for (int k = 0; k < r; ++k)
      if (k != d) perm.push_back(k);
    perm.push_back(d);
    std::vector<int64_t> back(r);
    for (int k = 0; k < r; ++k) back[perm[k]] = k;
    const Tensor w = cast_to(constant_on(g, weight_matrix(p, dim)), g.dtype());
    g = permute(matmul(permute(g, perm), w), back);
  }
  return {g};
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
