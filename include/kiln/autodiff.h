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
/// `shape` (the gradient of a broadcast).
Tensor sum_to_shape(const Tensor& g, const Shape& shape);
/// Zeros with x's shape and dtype (x's shape must be static).
Tensor zeros_like(const Tensor& x);
/// Ones with x's shape and dtype (x's shape must be static).
Tensor ones_like(const Tensor& x);

}  // namespace kiln
