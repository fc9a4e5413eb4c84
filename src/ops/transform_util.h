// Shape math shared by the transform ops' inference and their CPU kernels (header only, so the
// kernels resolve slices exactly as inference did).
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kiln/dtype.h"
#include "kiln/shape.h"

namespace kiln {

class Tensor;
struct VjpContext;

/// Registers the indexing and sorting half of the transform family (transform_index.cpp).
void register_transform_index_ops();
/// Registers gather_nd and scatter_nd (transform_nd.cpp).
void register_transform_nd_ops();
/// Registers resize and grid_sample (resize.cpp).
void register_resize_ops();
/// Registers depth_to_space, space_to_depth, embedding(_grad), masked_fill, roll and
/// non_max_suppression (rearrange.cpp).
void register_rearrange_ops();

namespace transform {
// Helpers of the family's gradient rules (transform.cpp).

/// Input i's shape; throws ShapeError naming the op when it has dynamic dims.
Shape static_input_shape(const VjpContext& c, int i = 0);
/// A tensor of `shape` filled with `value`, on the graph of `on`.
Tensor full_on(const Tensor& on, const Shape& shape, double value, DType dtype);
/// A tensor of like's shape (dynamic dims too: read when shapes are specialized) filled with
/// `value` in `dtype`.
Tensor full_shaped_like(const Tensor& like, double value, DType dtype);
/// 1, 2, ..., numel(u) as int64 in u's shape (dynamic dims too): ids of u's elements.
Tensor element_ids(const Tensor& u);

// Rules for dims known only at run time, their sizes read with shape_of (transform_grad.cpp).
/// gather's gradient with respect to x: g scatter-added back along axis.
Tensor gather_grad(const Tensor& x, const Tensor& indices, const Tensor& g, int64_t axis);
/// slice's gradient rule: g padded back with zeros (from shapes at run time where a dim is
/// dynamic and not taken whole, or the bounds are values: then steps of 1 there).
std::vector<std::optional<Tensor>> vjp_slice(const VjpContext& c);
/// tile's gradient: the copies of g added up.
Tensor tile_grad(const Tensor& x, const Tensor& g, const std::vector<int64_t>& reps);
/// The same with each dim's repeats a 1-element value.
Tensor tile_grad(const Tensor& x, const Tensor& g, const std::vector<Tensor>& reps);
/// concat's gradients: g sliced at the inputs' run-time sizes along axis.
std::vector<Tensor> concat_grad(const std::vector<Tensor>& xs, const Tensor& g, int64_t axis);
/// reflect or edge pad's gradient with respect to x (pads interleaved: begin, end per dim): each
/// padded dim's positions added back at their sources, x's sizes read at run time.
Tensor fold_pad_grad(const Tensor& x, const Tensor& g, const std::vector<int64_t>& pads,
                     const std::string& mode);
/// The same with the pads a value (pad's pads computed from shapes): every dim is folded.
Tensor fold_pad_grad(const Tensor& x, const Tensor& g, const Tensor& pads, const std::string& mode);
}  // namespace transform

namespace transform {

struct SliceDim {
  int64_t start = 0;  // first input index taken
  int64_t count = 0;  // number of elements taken
};

/// Python slicing of a dim of size n: negative start/stop count from the end, out-of-range values
/// clamp. step must not be 0.
inline SliceDim slice_dim(int64_t n, int64_t start, int64_t stop, int64_t step) {
  const int64_t lo = step > 0 ? 0 : -1, hi = step > 0 ? n : n - 1;
  auto resolve = [&](int64_t v) { return std::clamp(v < 0 ? v + n : v, lo, hi); };
  const int64_t b = resolve(start), e = resolve(stop);
  const int64_t span = step > 0 ? e - b : b - e;
  const int64_t s = step > 0 ? step : -step;
  return {b, span > 0 ? (span + s - 1) / s : 0};
}

}  // namespace transform
}  // namespace kiln
