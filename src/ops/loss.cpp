// Ops of the loss family. Losses take float inputs and give their dtype; with reduction "mean"
// or "sum" the output is a scalar, with "none" one loss per position.
//   softmax_cross_entropy: axis (resolved), reduction; inputs logits, labels where labels are
//     class indices (i32/i64, logits' shape without axis) or probabilities (logits' dtype/shape)
//   nll: reduction, ignore_index; inputs log_probs (N, C, d...) or (C), target (N, d...) or ()
//   mse: reduction; inputs a, b of one dtype that broadcast
#include "kiln/ops/loss.h"

#include "kiln/autodiff.h"
#include "kiln/ops/core.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/norm.h"
#include "kiln/ops/reduce.h"
#include "kiln/ops/transform.h"
#include "ops/common.h"
#include "ops/loss_params.h"
#include "ops/shape_values.h"

namespace kiln {

using namespace ops;

namespace {

constexpr DTypeSet kLabelIndexTypes{i32, i64};

const char* reduction_name(Reduction r) {
  switch (r) {
    case Reduction::none:
      return "none";
    case Reduction::mean:
      return "mean";
    case Reduction::sum:
      return "sum";
  }
  fail<ValueError>("[loss] unknown reduction {}", static_cast<int>(r));
}

// The output of a loss whose per-position losses have `shape`.
std::vector<TensorInfo> reduced(const InferContext& ctx, Shape shape) {
  const std::string& r = ctx.attrs.str("reduction");
  if (r != "none" && r != "mean" && r != "sum")
    fail<ValueError>("[{}] unknown reduction '{}'", ctx.name(), r);
  return {{r == "none" ? std::move(shape) : Shape{}, ctx.inputs[0].dtype}};
}

Shape without_axis(const Shape& s, int64_t axis) {
  Shape r = s;
  r.erase(r.begin() + axis);
  return r;
}

// Labels (or targets) must have shape `want` (dynamic dims match anything).
void check_labels(const InferContext& ctx, const Shape& want, const char* what) {
  const TensorInfo &x = ctx.inputs[0], &t = ctx.inputs[1];
  if (!shapes_match(t.shape, want))
    fail<ShapeError>("[{}] {} have shape {}; expected {} for input of shape {}", ctx.name(), what,
                     str(t.shape), str(want), str(x.shape));
}

std::vector<TensorInfo> infer_softmax_cross_entropy(const InferContext& ctx) {
  require_dtype(ctx, 0, kFloatTypes, "a float dtype");
  require_rank(ctx, 0, 1, 64);
  const Shape& x = ctx.inputs[0].shape;
  const int64_t axis = ctx.attrs.i("axis");
  if (axis < 0 || axis >= static_cast<int64_t>(x.size()))
    fail<ValueError>("[{}] axis {} is out of range for shape {}", ctx.name(), axis, str(x));
  const DType lt = ctx.inputs[1].dtype;
  if (kLabelIndexTypes.has(lt)) {
    check_labels(ctx, without_axis(x, axis), "index labels");
  } else if (lt == ctx.inputs[0].dtype) {
    check_labels(ctx, x, "probability labels");
  } else {
    fail<DTypeError>(
        "[{}] labels have dtype {}; expected i32/i64 class indices or {} "
        "probabilities like the logits of shape {}",
        ctx.name(), name(lt), name(ctx.inputs[0].dtype), str(x));
  }
  return reduced(ctx, without_axis(x, axis));
}

// The class axis of nll: 1, or 0 for a single (C) row.
int64_t nll_class_axis(const Shape& s) { return s.size() == 1 ? 0 : 1; }

std::vector<TensorInfo> infer_nll(const InferContext& ctx) {
  require_dtype(ctx, 0, kFloatTypes, "a float dtype");
  require_dtype(ctx, 1, kLabelIndexTypes, "i32 or i64 class indices");
  require_rank(ctx, 0, 1, 64);
  const Shape& x = ctx.inputs[0].shape;
  const Shape want = without_axis(x, nll_class_axis(x));
  check_labels(ctx, want, "targets");
  return reduced(ctx, want);
}

std::vector<TensorInfo> infer_mse(const InferContext& ctx) {
  if (ctx.inputs[0].dtype != ctx.inputs[1].dtype)
    fail<DTypeError>("[{}] inputs have dtypes {} and {}", ctx.name(), name(ctx.inputs[0].dtype),
                     name(ctx.inputs[1].dtype));
  require_dtype(ctx, 0, kFloatTypes, "a float dtype");
  return reduced(ctx, broadcast_infer(ctx));
}

void require_float(const char* op, const Tensor& t, const char* what) {
  if (!is_floating(t.dtype()))
    fail<DTypeError>("[{}] {} has dtype {} (shape {}); expected a float dtype", op, what,
                     name(t.dtype()), str(t.shape()));
}

// ---- gradient rules (written with kiln ops) ----

using Grads = std::vector<std::optional<Tensor>>;

// The incoming gradient of each position's loss, broadcastable against the input: g with a
// size-1 class axis (if any) for "none", else the scalar g, divided by count() for "mean".
template <typename Count>
Tensor position_grad(const VjpContext& c, std::optional<int64_t> class_axis, Count&& count) {
  const Tensor& g = *c.cotangents[0];
  const std::string& r = c.attrs.str("reduction");
  if (r == "none") return class_axis ? expand_dims(g, {*class_axis}) : g;
  return r == "mean" ? g / count() : g;
}

// A "mean" divides by the number of positions: `like` has one element per position, times its
// size along `class_axis` when given. With dynamic dims, a count computed from its shape, which
// folds to a constant once shapes are specialized.
Tensor position_count(const VjpContext& c, const Tensor& like,
                      std::optional<int64_t> class_axis = std::nullopt) {
  const Shape s = like.shape();
  const int64_t per = class_axis ? s[*class_axis] : 1;
  if (is_static(s)) return scalar_like(c.inputs[0], static_cast<double>(numel(s) / per));
  if (per >= 0) return sum(ones_like(like)) / static_cast<double>(per);
  return cast_to(prod(shape_of(like)) / size_value(like, *class_axis), c.inputs[0].dtype());
}

// One-hot rows of `labels` over x's classes along `axis` (their number read from x's shape when
// it is known only when run).
Tensor class_one_hot(const Tensor& labels, const Tensor& x, int64_t axis) {
  if (x.shape()[axis] >= 0) return one_hot(labels, x.shape()[axis], axis, x.dtype());
  return one_hot(labels, size_value(x, axis), axis, x.dtype());
}

// Index labels: g * (softmax - one_hot). Probability labels p (need not sum to one): the loss
// is -sum_k p_k * log_softmax_k, so dlogits = g * (softmax * sum_k p_k - p), dp = -g * log_softmax.
Grads vjp_softmax_cross_entropy(const VjpContext& c) {
  const Tensor &x = c.inputs[0], &labels = c.inputs[1];
  const int64_t axis = c.attrs.i("axis");
  if (is_floating(labels.dtype())) {
    const Tensor g = position_grad(c, axis, [&] { return position_count(c, x, axis); });
    return {g * (softmax(x, axis) * sum(labels, {axis}, true) - labels), -g * log_softmax(x, axis)};
  }
  const Tensor p = class_one_hot(labels, x, axis);
  // every in-range label has one 1, so sum(p) counts the positions, also for a dynamic batch
  const Tensor g = position_grad(c, axis, [&] { return sum(p); });
  return {g * (softmax(x, axis) - p), std::nullopt};
}

// -g at each counted position's target class; ignored positions (which may name a class) get 0.
Grads vjp_nll(const VjpContext& c) {
  const Tensor &x = c.inputs[0], &target = c.inputs[1];
  const int64_t axis = nll_class_axis(x.shape());
  const Tensor counted =
      cast(not_equal(target, scalar_like(target, static_cast<double>(c.attrs.i("ignore_index")))),
           x.dtype());
  const Tensor g = position_grad(c, axis, [&] { return sum(counted); });
  const Tensor pick = class_one_hot(target, x, axis) * expand_dims(counted, {axis});
  return {-g * pick, std::nullopt};
}

// d/da (a - b)^2 = 2 (a - b); broadcasting is undone with sum_to_shape.
Grads vjp_mse(const VjpContext& c) {
  const Tensor &a = c.inputs[0], &b = c.inputs[1];
  const Tensor d = a - b;
  const Tensor g = position_grad(c, std::nullopt, [&] { return position_count(c, d); });
  const Tensor ga = g * d * 2.0;
  return {sum_to_shape_of(ga, a), sum_to_shape_of(-ga, b)};
}

}  // namespace

void register_loss_ops() {
  define_op(OpId::SoftmaxCrossEntropy)
      .set_infer(infer_softmax_cross_entropy)
      .inputs(2)
      .params<LossParams>();
  define_op(OpId::Nll).set_infer(infer_nll).inputs(2).params<LossParams>();
  define_op(OpId::Mse).set_infer(infer_mse).inputs(2).params<LossParams>();

  define_op(OpId::SoftmaxCrossEntropy).grad(vjp_softmax_cross_entropy);
  define_op(OpId::Nll).grad(vjp_nll);
  define_op(OpId::Mse).grad(vjp_mse);
}

Tensor softmax_cross_entropy(const Tensor& logits, const Tensor& labels, Reduction reduction,
                             int64_t axis) {
  require_float("softmax_cross_entropy", logits, "logits");
  const int64_t a = resolve_axis("softmax_cross_entropy", axis, logits.shape());
  // probabilities follow the logits' dtype; indices stay integers
  const Tensor l = is_floating(labels.dtype()) ? cast_to(labels, logits.dtype()) : labels;
  return make_node1(OpId::SoftmaxCrossEntropy, {logits, l},
                    {{"axis", a}, {"reduction", std::string(reduction_name(reduction))}});
}

Tensor nll(const Tensor& log_probs, const Tensor& target, Reduction reduction,
           int64_t ignore_index) {
  require_float("nll", log_probs, "log_probs");
  return make_node1(
      OpId::Nll, {log_probs, target},
      {{"reduction", std::string(reduction_name(reduction))}, {"ignore_index", ignore_index}});
}

Tensor mse(const Tensor& a, const Tensor& b, Reduction reduction) {
  const DType t = promote(a.dtype(), b.dtype());
  if (!is_floating(t))
    fail<DTypeError>("[mse] inputs have dtypes {} and {} (shapes {} and {}); expected float",
                     name(a.dtype()), name(b.dtype()), str(a.shape()), str(b.shape()));
  return make_node1(OpId::Mse, {cast_to(a, t), cast_to(b, t)},
                    {{"reduction", std::string(reduction_name(reduction))}});
}

}  // namespace kiln
