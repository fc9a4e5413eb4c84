// Small helpers shared by the op-table families.
#pragma once

#include <vector>

#include "core/errors.h"
#include "io/onnx/importer.h"
#include "io/onnx/op_table.h"
#include "kiln/ops/core.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/loss.h"
#include "kiln/ops/nn.h"
#include "kiln/ops/norm.h"
#include "kiln/ops/reduce.h"
#include "kiln/ops/transform.h"

namespace kiln::onnx::detail {

using Outs = std::vector<Tensor>;

/// A 0-d constant of x's dtype.
inline Tensor scalar_of(const Tensor& x, double v) { return scalar_like(x, v); }

/// Axis in [0, rank) or a ValueError naming the node.
inline int64_t axis_of(NodeContext& c, int64_t axis, int rank) {
  const int a = normalize_axis(axis, rank);
  if (a < 0) c.fail(fmt::format("axis {} is out of range for rank {}", axis, rank));
  return a;
}

/// `shape` with every dim that is not a size made -1 and dim `axis` (negative from the end)
/// made -1: an output's dims as far as they do not depend on the data (NodeContext::needs_data).
inline Shape data_dim(Shape shape, int64_t axis) {
  const auto rank = static_cast<int64_t>(shape.size());
  for (int64_t& d : shape) d = d < 0 ? -1 : d;
  if (axis < 0) axis += rank;
  if (axis >= 0 && axis < rank) shape[static_cast<size_t>(axis)] = -1;
  return shape;
}

/// Input i is computed from shapes alone (shape_of, constants and ops on them): the runtime
/// computes it when a run's shapes are known (src/io/onnx/ops_tensor.cpp).
bool from_shapes(NodeContext& c, int i);

/// Dropout's mask in training mode (ops_random.cpp): `keep` in (0, 1] of `shape`'s elements hold
/// 1 / keep and the rest 0 (in `dtype`), drawn from kiln's Philox generator seeded by the node's
/// int `seed` attribute, else by its first output's name.
Tensor training_dropout_mask(NodeContext& c, const Shape& shape, double keep, DType dtype);

/// A known value as a kiln constant remembered by the importer.
inline Tensor known(NodeContext& c, const Array& a) { return c.importer().constant(a); }

/// Int64 list as a 1-D i64 constant.
inline Tensor known_ints(NodeContext& c, const std::vector<int64_t>& v) {
  return known(c, Array::from_vector(v, {static_cast<int64_t>(v.size())}));
}

/// 0, 1, ..., n - 1 (i64) for a one-value i64 tensor n (a dim sliced from shape_of): positions
/// along a dim whose size may be known only at run time.
inline Tensor positions(NodeContext& c, const Tensor& n) {
  return arange(known_ints(c, {0}), n, known_ints(c, {1}), i64);
}

/// The `reduction` attribute of ScatterElements and ScatterND.
inline ScatterReduction reduction_of(NodeContext& c) {
  const std::string r = c.attr_string("reduction", "none");
  if (r == "none") return ScatterReduction::none;
  if (r == "add") return ScatterReduction::add;
  if (r == "mul") return ScatterReduction::mul;
  if (r == "max") return ScatterReduction::max;
  if (r == "min") return ScatterReduction::min;
  c.fail(fmt::format("unknown reduction '{}'", r));
}

}  // namespace kiln::onnx::detail
