// ONNX ops lowered onto several kiln ops (Einsum, Det, CenterCropPad, MaxUnpool, ReverseSequence,
// AffineGrid), and the indexing, resizing and sampling ops.
#include <onnx/onnx_pb.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "io/onnx/map_util.h"
#include "kiln/ops/linalg.h"

namespace kiln::onnx::detail {

namespace {

// ---- Einsum: kiln::einsum (src/ops/einsum.cpp) ----

Outs einsum_op(NodeContext& c) {
  std::vector<Tensor> operands;
  for (int i = 0; i < c.num_inputs(); ++i) operands.push_back(c.input(i));
  return {einsum(c.attr_string("equation", ""), operands)};
}

// ---- Det: LU with partial pivoting, written out one column a step ----

// Det (opset 11): the determinant of each matrix of X (..., n, n), n known while importing, by
// Gaussian elimination with partial pivoting written out with kiln ops (n steps of a row swap
// gathered, and the rows below the pivot reduced), so that it runs on every backend: the product
// of the pivots, negated for each swap. A column without a nonzero pivot leaves a zero on the
// diagonal: det 0, as LAPACK gives. f16/bf16 run in f32.
Outs det_op(NodeContext& c) {
  const Tensor x = c.input(0);
  if (!is_floating(x.dtype()))
    c.fail(fmt::format("X must be a float tensor, got {}", name(x.dtype())));
  const int r = x.rank();
  if (r < 2) c.fail(fmt::format("X of rank {} (at least 2: (..., n, n))", r));
  const int64_t n = x.dim(r - 1);
  if (n < 0 || x.dim(r - 2) < 0) c.unsupported("a matrix size known only at run time");
  if (x.dim(r - 2) != n) c.fail(fmt::format("X {} is not square", str(x.shape())));
  const DType t = x.dtype() == f16 || x.dtype() == bf16 ? f32 : x.dtype();
  Tensor a = cast(x, t);
  const Tensor batch = slice(shape_of(x), {0}, {r - 2});
  if (n == 0) return {cast(full(batch, 1.0, t), x.dtype())};
  const Tensor rows = reshape(arange(c.graph(), 0, static_cast<double>(n), 1, i64), {n, 1});
  const Tensor cols = reshape(rows, {1, n});
  const Tensor zero = scalar_of(a, 0);
  Tensor sign = full(concat({batch, known_ints(c, {1, 1})}, 0), 1.0, t);  // (..., 1, 1)
  for (int64_t k = 0; k < n; ++k) {
    const Tensor kk = scalar_of(rows, static_cast<double>(k));
    // the pivot: the largest |a[i, k]| of rows i >= k; rows k and p swapped
    const Tensor col = slice(a, {0, k}, {n, k + 1}, {}, {r - 2, r - 1});  // (..., n, 1)
    const Tensor candidates = where(greater_equal(rows, kk), abs(col), scalar_of(col, -1));
    const Tensor p = argmax(candidates, r - 2, true);  // (..., 1, 1)
    const Tensor order = where(equal(rows, kk), p, where(equal(rows, p), kk, rows));
    a = gather_elements(a, expand(order, shape_of(a)), r - 2);
    sign = where(equal(p, kk), sign, neg(sign));
    // rows below k minus their multiple of row k
    const Tensor pivot = slice(a, {k, k}, {k + 1, k + 1}, {}, {r - 2, r - 1});  // (..., 1, 1)
    const Tensor below = slice(a, {0, k}, {n, k + 1}, {}, {r - 2, r - 1});
    const Tensor reduce = logical_and(greater(rows, kk), not_equal(pivot, zero));
    const Tensor factor = where(reduce, below / pivot, zero);  // (..., n, 1)
    const Tensor row_k = slice(a, {k}, {k + 1}, {}, {r - 2});  // (..., 1, n)
    a = where(greater(rows, kk), a - factor * row_k, a);
  }
  const Tensor diagonal = sum(where(equal(rows, cols), a, zero), {r - 1});  // (..., n)
  const Tensor det = prod(diagonal, {r - 2}) * reshape_to(sign, batch);
  return {cast(det, x.dtype())};
}

// ---- the rest ----

// x along axis a (of a size known only when run) centred in `want`: its middle `want` elements
// where it is longer, padded with zeros on both sides (the odd one at the end) where it is shorter.
Tensor center_crop_pad_run_time(NodeContext& c, const Tensor& x, int64_t a, int64_t want) {
  const Tensor n = slice(shape_of(x), {a}, {a + 1}), w = known_ints(c, {want});
  const Tensor zero = known_ints(c, {0}), two = known_ints(c, {2});
  const Tensor start = div(maximum(sub(n, w), zero), two);
  const Tensor cropped = slice(x, start, add(start, minimum(n, w)), {}, {a});
  const Tensor total = maximum(sub(w, n), zero), before = div(total, two);
  std::vector<Tensor> pads;  // kiln's (begin, end) per dim
  for (int64_t d = 0; d < x.rank(); ++d) {
    pads.push_back(d == a ? before : zero);
    pads.push_back(d == a ? sub(total, before) : zero);
  }
  return pad(cropped, concat(pads, 0));
}

Outs center_crop_pad(NodeContext& c) {
  Tensor x = c.input(0);
  const auto want = c.ints(1);
  std::vector<int64_t> axes = c.attr_ints("axes");
  if (axes.empty()) {
    axes.resize(x.rank());
    std::iota(axes.begin(), axes.end(), 0);
  }
  if (want.size() != axes.size()) c.fail("shape must have one value per axis");
  std::vector<int64_t> pads(2 * x.rank(), 0);
  bool padding = false;
  for (size_t i = 0; i < axes.size(); ++i) {
    const int64_t a = axis_of(c, axes[i], x.rank());
    const int64_t n = x.dim(static_cast<int>(a));
    if (n < 0) {  // cropped or padded as the run-time size falls: both computed from it
      x = center_crop_pad_run_time(c, x, a, want[i]);
      continue;
    }
    if (want[i] < n) {
      const int64_t start = (n - want[i]) / 2;
      x = slice(x, {start}, {start + want[i]}, {}, {a});
    } else if (want[i] > n) {
      pads[2 * a] = (want[i] - n) / 2;
      pads[2 * a + 1] = want[i] - n - pads[2 * a];
      padding = true;
    }
  }
  return {padding ? pad(x, pads) : x};
}

Outs max_unpool(NodeContext& c) {
  Tensor x = c.input(0), idx = c.input(1);
  const Shape s = x.shape();
  for (size_t d = 2; d < s.size(); ++d)
    if (s[d] < 0) c.unsupported("needs static spatial dims");
  // scatter into the shape the pooling came from; output_shape then pads at the ends
  const auto k = c.attr_ints("kernel_shape");
  const size_t nd = k.size();
  const auto st = c.attr_ints("strides", std::vector<int64_t>(nd, 1));
  const auto p = c.attr_ints("pads", std::vector<int64_t>(2 * nd, 0));
  if (nd + 2 != s.size() || st.size() != nd || p.size() != 2 * nd)
    c.fail("kernel_shape, strides and pads do not match the input's rank");
  Shape inferred{s[0], s[1]};
  for (size_t i = 0; i < nd; ++i) inferred.push_back((s[2 + i] - 1) * st[i] + k[i] - p[i] - p[i + nd]);
  Tensor y;
  if (is_static(s)) {
    Tensor flat = full(c.graph(), {numel(inferred)}, 0.0, x.dtype());
    y = reshape(scatter_elements(flat, reshape(idx, {-1}), reshape(x, {-1}), 0), inferred);
  } else {  // the batch or channels known only when run: the unpooled size from x's shape
    const Tensor sizes = concat(
        {slice(shape_of(x), {0}, {2}), known_ints(c, Shape(inferred.begin() + 2, inferred.end()))},
        0);
    const Tensor flat = full(reshape(prod(sizes), {1}), 0.0, x.dtype());
    y = reshape_to(scatter_elements(flat, reshape(idx, {-1}), reshape(x, {-1}), 0), sizes);
  }
  if (!c.has_input(2)) return {y};
  const Shape out = c.ints(2);
  if (out.size() != inferred.size()) c.fail("output_shape has the wrong rank");
  std::vector<int64_t> pads(2 * out.size(), 0);
  for (size_t i = 0; i < out.size(); ++i) {
    if (inferred[i] < 0) continue;  // (a dynamic batch or channel dim: as output_shape gives it)
    if (out[i] < inferred[i]) c.fail("output_shape is smaller than the unpooled shape");
    pads[2 * i + 1] = out[i] - inferred[i];
  }
  return {pad(y, pads)};
}

Outs reverse_sequence(NodeContext& c) {
  Tensor x = c.input(0), lens = cast(c.input(1), i64);
  const int64_t bax = axis_of(c, c.attr_int("batch_axis", 1), x.rank());
  const int64_t tax = axis_of(c, c.attr_int("time_axis", 0), x.rank());
  // each position's time index (x's run-time size along the axis), and its sequence's length
  Shape bs(x.rank(), 1);
  bs[bax] = x.dim(static_cast<int>(bax));
  const Tensor t = coordinate_along_axis(x, tax, i64);
  const Tensor len = reshape(lens, bs);
  const Tensor src = where(less(t, len), sub(sub(len, scalar_of(len, 1)), t), t);
  return {gather_elements(x, src, tax)};
}

Outs affine_grid(NodeContext& c) {
  Tensor theta = c.input(0);
  const auto size = c.ints(1);
  const bool align = c.attr_int("align_corners", 0) != 0;
  const size_t nd = size.size() - 2;
  if (nd != 2 && nd != 3) c.fail("size must be (N, C, H, W) or (N, C, D, H, W)");
  auto coords = [&](int64_t n) {
    std::vector<double> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i)
      v[i] = align ? (n > 1 ? -1.0 + 2.0 * static_cast<double>(i) / static_cast<double>(n - 1) : 0.0)
                   : -1.0 + (2.0 * static_cast<double>(i) + 1.0) / static_cast<double>(n);
    return v;
  };
  // base grid rows (x, y[, z], 1), x varying fastest
  const int64_t D = nd == 3 ? size[2] : 1, H = size[nd == 3 ? 3 : 2], W = size[nd == 3 ? 4 : 3];
  const auto xs = coords(W), ys = coords(H), zs = coords(D);
  const int64_t cols = static_cast<int64_t>(nd) + 1, rows = D * H * W;
  Array base = Array::zeros({rows, cols}, f64);
  double* b = base.data<double>();
  for (int64_t d = 0; d < D; ++d)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t w = 0; w < W; ++w) {
        double* r = b + ((d * H + h) * W + w) * cols;
        r[0] = xs[w];
        r[1] = ys[h];
        if (nd == 3) r[2] = zs[d];
        r[cols - 1] = 1;
      }
  Tensor g = matmul(known(c, base.astype(theta.dtype())), transpose(theta, {0, 2, 1}));
  Shape out{size[0]};
  if (nd == 3) out.push_back(D);
  out.insert(out.end(), {H, W, static_cast<int64_t>(nd)});
  return {reshape(g, out)};
}

// ---- indexing, resizing, sampling ----

Outs gather_nd_op(NodeContext& c) {
  return {gather_nd(c.input(0), c.input(1), c.attr_int("batch_dims", 0))};
}
Outs scatter_nd_op(NodeContext& c) {
  return {scatter_nd(c.input(0), c.input(1), c.input(2), reduction_of(c))};
}

// Resize (10 to 19) and Upsample (7, 9): output sizes from `sizes` or `scales`, per axis.
Outs resize_op(NodeContext& c) {
  Tensor x = c.input(0);
  const Shape in = x.shape();
  const bool dynamic = !is_static(in);  // sizes computed from x's shape when it is known
  const int r = x.rank();
  const bool upsample = c.op_type() == "Upsample";
  const bool v10 = upsample || c.version() < 11;
  ResizeOptions o;
  const std::string mode = c.attr_string("mode", "nearest");
  if (mode == "nearest") o.mode = ResizeMode::nearest;
  else if (mode == "linear" || mode == "bilinear") o.mode = ResizeMode::linear;
  else if (mode == "cubic" && !v10) o.mode = ResizeMode::cubic;
  else c.fail(fmt::format("unknown mode '{}'", mode));
  std::vector<double> scales;
  std::vector<int64_t> sizes;
  Tensor computed_sizes;  // sizes computed from shapes
  if (upsample && c.version() < 9) {
    for (float f : c.attr_floats("scales")) scales.push_back(f);
  } else if (v10) {
    scales = c.doubles(1);
  } else {
    // an empty tensor stands for an omitted input
    auto given = [&](int i) { return c.has_input(i) && !(c.constant(i) && c.constant(i)->numel() == 0); };
    if (given(3) && !c.constant(3) && from_shapes(c, 3)) computed_sizes = c.input(3);
    else if (given(3)) sizes = c.ints(3);
    else if (given(2)) scales = c.doubles(2);
  }
  if (v10) {  // Upsample's convention: out = floor(in * scale), asymmetric, nearest floors
    o.coordinate_transformation_mode = ResizeCoordinates::asymmetric;
    o.nearest_mode = NearestMode::floor;
  } else {
    const std::string ct = c.attr_string("coordinate_transformation_mode", "half_pixel");
    if (ct == "half_pixel") o.coordinate_transformation_mode = ResizeCoordinates::half_pixel;
    else if (ct == "half_pixel_symmetric") o.coordinate_transformation_mode = ResizeCoordinates::half_pixel_symmetric;
    else if (ct == "pytorch_half_pixel") o.coordinate_transformation_mode = ResizeCoordinates::pytorch_half_pixel;
    else if (ct == "align_corners") o.coordinate_transformation_mode = ResizeCoordinates::align_corners;
    else if (ct == "asymmetric") o.coordinate_transformation_mode = ResizeCoordinates::asymmetric;
    else if (ct == "tf_crop_and_resize") o.coordinate_transformation_mode = ResizeCoordinates::tf_crop_and_resize;
    else c.fail(fmt::format("unknown coordinate_transformation_mode '{}'", ct));
    const std::string nm = c.attr_string("nearest_mode", "round_prefer_floor");
    if (nm == "round_prefer_floor") o.nearest_mode = NearestMode::round_prefer_floor;
    else if (nm == "round_prefer_ceil") o.nearest_mode = NearestMode::round_prefer_ceil;
    else if (nm == "floor") o.nearest_mode = NearestMode::floor;
    else if (nm == "ceil") o.nearest_mode = NearestMode::ceil;
    else c.fail(fmt::format("unknown nearest_mode '{}'", nm));
    o.cubic_coeff_a = c.attr_float("cubic_coeff_a", -0.75f);
    o.exclude_outside = c.attr_int("exclude_outside", 0) != 0;
    o.extrapolation_value = c.attr_float("extrapolation_value", 0.0f);
    o.antialias = c.attr_int("antialias", 0) != 0;
  }
  std::vector<int64_t> axes = c.attr_ints("axes");
  if (axes.empty()) {
    axes.resize(r);
    std::iota(axes.begin(), axes.end(), 0);
  }
  for (auto& a : axes) a = axis_of(c, a, r);
  const size_t n = axes.size();
  // tf_crop_and_resize's region: every dim's start, then every dim's end (0 and 1 off the axes)
  auto read_roi = [&] {
    if (o.coordinate_transformation_mode != ResizeCoordinates::tf_crop_and_resize ||
        !c.has_input(1) || (c.constant(1) && c.constant(1)->numel() == 0))
      return;
    const auto roi = c.doubles(1);
    if (roi.size() != 2 * n) c.fail("roi needs a start and an end per axis");
    std::vector<double> full_roi(2 * r);
    for (int i = 0; i < r; ++i) full_roi[i] = 0, full_roi[r + i] = 1;
    for (size_t i = 0; i < n; ++i) {
      full_roi[axes[i]] = roi[i];
      full_roi[r + axes[i]] = roi[n + i];
    }
    o.roi = full_roi;
  };
  read_roi();
  if (computed_sizes.valid()) {
    if (computed_sizes.rank() != 1 || computed_sizes.dim(0) != static_cast<int64_t>(n))
      c.fail(fmt::format("sizes has shape {} for {} axes", str(computed_sizes.shape()), n));
    if (c.attr_string("keep_aspect_ratio_policy", "stretch") != "stretch")
      c.unsupported("keep_aspect_ratio_policy needs static sizes");
    if (static_cast<int>(n) == r && std::is_sorted(axes.begin(), axes.end()))
      return {resize_to(x, computed_sizes, o)};
    // the computed sizes on their axes, x's dims elsewhere
    const Tensor s = shape_of(x), given = cast(computed_sizes, i64);
    std::vector<Tensor> parts;
    for (int d = 0; d < r; ++d) {
      const auto it = std::find(axes.begin(), axes.end(), d);
      const int64_t i = it - axes.begin();
      parts.push_back(it != axes.end() ? slice(given, {i}, {i + 1}) : slice(s, {d}, {d + 1}));
    }
    return {resize_to(x, concat(parts, 0), o)};
  }
  if (!sizes.empty() && sizes.size() != n) c.fail(fmt::format("sizes has {} values for {} axes", sizes.size(), n));
  if (!scales.empty() && scales.size() != n) c.fail(fmt::format("scales has {} values for {} axes", scales.size(), n));
  if (sizes.empty() && scales.empty()) c.fail("needs scales or sizes");
  std::vector<double> full_scales(r, 1.0);
  if (dynamic) {
    if (!sizes.empty() && c.attr_string("keep_aspect_ratio_policy", "stretch") != "stretch")
      c.unsupported("keep_aspect_ratio_policy needs x's static shape");
    const Tensor s = shape_of(x);
    Tensor out_sizes;
    if (!sizes.empty()) {  // the given sizes on their axes, x's dims elsewhere
      std::vector<Tensor> parts;
      for (int d = 0; d < r; ++d) {
        const auto it = std::find(axes.begin(), axes.end(), d);
        parts.push_back(it != axes.end() ? known_ints(c, {sizes[it - axes.begin()]})
                                         : slice(s, {d}, {d + 1}));
      }
      out_sizes = concat(parts, 0);
    } else {  // floor(dim * scale), as the static path and the ONNX reference size it
      for (size_t i = 0; i < n; ++i) {
        if (!(scales[i] > 0)) c.fail("scales must be positive");
        full_scales[axes[i]] = scales[i];
      }
      Tensor f = cast(s, f64) * known(c, Array::from_vector(full_scales, {r}));
      out_sizes = cast(floor(f), i64);
      o.scales = full_scales;
    }
    return {resize_to(x, out_sizes, o)};
  }
  Shape out = in;
  if (!sizes.empty()) {
    for (size_t i = 0; i < n; ++i) full_scales[axes[i]] = double(sizes[i]) / double(in[axes[i]]);
    const std::string policy = c.attr_string("keep_aspect_ratio_policy", "stretch");
    if (policy != "stretch") {
      double sc = policy == "not_larger" ? INFINITY : 0;
      if (policy != "not_larger" && policy != "not_smaller")
        c.fail(fmt::format("unknown keep_aspect_ratio_policy '{}'", policy));
      for (int64_t a : axes) sc = policy == "not_larger" ? std::min(sc, full_scales[a]) : std::max(sc, full_scales[a]);
      for (int64_t a : axes) {
        full_scales[a] = sc;
        out[a] = static_cast<int64_t>(sc * double(in[a]) + 0.5);
      }
    } else {
      for (size_t i = 0; i < n; ++i) out[axes[i]] = sizes[i];
    }
  } else {
    for (size_t i = 0; i < n; ++i) {
      if (!(scales[i] > 0)) c.fail("scales must be positive");
      full_scales[axes[i]] = scales[i];
      out[axes[i]] = static_cast<int64_t>(scales[i] * double(in[axes[i]]));
    }
  }
  o.scales = full_scales;
  return {resize(x, out, o)};
}

Outs grid_sample_op(NodeContext& c) {
  GridSampleOptions o;
  const std::string mode = c.attr_string("mode", c.version() >= 20 ? "linear" : "bilinear");
  if (mode == "bilinear" || mode == "linear") o.mode = GridSampleMode::linear;
  else if (mode == "nearest") o.mode = GridSampleMode::nearest;
  else if (mode == "bicubic" || mode == "cubic") o.mode = GridSampleMode::cubic;
  else c.fail(fmt::format("unknown mode '{}'", mode));
  const std::string pad = c.attr_string("padding_mode", "zeros");
  if (pad == "zeros") o.padding_mode = GridSamplePadding::zeros;
  else if (pad == "border") o.padding_mode = GridSamplePadding::border;
  else if (pad == "reflection") o.padding_mode = GridSamplePadding::reflection;
  else c.fail(fmt::format("unknown padding_mode '{}'", pad));
  o.align_corners = c.attr_int("align_corners", 0) != 0;
  return {grid_sample(c.input(0), c.input(1), o)};
}

// Optionals (opsets 15, 18): an optional that holds a tensor or a sequence is that value, one
// without (an absent graph input, Optional() of a type, an omitted input) is an absent value.
// OptionalHasElement says which (a bool scalar known while importing); OptionalGetElement of a
// value is the value.
Outs optional_has_element(NodeContext& c) {
  const bool has = c.has_input(0) && !c.is_absent(0);
  return {known(c, Array::from_vector<int64_t>({has ? 1 : 0}, {}).astype(boolean))};
}
Outs optional_get_element(NodeContext& c) {
  if (!c.has_input(0) || c.is_absent(0))
    c.fail("an optional without a value has no element to get");
  if (c.is_sequence(0)) {
    c.set_sequence(0, c.sequence(0));
    return {};
  }
  return {c.input(0)};
}
Outs optional_op(NodeContext& c) {
  if (!c.has_input(0)) {
    c.set_absent(0);
    return {};
  }
  return optional_get_element(c);
}

}  // namespace

void add_misc_ops(std::vector<OpEntry>& t) {
  t.insert(t.end(), {
                        {"Einsum", 12, einsum_op},
                        {"Det", 11, det_op},
                        {"CenterCropPad", 18, center_crop_pad},
                        {"MaxUnpool", 9, max_unpool},
                        {"ReverseSequence", 10, reverse_sequence},
                        {"AffineGrid", 20, affine_grid},
                        {"GatherND", 11, gather_nd_op},
                        {"ScatterND", 11, scatter_nd_op},
                        {"Resize", 10, resize_op},
                        {"Upsample", 7, resize_op},
                        {"GridSample", 16, grid_sample_op},
                        {"OptionalHasElement", 15, optional_has_element},
                        {"OptionalHasElement", 18, optional_has_element},
                        {"OptionalGetElement", 15, optional_get_element},
                        {"OptionalGetElement", 18, optional_get_element},
                        {"Optional", 15, optional_op},
                    });
}

}  // namespace kiln::onnx::detail
