// Attributes taken from values (OpDef::value_attrs, attribute from_values): what a node's
// inference gives before its values are known, and the checks of the builders that take them.
// Shape arithmetic computes such values: shape_of(x) and the integer ops on its result, which
// specialize_shapes evaluates on the host once x's shape is known (src/passes/program.cpp).
#pragma once

#include <vector>

#include "core/graph_impl.h"
#include "core/op_registry.h"
#include "kiln/graph.h"
#include "kiln/ops/transform.h"

namespace kiln::ops {

/// The node reads attributes from values not known yet.
inline bool from_values(const InferContext& ctx) { return ctx.attrs.b("from_values", false); }
/// Input `input` as a list value for attribute `attr`: 1-d, of an integer dtype and a static
/// length, which it returns. Throws ShapeError or DTypeError naming the op and the attribute.
int64_t value_length(const InferContext& ctx, int input, const char* attr);
/// Input `input` as a scalar value for attribute `attr`: 0-d or one element, of a numeric dtype.
void require_scalar_value(const InferContext& ctx, int input, const char* attr);
/// A builder's value that sizes an axis (topk's k, one_hot's depth): one element of an integer
/// dtype, returned as a 0-d int64 value. Throws naming the op and the attribute.
Tensor count_value(const char* op, const char* attr, const Tensor& v);
/// x's size along `axis` as a 0-d int64 value (a constant once shapes are specialized).
Tensor size_value(const Tensor& x, int64_t axis);
/// The value of t when t is a constant node (builders then write it in as an attribute).
const Array* constant_value(const Tensor& t);
/// A node of op on `inputs` whose attributes listed by its record's value_attrs come from
/// `values` (one each, in order).
Tensor node_from_values(OpId op, std::vector<Tensor> inputs, Attrs attrs,
                        const std::vector<Tensor>& values);

std::vector<TensorInfo> infer_shape_of(const InferContext& ctx);
/// pad's mode attribute (src/ops/transform.cpp).
std::string pad_mode(PadKind kind);

/// Builders on a graph's impl (src/ops/core.cpp): full, arange and a constant node.
Tensor full_on(detail::GraphImpl& g, const Shape& shape, double value, DType dtype);
Tensor arange_on(detail::GraphImpl& g, double start, double stop, double step, DType dtype);
Tensor constant_on(detail::GraphImpl& g, const Array& value);

}  // namespace kiln::ops
