#include "support/gradcheck.h"

#include <cmath>

namespace kiln::test {

void check_gradients(const GradFn& f, const std::vector<Array>& inputs,
                     const GradCheckOptions& opts) {
  Graph g;
  std::vector<Tensor> xs;
  for (size_t i = 0; i < inputs.size(); ++i)
    xs.push_back(g.placeholder(inputs[i].shape(), inputs[i].dtype(), "x" + std::to_string(i)));
  std::vector<Tensor> outs = f(g, xs);
  std::optional<Tensor> loss;
  for (auto& o : outs) {
    if (!is_floating(o.dtype())) continue;
    Tensor w = g.constant(random_array(o.shape(), o.dtype(), -1, 1));
    Tensor term = sum(o * w);
    loss = loss ? *loss + term : term;
  }
  ASSERT_TRUE(loss.has_value()) << "no float output to differentiate";
  std::vector<int> wrt = opts.wrt;
  if (wrt.empty())
    for (size_t i = 0; i < inputs.size(); ++i)
      if (is_floating(inputs[i].dtype())) wrt.push_back(static_cast<int>(i));
  std::vector<Tensor> targets;
  for (int i : wrt) targets.push_back(xs[i]);
  std::vector<Tensor> grads = gradients(*loss, targets);

  Feeds feeds;
  for (size_t i = 0; i < inputs.size(); ++i) feeds.emplace_back(xs[i], inputs[i]);
  Executable exe_grad = g.compile(Device::cpu(), {}, grads);
  Executable exe_loss = g.compile(Device::cpu(), {}, {*loss});
  std::vector<Array> analytic = exe_grad.run(feeds);

  for (size_t k = 0; k < wrt.size(); ++k) {
    const int i = wrt[k];
    ASSERT_EQ(to_string(analytic[k].shape()), to_string(inputs[i].shape()));
    const std::vector<double> got = to_f64(analytic[k]);
    Array x = inputs[i].copy();
    Feeds fd = feeds;
    fd[i].second = x;
    int bad = 0;
    for (int64_t j = 0; j < x.numel(); ++j) {
      std::vector<double> v = to_f64(inputs[i]);
      const double x0 = v[j];
      auto loss_at = [&](double xv) {
        v[j] = xv;
        Array a = Array::from_vector(v, x.shape()).astype(x.dtype());
        fd[i].second = a;
        return to_f64(exe_loss.run(fd)[0])[0];
      };
      const double up = loss_at(x0 + opts.eps), down = loss_at(x0 - opts.eps);
      const double numeric = (up - down) / (2 * opts.eps);
      auto close = [&](double d, double extra) {  // (NaN against NaN passes, as it always has)
        return !(std::fabs(got[j] - d) > opts.atol + opts.rtol * std::fabs(d) + extra);
      };
      if (close(numeric, 0)) continue;
      // A kink within eps of x0 (a clip, relu or max changing sides) makes the central difference
      // a blend of the slopes on its two sides. There, accept the slope of either side, each
      // measured beyond the kink (over [x0 + eps, x0 + 2 eps] and [x0 - 2 eps, x0 - eps]) when
      // the two differ by more than what the offset of 1.5 eps can change a smooth slope by.
      const double right = (loss_at(x0 + 2 * opts.eps) - up) / opts.eps;
      const double left = (down - loss_at(x0 - 2 * opts.eps)) / opts.eps;
      const double slack = 4 * opts.eps * (1 + std::fabs(right) + std::fabs(left));
      const bool kink =
          std::fabs(right - left) > 2 * (opts.atol + opts.rtol * std::fabs(numeric) + slack);
      if (kink && (close(right, slack) || close(left, slack))) continue;
      if (bad++ < 5)
        ADD_FAILURE() << "input " << i << " element " << j << ": autodiff " << got[j]
                      << ", finite differences " << numeric << " (seed " << seed() << ")";
    }
    EXPECT_EQ(bad, 0) << bad << " gradient elements of input " << i << " differ";
  }
}

void check_gradients(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                     const std::vector<Array>& inputs, const GradCheckOptions& opts) {
  check_gradients([&](Graph&, const std::vector<Tensor>& xs) { return std::vector<Tensor>{f(xs)}; },
                  inputs, opts);
}

}  // namespace kiln::test
