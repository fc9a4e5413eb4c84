// Reverse-mode automatic differentiation: gradients are built as more nodes of the same graph.
#pragma once

#include <vector>

#include "kiln/graph.h"

namespace kiln {

/// d(sum(y))/dx for each x in xs, in the same graph (MPSGraph's gradientForPrimaryTensor).
/// An x that y does not depend on gets zeros. Throws UnsupportedError naming the op when the path
/// from an x to y crosses an op without a gradient (argmax, comparisons, ...).
std::vector<Tensor> gradients(const Tensor& y, const std::vector<Tensor>& xs);
/// Same, with the incoming gradient of y given (shape of y): d(sum(y * grad_y))/dx.
std::vector<Tensor> gradients(const Tensor& y, const std::vector<Tensor>& xs,
                              const Tensor& grad_y);

/// Sums `g` over the dims along which a tensor of `shape` was broadcast to g's shape, giving
/// `shape` (the gradient of a broadcast). A dynamic dim of `shape` is taken to match g's (not to
/// have broadcast); `shape` may have one dynamic dim (else use sum_to_shape_of).
Tensor sum_to_shape(const Tensor& g, const Shape& shape);
/// sum_to_shape to the shape of `like`, which may have dynamic dims: the result reads like's
/// shape when shapes are specialized (where a dynamic dim of like broadcast, being 1 against a
/// larger dim of g, that fails then).
Tensor sum_to_shape_of(const Tensor& g, const Tensor& like);
/// Zeros with x's shape and dtype (x's shape must be static).
Tensor zeros_like(const Tensor& x);
/// Ones with x's shape and dtype (x's shape must be static).
Tensor ones_like(const Tensor& x);

}  // namespace kiln
