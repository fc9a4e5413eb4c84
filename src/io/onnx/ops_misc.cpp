// ONNX ops lowered onto several kiln ops (Einsum, Det, DeformConv, RoiAlign, CenterCropPad,
// MaxUnpool, ReverseSequence, AffineGrid), and the indexing, resizing and sampling ops.
#include <onnx/onnx_pb.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>

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
  // (one of the two dims known is enough: the other must equal it when run)
  const int64_t n = x.dim(r - 1) >= 0 ? x.dim(r - 1) : x.dim(r - 2);
  if (n < 0) c.unsupported("a matrix size known only at run time");
  if (x.dim(r - 2) >= 0 && x.dim(r - 1) >= 0 && x.dim(r - 2) != n)
    c.fail(fmt::format("X {} is not square", str(x.shape())));
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

// ---- DeformConv: bilinear samples at the offset positions, then a product with the weights ----

// DeformConv (opset 19): a convolution of X (N, C, I...) by W (O, C / group, K...) whose taps read
// X at their positions plus the offsets (N, offset_group · prod(K) · s, O...) (a (d1, ..., ds)
// pair per tap), bilinearly interpolated with zeros outside, times the mask (N, offset_group ·
// prod(K), O...) where given, plus B. Written out with kiln ops so that it runs on every backend:
// per offset group one grid_sample of every tap (the taps stacked along the first output dim),
// then a batched product with the weights. X's spatial dims and the output's must be known
// while importing; f16/bf16 run in f32.
Outs deform_conv_op(NodeContext& c) {
  const Tensor x0 = c.input(0), w0 = c.input(1), offset = c.input(2);
  const int r = x0.rank(), s = r - 2;
  if (r < 3 || r > 5) c.fail(fmt::format("X of rank {} (3 to 5: 1 to 3 spatial dims)", r));
  if (w0.rank() != r || offset.rank() != r)
    c.fail(fmt::format("X, W and offset of ranks {}, {} and {} (all {})", r, w0.rank(),
                       offset.rank(), r));
  const int64_t C = x0.dim(1), O = w0.dim(0);
  const int64_t group = c.attr_int("group", 1), og = c.attr_int("offset_group", 1);
  if (C < 0 || O < 0) c.unsupported("channels known only at run time");
  if (group < 1 || og < 1 || C % group != 0 || O % group != 0 || C % og != 0 ||
      w0.dim(1) != C / group)
    c.fail(fmt::format("X {} and W {} with group {} and offset_group {}", str(x0.shape()),
                       str(w0.shape()), group, og));
  const auto sd = static_cast<size_t>(s);
  std::vector<int64_t> K(sd), I(sd), out(sd);
  const std::vector<int64_t> ks = c.attr_ints("kernel_shape");
  const std::vector<int64_t> strides = c.attr_ints("strides", std::vector<int64_t>(sd, 1));
  const std::vector<int64_t> dil = c.attr_ints("dilations", std::vector<int64_t>(sd, 1));
  const std::vector<int64_t> pads = c.attr_ints("pads", std::vector<int64_t>(2 * sd, 0));
  if (strides.size() != sd || dil.size() != sd || pads.size() != 2 * sd ||
      (!ks.empty() && ks.size() != sd))
    c.fail("strides, dilations, pads or kernel_shape do not match X's spatial dims");
  int64_t taps = 1, positions = 1;
  for (size_t d = 0; d < sd; ++d) {
    K[d] = w0.dim(static_cast<int>(d) + 2), I[d] = x0.dim(static_cast<int>(d) + 2);
    out[d] = offset.dim(static_cast<int>(d) + 2);
    if (K[d] < 1 || I[d] < 0 || out[d] < 0)
      c.unsupported("spatial dims of X, W or offset known only at run time");
    if (!ks.empty() && ks[d] != K[d]) c.fail(fmt::format("kernel_shape {} for W {}", ks[d], K[d]));
    const int64_t span = (K[d] - 1) * dil[d] + 1;
    if (strides[d] < 1 || dil[d] < 1 ||
        out[d] != (I[d] + pads[d] + pads[d + sd] - span) / strides[d] + 1)
      c.fail(fmt::format("offset's spatial dim {} is {}, where X {} with W {} gives {}", d, out[d],
                         str(x0.shape()), str(w0.shape()),
                         (I[d] + pads[d] + pads[d + sd] - span) / strides[d] + 1));
    taps *= K[d], positions *= out[d];
  }
  if (offset.dim(1) != og * taps * s)
    c.fail(fmt::format("offset has {} channels, not offset_group · taps · {} = {}", offset.dim(1),
                       s, og * taps * s));
  const DType t = x0.dtype() == f16 || x0.dtype() == bf16 ? f32 : x0.dtype();
  const Tensor x = cast(x0, t), w = cast(w0, t);
  // each tap's position before its offset: -pad + stride · o + dilation · k, as (taps, s, out...)
  Shape base_shape{taps, s};
  base_shape.insert(base_shape.end(), out.begin(), out.end());
  std::vector<double> base(static_cast<size_t>(taps * s * positions));
  std::vector<double> scale(sd), shift(sd);  // p -> grid_sample's normalized coordinate
  for (size_t d = 0; d < sd; ++d)
    scale[d] = 2.0 / static_cast<double>(I[d]), shift[d] = 1.0 / static_cast<double>(I[d]) - 1;
  for (int64_t k = 0; k < taps; ++k)
    for (int64_t q = 0; q < positions; ++q) {
      int64_t kr = k, qr = q;
      for (size_t d = sd; d-- > 0;) {
        const int64_t kd = kr % K[d], od = qr % out[d];
        kr /= K[d], qr /= out[d];
        base[static_cast<size_t>((k * s + static_cast<int64_t>(d)) * positions + q)] =
            static_cast<double>(-pads[d] + strides[d] * od + dil[d] * kd);
      }
    }
  Shape per_dim(static_cast<size_t>(4 + s), 1);  // broadcast over (N, og, taps, s, out...)
  per_dim[3] = s;
  const Tensor positions_of = known(c, Array::from_vector(base, base_shape).astype(t));
  const Tensor norm_scale = known(c, Array::from_vector(scale, per_dim).astype(t));
  const Tensor norm_shift = known(c, Array::from_vector(shift, per_dim).astype(t));
  // (reshapes keep the batch dim: a 0 takes it)
  auto batched = [&](const Tensor& v, std::vector<int64_t> dims) {
    dims.insert(dims.begin(), 0);
    return reshape_to(v, known_ints(c, dims), true);
  };
  auto with_out = [&](std::vector<int64_t> dims) {
    dims.insert(dims.end(), out.begin(), out.end());
    return dims;
  };
  // offsets (N, og, taps, s, out...) -> normalized positions
  Tensor grid_all = batched(cast(offset, t), with_out({og, taps, s}));
  grid_all = (grid_all + positions_of) * norm_scale + norm_shift;
  std::optional<Tensor> mask;
  if (c.has_input(4)) mask = batched(cast(c.input(4), t), with_out({og, taps}));
  // (s last, innermost dim first, taps stacked along the first output dim)
  std::vector<int64_t> to_last{0, 1};
  for (int d = 0; d < s; ++d) to_last.push_back(3 + d);
  to_last.push_back(2);
  std::vector<int64_t> stacked{taps * out[0]};
  stacked.insert(stacked.end(), out.begin() + 1, out.end());
  stacked.push_back(s);
  std::vector<Tensor> cols;
  const int64_t cog = C / og;
  for (int64_t g = 0; g < og; ++g) {
    const Tensor q = batched(slice(grid_all, {g}, {g + 1}, {}, {1}), with_out({taps, s}));
    const Tensor grid = batched(flip(permute(q, to_last), {r}), stacked);
    GridSampleOptions o;  // bilinear, zeros outside, pixel centres at (2p + 1) / I - 1
    const Tensor xs = slice(x, {g * cog}, {(g + 1) * cog}, {}, {1});
    Tensor sampled = batched(grid_sample(xs, grid, o), with_out({cog, taps}));  // (N, cog, ...)
    if (mask) sampled = sampled * slice(*mask, {g}, {g + 1}, {}, {1});
    cols.push_back(sampled);
  }
  // (N, C, taps, out...) -> (N, group, C / group · taps, positions) times W (group, O / group, ...)
  const Tensor col =
      batched(og == 1 ? cols[0] : concat(cols, 1), {group, C / group * taps, positions});
  const Tensor wg = reshape(w, {group, O / group, C / group * taps});
  Tensor y = batched(matmul(wg, col), with_out({O}));
  if (c.has_input(3)) {
    Shape b_shape(static_cast<size_t>(r), 1);
    b_shape[1] = O;
    y = y + reshape(cast(c.input(3), t), b_shape);
  }
  return {cast(y, x0.dtype())};
}

// ---- RoiAlign: four gathered neighbours per sample, weighted, then averaged or maxed ----

// Sampling offsets within a bin of each roi, as fractions of the bin: (iy + 0.5) / grid for the
// grid's samples, and whether each of the widest grid's places holds a sample. One row for all
// rois (a fixed sampling_ratio) or one a roi (adaptive: ceil(roi extent / bins) samples, from the
// rois known while importing).
struct SampleGrid {
  std::vector<float> frac;
  std::vector<uint8_t> used;
  std::vector<float> count;  // the grid's size, at least 1 (only the first axis's fills it)
  int64_t rows = 1, width = 1;
};
SampleGrid sample_grid(const std::vector<int64_t>& per_row) {
  SampleGrid g;
  g.rows = static_cast<int64_t>(per_row.size());
  g.width = std::max<int64_t>(1, *std::max_element(per_row.begin(), per_row.end()));
  for (int64_t n : per_row)
    for (int64_t i = 0; i < g.width; ++i) {
      g.frac.push_back(i < n ? (static_cast<float>(i) + 0.5f) / static_cast<float>(n) : 0.0f);
      g.used.push_back(i < n ? 1 : 0);
    }
  return g;
}

// RoiAlign (opsets 10, 16): for each roi (x1, y1, x2, y2) · spatial_scale (less 0.5 with
// half_pixel) of image batch_indices[r], output_height × output_width bins, each the average (or
// the largest weighted neighbour, as ONNX's reference and ONNX Runtime take max) of a grid of
// bilinear samples, as the reference computes them: samples past a pixel outside the image give
// 0, the others are clamped into it. Written out with kiln ops (one gather of the four
// neighbours of every sample from X channels-last), so it runs on every backend. With
// sampling_ratio 0 each roi's grid depends on its extent, so the rois must be known while
// importing.
Outs roi_align_op(NodeContext& c) {
  const Tensor x0 = c.input(0), rois0 = c.input(1), batch_idx = c.input(2);
  if (x0.rank() != 4) c.fail(fmt::format("X of rank {} (4: N, C, H, W)", x0.rank()));
  if (rois0.rank() != 2 || (rois0.dim(1) >= 0 && rois0.dim(1) != 4))
    c.fail(fmt::format("rois {} (num_rois, 4)", str(rois0.shape())));
  if (batch_idx.rank() != 1 || !is_integer(batch_idx.dtype()))
    c.fail("batch_indices must be 1-D integers");
  const int64_t H = x0.dim(2), W = x0.dim(3), C = x0.dim(1);
  // adaptive grids (sampling_ratio 0) over rois computed at run time: a session runs the node on
  // the host, where X's dims are known too
  if (c.attr_int("sampling_ratio", 0) == 0 && !c.constant(1))
    c.needs_data({1},
                 "RoiAlign with sampling_ratio 0 sizes each roi's sample grid by its extent, so "
                 "kiln needs the rois while importing",
                 {{std::max<int64_t>(rois0.dim(0), -1), std::max<int64_t>(C, -1),
                   c.attr_int("output_height", 1), c.attr_int("output_width", 1)}});
  if (H < 0 || W < 0 || C < 0) c.unsupported("X's channels or size known only at run time");
  const std::string mode = c.attr_string("mode", "avg");
  if (mode != "avg" && mode != "max") c.fail(fmt::format("mode '{}' (avg or max)", mode));
  const bool half =
      c.attr_string("coordinate_transformation_mode",
                    c.version() >= 16 ? "half_pixel" : "output_half_pixel") == "half_pixel";
  const int64_t oh = c.attr_int("output_height", 1), ow = c.attr_int("output_width", 1);
  const int64_t ratio = c.attr_int("sampling_ratio", 0);
  const double scale = c.attr_float("spatial_scale", 1.0f);
  if (oh < 1 || ow < 1 || ratio < 0)
    c.fail(fmt::format("output_height {}, output_width {}, sampling_ratio {}", oh, ow, ratio));
  const DType t = x0.dtype() == f64 ? f64 : f32;
  const double off = half ? 0.5 : 0.0;
  // each roi's corner and extent, (R, 1)
  const Tensor rois = cast(rois0, t);
  auto coord = [&](int64_t i) { return slice(rois, {i}, {i + 1}, {}, {1}) * scale - off; };
  const Tensor x1 = coord(0), y1 = coord(1);
  Tensor rw = coord(2) - x1, rh = coord(3) - y1;
  if (!half) rw = maximum(rw, scalar_of(rw, 1)), rh = maximum(rh, scalar_of(rh, 1));
  // the sample grids: fixed, or per roi from the rois' values
  SampleGrid gy, gx;
  if (ratio > 0) {
    gy = sample_grid({ratio}), gx = gy;
  } else {
    const Array r = c.constant(1)->astype(f64);
    const double* v = r.data<double>();
    std::vector<int64_t> ny, nx;
    for (int64_t i = 0; i < r.shape()[0]; ++i) {
      double h = (v[i * 4 + 3] - v[i * 4 + 1]) * scale, w = (v[i * 4 + 2] - v[i * 4]) * scale;
      if (!half) h = std::max(h, 1.0), w = std::max(w, 1.0);
      const double sy = std::ceil(h / static_cast<double>(oh));
      const double sx = std::ceil(w / static_cast<double>(ow));
      if (!std::isfinite(sy) || !std::isfinite(sx))
        c.fail(fmt::format("roi {} holds a value that is not finite", i));
      if (sy > 4096 || sx > 4096)
        c.fail(fmt::format("roi {} asks for {} x {} samples a bin (at most 4096 each way)", i, sy,
                           sx));
      ny.push_back(static_cast<int64_t>(std::max(0.0, sy)));
      nx.push_back(static_cast<int64_t>(std::max(0.0, sx)));
    }
    gy = sample_grid(ny), gx = sample_grid(nx);
  }
  // sample positions: y (R, oh, gh, 1, 1), x (R, 1, 1, ow, gw)
  auto positions = [&](const Tensor& start, const Tensor& extent, int64_t bins, const SampleGrid& g,
                       bool rows) {
    const Shape one = rows ? Shape{g.rows, 1, g.width, 1, 1} : Shape{g.rows, 1, 1, 1, g.width};
    const Shape bin = rows ? Shape{1, bins, 1, 1, 1} : Shape{1, 1, 1, bins, 1};
    std::vector<float> b(static_cast<size_t>(bins));
    std::iota(b.begin(), b.end(), 0.0f);
    const Tensor size = reshape(extent, {-1, 1, 1, 1, 1}) * (1.0 / static_cast<double>(bins));
    const Tensor frac = known(c, Array::from_vector(g.frac, one).astype(t));
    const Tensor p = reshape(start, {-1, 1, 1, 1, 1}) +
                     known(c, Array::from_vector(b, bin).astype(t)) * size + frac * size;
    return p;
  };
  const Tensor ys = positions(y1, rh, oh, gy, true), xs = positions(x1, rw, ow, gx, false);
  Tensor used = cast(known(c, Array::from_vector(gy.used, {gy.rows, 1, gy.width, 1, 1})), boolean);
  used = logical_and(
      used, cast(known(c, Array::from_vector(gx.used, {gx.rows, 1, 1, 1, gx.width})), boolean));
  // the reference's neighbours and weights along one axis
  struct Axis {
    Tensor inside, low, high, l, h;
  };
  auto axis = [&](const Tensor& p, int64_t n) {
    const Tensor top = scalar_of(p, static_cast<double>(n - 1));
    const Tensor inside = logical_and(greater_equal(p, scalar_of(p, -1.0)),
                                      less_equal(p, scalar_of(p, static_cast<double>(n))));
    const Tensor q = maximum(p, scalar_of(p, 0.0));
    const Tensor lowf = floor(q), edge = greater_equal(lowf, top);
    const Tensor low = where(edge, top, lowf);
    const Tensor high = where(edge, top, low + 1.0);
    const Tensor l = where(edge, scalar_of(q, 0.0), q - low);
    return Axis{inside, cast(low, i64), cast(high, i64), l, 1.0 - l};
  };
  const Axis ay = axis(ys, H), ax = axis(xs, W);
  const Tensor keep = logical_and(logical_and(ay.inside, ax.inside), used);  // (R, oh, gh, ow, gw)
  // X channels-last, one row a pixel: (N·H·W, C); the roi's image offset b·H·W
  const Tensor pixels = reshape_to(permute(cast(x0, t), {0, 2, 3, 1}), known_ints(c, {-1, C}));
  const Tensor base = reshape(cast(batch_idx, i64), {-1, 1, 1, 1, 1}) * (H * W);
  const Tensor zero = scalar_of(ay.l, 0.0);
  std::optional<Tensor> avg, mx;
  for (int k = 0; k < 4; ++k) {
    const Tensor& yi = k < 2 ? ay.low : ay.high;
    const Tensor& xi = k % 2 == 0 ? ax.low : ax.high;
    const Tensor wk = where(keep, (k < 2 ? ay.h : ay.l) * (k % 2 == 0 ? ax.h : ax.l), zero);
    const Tensor v = gather(pixels, base + yi * W + xi, 0) * expand_dims(wk, {5});  // (..., C)
    if (mode == "avg") avg = avg ? *avg + v : v;
    else mx = mx ? maximum(*mx, v) : v;
  }
  Tensor y;  // (R, oh, ow, C)
  if (mode == "avg") {
    std::vector<float> counts;
    for (int64_t i = 0; i < std::max(gy.rows, gx.rows); ++i) {
      const auto n = [](const SampleGrid& g, int64_t r) {
        int64_t k = 0;
        for (int64_t j = 0; j < g.width; ++j)
          k += g.used[static_cast<size_t>((g.rows == 1 ? 0 : r) * g.width + j)];
        return k;
      };
      counts.push_back(static_cast<float>(std::max<int64_t>(1, n(gy, i) * n(gx, i))));
    }
    const Tensor count = known(
        c, Array::from_vector(counts, {static_cast<int64_t>(counts.size()), 1, 1, 1}).astype(t));
    y = sum(*avg, {2, 4}) / count;
  } else {
    // samples that are not in a roi's grid never win; a roi without samples gives 0
    const Tensor lowest = scalar_of(*mx, -std::numeric_limits<double>::infinity());
    const Tensor m = max(where(expand_dims(used, {5}), *mx, lowest), {2, 4});
    y = where(equal(m, lowest), scalar_of(m, 0.0), m);
  }
  return {cast(permute(y, {0, 3, 1, 2}), x0.dtype())};
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
                        {"DeformConv", 19, deform_conv_op},
                        {"RoiAlign", 10, roi_align_op},
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
