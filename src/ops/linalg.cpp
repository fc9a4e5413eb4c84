// Matrix products. The builders promote dtypes; batch broadcasting and 1-D operands stay in the
// node (numpy semantics), so kernels read broadcast batches in place instead of copying them.
//   matmul: no attrs. Inputs a (..., M, K) or (K), b (..., K, N) or (K).
//   linear: has_bias. Inputs x (..., K), w (N, K)[, bias (N)]; out (..., N).
//   fused_matmul (internal: the CPU's fuse_cpu_matmul_epilogues makes it): transpose_b,
//     epilogue (MatmulStep values), const_weight. Inputs x (..., K), b (K, N) (transpose_b:
//     (N, K)), then one operand per add or mul step, each of the output's shape or a row of it
//     (every dim 1 but the last, N or 1); out (..., N) = the epilogue's steps, in order, over
//     x · b: y + operand, y · operand, or an activation of y.
#include <numeric>

#include "kiln/autodiff.h"
#include "kiln/ops/nn.h"
#include "kiln/ops/transform.h"
#include "ops/common.h"
#include "ops/linalg_params.h"

namespace kiln {

using namespace ops;

namespace {
constexpr DTypeSet kMatmulTypes = kNumericTypes;

void require_same_dtypes(const InferContext& ctx) {
  for (size_t i = 1; i < ctx.inputs.size(); ++i)
    if (ctx.inputs[i].dtype != ctx.inputs[0].dtype)
      fail<DTypeError>("[{}] input 0 has dtype {} but input {} has dtype {}", ctx.name(),
                       name(ctx.inputs[0].dtype), i, name(ctx.inputs[i].dtype));
  require_dtype(ctx, 0, kMatmulTypes, "a numeric dtype");
}

bool dims_differ(int64_t a, int64_t b) { return a >= 0 && b >= 0 && a != b; }

std::vector<TensorInfo> infer_matmul(const InferContext& ctx) {
  require_same_dtypes(ctx);
  const Shape& a = ctx.inputs[0].shape;
  const Shape& b = ctx.inputs[1].shape;
  if (a.empty() || b.empty())
    fail<ShapeError>("[matmul] inputs must have rank >= 1, got shapes {} and {}", str(a), str(b));
  const int64_t ka = a.back();
  const int64_t kb = b.size() == 1 ? b[0] : b[b.size() - 2];
  if (dims_differ(ka, kb))
    fail<ShapeError>(
        "[matmul] last dimension of first input with shape {} must match second-to-last "
        "dimension of second input with shape {}",
        str(a), str(b));
  Shape batch_a(a.begin(), a.end() - std::min<size_t>(a.size(), 2));
  Shape batch_b(b.begin(), b.end() - std::min<size_t>(b.size(), 2));
  Shape out;
  if (!broadcast_shapes(batch_a, batch_b, out))
    fail<ShapeError>("[matmul] batch dimensions of shapes {} and {} do not broadcast", str(a),
                     str(b));
  if (a.size() >= 2) out.push_back(a[a.size() - 2]);
  if (b.size() >= 2) out.push_back(b.back());
  return {{out, ctx.inputs[0].dtype}};
}

std::vector<TensorInfo> infer_linear(const InferContext& ctx) {
  require_same_dtypes(ctx);
  const Shape& x = ctx.inputs[0].shape;
  const Shape& w = ctx.inputs[1].shape;
  require_rank(ctx, 0, 1, 64);
  if (w.size() != 2)
    fail<ShapeError>("[linear] weight must have rank 2 (out_features, in_features), got shape {}",
                     str(w));
  if (dims_differ(x.back(), w[1]))
    fail<ShapeError>(
        "[linear] last dimension of input with shape {} must match in_features of "
        "weight with shape {}",
        str(x), str(w));
  if (ctx.attrs.b("has_bias")) {
    const Shape& bias = ctx.inputs[2].shape;
    if (bias.size() != 1 || dims_differ(bias[0], w[0]))
      fail<ShapeError>("[linear] bias with shape {} must have shape ({},) for weight with shape {}",
                       str(bias), w[0], str(w));
  }
  Shape out(x.begin(), x.end() - 1);
  out.push_back(w[0]);
  return {{out, ctx.inputs[0].dtype}};
}

int fused_matmul_operands(const Attrs& a) {
  if (!a.has("epilogue")) return 0;  // (inference names the missing attribute)
  int n = 0;
  for (int64_t s : a.ints("epilogue"))
    n += is_matmul_step(s) && takes_operand(static_cast<MatmulStep>(s));
  return n;
}

std::vector<TensorInfo> infer_fused_matmul(const InferContext& ctx) {
  require_same_dtypes(ctx);
  const Shape& x = ctx.inputs[0].shape;
  const Shape& b = ctx.inputs[1].shape;
  const bool t = ctx.attrs.b("transpose_b", false);
  require_rank(ctx, 0, 1, 64);
  if (b.size() != 2 || dims_differ(x.back(), b[t ? 1 : 0]))
    fail<ShapeError>(
        "[fused_matmul] input with shape {} and {} matrix with shape {} do not multiply", str(x),
        t ? "(N, K)" : "(K, N)", str(b));
  const auto& steps = ctx.attrs.ints("epilogue");
  if (steps.empty() || steps.size() > static_cast<size_t>(kMaxMatmulSteps))
    fail<ValueError>("[fused_matmul] epilogue of {} steps (1 to {})", steps.size(),
                     kMaxMatmulSteps);
  for (int64_t s : steps)
    if (!is_matmul_step(s)) fail<ValueError>("[fused_matmul] unknown epilogue step {}", s);
  Shape out(x.begin(), x.end() - 1);
  out.push_back(b[t ? 0 : 1]);
  for (size_t i = 2; i < ctx.inputs.size(); ++i) {
    const Shape& o = ctx.inputs[i].shape;
    bool row = o.size() <= out.size() &&
               (o.empty() || o.back() == 1 || !dims_differ(o.back(), out.back()));
    for (size_t d = 0; d + 1 < o.size(); ++d) row = row && o[d] == 1;
    if (!row && !shapes_match(o, out))
      fail<ShapeError>(
          "[fused_matmul] operand {} with shape {} is neither the output's shape {} nor a row of "
          "it",
          i, str(o), str(out));
  }
  return {{out, ctx.inputs[0].dtype}};
}

std::string check_stored_fused_matmul(const InferContext& c) {
  const auto& steps = c.attrs.ints("epilogue");
  if (steps.empty() || steps.size() > static_cast<size_t>(kMaxMatmulSteps))
    return "an epilogue of no steps or too many";
  for (int64_t s : steps)
    if (!is_matmul_step(s)) return "an unknown epilogue step";
  return "";
}

// ---- gradient rules ----
using Grads = std::vector<std::optional<Tensor>>;

// The last two dims swapped.
Tensor transpose_last2(const Tensor& x) {
  std::vector<int64_t> perm(x.shape().size());
  std::iota(perm.begin(), perm.end(), 0);
  std::swap(perm[perm.size() - 1], perm[perm.size() - 2]);
  return transpose(x, perm);
}

// numpy promotes a 1-D a to (1, K) and a 1-D b to (K, 1) and drops those dims from the result:
// the rule works on the promoted forms, and sum_to_shape undoes the batch broadcast.
Grads vjp_matmul(const VjpContext& c) {
  const Tensor &a = c.inputs[0], &b = c.inputs[1];
  const bool a1 = a.shape().size() == 1, b1 = b.shape().size() == 1;
  const Tensor a2 = a1 ? expand_dims(a, {0}) : a;
  const Tensor b2 = b1 ? expand_dims(b, {1}) : b;
  Tensor g = *c.cotangents[0];
  if (b1) g = expand_dims(g, {static_cast<int64_t>(g.shape().size())});
  if (a1) g = expand_dims(g, {static_cast<int64_t>(g.shape().size()) - 1});
  const Tensor da = sum_to_shape_of(matmul(g, transpose_last2(b2)), a2);
  const Tensor db = sum_to_shape_of(matmul(transpose_last2(a2), g), b2);
  return {a1 ? reshape(da, a.shape()) : da, b1 ? reshape(db, b.shape()) : db};
}

// y = x wᵀ + bias over any leading dims of x: dx = g w; dw = gᵀ x with those dims flattened.
Grads vjp_linear(const VjpContext& c) {
  const Tensor &x = c.inputs[0], &w = c.inputs[1];
  const Tensor& g = *c.cotangents[0];
  const int64_t n = w.shape()[0], k = w.shape()[1];
  // x and g as (rows, k) and (rows, n); rows written out where known, since -1 cannot be inferred
  // beside a zero dim (k = 0 or n = 0)
  const Shape xs = x.shape();
  const Shape lead(xs.begin(), xs.end() - 1);
  const int64_t rows = is_static(lead) ? numel(lead) : -1;
  Grads r{matmul(g, w), matmul(transpose(reshape(g, {rows, n})), reshape(x, {rows, k}))};
  if (c.attrs.b("has_bias")) r.push_back(sum_to_shape(g, {n}));
  return r;
}
}  // namespace

void register_linalg_ops() {
  define_op(OpId::Matmul)
      .set_infer(infer_matmul)
      .grad(vjp_matmul)
      .inputs(2)
      .on_tensor_cores()
      .low_precision()
      .params<LinalgParams>();
  define_op(OpId::Linear)
      .set_infer(infer_linear)
      .grad(vjp_linear)
      .inputs(2)
      .optional_inputs({"has_bias"})
      .on_tensor_cores()
      .low_precision()
      .params<LinalgParams>();
  define_op(OpId::FusedMatmul)
      .set_infer(infer_fused_matmul)
      .not_differentiable()
      .inputs(2)
      .more_inputs(fused_matmul_operands)
      .check_stored(check_stored_fused_matmul)
      .params<LinalgParams>();
}

Tensor matmul(const Tensor& a, const Tensor& b) {
  DType t = promote(a.dtype(), b.dtype());
  return make_node1(OpId::Matmul, {cast_to(a, t), cast_to(b, t)});
}

Tensor linear(const Tensor& x, const Tensor& w, const std::optional<Tensor>& bias) {
  DType t = promote(x.dtype(), w.dtype());
  if (bias) t = promote(t, bias->dtype());
  std::vector<Tensor> inputs{cast_to(x, t), cast_to(w, t)};
  Attrs attrs;
  add_optional(inputs, attrs, "bias", bias ? std::optional<Tensor>(cast_to(*bias, t)) : bias);
  return make_node1(OpId::Linear, inputs, attrs);
}

}  // namespace kiln
