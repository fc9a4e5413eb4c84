// The dtype dispatch of the int8 kernels (quantized_matmul, quantized_conv) on every backend.
#pragma once

#include <cstdint>

#include "core/errors.h"
#include "kiln/kernel.h"

namespace kiln {

/// Calls f(A{}, W{}, Y{}) with the C++ types (int8_t for i8, uint8_t for u8) of a quantized
/// kernel's data (input 0), weights (input 3) and result (the dtype of input 7, its zero point);
/// any other dtype is an UnsupportedError naming the op and `backend`.
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
  one(ctx.in(0).dtype, [&](auto a) {
    one(ctx.in(3).dtype, [&](auto w) { one(ctx.in(7).dtype, [&](auto y) { f(a, w, y); }); });
  });
}

}  // namespace kiln
