// Shared helpers of the op builders and their shape inference.
#pragma once

#include <optional>
#include <vector>

#include "core/errors.h"
#include "core/graph_impl.h"
#include "core/op_registry.h"
#include "kiln/graph.h"
#include "kiln/ops/transform.h"

namespace kiln::ops {

using detail::make_node;
using detail::make_node1;

/// x cast to `t` (x itself when it already has dtype t).
Tensor cast_to(const Tensor& x, DType t);
/// Resolves `axis` against `rank`; throws ValueError "[op] axis 3 is out of range for shape ...".
int resolve_axis(const char* op, int64_t axis, const Shape& shape);
/// Resolves, sorts and de-duplicates axes (empty = all axes when `empty_means_all`).
std::vector<int64_t> resolve_axes(const char* op, const std::vector<int64_t>& axes,
                                  const Shape& shape, bool empty_means_all = true);
/// numpy broadcast of input infos, or ShapeError naming the op and both shapes.
Shape broadcast_infer(const InferContext& ctx, int first = 0, int count = -1);
/// Throws DTypeError "[op] input i has dtype X; expected <what>" unless the dtype is in `ok`.
void require_dtype(const InferContext& ctx, int input, DTypeSet ok, const char* what);
/// Throws ShapeError unless input `i` has rank in [lo, hi].
void require_rank(const InferContext& ctx, int input, int lo, int hi);
/// Dims equal, or either unknown (-1) until compile.
bool dims_match(int64_t a, int64_t b);
/// Same rank and every pair of dims matches.
bool shapes_match(const Shape& a, const Shape& b);
/// Whether an (N, C, spatial...) shape has a spatial dim known only at run time.
bool dynamic_spatial(const Shape& s);
/// Appends optional tensors and records which are present as bool attrs ("has_<name>").
void add_optional(std::vector<Tensor>& inputs, Attrs& attrs, const char* name,
                  const std::optional<Tensor>& t);

/// x broadcast to the shape of `like`, also where that shape has dynamic dims (then a
/// broadcast_to node reading like's shape, made static when shapes are specialized).
Tensor broadcast_to_like(const Tensor& x, const Tensor& like);
/// x reshaped to like's shape, which may have dynamic dims (then a reshape node reading like's
/// shape when shapes are specialized).
Tensor reshape_like(const Tensor& x, const Tensor& like);

/// slice's attributes (a start, stop and step per dim) from per-axis lists; throws ValueError for
/// lists of different lengths, an axis given twice or a step of 0.
Attrs slice_attrs(const Shape& in, const std::vector<int64_t>& starts,
                  const std::vector<int64_t>& stops, const std::vector<int64_t>& steps,
                  const std::vector<int64_t>& axes);

/// The attribute value of a scatter reduction ("none", "add", ...).
inline const char* reduction_name(ScatterReduction r) {
  switch (r) {
    case ScatterReduction::none: return "none";
    case ScatterReduction::add: return "add";
    case ScatterReduction::mul: return "mul";
    case ScatterReduction::max: return "max";
    case ScatterReduction::min: return "min";
  }
  return "none";
}

}  // namespace kiln::ops
