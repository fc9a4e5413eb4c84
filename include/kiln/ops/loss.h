// Losses.
#pragma once

#include "kiln/graph.h"

namespace kiln {

enum class Reduction { none, mean, sum };

/// Cross entropy of softmax(logits) along `axis` with labels that are either class indices
/// (integer tensor of logits' shape without `axis`) or probabilities (float, logits' shape).
Tensor softmax_cross_entropy(const Tensor& logits, const Tensor& labels,
                             Reduction reduction = Reduction::mean, int64_t axis = -1);
/// Negative log likelihood of log-probabilities (N, C, ...) at integer targets (N, ...);
/// targets equal to ignore_index add nothing and do not count towards the mean.
Tensor nll(const Tensor& log_probs, const Tensor& target, Reduction reduction = Reduction::mean,
           int64_t ignore_index = -100);
/// Mean squared error; a and b broadcast.
Tensor mse(const Tensor& a, const Tensor& b, Reduction reduction = Reduction::mean);

}  // namespace kiln
