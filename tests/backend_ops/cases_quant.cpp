// Cases of quantize, dequantize and fake_quantize: per tensor, per channel and per group (a
// last block shorter than the others), i8 / u8 / i16 data with zero points, x spread so that
// some values saturate. Both backends compute x / scale in f32 (f64 for f64) and round half to
// even, so integer outputs must agree exactly.
#include <fmt/format.h>

#include "backend_ops/harness.h"
#include "kiln/ops/quant.h"

namespace kiln::harness {
namespace {

struct QuantCase {
  Shape x;
  int64_t axis, block;
  bool per_tensor;
  DType q;
};
const QuantCase kCases[] = {
    {{4099}, 0, 0, true, i8},
    {{3, 5, 7}, 1, 0, false, u8},
    {{6, 10}, 1, 4, false, i16},
};

Shape scale_shape(const QuantCase& k) {
  if (k.per_tensor) return {};
  if (k.block == 0) return {k.x[static_cast<size_t>(k.axis)]};
  Shape s = k.x;
  s[static_cast<size_t>(k.axis)] = (s[static_cast<size_t>(k.axis)] + k.block - 1) / k.block;
  return s;
}

bool build(Case& c, DType t, int i, OpId op) {
  const QuantCase& k = kCases[i];
  const Shape ss = scale_shape(k);
  const int64_t zlo = k.q == u8 ? 100 : -20, zhi = k.q == u8 ? 150 : 20;
  const double span = k.q == i16 ? 400 : 6;
  const QuantizeOptions o{k.axis, k.block};
  const Tensor zp = c.ints(ss, zlo, zhi, k.q);
  const Tensor s = c.rand(ss, t, 0.01, 0.05);
  if (op == OpId::Dequantize) {
    c.outs = {dequantize(c.ints(k.x, k.q == u8 ? 0 : -100, 100, k.q), s, zp, o)};
  } else {
    const Tensor x = c.rand(k.x, t, -span, span);
    c.outs = {op == OpId::Quantize ? quantize(x, s, zp, o) : fake_quantize(x, s, zp, o)};
    c.grad = op == OpId::FakeQuantize;
  }
  c.note(fmt::format("{} x {} scale {} axis {} block {} {}", op_name(op), to_string(k.x),
                     to_string(ss), k.axis, k.block, name(k.q)));
  return true;
}

const std::vector<DType> kFloats = {f32, f16, bf16, f64};

#define KILN_QUANT_CASES(Op)                                                                    \
  const bool k##Op = register_cases(                                                           \
      {OpId::Op, 3, [](Case& c, DType t, int i) { return build(c, t, i, OpId::Op); }, kFloats});
KILN_QUANT_CASES(Quantize)
KILN_QUANT_CASES(Dequantize)
KILN_QUANT_CASES(FakeQuantize)
#undef KILN_QUANT_CASES

}  // namespace
}  // namespace kiln::harness
