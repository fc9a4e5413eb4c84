// Gradients and optimizers.
#include "common.h"

namespace kiln::py {

namespace {
optim::Rate rate(nb::handle lr) {
  if (nb::isinstance<Tensor>(lr)) return optim::Rate(nb::cast<Tensor>(lr));
  return optim::Rate(nb::cast<double>(lr));
}
using Ts = std::vector<Tensor>;
}  // namespace

void bind_train(nb::module_& m) {
  m.def(
      "gradients",
      [](const Tensor& y, const Ts& xs, const std::optional<Tensor>& grad_y) {
        return tensor_list(grad_y ? gradients(y, xs, *grad_y) : gradients(y, xs), nb::cast(y));
      },
      nb::arg("y"), nb::arg("xs"), nb::arg("grad_y") = nb::none(),
      "d(sum(y * grad_y))/dx for each x in xs, as tensors of the same graph (grad_y: ones).");
  m.def(
      "sum_to_shape", [](const Tensor& g, nb::handle s) { return sum_to_shape(g, to_shape(s)); },
      nb::arg("g"), nb::arg("shape"), nb::keep_alive<0, 1>());
  m.def("zeros_like", &zeros_like, nb::arg("x"), nb::keep_alive<0, 1>());
  m.def("ones_like", &ones_like, nb::arg("x"), nb::keep_alive<0, 1>());

  nb::module_ o = m.def_submodule("optim", "Optimizers: each returns the assign ops of one step.");
  o.def(
      "sgd",
      [](Graph& g, const Ts& vars, const Ts& grads, nb::handle lr, double momentum, bool nesterov,
         double weight_decay) {
        optim::SgdOptions opts;
        opts.lr = rate(lr);
        opts.momentum = momentum;
        opts.nesterov = nesterov;
        opts.weight_decay = weight_decay;
        return tensor_list(optim::sgd(g, vars, grads, opts), nb::find(g));
      },
      nb::arg("graph"), nb::arg("variables"), nb::arg("grads"), nb::arg("lr") = 0.01,
      nb::arg("momentum") = 0.0, nb::arg("nesterov") = false, nb::arg("weight_decay") = 0.0,
      "SGD with optional (Nesterov) momentum; lr is a number or a 0-d float tensor.");
  auto adam_like = [&o](const char* name, auto fn, const char* doc) {
    o.def(
        name,
        [fn](Graph& g, const Ts& vars, const Ts& grads, nb::handle lr, double beta1, double beta2,
             double eps, double weight_decay) {
          optim::AdamOptions opts;
          opts.lr = rate(lr);
          opts.beta1 = beta1;
          opts.beta2 = beta2;
          opts.eps = eps;
          opts.weight_decay = weight_decay;
          return tensor_list(fn(g, vars, grads, opts), nb::find(g));
        },
        nb::arg("graph"), nb::arg("variables"), nb::arg("grads"), nb::arg("lr") = 1e-3,
        nb::arg("beta1") = 0.9, nb::arg("beta2") = 0.999, nb::arg("eps") = 1e-8,
        nb::arg("weight_decay") = 0.0, doc);
  };
  adam_like("adam", &optim::adam, "Adam (weight decay added to the gradient).");
  adam_like("adamw", &optim::adamw, "Adam with decoupled weight decay.");
  o.def(
      "rmsprop",
      [](Graph& g, const Ts& vars, const Ts& grads, nb::handle lr, double alpha, double eps,
         double momentum, double weight_decay) {
        optim::RmsPropOptions opts;
        opts.lr = rate(lr);
        opts.alpha = alpha;
        opts.eps = eps;
        opts.momentum = momentum;
        opts.weight_decay = weight_decay;
        return tensor_list(optim::rmsprop(g, vars, grads, opts), nb::find(g));
      },
      nb::arg("graph"), nb::arg("variables"), nb::arg("grads"), nb::arg("lr") = 0.01,
      nb::arg("alpha") = 0.99, nb::arg("eps") = 1e-8, nb::arg("momentum") = 0.0,
      nb::arg("weight_decay") = 0.0);
  o.def(
      "apply_if",
      [](const Tensor& cond, const Ts& updates) {
        return tensor_list(optim::apply_if(cond, updates), nb::cast(cond));
      },
      nb::arg("condition"), nb::arg("updates"),
      "Copies of the step's assigns that apply only when the 0-d bool condition is true.");
  nb::class_<optim::LossScaled>(o, "LossScaled")
      .def_ro("updates", &optim::LossScaled::updates)
      .def_ro("scale", &optim::LossScaled::scale)
      .def_ro("good_steps", &optim::LossScaled::good_steps)
      .def_ro("finite", &optim::LossScaled::finite)
      .def_ro("grads", &optim::LossScaled::grads);
  o.def(
      "scale_loss_and_step",
      [](Graph& g, const Tensor& loss, const Ts& vars, nb::object step, double initial,
         double growth, int64_t growth_interval, double backoff) {
        optim::LossScaleOptions opts;
        opts.initial = initial;
        opts.growth = growth;
        opts.growth_interval = growth_interval;
        opts.backoff = backoff;
        auto builder = [&step](Graph& gr, const Ts& vs, const Ts& gs) {
          return nb::cast<Ts>(step(nb::cast(&gr, nb::rv_policy::reference), vs, gs));
        };
        return optim::scale_loss_and_step(g, loss, vars, builder, opts);
      },
      nb::arg("graph"), nb::arg("loss"), nb::arg("variables"), nb::arg("step"),
      nb::arg("initial") = 65536.0, nb::arg("growth") = 2.0, nb::arg("growth_interval") = 2000,
      nb::arg("backoff") = 0.5, nb::keep_alive<0, 1>(),
      "Dynamic loss scaling: step(graph, variables, grads) builds the optimizer step.");
}

}  // namespace kiln::py
