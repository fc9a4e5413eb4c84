// Scaled dot-product attention and its gradient op (family attention). Attrs of both:
//   causal (bool), scale (double; absent: 1/sqrt(E), resolved by the kernel), has_mask (bool)
//   scaled_dot_product_attention: inputs q (B..., Lq, E), k (B..., Lk, E), v (B..., Lk, Ev)
//     [, mask broadcasting to (B..., Lq, Lk): bool keep-mask or additive in q's dtype];
//     out (B..., Lq, Ev). The builder broadcasts q, k and v to one batch shape; the mask stays
//     as given and kernels read it with broadcast strides (no (B, Lq, Lk) copy).
//   scaled_dot_product_attention_grad: inputs dout, q, k, v, out [, mask]; attr mask_grad:
//     false -> outputs dq, dk, dv; true -> one output, the gradient of the additive mask at
//     full shape (B..., Lq, Lk) (a node of its own so that it is dropped unless asked for).
// A query whose every key is masked outputs zeros and passes no gradient.
#include "kiln/ops/attention.h"

#include <cmath>

#include "kiln/autodiff.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/transform.h"
#include "ops/attention_params.h"
#include "ops/attention_util.h"
#include "ops/common.h"

namespace kiln {

using namespace ops;


namespace {

Shape batch_of(const Shape& s) { return Shape(s.begin(), s.end() - 2); }

// q, k, v (and dout, out for the grad op) at positions first.. of the inputs.
void check_qkv(const InferContext& ctx, int iq) {
  const TensorInfo &q = ctx.inputs[iq], &k = ctx.inputs[iq + 1], &v = ctx.inputs[iq + 2];
  require_dtype(ctx, iq, kFloatTypes, "a float dtype");
  for (int i = 1; i < 3; ++i)
    if (ctx.inputs[iq + i].dtype != q.dtype)
      fail<DTypeError>("[{}] q has dtype {} but {} has dtype {}", ctx.name(), name(q.dtype),
                       i == 1 ? "k" : "v", name(ctx.inputs[iq + i].dtype));
  const size_t r = q.shape.size();
  if (r < 2 || k.shape.size() != r || v.shape.size() != r ||
      static_cast<int>(r) > attention::kMaxBatchRank + 2)
    fail<ShapeError>("[{}] q {}, k {} and v {} must have one rank in [2, {}]", ctx.name(),
                     str(q.shape), str(k.shape), str(v.shape), attention::kMaxBatchRank + 2);
  if (!shapes_match(batch_of(q.shape), batch_of(k.shape)) ||
      !shapes_match(batch_of(q.shape), batch_of(v.shape)) ||
      !dims_match(q.shape[r - 1], k.shape[r - 1]) || !dims_match(k.shape[r - 2], v.shape[r - 2]))
    fail<ShapeError>("[{}] q {}, k {}, v {} must be (..., Lq, E), (..., Lk, E), (..., Lk, Ev)",
                     ctx.name(), str(q.shape), str(k.shape), str(v.shape));
}

void check_mask(const InferContext& ctx, int im, const Shape& scores) {
  const TensorInfo &m = ctx.inputs[im], &q = ctx.inputs[1 + (im == 3 ? -1 : 0)];
  if (m.dtype != DType::boolean && m.dtype != q.dtype)
    fail<DTypeError>("[{}] mask dtype {} must be bool or q's dtype {}", ctx.name(), name(m.dtype),
                     name(q.dtype));
  Shape b;
  if (m.shape.size() > scores.size() || !broadcast_shapes(m.shape, scores, b) ||
      !shapes_match(b, scores))
    fail<ShapeError>("[{}] mask shape {} does not broadcast to the scores' shape {}", ctx.name(),
                     str(m.shape), str(scores));
}

Shape scores_shape(const Shape& q, const Shape& k) {
  Shape s = q;
  s.back() = k[k.size() - 2];
  return s;
}

std::vector<TensorInfo> infer_sdpa(const InferContext& ctx) {
  check_qkv(ctx, 0);
  const Shape &q = ctx.inputs[0].shape, &k = ctx.inputs[1].shape, &v = ctx.inputs[2].shape;
  if (ctx.attrs.b("has_mask")) check_mask(ctx, 3, scores_shape(q, k));
  Shape out = q;
  out.back() = v.back();
  return {{out, ctx.inputs[0].dtype}};
}

std::vector<TensorInfo> infer_sdpa_grad(const InferContext& ctx) {
  check_qkv(ctx, 1);
  const TensorInfo &dout = ctx.inputs[0], &q = ctx.inputs[1], &k = ctx.inputs[2],
                   &v = ctx.inputs[3], &out = ctx.inputs[4];
  Shape os = q.shape;
  os.back() = v.shape.back();
  if (!shapes_match(dout.shape, os) || !shapes_match(out.shape, os) || dout.dtype != q.dtype ||
      out.dtype != q.dtype)
    fail<ShapeError>("[{}] dout {} ({}) and out {} ({}) must have shape {} and dtype {}",
                     ctx.name(), str(dout.shape), name(dout.dtype), str(out.shape),
                     name(out.dtype), str(os), name(q.dtype));
  const Shape scores = scores_shape(q.shape, k.shape);
  if (ctx.attrs.b("has_mask")) check_mask(ctx, 5, scores);
  if (ctx.attrs.b("mask_grad", false)) return {{scores, q.dtype}};
  return {{q.shape, q.dtype}, {k.shape, q.dtype}, {v.shape, q.dtype}};
}

Attrs attrs_of(const AttentionOptions& o, int64_t e, bool has_mask) {
  Attrs a{{"causal", o.causal}, {"has_mask", has_mask}};
  if (o.scale) a.set("scale", *o.scale);
  else if (e > 0) a.set("scale", 1.0 / std::sqrt(static_cast<double>(e)));
  return a;
}

AttentionOptions options_of(const Attrs& a) {
  AttentionOptions o;
  o.causal = a.b("causal");
  if (a.has("scale")) o.scale = a.f("scale");
  return o;
}

using Grads = std::vector<std::optional<Tensor>>;

Grads vjp_sdpa(const VjpContext& c) {
  const bool has_mask = c.attrs.b("has_mask");
  std::optional<Tensor> mask;
  if (has_mask) mask = c.inputs[3];
  const AttentionOptions o = options_of(c.attrs);
  const std::vector<Tensor> d = scaled_dot_product_attention_grad(
      c.cotangent_or_zeros(0), c.inputs[0], c.inputs[1], c.inputs[2], c.outputs[0], mask, o);
  Grads g{d[0], d[1], d[2]};
  if (has_mask) {
    if (mask->dtype() == DType::boolean) {
      g.push_back(std::nullopt);
    } else {
      std::vector<Tensor> in{c.cotangent_or_zeros(0), c.inputs[0], c.inputs[1], c.inputs[2],
                             c.outputs[0], *mask};
      Attrs a = c.attrs;
      a.set("mask_grad", true);
      g.push_back(sum_to_shape_of(make_node1(OpId::ScaledDotProductAttentionGrad, in, a), *mask));
    }
  }
  return g;
}

}  // namespace

void register_attention_ops() {
  // autocast runs it low when q, k, v (and a float mask) are f32; a bool mask stays bool
  define_op(OpId::ScaledDotProductAttention)
      .set_infer(infer_sdpa)
      .grad(vjp_sdpa)
      .inputs(3)
      .optional_inputs({"has_mask"})
      .params<AttentionParams>()
      .low_precision(3);
  // double backward through attention is not supported
  define_op(OpId::ScaledDotProductAttentionGrad)
      .set_infer(infer_sdpa_grad)
      .not_differentiable()
      .inputs(5)
      .optional_inputs({"has_mask"})
      .params<AttentionParams>();
}

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const std::optional<Tensor>& mask,
                                    const AttentionOptions& o) {
  const char* op = "scaled_dot_product_attention";
  const DType t = promote(q.dtype(), promote(k.dtype(), v.dtype()));
  if (!kFloatTypes.has(t))
    fail<DTypeError>("[{}] q, k, v have dtypes {}, {}, {}; expected float dtypes", op,
                     name(q.dtype()), name(k.dtype()), name(v.dtype()));
  const Shape qs = q.shape(), ks = k.shape(), vs = v.shape();
  if (qs.size() < 2 || ks.size() < 2 || vs.size() < 2)
    fail<ShapeError>("[{}] q {}, k {}, v {} must have rank >= 2", op, str(qs), str(ks), str(vs));
  Shape batch, b2;
  if (!broadcast_shapes(batch_of(qs), batch_of(ks), b2) ||
      !broadcast_shapes(b2, batch_of(vs), batch))
    fail<ShapeError>("[{}] batch dims of q {}, k {}, v {} do not broadcast", op, str(qs),
                     str(ks), str(vs));
  auto to_batch = [&](const Tensor& x) {
    Tensor y = cast_to(x, t);
    const Shape s = y.shape();
    Shape want = batch;
    want.insert(want.end(), s.end() - 2, s.end());
    return s == want ? y : broadcast_to(y, want);
  };
  std::vector<Tensor> in{to_batch(q), to_batch(k), to_batch(v)};
  if (mask) {
    if (mask->dtype() == DType::boolean) in.push_back(*mask);
    else if (kFloatTypes.has(mask->dtype())) in.push_back(cast_to(*mask, t));
    else
      fail<DTypeError>("[{}] mask has dtype {}; expected bool (keep) or a float dtype (added)",
                       op, name(mask->dtype()));
  }
  return make_node1(OpId::ScaledDotProductAttention, in, attrs_of(o, qs.back(), mask.has_value()));
}

std::vector<Tensor> scaled_dot_product_attention_grad(const Tensor& dout, const Tensor& q,
                                                      const Tensor& k, const Tensor& v,
                                                      const Tensor& out,
                                                      const std::optional<Tensor>& mask,
                                                      const AttentionOptions& o) {
  const DType t = q.dtype();
  std::vector<Tensor> in{cast_to(dout, t), q, k, v, cast_to(out, t)};
  if (mask) in.push_back(mask->dtype() == DType::boolean ? *mask : cast_to(*mask, t));
  Attrs a = attrs_of(o, q.dim(-1), mask.has_value());
  a.set("mask_grad", false);
  return make_node(OpId::ScaledDotProductAttentionGrad, in, a);
}

}  // namespace kiln
