// Tensor transforms, indexing, sorting.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "kiln/graph.h"

namespace kiln {

/// One dim of `shape` may be -1 and is inferred.
Tensor reshape(const Tensor& x, const Shape& shape);
/// `perm` empty reverses the dims.
Tensor transpose(const Tensor& x, const std::vector<int64_t>& perm = {});
Tensor permute(const Tensor& x, const std::vector<int64_t>& perm);
/// Inserts size-1 dims at `axes` (positions in the result).
Tensor expand_dims(const Tensor& x, const std::vector<int64_t>& axes);
/// Removes size-1 dims at `axes` (all size-1 dims when empty).
Tensor squeeze(const Tensor& x, const std::vector<int64_t>& axes = {});
/// Splits into `parts` equal pieces along `axis`.
std::vector<Tensor> split(const Tensor& x, int64_t parts, int64_t axis = 0);
/// Splits into pieces of `sizes` along `axis`.
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t axis);
Tensor stack(const std::vector<Tensor>& xs, int64_t axis = 0);
Tensor concat(const std::vector<Tensor>& xs, int64_t axis = 0);
/// Python slicing per axis; `axes` empty means 0..n-1; `steps` empty means 1.
/// Negative starts/stops count from the end; out-of-range values clamp.
Tensor slice(const Tensor& x, const std::vector<int64_t>& starts, const std::vector<int64_t>& stops,
             const std::vector<int64_t>& steps = {}, const std::vector<int64_t>& axes = {});
enum class PadKind { constant, reflect, edge };
/// `pads` = (begin_0, end_0, begin_1, end_1, ...) for every dim.
Tensor pad(const Tensor& x, const std::vector<int64_t>& pads, PadKind kind = PadKind::constant,
           double value = 0);
Tensor tile(const Tensor& x, const std::vector<int64_t>& reps);
Tensor broadcast_to(const Tensor& x, const Shape& shape);
Tensor flip(const Tensor& x, const std::vector<int64_t>& axes);
/// numpy.take(x, indices, axis); negative indices count from the end.
Tensor gather(const Tensor& x, const Tensor& indices, int64_t axis = 0);
/// out[i][j][k] = x[i][indices[i][j][k]][k] for axis 1 (ONNX GatherElements).
Tensor gather_elements(const Tensor& x, const Tensor& indices, int64_t axis);
enum class ScatterReduction { none, add, mul, max, min };
/// ONNX ScatterElements: a copy of x with updates written at indices along axis.
Tensor scatter_elements(const Tensor& x, const Tensor& indices, const Tensor& updates,
                        int64_t axis, ScatterReduction reduction = ScatterReduction::none);
/// A new axis of size `depth` at `axis`, on_value where index matches, else off_value.
Tensor one_hot(const Tensor& indices, int64_t depth, int64_t axis = -1, DType dtype = f32,
               double on_value = 1, double off_value = 0);
/// The k largest (or smallest) values along axis with their i64 indices; ties keep lower index.
std::pair<Tensor, Tensor> topk(const Tensor& x, int64_t k, int64_t axis = -1, bool largest = true);
/// Stable sort along axis.
Tensor sort(const Tensor& x, int64_t axis = -1, bool descending = false);
Tensor argsort(const Tensor& x, int64_t axis = -1, bool descending = false);
/// Each element's coordinate along `axis`, for a tensor of x's shape (MPSGraph's
/// coordinateAlongAxis).
Tensor coordinate_along_axis(const Tensor& x, int64_t axis, DType dtype = i32);
/// Hamming distance between bit-packed integer vectors in the last dim of a and b; leading dims
/// broadcast. Result dtype i32 (or `dtype`).
Tensor hamming_distance(const Tensor& a, const Tensor& b, DType dtype = i32);

}  // namespace kiln
