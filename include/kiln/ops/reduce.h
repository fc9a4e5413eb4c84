// Reductions. `axes` empty means all axes; negative axes count from the end.
#pragma once

#include <vector>

#include "kiln/graph.h"

namespace kiln {

using Axes = std::vector<int64_t>;

/// Sum of x over `axes` (every axis when empty) in x's dtype; bool sums as i64. The sum of
/// nothing is 0.
Tensor sum(const Tensor& x, const Axes& axes = {}, bool keepdims = false);
/// Mean of x over `axes` (every axis when empty); float dtypes.
Tensor mean(const Tensor& x, const Axes& axes = {}, bool keepdims = false);
/// Largest element of x over `axes` (every axis when empty); any dtype. Reducing an empty
/// axis is a ValueError.
Tensor max(const Tensor& x, const Axes& axes = {}, bool keepdims = false);
/// Smallest element of x over `axes` (every axis when empty); any dtype. Reducing an empty
/// axis is a ValueError.
Tensor min(const Tensor& x, const Axes& axes = {}, bool keepdims = false);
/// Product of x over `axes` (every axis when empty) in x's dtype; bool multiplies as i64. The
/// product of nothing is 1.
Tensor prod(const Tensor& x, const Axes& axes = {}, bool keepdims = false);
/// log(sum(exp(x))) over `axes` (every axis when empty); float dtypes.
Tensor logsumexp(const Tensor& x, const Axes& axes = {}, bool keepdims = false);
/// Variance of x over `axes` (every axis when empty) with `correction` subtracted from the count
/// (0: population, 1: sample); float dtypes.
Tensor variance(const Tensor& x, const Axes& axes = {}, bool keepdims = false,
                int64_t correction = 0);
/// sum(|x|) over `axes` (every axis when empty); float dtypes.
Tensor norm_l1(const Tensor& x, const Axes& axes = {}, bool keepdims = false);
/// sqrt(sum(x²)) over `axes` (every axis when empty); float dtypes.
Tensor norm_l2(const Tensor& x, const Axes& axes = {}, bool keepdims = false);
/// Index (i64) of the first maximum along `axis`.
Tensor argmax(const Tensor& x, int64_t axis, bool keepdims = false);
/// Index (i64) of the first minimum along `axis`.
Tensor argmin(const Tensor& x, int64_t axis, bool keepdims = false);
/// Running sum of x along `axis` in x's dtype (bool as i64): exclusive leaves each element out
/// of its own sum (the first is 0), reverse sums from the end.
Tensor cumsum(const Tensor& x, int64_t axis, bool exclusive = false, bool reverse = false);

}  // namespace kiln
