// Constants and generated tensors.
#pragma once

#include <initializer_list>
#include <vector>

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
/// Writes `update` (cast to the variable's dtype; of the variable's rank, each dim at most the
/// variable's) into the region of `variable` that starts at `starts` (1-d integer, one start per
/// dim, read when the run reaches the op: a placeholder or a computed value), in place: only the
/// region's bytes move (XLA's dynamic_update_slice, but a start out of range is an error, not
/// clamped). Runs after every other op of the run that reads the variable. Returns the new
/// value (the variable's storage itself unless the result is also returned). A start outside
/// [0, dim - update dim] throws ValueError naming the variable, its shape and the start: on the
/// CPU before anything is written, on a GPU after the run (the kernel writes nothing then).
Tensor assign_slice(const Tensor& variable, const Tensor& update, const Tensor& starts);
/// assign_slice with starts known when the graph is built.
Tensor assign_slice(const Tensor& variable, const Tensor& update,
                    const std::vector<int64_t>& starts);
inline Tensor assign_slice(const Tensor& variable, const Tensor& update,
                           std::initializer_list<int64_t> starts) {
  return assign_slice(variable, update, std::vector<int64_t>(starts));
}
/// A 0-d constant of x's dtype on x's graph (for scalar operands).
Tensor scalar_like(const Tensor& x, double value);

}  // namespace kiln
