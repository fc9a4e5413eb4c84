// SGD, Adam, AdamW, RMSProp as graph builders. Optimizer state lives in variables named after
// the variable they belong to ("w.momentum", "w.adam_m", ...), so checkpoints carry it.
#include "kiln/optim.h"

#include "core/errors.h"
#include "core/graph_impl.h"
#include "kiln/ops/core.h"
#include "kiln/ops/elementwise.h"

namespace kiln::optim {

namespace {
void check(const char* op, const std::vector<Tensor>& vars, const std::vector<Tensor>& grads) {
  if (vars.size() != grads.size())
    fail<ValueError>("[{}] {} variables but {} gradients", op, vars.size(), grads.size());
  for (size_t i = 0; i < vars.size(); ++i) {
    if (!vars[i].valid() || vars[i].graph_impl()->nodes[vars[i].node_id()].op != OpId::Variable)
      fail<ValueError>("[{}] input {} is not a variable", op, i);
    if (!is_floating(vars[i].dtype()))
      fail<DTypeError>("[{}] variable '{}' has dtype {}; optimizers update float variables", op,
                       vars[i].name(), name(vars[i].dtype()));
    if (grads[i].shape() != vars[i].shape())
      fail<ShapeError>("[{}] gradient of shape {} for variable '{}' of shape {}", op,
                       str(grads[i].shape()), vars[i].name(), str(vars[i].shape()));
  }
}

Tensor state(Graph& g, const Tensor& var, const char* suffix) {
  return g.variable(Array::zeros(var.shape(), var.dtype()), var.name() + "." + suffix);
}

Tensor with_l2(const Tensor& grad, const Tensor& w, double wd) {
  Tensor gr = grad.dtype() == w.dtype() ? grad : cast(grad, w.dtype());
  return wd != 0 ? gr + w * wd : gr;
}

std::vector<Tensor> adam_impl(const char* op, Graph& g, const std::vector<Tensor>& vars,
                              const std::vector<Tensor>& grads, const AdamOptions& o,
                              bool decoupled) {
  check(op, vars, grads);
  std::vector<Tensor> updates;
  if (vars.empty()) return updates;
  // one step counter per optimizer, in f64 so bias corrections stay exact for long runs
  Tensor step = g.variable(Array::zeros({}, f64), vars[0].name() + "." + op + "_step");
  Tensor t = step + 1.0;
  updates.push_back(assign(step, t));
  const Tensor bc1 = 1.0 - pow(g.scalar(o.beta1, f64), t);
  const Tensor bc2 = 1.0 - pow(g.scalar(o.beta2, f64), t);
  for (size_t i = 0; i < vars.size(); ++i) {
    const Tensor& w = vars[i];
    const DType dt = w.dtype();
    Tensor lr = o.lr.as_tensor(g, dt);
    Tensor gr = with_l2(grads[i], w, decoupled ? 0 : o.weight_decay);
    Tensor m = state(g, w, "adam_m"), v = state(g, w, "adam_v");
    Tensor m1 = m * o.beta1 + gr * (1 - o.beta1);
    Tensor v1 = v * o.beta2 + gr * gr * (1 - o.beta2);
    Tensor mhat = m1 / cast(bc1, dt), vhat = v1 / cast(bc2, dt);
    Tensor base = decoupled && o.weight_decay != 0 ? w - lr * o.weight_decay * w : w;
    updates.push_back(assign(m, m1));
    updates.push_back(assign(v, v1));
    updates.push_back(assign(w, base - lr * mhat / (sqrt(vhat) + o.eps)));
  }
  return updates;
}
}  // namespace

Tensor Rate::as_tensor(Graph& g, DType dtype) const {
  if (!tensor_) return g.scalar(value_, dtype);
  if (!tensor_->shape().empty())
    fail<ShapeError>("[optim] the learning rate must be 0-d, got shape {}", str(tensor_->shape()));
  return tensor_->dtype() == dtype ? *tensor_ : cast(*tensor_, dtype);
}

std::vector<Tensor> sgd(Graph& g, const std::vector<Tensor>& vars, const std::vector<Tensor>& grads,
                        const SgdOptions& o) {
  check("sgd", vars, grads);
  if (o.nesterov && o.momentum <= 0)
    fail<ValueError>("[sgd] nesterov needs a positive momentum (got {})", o.momentum);
  std::vector<Tensor> updates;
  for (size_t i = 0; i < vars.size(); ++i) {
    const Tensor& w = vars[i];
    Tensor gr = with_l2(grads[i], w, o.weight_decay);
    Tensor lr = o.lr.as_tensor(g, w.dtype());
    if (o.momentum != 0) {
      // a zero-initialized buffer makes the first step buf = g, as PyTorch's first step does
      Tensor buf = state(g, w, "momentum");
      Tensor b1 = buf * o.momentum + gr;
      updates.push_back(assign(buf, b1));
      gr = o.nesterov ? gr + b1 * o.momentum : b1;
    }
    updates.push_back(assign(w, w - lr * gr));
  }
  return updates;
}

std::vector<Tensor> adam(Graph& g, const std::vector<Tensor>& vars, const std::vector<Tensor>& grads,
                         const AdamOptions& o) {
  return adam_impl("adam", g, vars, grads, o, false);
}

std::vector<Tensor> adamw(Graph& g, const std::vector<Tensor>& vars,
                          const std::vector<Tensor>& grads, const AdamOptions& o) {
  return adam_impl("adamw", g, vars, grads, o, true);
}

std::vector<Tensor> rmsprop(Graph& g, const std::vector<Tensor>& vars,
                            const std::vector<Tensor>& grads, const RmsPropOptions& o) {
  check("rmsprop", vars, grads);
  std::vector<Tensor> updates;
  for (size_t i = 0; i < vars.size(); ++i) {
    const Tensor& w = vars[i];
    Tensor gr = with_l2(grads[i], w, o.weight_decay);
    Tensor lr = o.lr.as_tensor(g, w.dtype());
    Tensor sq = state(g, w, "rms_sq");
    Tensor sq1 = sq * o.alpha + gr * gr * (1 - o.alpha);
    updates.push_back(assign(sq, sq1));
    Tensor stepv = gr / (sqrt(sq1) + o.eps);
    if (o.momentum != 0) {
      Tensor buf = state(g, w, "rms_momentum");
      Tensor b1 = buf * o.momentum + stepv;
      updates.push_back(assign(buf, b1));
      stepv = b1;
    }
    updates.push_back(assign(w, w - lr * stepv));
  }
  return updates;
}

}  // namespace kiln::optim
