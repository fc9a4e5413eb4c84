// Matrix products. The builders promote dtypes; batch broadcasting and 1-D operands stay in the
// node (numpy semantics), so kernels read broadcast batches in place instead of copying them.
//   matmul: no attrs. Inputs a (..., M, K) or (K), b (..., K, N) or (K).
//   linear: has_bias. Inputs x (..., K), w (N, K)[, bias (N)]; out (..., N).
#include "kiln/ops/nn.h"
#include "ops/common.h"

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
}  // namespace

void register_linalg_ops() {
  define_op(OpId::Matmul).set_infer(infer_matmul);
  define_op(OpId::Linear).set_infer(infer_linear);
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
