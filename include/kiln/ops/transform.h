// Tensor transforms, indexing, sorting.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "kiln/graph.h"

namespace kiln {

/// x's elements in `shape`. One dim of `shape` may be -1 and is inferred. The result is a view of
/// x's buffer when the memory planner can make it one (no copy).
Tensor reshape(const Tensor& x, const Shape& shape);
/// x in the shape that is the value of `shape` (1-d integer, computed from shapes with shape_of or
/// a constant; ONNX Reshape): one -1 is inferred; with `zero_copies` a 0 takes x's dim at its
/// place.
Tensor reshape_to(const Tensor& x, const Tensor& shape, bool zero_copies = false);
/// x with its dims in the order `perm` gives (result dim i is x's dim perm[i]); `perm` empty
/// reverses the dims.
Tensor transpose(const Tensor& x, const std::vector<int64_t>& perm = {});
/// x with its dims in the order `perm` gives (result dim i is x's dim perm[i]); `perm` names every
/// dim once (ValueError otherwise).
Tensor permute(const Tensor& x, const std::vector<int64_t>& perm);
/// Inserts size-1 dims at `axes` (positions in the result).
Tensor expand_dims(const Tensor& x, const std::vector<int64_t>& axes);
/// Removes size-1 dims at `axes` (all size-1 dims when empty).
Tensor squeeze(const Tensor& x, const std::vector<int64_t>& axes = {});
/// Splits into `parts` equal pieces along `axis` (one node with `parts` outputs).
std::vector<Tensor> split(const Tensor& x, int64_t parts, int64_t axis = 0);
/// Splits into pieces of `sizes` along `axis`.
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t axis);
/// Joins equally shaped tensors along a new axis `axis` of the result.
Tensor stack(const std::vector<Tensor>& xs, int64_t axis = 0);
/// Joins along `axis`; dtypes are promoted, all other dims must match.
Tensor concat(const std::vector<Tensor>& xs, int64_t axis = 0);
/// Python slicing per axis; `axes` empty means 0..n-1; `steps` empty means 1.
/// Negative starts/stops count from the end; out-of-range values clamp.
Tensor slice(const Tensor& x, const std::vector<int64_t>& starts, const std::vector<int64_t>& stops,
             const std::vector<int64_t>& steps = {}, const std::vector<int64_t>& axes = {});
/// slice whose starts and stops are values (1-d integer, one entry per axis; computed from shapes
/// with shape_of, or constants); steps and axes as above.
Tensor slice(const Tensor& x, const Tensor& starts, const Tensor& stops,
             const std::vector<int64_t>& steps = {}, const std::vector<int64_t>& axes = {});
enum class PadKind { constant, reflect, edge };
/// x padded with `value` (constant), its mirror image (reflect) or its border (edge).
/// `pads` = (begin_0, end_0, begin_1, end_1, ...) for every dim; a negative pad crops. Reflect
/// mirrors about the input's edges (numpy "reflect") and needs each positive pad < the dim size;
/// edge repeats the border element and needs a non-empty dim.
Tensor pad(const Tensor& x, const std::vector<int64_t>& pads, PadKind kind = PadKind::constant,
           double value = 0);
/// pad whose pads are a value (1-d integer, two entries per dim in the order above; computed from
/// shapes with shape_of, or a constant).
Tensor pad(const Tensor& x, const Tensor& pads, PadKind kind = PadKind::constant, double value = 0);
/// numpy.tile: x repeated reps[d] times along each dim (missing leading reps or dims count as 1).
Tensor tile(const Tensor& x, const std::vector<int64_t>& reps);
/// tile whose reps are a value (1-d integer, one entry per dim of x; computed from shapes with
/// shape_of, or a constant).
Tensor tile(const Tensor& x, const Tensor& reps);
/// numpy broadcasting of x to `shape`; a -1 in `shape` keeps x's dim.
Tensor broadcast_to(const Tensor& x, const Shape& shape);
/// x broadcast with the value of `shape` (1-d integer, computed from shapes with shape_of or a
/// constant): the result's shape is the numpy broadcast of both (ONNX Expand).
Tensor expand(const Tensor& x, const Tensor& shape);
/// Reverses the order of elements along `axes` (every axis when empty).
Tensor flip(const Tensor& x, const std::vector<int64_t>& axes);
/// numpy.take(x, indices, axis); indices of any integer dtype; negative indices count from the
/// end. An index out of range throws ValueError when the graph runs.
Tensor gather(const Tensor& x, const Tensor& indices, int64_t axis = 0);
/// out[i][j][k] = x[i][indices[i][j][k]][k] for axis 1 (ONNX GatherElements); indices have x's
/// rank and fit inside x on the other axes. Index rules as for gather.
Tensor gather_elements(const Tensor& x, const Tensor& indices, int64_t axis);
enum class ScatterReduction { none, add, mul, max, min };
/// ONNX ScatterElements: a copy of x with updates written (or combined by `reduction`) at indices
/// along axis; duplicates apply in index order (the last one wins for none). Index rules as for
/// gather; updates are cast to x's dtype.
Tensor scatter_elements(const Tensor& x, const Tensor& indices, const Tensor& updates,
                        int64_t axis, ScatterReduction reduction = ScatterReduction::none);
/// ONNX GatherND: indices (..., m) address slices of x; the first `batch_dims` dims of x and
/// indices are batch dims and must match. The result has shape indices.shape[:-1] +
/// x.shape[batch_dims + m:]. Negative indices count from the end; an index out of range throws
/// ValueError when the graph runs.
Tensor gather_nd(const Tensor& x, const Tensor& indices, int64_t batch_dims = 0);
/// ONNX ScatterND: a copy of x with slices of updates (shape indices.shape[:-1] + x.shape[m:])
/// written (or combined by `reduction`) at the m-tuples of indices; duplicates apply in index
/// order. Index rules as for gather_nd; updates are cast to x's dtype.
Tensor scatter_nd(const Tensor& x, const Tensor& indices, const Tensor& updates,
                  ScatterReduction reduction = ScatterReduction::none);
/// scatter_nd into `variable` in place: only the slices at `indices` are written (a paged KV
/// cache, rows of an embedding table). Runs after every other op of the run that reads the
/// variable and returns its new value, as assign does. An index out of range throws ValueError
/// and writes nothing (on a GPU, after the run).
Tensor assign_scatter_nd(const Tensor& variable, const Tensor& indices, const Tensor& updates,
                         ScatterReduction reduction = ScatterReduction::none);
enum class ResizeMode { nearest, linear, cubic };
enum class ResizeCoordinates {
  half_pixel,
  half_pixel_symmetric,
  pytorch_half_pixel,
  align_corners,
  asymmetric,
  tf_crop_and_resize
};
enum class NearestMode { round_prefer_floor, round_prefer_ceil, floor, ceil };
struct ResizeOptions {
  ResizeMode mode = ResizeMode::nearest;
  ResizeCoordinates coordinate_transformation_mode = ResizeCoordinates::half_pixel;
  NearestMode nearest_mode = NearestMode::round_prefer_floor;
  double cubic_coeff_a = -0.75;
  /// Taps outside the input get weight 0 and the others renormalize (linear, cubic).
  bool exclude_outside = false;
  /// The value of outputs whose source lies outside the input (tf_crop_and_resize).
  double extrapolation_value = 0;
  /// Widens the linear/cubic kernel by 1/scale when downsampling.
  bool antialias = false;
  /// Per-dim scales the coordinate transformation uses (ONNX `scales`); empty: sizes / x dims.
  std::vector<double> scales;
  /// ONNX roi for tf_crop_and_resize: starts of every dim, then ends (fractions of the input);
  /// empty: the whole input.
  std::vector<double> roi;
};
/// ONNX Resize (opset 19) of x to `sizes` (every dim): nearest, N-linear or N-cubic
/// interpolation over every resized dim, separably. Integer and bool x take nearest only.
Tensor resize(const Tensor& x, const Shape& sizes, const ResizeOptions& options = {});
/// resize to the value of `sizes` (1-d integer, every dim; computed from shapes with shape_of or a
/// constant): an upsampling by scales of a dynamic shape.
Tensor resize_to(const Tensor& x, const Tensor& sizes, const ResizeOptions& options = {});
enum class GridSampleMode { linear, nearest, cubic };
enum class GridSamplePadding { zeros, border, reflection };
struct GridSampleOptions {
  /// linear and cubic are ONNX opset 16's bilinear and bicubic.
  GridSampleMode mode = GridSampleMode::linear;
  GridSamplePadding padding_mode = GridSamplePadding::zeros;
  bool align_corners = false;
};
/// ONNX GridSample (opset 20): x (N, C, D1, ..., Dk) sampled at the normalized coordinates of
/// grid (N, O1, ..., Ok, k) (the last dim lists (x_k, ..., x_1): the innermost dim first), for
/// k = 1, 2 or 3 spatial dims; the result is (N, C, O1, ..., Ok). grid is cast to x's float
/// dtype. Not differentiable.
Tensor grid_sample(const Tensor& x, const Tensor& grid, const GridSampleOptions& options = {});
/// A new axis of size `depth` at `axis`, on_value where index matches, else off_value. Indices of
/// any integer dtype; an index outside [0, depth) gives a row of off_value.
Tensor one_hot(const Tensor& indices, int64_t depth, int64_t axis = -1, DType dtype = f32,
               double on_value = 1, double off_value = 0);
/// one_hot with `depth` a value (one integer element; computed from shapes with shape_of, or a
/// constant): the new axis is dynamic until shapes are specialized.
Tensor one_hot(const Tensor& indices, const Tensor& depth, int64_t axis = -1, DType dtype = f32,
               double on_value = 1, double off_value = 0);
/// The k largest (or smallest) values along axis with their i64 indices; ties keep lower index.
/// k larger than the dim is a ShapeError. NaN counts as larger than every number.
std::pair<Tensor, Tensor> topk(const Tensor& x, int64_t k, int64_t axis = -1, bool largest = true);
/// topk with `k` a value (one integer element; computed from shapes with shape_of, or a
/// constant): the axis is dynamic until shapes are specialized.
std::pair<Tensor, Tensor> topk(const Tensor& x, const Tensor& k, int64_t axis = -1,
                               bool largest = true);
/// Stable sort along axis (equal values keep their order, also when descending); NaN sorts above
/// every number.
Tensor sort(const Tensor& x, int64_t axis = -1, bool descending = false);
/// The i64 positions that sort x along axis (stable, as sort).
Tensor argsort(const Tensor& x, int64_t axis = -1, bool descending = false);
/// Each element's coordinate along `axis`, for a tensor of x's shape (MPSGraph's
/// coordinateAlongAxis).
Tensor coordinate_along_axis(const Tensor& x, int64_t axis, DType dtype = i32);
/// Hamming distance between bit-packed integer vectors in the last dim of a and b; leading dims
/// broadcast. Result dtype i32 (or `dtype`).
Tensor hamming_distance(const Tensor& a, const Tensor& b, DType dtype = i32);

}  // namespace kiln
