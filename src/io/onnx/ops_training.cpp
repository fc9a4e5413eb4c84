// ONNX's ai.onnx.preview.training optimizers, version 1: one update step of Adagrad, Adam and
// Momentum (standard or Nesterov) over each group of tensors, written with kiln's elementwise
// ops as ONNX's reference computes them (its formulas in the comments). R, the learning rate, and
// T, the step count, are scalars known at import or at run time; then come n tensors X, n
// gradients G and n of each state (Adagrad H; Momentum V; Adam V and H); the outputs are the n
// new X and then the new states, in the inputs' order.
#include "io/onnx/map_util.h"

namespace kiln::onnx::detail {

namespace {

// The group count n of a node with R, T and `lists` lists of n tensors each.
int groups(NodeContext& c, int lists) {
  const int n = c.num_inputs() - 2;
  if (n <= 0 || n % lists != 0)
    c.fail(fmt::format("takes R, T and {} lists of tensors of one length, got {} inputs", lists,
                       c.num_inputs()));
  return n / lists;
}

// norm_coefficient * X + G: the gradient with its L2 regularization term
Tensor regularized(const Tensor& x, const Tensor& g, double norm) {
  return add(mul(scalar_of(x, norm), x), cast(g, x.dtype()));
}

// T > 0, as a bool scalar
Tensor after_first_step(NodeContext& c) {
  const Tensor t = cast(c.input(1), f32);
  return greater(t, scalar_of(t, 0));
}

// Adagrad: r = R / (1 + T decay_factor); H' = H + g^2; X' = X - r g / (sqrt(H') + epsilon).
Outs adagrad(NodeContext& c) {
  const int n = groups(c, 3);
  const double decay = c.attr_float("decay_factor", 0), eps = c.attr_float("epsilon", 0),
               norm = c.attr_float("norm_coefficient", 0);
  Outs xs, hs;
  for (int i = 0; i < n; ++i) {
    const Tensor x = c.input(2 + i), h = c.input(2 + 2 * n + i);
    const Tensor t = cast(c.input(1), x.dtype()), r = cast(c.input(0), x.dtype());
    const Tensor rate = div(r, add(scalar_of(x, 1), mul(t, scalar_of(x, decay))));
    const Tensor g = regularized(x, c.input(2 + n + i), norm);
    const Tensor h_new = add(cast(h, x.dtype()), mul(g, g));
    xs.push_back(sub(x, div(mul(rate, g), add(sqrt(h_new), scalar_of(x, eps)))));
    hs.push_back(cast(h_new, h.dtype()));
  }
  xs.insert(xs.end(), hs.begin(), hs.end());
  return xs;
}

// Momentum: beta' = beta after the first step, else 1; V' = alpha V + beta' g; standard
// X' = X - R V', nesterov X' = X - R (g + alpha V').
Outs momentum(NodeContext& c) {
  const int n = groups(c, 3);
  const double alpha = c.attr_float("alpha", 0), beta = c.attr_float("beta", 0),
               norm = c.attr_float("norm_coefficient", 0);
  const std::string mode = c.attr_string("mode", "standard");
  if (mode != "standard" && mode != "nesterov")
    c.fail(fmt::format("mode must be \"standard\" or \"nesterov\", got \"{}\"", mode));
  const Tensor later = after_first_step(c);
  Outs xs, vs;
  for (int i = 0; i < n; ++i) {
    const Tensor x = c.input(2 + i), v = c.input(2 + 2 * n + i);
    const Tensor r = cast(c.input(0), x.dtype());
    const Tensor g = regularized(x, c.input(2 + n + i), norm);
    const Tensor b = where(later, scalar_of(x, beta), scalar_of(x, 1));
    const Tensor v_new = add(mul(scalar_of(x, alpha), cast(v, x.dtype())), mul(b, g));
    const Tensor step = mode == "standard" ? v_new : add(g, mul(scalar_of(x, alpha), v_new));
    xs.push_back(sub(x, mul(r, step)));
    vs.push_back(cast(v_new, v.dtype()));
  }
  xs.insert(xs.end(), vs.begin(), vs.end());
  return xs;
}

// Adam: V' = alpha V + (1 - alpha) g; H' = beta H + (1 - beta) g^2; after the first step
// r = R sqrt(1 - beta^T) / (1 - alpha^T), else R; X' = (1 - norm_coefficient_post)
// (X - r V' / (sqrt(H') + epsilon)).
Outs adam(NodeContext& c) {
  const int n = groups(c, 4);
  const double alpha = c.attr_float("alpha", 0.9f), beta = c.attr_float("beta", 0.999f),
               eps = c.attr_float("epsilon", 0), norm = c.attr_float("norm_coefficient", 0),
               post = c.attr_float("norm_coefficient_post", 0);
  const Tensor later = after_first_step(c);
  Outs xs, vs, hs;
  for (int i = 0; i < n; ++i) {
    const Tensor x = c.input(2 + i), v = c.input(2 + 2 * n + i), h = c.input(2 + 3 * n + i);
    const Tensor t = cast(c.input(1), x.dtype()), r = cast(c.input(0), x.dtype());
    const Tensor g = regularized(x, c.input(2 + n + i), norm);
    const Tensor one = scalar_of(x, 1);
    const Tensor v_new =
        add(mul(scalar_of(x, alpha), cast(v, x.dtype())), mul(scalar_of(x, 1 - alpha), g));
    const Tensor h_new =
        add(mul(scalar_of(x, beta), cast(h, x.dtype())), mul(scalar_of(x, 1 - beta), mul(g, g)));
    const Tensor corrected = div(mul(r, sqrt(sub(one, pow(scalar_of(x, beta), t)))),
                                 sub(one, pow(scalar_of(x, alpha), t)));
    const Tensor rate = where(later, corrected, r);
    const Tensor x_new = sub(x, mul(rate, div(v_new, add(sqrt(h_new), scalar_of(x, eps)))));
    xs.push_back(mul(scalar_of(x, 1 - post), x_new));
    vs.push_back(cast(v_new, v.dtype()));
    hs.push_back(cast(h_new, h.dtype()));
  }
  xs.insert(xs.end(), vs.begin(), vs.end());
  xs.insert(xs.end(), hs.begin(), hs.end());
  return xs;
}

}  // namespace

void add_training_ops(std::vector<OpEntry>& t) {
  t.insert(t.end(), {
                        {"ai.onnx.preview.training.Adagrad", 1, adagrad},
                        {"ai.onnx.preview.training.Adam", 1, adam},
                        {"ai.onnx.preview.training.Momentum", 1, momentum},
                    });
}

}  // namespace kiln::onnx::detail
