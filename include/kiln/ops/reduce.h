// Reductions. `axes` empty means all axes; negative axes count from the end.
#pragma once

#include <vector>

#include "kiln/graph.h"

namespace kiln {

using Axes = std::vector<int64_t>;

Tensor sum(const Tensor& x, const Axes& axes = {}, bool keepdims = false);
Tensor mean(const Tensor& x, const Axes& axes = {}, bool keepdims = false);
Tensor max(const Tensor& x, const Axes& axes = {}, bool keepdims = false);
Tensor min(const Tensor& x, const Axes& axes = {}, bool keepdims = false);
Tensor prod(const Tensor& x, const Axes& axes = {}, bool keepdims = false);
Tensor logsumexp(const Tensor& x, const Axes& axes = {}, bool keepdims = false);
/// Variance with `correction` subtracted from the count (0: population, 1: sample).
Tensor variance(const Tensor& x, const Axes& axes = {}, bool keepdims = false,
                int64_t correction = 0);
Tensor norm_l1(const Tensor& x, const Axes& axes = {}, bool keepdims = false);
Tensor norm_l2(const Tensor& x, const Axes& axes = {}, bool keepdims = false);
/// Index (i64) of the first maximum / minimum along `axis`.
Tensor argmax(const Tensor& x, int64_t axis, bool keepdims = false);
Tensor argmin(const Tensor& x, int64_t axis, bool keepdims = false);
Tensor cumsum(const Tensor& x, int64_t axis, bool exclusive = false, bool reverse = false);

}  // namespace kiln
