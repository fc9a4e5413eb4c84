// Optimizers as graph builders: each returns the assign ops of one training step, to pass to
// Graph::compile as updates. Formulas follow PyTorch's optimizers of the same names.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
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

/// Conditional copies of the assign ops `updates` (an optimizer step), to compile instead of them:
/// each assigns where(condition, new value, current value), so when the 0-d bool `condition` is
/// false at run time every variable they update, optimizer state included, keeps its value.
/// Throws ValueError for a tensor that is not an assign.
std::vector<Tensor> apply_if(const Tensor& condition, const std::vector<Tensor>& updates);

/// Dynamic loss scaling for f16 training (PyTorch's GradScaler). The loss is multiplied by a
/// scale before differentiation so small f16 gradients do not flush to zero; the gradients are
/// divided by it again before the optimizer sees them.
struct LossScaleOptions {
  double initial = 65536;
  double growth = 2;                // the scale grows by this factor ...
  int64_t growth_interval = 2000;   // ... after this many finite steps in a row
  double backoff = 0.5;             // the scale shrinks by this factor on a non-finite step
  std::string name = "loss_scale";  // names of the scale variable and its counter
};

/// Builds an optimizer step from variables and their (unscaled) gradients, e.g.
/// `[](Graph& g, auto& vs, auto& gs) { return optim::adam(g, vs, gs); }`.
using StepBuilder = std::function<std::vector<Tensor>(Graph&, const std::vector<Tensor>& variables,
                                                      const std::vector<Tensor>& grads)>;

struct LossScaled {
  /// The gated optimizer step and the scale updates: pass them to compile as updates.
  std::vector<Tensor> updates;
  /// The current scale (0-d f32 variable) and the count of finite steps since it last changed
  /// (0-d i64 variable).
  Tensor scale, good_steps;
  /// 0-d bool: whether this run's gradients were all finite, i.e. whether the step was applied.
  Tensor finite;
  /// The unscaled gradients, one per variable.
  std::vector<Tensor> grads;
};

/// Differentiates loss * scale with respect to `variables`, unscales the gradients, and applies
/// the step that `step` builds only when every gradient is finite (no inf or nan). The scale
/// shrinks by `backoff` on a skipped step and grows by `growth` after `growth_interval` applied
/// steps in a row. Works with every optimizer of this header.
LossScaled scale_loss_and_step(Graph& g, const Tensor& loss, const std::vector<Tensor>& variables,
                               const StepBuilder& step, const LossScaleOptions& opts = {});

}  // namespace kiln::optim
