// The dtype dispatch and epilogue inputs of the int8 kernels (quantized_matmul, quantized_conv)
// on every backend, from the ops' params (src/ops/quant_params.h).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "backends/quant_math.h"
#include "core/errors.h"
#include "kiln/kernel.h"
#include "ops/quant_params.h"

namespace kiln {

/// The epilogue activation (quant_math::Activation) of a quantized kernel's node: relu, a GELU,
/// or none.
inline int epilogue_activation(const QuantEpilogueParams& p) {
  if (p.relu) return quant_math::kRelu;
  switch (p.gelu) {
    case QuantEpilogueParams::Gelu::erf:
      return quant_math::kGeluErf;
    case QuantEpilogueParams::Gelu::tanh:
      return quant_math::kGeluTanh;
    default:
      return quant_math::kNone;
  }
}
/// The same for the node of a quantized_matmul or quantized_conv kernel.
inline int epilogue_activation(const KernelContext& ctx) {
  return epilogue_activation(params_of<QuantEpilogueParams>(ctx));
}

/// Calls f(A{}, W{}, Y{}) with the C++ types (int8_t for i8, uint8_t for u8) of a quantized
/// kernel's data (of dtype `data`: input 0's, or with quantize_x its zero point's, input 2),
/// weights (input 3) and result (the dtype of input 7, its zero point); any other dtype is an
/// UnsupportedError naming the op and `backend`.
template <typename F>
void with_int8_types(const KernelContext& ctx, DType data, const char* backend, F&& f) {
  auto one = [&](DType t, auto&& next) {
    if (t == DType::i8)
      next(int8_t{});
    else if (t == DType::u8)
      next(uint8_t{});
    else
      fail<UnsupportedError>("[{}] {} kernel got {}", ctx.op_name(), backend, name(t));
  };
  one(data, [&](auto a) {
    one(ctx.in(3).dtype, [&](auto w) { one(ctx.in(7).dtype, [&](auto y) { f(a, w, y); }); });
  });
}
/// The same for a quantized_matmul kernel, whose data is input 0.
template <typename F> void with_int8_types(const KernelContext& ctx, const char* backend, F&& f) {
  with_int8_types(ctx, ctx.in(0).dtype, backend, std::forward<F>(f));
}

/// quantized_conv with quantize_x, once the backend has quantized x into `q` (NHWC when
/// `nhwc`, the channels_last layout): `kernel`, the backend's quantized_conv for the node's
/// layout, on q with quantize_x off, on ctx's stream and scratch.
inline void conv_on_quantized_x(KernelContext& ctx, void* q, bool nhwc,
                                void (*kernel)(KernelContext&)) {
  const Shape& s = ctx.in(0).shape;
  Attrs attrs = ctx.attrs();
  attrs.set("quantize_x", false);
  std::vector<TensorView> in;
  for (int i = 0; i < ctx.num_inputs(); ++i) in.push_back(ctx.in(i));
  in[0] = {q, nhwc ? Shape{s[0], s[2], s[3], s[1]} : s, ctx.in(2).dtype};
  KernelContext inner(ctx, attrs, std::move(in));
  kernel(inner);
}

/// The residual input of a quantized kernel at input `at` (none without has_residual): f32, or
/// with quantized_residual an i8/u8 tensor whose 0-d scale and zero point follow it.
inline quant_math::Residual residual_input(const KernelContext& ctx, int at,
                                           const QuantEpilogueParams& p) {
  quant_math::Residual r;
  if (!p.has_residual) return r;
  const TensorView& v = ctx.in(at);
  r.data = v.data;
  if (!p.quantized_residual) {
    r.kind = quant_math::Residual::kF32;
    return r;
  }
  r.kind = v.dtype == DType::u8 ? quant_math::Residual::kU8 : quant_math::Residual::kI8;
  r.scale = ctx.in(at + 1).ptr<float>();
  r.zp = ctx.in(at + 2).data;
  return r;
}
/// The same for the node of a quantized_matmul or quantized_conv kernel.
inline quant_math::Residual residual_input(const KernelContext& ctx, int at) {
  return residual_input(ctx, at, params_of<QuantEpilogueParams>(ctx));
}

}  // namespace kiln
