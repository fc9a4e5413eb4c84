// Optimizers as graph builders: each returns the assign ops of one training step, to pass to
// Graph::compile as updates. Formulas follow PyTorch's optimizers of the same names.
#pragma once

#include <optional>
#include <vector>

#include "kiln/graph.h"

namespace kiln::optim {

/// A learning rate: a fixed number, or a 0-d float tensor (placeholder or variable) read on every
/// run, so schedules need no recompilation.
class Rate {
 public:
  Rate(double value) : value_(value) {}
  Rate(const Tensor& t) : tensor_(t) {}
  /// The rate as a scalar tensor of `dtype` on `g`.
  Tensor as_tensor(Graph& g, DType dtype) const;

 private:
  double value_ = 0;
  std::optional<Tensor> tensor_;
};

struct SgdOptions {
  Rate lr = 0.01;
  double momentum = 0;
  bool nesterov = false;
  double weight_decay = 0;  // added to the gradient (L2)
};
/// Stochastic gradient descent with optional (Nesterov) momentum.
std::vector<Tensor> sgd(Graph& g, const std::vector<Tensor>& variables,
                        const std::vector<Tensor>& grads, const SgdOptions& opts = {});

struct AdamOptions {
  Rate lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double weight_decay = 0;  // Adam: added to the gradient; AdamW: decoupled
};
std::vector<Tensor> adam(Graph& g, const std::vector<Tensor>& variables,
                         const std::vector<Tensor>& grads, const AdamOptions& opts = {});
/// Adam with decoupled weight decay (the weights shrink by lr * weight_decay each step).
std::vector<Tensor> adamw(Graph& g, const std::vector<Tensor>& variables,
                          const std::vector<Tensor>& grads, const AdamOptions& opts = {});

struct RmsPropOptions {
  Rate lr = 0.01;
  double alpha = 0.99, eps = 1e-8;
  double momentum = 0;
  double weight_decay = 0;
};
std::vector<Tensor> rmsprop(Graph& g, const std::vector<Tensor>& variables,
                            const std::vector<Tensor>& grads, const RmsPropOptions& opts = {});

}  // namespace kiln::optim
