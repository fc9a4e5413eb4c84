// Constants and generated tensors.
#pragma once

#include "kiln/graph.h"

namespace kiln {

/// A constant tensor holding `value` (shared, not copied).
Tensor constant(Graph& g, const Array& value);
/// A tensor of `shape` filled with `value`.
Tensor full(Graph& g, const Shape& shape, double value, DType dtype = f32);
/// A tensor of `shape` filled with 0.
Tensor zeros(Graph& g, const Shape& shape, DType dtype = f32);
/// A tensor of `shape` filled with 1.
Tensor ones(Graph& g, const Shape& shape, DType dtype = f32);
/// Values start, start+step, ... below stop (numpy.arange). Throws ValueError for step 0.
Tensor arange(Graph& g, double start, double stop, double step = 1, DType dtype = f32);
/// x's shape as an int64 vector (ONNX Shape, MPSGraph shapeOf). A constant when x's shape is
/// static; otherwise computed when a run's shapes are known, on the host, with the integer ops
/// that read it (gather, concat, slice, arithmetic), before any kernel runs.
Tensor shape_of(const Tensor& x);
/// A tensor filled with `value` whose shape is the value of `shape` (1-d integer; ONNX
/// ConstantOfShape): computed from shapes (shape_of), or a constant.
Tensor full(const Tensor& shape, double value, DType dtype = f32);
/// arange whose start, stop and step are values (one element each; ONNX Range): computed from
/// shapes (shape_of), or constants.
Tensor arange(const Tensor& start, const Tensor& stop, const Tensor& step, DType dtype);
/// Writes `value` (cast and broadcast to the variable's dtype and shape) into `variable` when a
/// run reaches it: after every other op of that run that reads the variable. Returns the new
/// value. Pass it to compile as a target or an update.
Tensor assign(const Tensor& variable, const Tensor& value);
/// A 0-d constant of x's dtype on x's graph (for scalar operands).
Tensor scalar_like(const Tensor& x, double value);

}  // namespace kiln
