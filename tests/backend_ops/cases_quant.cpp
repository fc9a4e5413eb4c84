// Cases of quantize, dequantize and fake_quantize: per tensor, per channel and per group (a
// last block shorter than the others), i8 / u8 / i16 data with zero points, x spread so that
// some values saturate. Both backends compute x / scale in f32 (f64 for f64) and round half to
// even, so integer outputs must agree exactly. quantized_matmul: exact integer products and the
// same double epilogue on both backends, so its outputs agree exactly too.
#include <fmt/format.h>

#include <cmath>

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

#define KILN_QUANT_CASES(Op)         \
  const bool k##Op = register_cases( \
      {OpId::Op, 3, [](Case& c, DType t, int i) { return build(c, t, i, OpId::Op); }, kFloats});
KILN_QUANT_CASES(Quantize)
KILN_QUANT_CASES(Dequantize)
KILN_QUANT_CASES(FakeQuantize)
#undef KILN_QUANT_CASES

// (a dtype = t) x (w i8): per tensor (matmul layout) with bias; per channel (linear layout) with
// residual and relu; a 3-D a with everything.
bool build_qmm(Case& c, DType t, int i) {
  const Shape as = i == 2 ? Shape{2, 3, 40} : Shape{9, 33};
  const int64_t k = as.back(), n = i == 0 ? 7 : 16;
  Shape out(as.begin(), as.end() - 1);
  out.push_back(n);
  const bool tw = i >= 1, per_channel = i >= 1;
  const Shape ss = per_channel ? Shape{n} : Shape{};
  auto zp = [&](const Shape& s, DType d) {
    return d == u8 ? c.ints(s, 100, 150, u8) : c.ints(s, -10, 10, i8);
  };
  const Tensor a = t == u8 ? c.ints(as, 0, 255, u8) : c.ints(as, -128, 127, i8);
  const Tensor w = c.ints(tw ? Shape{n, k} : Shape{k, n}, -128, 127, i8);
  QuantizedMatmulOptions o;
  o.transpose_w = tw;
  o.relu = i >= 1;
  const double spread = 0.66 * std::sqrt(static_cast<double>(k));
  if (i != 1) o.bias = c.rand({n}, f32, -spread, spread);
  if (i >= 1) o.residual = c.rand(out, f32, -spread, spread);
  const DType yt = i == 1 ? i8 : u8;
  c.outs = {quantized_matmul({a, c.rand({}, f32, 0.01, 0.03), zp({}, t)},
                             {w, c.rand(ss, f32, 0.002, 0.01), zp(ss, i8)},
                             c.rand({}, f32, spread / 50, spread / 30), zp({}, yt), o)};
  c.grad = false;
  c.note(fmt::format("quantized_matmul a {} n {} transpose_w {} per_channel {}", to_string(as), n,
                     tw, per_channel));
  return true;
}
const bool kQmm = register_cases({OpId::QuantizedMatmul, 3, build_qmm, {i8, u8}});

}  // namespace
}  // namespace kiln::harness
