// The dtype dispatch of the int8 kernels (quantized_matmul, quantized_conv) on every backend.
#pragma once

#include <cstdint>
#include <vector>

#include "backends/quant_math.h"
#include "core/errors.h"
#include "kiln/kernel.h"

namespace kiln {

/// The epilogue activation of a quantized kernel's node (quant_math::Activation): attr relu, or
/// attr gelu ("erf", "tanh"; quantized_matmul), or none.
inline int epilogue_activation(const KernelContext& ctx) {
  if (ctx.attrs().b("relu", false)) return quant_math::kRelu;
  if (!ctx.attrs().has("gelu")) return quant_math::kNone;
  return ctx.attrs().str("gelu") == "tanh" ? quant_math::kGeluTanh : quant_math::kGeluErf;
}

/// Calls f(A{}, W{}, Y{}) with the C++ types (int8_t for i8, uint8_t for u8) of a quantized
/// kernel's data (input 0; with quantize_x, f32 data, the dtype of its zero point, input 2),
/// weights (input 3) and result (the dtype of input 7, its zero point); any other dtype is an
/// UnsupportedError naming the op and `backend`.
template <typename F>
void with_int8_types(const KernelContext& ctx, const char* backend, F&& f) {
  auto one = [&](DType t, auto&& next) {
    if (t == DType::i8)
      next(int8_t{});
    else if (t == DType::u8)
      next(uint8_t{});
    else
      fail<UnsupportedError>("[{}] {} kernel got {}", ctx.op_name(), backend, name(t));
  };
  const DType data = ctx.attrs().b("quantize_x", false) ? ctx.in(2).dtype : ctx.in(0).dtype;
  one(data, [&](auto a) {
    one(ctx.in(3).dtype, [&](auto w) { one(ctx.in(7).dtype, [&](auto y) { f(a, w, y); }); });
  });
}

/// quantized_conv with quantize_x, once the backend has quantized x into `q` (NHWC with
/// channels_last): `plain`, the backend's quantized_conv, on q with quantize_x off, on ctx's
/// stream and scratch.
inline void conv_on_quantized_x(KernelContext& ctx, void* q, void (*plain)(KernelContext&)) {
  const Shape& s = ctx.in(0).shape;
  const bool cl = ctx.attrs().b("channels_last", false);
  Attrs attrs = ctx.attrs();
  attrs.set("quantize_x", false);
  std::vector<TensorView> in;
  for (int i = 0; i < ctx.num_inputs(); ++i) in.push_back(ctx.in(i));
  in[0] = {q, cl ? Shape{s[0], s[2], s[3], s[1]} : s, ctx.in(2).dtype};
  KernelContext inner(ctx, attrs, std::move(in));
  plain(inner);
}

/// The residual input of a quantized kernel at input `at` (none without has_residual): f32, or
/// with quantized_residual an i8/u8 tensor whose 0-d scale and zero point follow it.
inline quant_math::Residual residual_input(const KernelContext& ctx, int at) {
  quant_math::Residual r;
  if (!ctx.attrs().b("has_residual", false)) return r;
  const TensorView& v = ctx.in(at);
  r.data = v.data;
  if (!ctx.attrs().b("quantized_residual", false)) {
    r.kind = quant_math::Residual::kF32;
    return r;
  }
  r.kind = v.dtype == DType::u8 ? quant_math::Residual::kU8 : quant_math::Residual::kI8;
  r.scale = ctx.in(at + 1).ptr<float>();
  r.zp = ctx.in(at + 2).data;
  return r;
}

}  // namespace kiln
