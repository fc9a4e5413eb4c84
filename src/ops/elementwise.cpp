// Elementwise ops. Binary ops promote dtypes and broadcast in the builder, so the node's inputs
// already have the result dtype; comparisons give bool.
//   leaky_relu: alpha   elu: alpha   gelu: approximate ("none" | "tanh")
//   softplus: beta, threshold   softshrink/hardshrink: lambda   hardsigmoid: alpha, beta
//   clip: min, max   cast: dtype
#include "kiln/ops/elementwise.h"

#include "kiln/ops/core.h"
#include "ops/common.h"

namespace kiln {

using namespace ops;

namespace {
std::vector<TensorInfo> infer_binary(const InferContext& ctx) {
  if (ctx.inputs[0].dtype != ctx.inputs[1].dtype)
    fail<DTypeError>("[{}] inputs have dtypes {} and {}", ctx.name(), name(ctx.inputs[0].dtype),
                     name(ctx.inputs[1].dtype));
  require_dtype(ctx, 0, kNumericTypes, "a numeric dtype");
  return {{broadcast_infer(ctx), ctx.inputs[0].dtype}};
}
std::vector<TensorInfo> infer_unary_float(const InferContext& ctx) {
  require_dtype(ctx, 0, kFloatTypes, "a float dtype");
  return {ctx.inputs[0]};
}
std::vector<TensorInfo> infer_unary_signed(const InferContext& ctx) {
  require_dtype(ctx, 0, kSignedTypes, "a signed numeric dtype");
  return {ctx.inputs[0]};
}
std::vector<TensorInfo> infer_cast(const InferContext& ctx) {
  return {{ctx.inputs[0].shape, ctx.attrs.dtype("dtype")}};
}

std::pair<Tensor, Tensor> promoted(const Tensor& a, const Tensor& b) {
  DType t = promote(a.dtype(), b.dtype());
  return {cast_to(a, t), cast_to(b, t)};
}
Tensor binary(OpId op, const Tensor& a, const Tensor& b) {
  auto [x, y] = promoted(a, b);
  return make_node1(op, {x, y});
}
}  // namespace

void register_elementwise_ops() {
  define_op(OpId::Add).set_infer(infer_binary).inplace(0);
  define_op(OpId::Sub).set_infer(infer_binary).inplace(0);
  define_op(OpId::Mul).set_infer(infer_binary).inplace(0);
  define_op(OpId::Neg).set_infer(infer_unary_signed).inplace(0);
  define_op(OpId::Exp).set_infer(infer_unary_float).inplace(0);
  define_op(OpId::Relu).set_infer(infer_unary_signed).inplace(0);
  define_op(OpId::Cast).set_infer(infer_cast);
}

Tensor add(const Tensor& a, const Tensor& b) { return binary(OpId::Add, a, b); }
Tensor sub(const Tensor& a, const Tensor& b) { return binary(OpId::Sub, a, b); }
Tensor mul(const Tensor& a, const Tensor& b) { return binary(OpId::Mul, a, b); }
Tensor neg(const Tensor& x) { return make_node1(OpId::Neg, {x}); }
Tensor exp(const Tensor& x) { return make_node1(OpId::Exp, {x}); }
Tensor relu(const Tensor& x) { return make_node1(OpId::Relu, {x}); }
Tensor cast(const Tensor& x, DType dtype) {
  return make_node1(OpId::Cast, {x}, {{"dtype", dtype}});
}

Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator-(const Tensor& x) { return neg(x); }
Tensor operator+(const Tensor& a, double b) { return add(a, scalar_like(a, b)); }
Tensor operator-(const Tensor& a, double b) { return sub(a, scalar_like(a, b)); }
Tensor operator*(const Tensor& a, double b) { return mul(a, scalar_like(a, b)); }
Tensor operator+(double a, const Tensor& b) { return add(scalar_like(b, a), b); }
Tensor operator-(double a, const Tensor& b) { return sub(scalar_like(b, a), b); }
Tensor operator*(double a, const Tensor& b) { return mul(scalar_like(b, a), b); }

}  // namespace kiln
