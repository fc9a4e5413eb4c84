// Finite-difference gradient checks: central differences in float64 against kiln::gradients.
#pragma once

#include <functional>
#include <vector>

#include "support/reference.h"

namespace kiln::test {

struct GradCheckOptions {
  double eps = 1e-6;
  double atol = 1e-5;
  double rtol = 1e-3;
  /// Inputs to differentiate (empty: every float input).
  std::vector<int> wrt;
};

using GradFn = std::function<std::vector<Tensor>(Graph&, const std::vector<Tensor>&)>;

/// Builds f on placeholders shaped like `inputs`, reduces its float outputs to a scalar
/// L = sum_k sum(out_k * w_k) with fresh random weights w_k (so every output element counts
/// differently), and checks dL/dx from kiln::gradients against central differences of L.
void check_gradients(const GradFn& f, const std::vector<Array>& inputs,
                     const GradCheckOptions& opts = {});
/// Single-output shorthand.
void check_gradients(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                     const std::vector<Array>& inputs, const GradCheckOptions& opts = {});

}  // namespace kiln::test
