// Dynamic loss scaling (PyTorch's GradScaler as graph ops) and conditional optimizer steps. The
// scale and its counter are variables, so a compiled step needs no host round trip to decide.
#include "core/errors.h"
#include "core/graph_impl.h"
#include "kiln/autodiff.h"
#include "kiln/ops/core.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/reduce.h"
#include "kiln/optim.h"

namespace kiln::optim {

namespace {
// 0-d bool: no element of any of `xs` is inf or nan.
Tensor all_finite(const std::vector<Tensor>& xs) {
  std::optional<Tensor> bad;
  for (const Tensor& x : xs) {
    Tensor n = sum(cast(logical_or(isinf(x), isnan(x)), f32));
    bad = bad ? *bad + n : n;
  }
  return equal(*bad, scalar_like(*bad, 0));
}

void check_options(const Tensor& loss, const std::vector<Tensor>& vars, const LossScaleOptions& o) {
  if (!loss.valid() || !loss.shape().empty() || !is_floating(loss.dtype()))
    fail<ValueError>("[loss_scale] the loss must be a 0-d float tensor, got shape {} dtype {}",
                     str(loss.shape()), name(loss.dtype()));
  if (vars.empty()) fail<ValueError>("[loss_scale] no variables given");
  if (!(o.initial > 0) || !(o.growth >= 1) || !(o.backoff > 0 && o.backoff < 1) ||
      o.growth_interval < 1)
    fail<ValueError>(
        "[loss_scale] needs initial > 0, growth >= 1, 0 < backoff < 1 and "
        "growth_interval >= 1; got {}, {}, {}, {}",
        o.initial, o.growth, o.backoff, o.growth_interval);
}

// Assigns of the next scale and counter: back off on a skipped step, grow after a run of good ones.
std::vector<Tensor> update_scale(const LossScaled& s, const LossScaleOptions& o) {
  const Tensor next = s.good_steps + 1.0;
  const Tensor grow =
      greater_equal(next, scalar_like(next, static_cast<double>(o.growth_interval)));
  const Tensor zero = scalar_like(next, 0);
  const Tensor ok_scale = where(grow, s.scale * o.growth, s.scale);
  return {assign(s.scale, where(s.finite, ok_scale, s.scale * o.backoff)),
          assign(s.good_steps, where(s.finite, where(grow, zero, next), zero))};
}
}  // namespace

std::vector<Tensor> apply_if(const Tensor& condition, const std::vector<Tensor>& updates) {
  if (!condition.valid() || condition.dtype() != boolean || !condition.shape().empty())
    fail<ValueError>("[apply_if] the condition must be a 0-d bool tensor, got shape {} dtype {}",
                     str(condition.shape()), name(condition.dtype()));
  std::vector<Tensor> gated;
  for (size_t i = 0; i < updates.size(); ++i) {
    const Tensor& u = updates[i];
    if (!u.valid() || u.graph_impl()->nodes[u.node_id()].op != OpId::Assign)
      fail<ValueError>("[apply_if] update {} is {}, not an assign", i,
                       u.valid() ? u.op_name() : "empty");
    const auto& in = u.graph_impl()->nodes[u.node_id()].inputs;  // (variable, new value)
    const Tensor var(u.graph_impl(), in[0].node, in[0].index);
    const Tensor value(u.graph_impl(), in[1].node, in[1].index);
    gated.push_back(assign(var, where(condition, value, var)));
  }
  return gated;
}

LossScaled scale_loss_and_step(Graph& g, const Tensor& loss, const std::vector<Tensor>& vars,
                               const StepBuilder& step, const LossScaleOptions& o) {
  check_options(loss, vars, o);
  LossScaled s;
  s.scale = g.variable(Array::scalar(static_cast<float>(o.initial)), o.name);
  s.good_steps = g.variable(Array::zeros({}, i64), o.name + ".good_steps");
  const std::vector<Tensor> scaled = gradients(loss * cast(s.scale, loss.dtype()), vars);
  for (const Tensor& gr : scaled) s.grads.push_back(gr / cast(s.scale, gr.dtype()));
  s.finite = all_finite(s.grads);
  s.updates = apply_if(s.finite, step(g, vars, s.grads));
  for (const Tensor& u : update_scale(s, o)) s.updates.push_back(u);
  return s;
}

}  // namespace kiln::optim
