// Ops of the loss family. Losses take float inputs and give their dtype; with reduction "mean"
// or "sum" the output is a scalar, with "none" one loss per position.
//   softmax_cross_entropy: axis (resolved), reduction; inputs logits, labels where labels are
//     class indices (i32/i64, logits' shape without axis) or probabilities (logits' dtype/shape)
//   nll: reduction, ignore_index; inputs log_probs (N, C, d...) or (C), target (N, d...) or ()
//   mse: reduction; inputs a, b of one dtype that broadcast
#include "kiln/ops/loss.h"

#include "ops/common.h"

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

}  // namespace

void register_loss_ops() {
  define_op(OpId::SoftmaxCrossEntropy).set_infer(infer_softmax_cross_entropy);
  define_op(OpId::Nll).set_infer(infer_nll);
  define_op(OpId::Mse).set_infer(infer_mse);
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
