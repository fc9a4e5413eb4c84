// Ops of the norm family: softmax, normalization layers and dropout. Every op takes a float x
// (f16/bf16/f32/f64) and gives x's shape and dtype; parameters are cast to x's dtype in the
// builder. Inputs are x then the op's fixed parameters then the optional weight and bias.
//   softmax / log_softmax: axis (resolved; 0 for a scalar x)
//   layer_norm: begin_axis (resolved), eps, has_weight, has_bias; params of shape x[begin_axis:]
//   rms_norm: begin_axis (resolved), eps, has_weight
//   batch_norm: eps, has_weight, has_bias; inputs x, mean, var[, weight][, bias], params (C)
//   instance_norm: eps, has_weight, has_bias; params (C)
//   group_norm: groups, eps, has_weight, has_bias; params (C)
//   dropout: p in (0, 1), seed (uint64 bits in an int64); only built when training with p > 0
//   batch_norm_train: eps, has_weight, has_bias; inputs x[, weight][, bias]; outputs y, and the
//     batch's mean and biased var (C) in x's dtype
//   batch_norm_train_grad: eps, has_weight; inputs dy, x, mean, var[, weight]; outputs dx and
//     dweight, dbias (C), the last two always computed
//   Both training ops may carry channels_last (bool, set by the channels_last pass for CUDA; such
//     nodes run Layout::channels_last kernels): x, y, dy and dx are 4-D (N, H, W, C), the
//     parameters and statistics stay (C).
// The kernels read the attributes as SoftmaxParams, NormParams and DropoutParams.
#include "kiln/ops/norm.h"

#include "kiln/ops/core.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/reduce.h"
#include "kiln/ops/transform.h"
#include "ops/common.h"
#include "ops/norm_params.h"
#include "ops/shape_values.h"

namespace kiln {

using namespace ops;

namespace {

// Names of inputs 1.. : the op's fixed parameters, then the optional ones present.
std::vector<const char*> param_names(const InferContext& ctx, std::vector<const char*> fixed) {
  if (ctx.attrs.b("has_weight", false)) fixed.push_back("weight");
  if (ctx.attrs.b("has_bias", false)) fixed.push_back("bias");
  return fixed;
}

// Every parameter must have x's dtype and shape `want`.
void check_params(const InferContext& ctx, const std::vector<const char*>& names,
                  const Shape& want) {
  const TensorInfo& x = ctx.inputs[0];
  if (ctx.inputs.size() != names.size() + 1)
    fail<ValueError>("[{}] has {} inputs; its attributes ({}) call for {}", ctx.name(),
                     ctx.inputs.size(), ctx.attrs.to_string(), names.size() + 1);
  for (size_t i = 1; i < ctx.inputs.size(); ++i) {
    const TensorInfo& p = ctx.inputs[i];
    if (p.dtype != x.dtype)
      fail<DTypeError>("[{}] {} has dtype {} but x has dtype {}", ctx.name(), names[i - 1],
                       name(p.dtype), name(x.dtype));
    if (!shapes_match(p.shape, want))
      fail<ShapeError>("[{}] {} has shape {}; expected {} for x of shape {}", ctx.name(),
                       names[i - 1], str(p.shape), str(want), str(x.shape));
  }
}

void require_float_x(const InferContext& ctx) {
  require_dtype(ctx, 0, kFloatTypes, "a float dtype");
}

std::vector<TensorInfo> infer_softmax(const InferContext& ctx) {
  require_float_x(ctx);
  const Shape& x = ctx.inputs[0].shape;
  const int64_t axis = ctx.attrs.i("axis");
  if (!(x.empty() ? axis == 0 : axis >= 0 && axis < static_cast<int64_t>(x.size())))
    fail<ValueError>("[{}] axis {} is out of range for shape {}", ctx.name(), axis, str(x));
  return {ctx.inputs[0]};
}

// Layer and RMS norm: parameters have the shape of the normalized trailing dims.
std::vector<TensorInfo> infer_layer_norm(const InferContext& ctx) {
  require_float_x(ctx);
  const Shape& x = ctx.inputs[0].shape;
  const int64_t begin = ctx.attrs.i("begin_axis");
  if (begin < 0 || begin >= static_cast<int64_t>(x.size()))
    fail<ValueError>("[{}] begin_axis {} is out of range for shape {}", ctx.name(), begin, str(x));
  check_params(ctx, param_names(ctx, {}), Shape(x.begin() + begin, x.end()));
  return {ctx.inputs[0]};
}

// Ops over channel axis 1 with (C)-shaped parameters.
std::vector<TensorInfo> infer_channel_norm(const InferContext& ctx, int min_rank,
                                           std::vector<const char*> fixed) {
  require_float_x(ctx);
  require_rank(ctx, 0, min_rank, 64);
  check_params(ctx, param_names(ctx, std::move(fixed)), {ctx.inputs[0].shape[1]});
  return {ctx.inputs[0]};
}
std::vector<TensorInfo> infer_batch_norm(const InferContext& ctx) {
  return infer_channel_norm(ctx, 2, {"mean", "var"});
}
std::vector<TensorInfo> infer_instance_norm(const InferContext& ctx) {
  return infer_channel_norm(ctx, 3, {});
}
std::vector<TensorInfo> infer_group_norm(const InferContext& ctx) {
  auto out = infer_channel_norm(ctx, 2, {});
  const int64_t groups = ctx.attrs.i("groups"), c = ctx.inputs[0].shape[1];
  if (groups <= 0 || (c >= 0 && c % groups != 0))
    fail<ValueError>("[{}] {} groups do not divide the {} channels of x with shape {}", ctx.name(),
                     groups, c, str(ctx.inputs[0].shape));
  return out;
}

// Values per channel: every dim but 1 (-1 while any is unknown).
int64_t per_channel(const Shape& x) {
  int64_t m = 1;
  for (size_t i = 0; i < x.size(); ++i) {
    if (i == 1) continue;
    if (x[i] < 0) return -1;
    m *= x[i];
  }
  return m;
}

std::vector<TensorInfo> infer_batch_norm_train(const InferContext& ctx) {
  infer_channel_norm(ctx, 2, {});
  const TensorInfo& x = ctx.inputs[0];
  if (per_channel(x.shape) == 0)
    fail<ShapeError>("[{}] needs at least one value per channel, x has shape {}", ctx.name(),
                     str(x.shape));
  const TensorInfo stat{{x.shape[1]}, x.dtype};
  return {x, stat, stat};
}

// Inputs dy, x, mean, var[, weight]: dy has x's shape, the rest (C); all in x's dtype.
std::vector<TensorInfo> infer_batch_norm_train_grad(const InferContext& ctx) {
  require_dtype(ctx, 1, kFloatTypes, "a float dtype");
  require_rank(ctx, 1, 2, 64);
  const TensorInfo &dy = ctx.inputs[0], &x = ctx.inputs[1];
  if (dy.dtype != x.dtype || !shapes_match(dy.shape, x.shape))
    fail<ShapeError>("[{}] dy ({}, {}) must have the shape and dtype of x ({}, {})", ctx.name(),
                     str(dy.shape), name(dy.dtype), str(x.shape), name(x.dtype));
  std::vector<const char*> names{"mean", "var"};
  if (ctx.attrs.b("has_weight", false)) names.push_back("weight");
  if (ctx.inputs.size() != names.size() + 2)
    fail<ValueError>("[{}] has {} inputs; its attributes ({}) call for {}", ctx.name(),
                     ctx.inputs.size(), ctx.attrs.to_string(), names.size() + 2);
  const Shape want{x.shape[1]};
  for (size_t i = 2; i < ctx.inputs.size(); ++i) {
    const TensorInfo& p = ctx.inputs[i];
    if (p.dtype != x.dtype)
      fail<DTypeError>("[{}] {} has dtype {} but x has dtype {}", ctx.name(), names[i - 2],
                       name(p.dtype), name(x.dtype));
    if (!shapes_match(p.shape, want))
      fail<ShapeError>("[{}] {} has shape {}; expected {} for x of shape {}", ctx.name(),
                       names[i - 2], str(p.shape), str(want), str(x.shape));
  }
  const TensorInfo stat{want, x.dtype};
  return {x, stat, stat};
}

std::vector<TensorInfo> infer_dropout(const InferContext& ctx) {
  require_float_x(ctx);
  return {ctx.inputs[0]};
}

// Dtype checks the builder makes before it casts parameters to x's dtype.
void require_float(const char* op, const Tensor& t, const char* what) {
  if (!is_floating(t.dtype()))
    fail<DTypeError>("[{}] {} has dtype {} (shape {}); expected a float dtype", op, what,
                     name(t.dtype()), str(t.shape()));
}
Tensor param(const char* op, const Tensor& p, const Tensor& x, const char* what) {
  require_float(op, p, what);
  return cast_to(p, x.dtype());
}
std::optional<Tensor> param(const char* op, const std::optional<Tensor>& p, const Tensor& x,
                            const char* what) {
  if (!p) return std::nullopt;
  return param(op, *p, x, what);
}

// Builds a normalization node: x, fixed params (already cast), then optional weight and bias.
Tensor norm_node(OpId op, const Tensor& x, std::vector<Tensor> fixed,
                 const std::optional<Tensor>& weight, const std::optional<Tensor>& bias,
                 Attrs attrs) {
  const char* n = op_name(op);
  require_float(n, x, "x");
  std::vector<Tensor> inputs{x};
  inputs.insert(inputs.end(), fixed.begin(), fixed.end());
  add_optional(inputs, attrs, "weight", param(n, weight, x, "weight"));
  if (op != OpId::RmsNorm) add_optional(inputs, attrs, "bias", param(n, bias, x, "bias"));
  return make_node1(op, inputs, std::move(attrs));
}

Tensor softmax_like(OpId op, const Tensor& x, int64_t axis) {
  const char* n = op_name(op);
  require_float(n, x, "x");
  // a scalar is one row of one element
  const int64_t a =
      x.rank() == 0 && (axis == 0 || axis == -1) ? 0 : resolve_axis(n, axis, x.shape());
  return make_node1(op, {x}, {{"axis", a}});
}

// ---- gradient rules (written with kiln ops) ----

using Grads = std::vector<std::optional<Tensor>>;

Axes axis_range(int64_t begin, int64_t end) {
  Axes a;
  for (int64_t i = begin; i < end; ++i) a.push_back(i);
  return a;
}

// Sum along the softmax axis, kept; a scalar x is its own single-element row.
Tensor row_sum(const Tensor& t, int64_t axis) { return t.rank() == 0 ? t : sum(t, {axis}, true); }

Grads vjp_softmax(const VjpContext& c) {
  const Tensor &g = *c.cotangents[0], &y = c.outputs[0];
  return {y * (g - row_sum(g * y, c.attrs.i("axis")))};
}
Grads vjp_log_softmax(const VjpContext& c) {
  const Tensor &g = *c.cotangents[0], &y = c.outputs[0];
  return {g - exp(y) * row_sum(g, c.attrs.i("axis"))};
}

// x normalized over `axes`: xhat = (x - mean) * rstd, or x * rstd without centering (RMS).
// Recomputed rather than taken from the output, which would need a division by the weight.
struct Normalized {
  Tensor xhat, rstd;
};
Normalized normalize(const Tensor& x, const Axes& axes, double eps, bool center) {
  const Tensor xc = center ? x - mean(x, axes, true) : x;
  const Tensor rstd = rsqrt(mean(xc * xc, axes, true) + eps);
  return {xc * rstd, rstd};
}
// dx from dxhat: rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)), the mean term only
// when centered.
Tensor normalize_backward(const Tensor& dxhat, const Normalized& n, const Axes& axes, bool center) {
  Tensor r = dxhat - n.xhat * mean(dxhat * n.xhat, axes, true);
  if (center) r = r - mean(dxhat, axes, true);
  return n.rstd * r;
}

// How a norm's parameters meet x: `shape` broadcasts against x, and summing a tensor of x's
// shape over `reduce_axes` gives the parameter's shape.
struct ParamLayout {
  Shape shape;
  Axes reduce_axes;
  Tensor expand(const Tensor& p) const { return p.shape() == shape ? p : reshape(p, shape); }
  Tensor reduce(const Tensor& t) const { return reduce_axes.empty() ? t : sum(t, reduce_axes); }
};
// Trailing dims x[begin:] (layer and RMS norm).
ParamLayout trailing_layout(const Tensor& x, int64_t begin) {
  const Shape s = x.shape();
  return {Shape(s.begin() + begin, s.end()), axis_range(0, begin)};
}
// Channel axis 1 (batch, instance and group norm): params (C) act as (1, C, 1, ...).
ParamLayout channel_layout(const Tensor& x) {
  Shape s(x.rank(), 1);
  s[1] = x.shape()[1];
  Axes axes{0};
  for (int64_t i = 2; i < x.rank(); ++i) axes.push_back(i);
  return {s, axes};
}

// For y = xhat * weight + bias: appends the gradients of the weight and bias the node has (the
// weight is input `weight_input`) and returns d/dxhat.
Tensor affine_backward(const VjpContext& c, size_t weight_input, const ParamLayout& p,
                       const Tensor& xhat, Grads& grads) {
  const Tensor& g = *c.cotangents[0];
  Tensor dxhat = g;
  if (c.attrs.b("has_weight", false)) {
    grads.push_back(p.reduce(g * xhat));
    dxhat = g * p.expand(c.inputs[weight_input]);
  }
  if (c.attrs.b("has_bias", false)) grads.push_back(p.reduce(g));
  return dxhat;
}

// Layer norm (centered) and RMS norm: statistics over dims [begin_axis, rank).
Grads row_norm_grads(const VjpContext& c, bool center) {
  const Tensor& x = c.inputs[0];
  const int64_t begin = c.attrs.i("begin_axis");
  const Axes axes = axis_range(begin, x.rank());
  const Normalized n = normalize(x, axes, c.attrs.f("eps"), center);
  Grads grads{std::nullopt};
  const Tensor dxhat = affine_backward(c, 1, trailing_layout(x, begin), n.xhat, grads);
  grads[0] = normalize_backward(dxhat, n, axes, center);
  return grads;
}
Grads vjp_layer_norm(const VjpContext& c) { return row_norm_grads(c, true); }
Grads vjp_rms_norm(const VjpContext& c) { return row_norm_grads(c, false); }

// Inference batch norm: y = (x - mean) * s * w + b with s = 1/sqrt(var + eps) per channel.
Grads vjp_batch_norm(const VjpContext& c) {
  const Tensor &x = c.inputs[0], &m = c.inputs[1], &var = c.inputs[2];
  const ParamLayout p = channel_layout(x);
  const Tensor s = rsqrt(var + c.attrs.f("eps"));
  const Tensor xc = x - p.expand(m);
  Grads grads{std::nullopt, std::nullopt, std::nullopt};
  const Tensor dxhat = affine_backward(c, 3, p, xc * p.expand(s), grads);
  grads[0] = dxhat * p.expand(s);
  grads[1] = -p.reduce(dxhat) * s;
  // d s / d var = -s^3 / 2
  grads[2] = p.reduce(dxhat * xc) * (s * s * s) * -0.5;
  return grads;
}

// Training batch norm: y's gradient through one fused batch_norm_train_grad node; gradients of
// the mean and var outputs (only when a loss reads them) with plain ops: d mean / dx = 1 / M and
// d var / dx = 2 (x - mean) / M.
Grads vjp_batch_norm_train(const VjpContext& c) {
  const Tensor &x = c.inputs[0], &m = c.outputs[1], &var = c.outputs[2];
  const bool hw = c.attrs.b("has_weight", false), hb = c.attrs.b("has_bias", false);
  Grads grads(c.inputs.size());
  std::optional<Tensor> dx;
  if (c.cotangents[0]) {
    const std::optional<Tensor> w = hw ? std::optional(c.inputs[1]) : std::nullopt;
    const BatchNormTrainGradResult r =
        batch_norm_train_grad(*c.cotangents[0], x, m, var, w, c.attrs.f("eps"));
    dx = r.dx;
    size_t i = 1;
    if (hw) grads[i++] = r.dweight;
    if (hb) grads[i] = r.dbias;
  }
  if (c.cotangents[1] || c.cotangents[2]) {
    // 1 / M, M the positions per channel: from x's shape when it is known only when run
    const ParamLayout p = channel_layout(x);
    Tensor inv_m = scalar_like(x, 0);
    if (is_static(x.shape())) {
      inv_m = scalar_like(
          x, 1.0 / static_cast<double>(numel(x.shape()) / std::max<int64_t>(1, x.shape()[1])));
    } else {
      const Tensor m_count = prod(shape_of(x)) / size_value(x, 1);
      inv_m = cast_to(1.0 / cast(m_count, f32), x.dtype());
    }
    std::optional<Tensor> d;
    if (c.cotangents[1]) d = p.expand(*c.cotangents[1] * inv_m);
    if (c.cotangents[2]) {
      const Tensor t = (x - p.expand(m)) * p.expand(*c.cotangents[2] * (inv_m * 2.0));
      d = d ? *d + t : t;
    }
    dx = dx                     ? *dx + *d
         : is_static(x.shape()) ? broadcast_to(*d, x.shape())
                                : expand(*d, shape_of(x));
  }
  grads[0] = dx;
  return grads;
}

// Instance norm: per (n, c) statistics over the spatial dims.
Grads vjp_instance_norm(const VjpContext& c) {
  const Tensor& x = c.inputs[0];
  const Axes axes = axis_range(2, x.rank());
  const Normalized n = normalize(x, axes, c.attrs.f("eps"), true);
  Grads grads{std::nullopt};
  const Tensor dxhat = affine_backward(c, 1, channel_layout(x), n.xhat, grads);
  grads[0] = normalize_backward(dxhat, n, axes, true);
  return grads;
}

// Group norm: x viewed as (N, groups, C / groups, spatial...) is normalized over dims 2...
Grads vjp_group_norm(const VjpContext& c) {
  const Tensor& x = c.inputs[0];
  const int64_t groups = c.attrs.i("groups");
  Shape grouped = x.shape();
  grouped[1] = groups;
  grouped.insert(grouped.begin() + 2, x.shape()[1] / groups);
  const Axes axes = axis_range(2, x.rank() + 1);
  const Normalized n = normalize(reshape(x, grouped), axes, c.attrs.f("eps"), true);
  Grads grads{std::nullopt};
  const Tensor xhat = reshape(n.xhat, x.shape());
  const Tensor dxhat = affine_backward(c, 1, channel_layout(x), xhat, grads);
  grads[0] = reshape(normalize_backward(reshape(dxhat, grouped), n, axes, true), x.shape());
  return grads;
}

// The mask depends only on the seed and the element index, so the same seed drops the same
// elements of g: dx = mask * g / (1 - p).
Grads vjp_dropout(const VjpContext& c) {
  return {
      dropout(*c.cotangents[0], c.attrs.f("p"), true, static_cast<uint64_t>(c.attrs.i("seed")))};
}

// The NHWC inputs of channels_last nodes: batch_norm_train's x, batch_norm_train_grad's dy and x.
bool nhwc_x(const Attrs&, int k, int) { return k == 0; }
bool nhwc_dy_and_x(const Attrs&, int k, int) { return k <= 1; }

}  // namespace

void register_norm_ops() {
  define_op(OpId::Softmax).set_infer(infer_softmax).inplace(0).inputs(1).params<SoftmaxParams>();
  define_op(OpId::LogSoftmax).set_infer(infer_softmax).inplace(0).inputs(1).params<SoftmaxParams>();
  // the kernels read each row's statistics before writing the row, so x may be overwritten
  define_op(OpId::LayerNorm)
      .set_infer(infer_layer_norm)
      .inplace(0)
      .inputs(1)
      .optional_inputs({"has_weight", "has_bias"})
      .params<NormParams>();
  define_op(OpId::RmsNorm)
      .set_infer(infer_layer_norm)
      .inplace(0)
      .inputs(1)
      .optional_inputs({"has_weight"})
      .params<NormParams>();
  // x, running mean, running variance[, weight][, bias]
  define_op(OpId::BatchNorm)
      .set_infer(infer_batch_norm)
      .inplace(0)
      .inputs(3)
      .optional_inputs({"has_weight", "has_bias"})
      .params<NormParams>();
  // (channels_last: x and y NHWC, on the CPU; the channels_last pass sets it between NHWC convs)
  define_op(OpId::InstanceNorm)
      .set_infer(infer_instance_norm)
      .inplace(0)
      .inputs(1)
      .optional_inputs({"has_weight", "has_bias"})
      .params<NormParams>()
      .channels_last([](const Attrs&, int k, int) { return k == 0; });
  define_op(OpId::GroupNorm)
      .set_infer(infer_group_norm)
      .inplace(0)
      .inputs(1)
      .optional_inputs({"has_weight", "has_bias"})
      .params<NormParams>();
  define_op(OpId::Dropout)
      .set_infer(infer_dropout)
      .impure()
      .inplace(0)
      .inputs(1)
      .params<DropoutParams>();
  // y (dx) is written over x (dy) channel by channel after the channel's statistics are read
  define_op(OpId::BatchNormTrain)
      .set_infer(infer_batch_norm_train)
      .inplace(0)
      .inputs(1)
      .optional_inputs({"has_weight", "has_bias"})
      .params<NormParams>()
      .channels_last(nhwc_x);
  define_op(OpId::BatchNormTrainGrad)
      .set_infer(infer_batch_norm_train_grad)
      .inplace(0)
      .inputs(4)
      .optional_inputs({"has_weight"})
      .params<NormParams>()
      .channels_last(nhwc_dy_and_x);

  define_op(OpId::Softmax).grad(vjp_softmax);
  define_op(OpId::LogSoftmax).grad(vjp_log_softmax);
  define_op(OpId::LayerNorm).grad(vjp_layer_norm);
  define_op(OpId::RmsNorm).grad(vjp_rms_norm);
  define_op(OpId::BatchNorm).grad(vjp_batch_norm);
  define_op(OpId::InstanceNorm).grad(vjp_instance_norm);
  define_op(OpId::GroupNorm).grad(vjp_group_norm);
  define_op(OpId::Dropout).grad(vjp_dropout);
  define_op(OpId::BatchNormTrain).grad(vjp_batch_norm_train);
  // double backward through batch norm is not supported yet
  define_op(OpId::BatchNormTrainGrad).not_differentiable();
}

Tensor softmax(const Tensor& x, int64_t axis) { return softmax_like(OpId::Softmax, x, axis); }
Tensor log_softmax(const Tensor& x, int64_t axis) {
  return softmax_like(OpId::LogSoftmax, x, axis);
}

Tensor layer_norm(const Tensor& x, const std::optional<Tensor>& weight,
                  const std::optional<Tensor>& bias, int64_t begin_axis, double eps) {
  const int64_t begin = resolve_axis("layer_norm", begin_axis, x.shape());
  return norm_node(OpId::LayerNorm, x, {}, weight, bias, {{"begin_axis", begin}, {"eps", eps}});
}

Tensor rms_norm(const Tensor& x, const std::optional<Tensor>& weight, int64_t begin_axis,
                double eps) {
  const int64_t begin = resolve_axis("rms_norm", begin_axis, x.shape());
  return norm_node(OpId::RmsNorm, x, {}, weight, std::nullopt,
                   {{"begin_axis", begin}, {"eps", eps}});
}

Tensor batch_norm(const Tensor& x, const Tensor& mean, const Tensor& var,
                  const std::optional<Tensor>& weight, const std::optional<Tensor>& bias,
                  double eps) {
  require_float("batch_norm", x, "x");
  return norm_node(OpId::BatchNorm, x,
                   {param("batch_norm", mean, x, "mean"), param("batch_norm", var, x, "var")},
                   weight, bias, {{"eps", eps}});
}

BatchNormTrainResult batch_norm_train(const Tensor& x, const std::optional<Tensor>& weight,
                                      const std::optional<Tensor>& bias, double eps) {
  const char* n = "batch_norm_train";
  require_float(n, x, "x");
  std::vector<Tensor> inputs{x};
  Attrs attrs{{"eps", eps}};
  add_optional(inputs, attrs, "weight", param(n, weight, x, "weight"));
  add_optional(inputs, attrs, "bias", param(n, bias, x, "bias"));
  auto out = make_node(OpId::BatchNormTrain, inputs, std::move(attrs));
  return {out[0], out[1], out[2]};
}

BatchNormTrainGradResult batch_norm_train_grad(const Tensor& dy, const Tensor& x,
                                               const Tensor& mean, const Tensor& var,
                                               const std::optional<Tensor>& weight, double eps) {
  const char* n = "batch_norm_train_grad";
  require_float(n, x, "x");
  require_float(n, dy, "dy");
  std::vector<Tensor> inputs{cast_to(dy, x.dtype()), x, param(n, mean, x, "mean"),
                             param(n, var, x, "var")};
  Attrs attrs{{"eps", eps}};
  add_optional(inputs, attrs, "weight", param(n, weight, x, "weight"));
  auto out = make_node(OpId::BatchNormTrainGrad, inputs, std::move(attrs));
  return {out[0], out[1], out[2]};
}

// One fused batch_norm_train node; its gradient is the fused batch_norm_train_grad.
BatchNormTraining batch_norm_training(const Tensor& x, const Tensor& running_mean,
                                      const Tensor& running_var,
                                      const std::optional<Tensor>& weight,
                                      const std::optional<Tensor>& bias, double momentum,
                                      double eps) {
  require_float("batch_norm_training", x, "x");
  const Shape s = x.shape();
  if (s.size() < 2 || !is_static(s))
    fail<ShapeError>("[batch_norm_training] x must have a static shape of rank >= 2, got {}",
                     str(s));
  const int64_t c = s[1], count = numel(s) / std::max<int64_t>(c, 1);
  if (count < 2)
    fail<ShapeError>("[batch_norm_training] needs more than one value per channel, x is {}",
                     str(s));
  const char* n = "batch_norm_training";
  const BatchNormTrainResult r =
      batch_norm_train(x, param(n, weight, x, "weight"), param(n, bias, x, "bias"), eps);
  const double unbias = static_cast<double>(count) / static_cast<double>(count - 1);
  const Tensor bv = r.var * unbias;
  std::vector<Tensor> updates{
      assign(running_mean,
             running_mean * (1 - momentum) + cast_to(r.mean, running_mean.dtype()) * momentum),
      assign(running_var,
             running_var * (1 - momentum) + cast_to(bv, running_var.dtype()) * momentum)};
  return {r.y, updates};
}

Tensor instance_norm(const Tensor& x, const std::optional<Tensor>& weight,
                     const std::optional<Tensor>& bias, double eps) {
  return norm_node(OpId::InstanceNorm, x, {}, weight, bias, {{"eps", eps}});
}

Tensor group_norm(const Tensor& x, int64_t groups, const std::optional<Tensor>& weight,
                  const std::optional<Tensor>& bias, double eps) {
  return norm_node(OpId::GroupNorm, x, {}, weight, bias, {{"groups", groups}, {"eps", eps}});
}

Tensor dropout(const Tensor& x, double p, bool training, uint64_t seed) {
  if (!(p >= 0 && p < 1))
    fail<ValueError>("[dropout] p must be in [0, 1), got {} (x has shape {})", p, str(x.shape()));
  require_float("dropout", x, "x");
  if (!training || p == 0) return x;
  return make_node1(OpId::Dropout, {x}, {{"p", p}, {"seed", static_cast<int64_t>(seed)}});
}

}  // namespace kiln
