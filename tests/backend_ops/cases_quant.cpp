// Cases of quantize, dequantize and fake_quantize: per tensor, per channel and per group (a
// last block shorter than the others), i8 / u8 / i16 / u16 data with zero points, x spread so that
// some values saturate. Both backends compute x / scale in f32 (f64 for f64) and round half to
// even, so integer outputs must agree exactly. quantized_matmul: exact integer products and the
// same double epilogue on both backends, so its outputs agree exactly too; quantized_conv alike.
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
    {{5, 9}, 0, 2, false, u16},
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
  const int64_t zlo = k.q == u8 ? 100 : k.q == u16 ? 30000 : -20;
  const int64_t zhi = k.q == u8 ? 150 : k.q == u16 ? 35000 : 20;
  const double span = k.q == i16 || k.q == u16 ? 400 : 6;
  const QuantizeOptions o{k.axis, k.block};
  const Tensor zp = c.ints(ss, zlo, zhi, k.q);
  const Tensor s = c.rand(ss, t, 0.01, 0.05);
  if (op == OpId::Dequantize) {
    const int64_t lo = k.q == u8 ? 0 : k.q == u16 ? 29000 : -100, hi = k.q == u16 ? 36000 : 100;
    c.outs = {dequantize(c.ints(k.x, lo, hi, k.q), s, zp, o)};
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

#define KILN_QUANT_CASES(Op)                                         \
  const bool k##Op =                                                 \
      register_cases({OpId::Op, static_cast<int>(std::size(kCases)), \
                      [](Case& c, DType t, int i) { return build(c, t, i, OpId::Op); }, kFloats});
KILN_QUANT_CASES(Quantize)
KILN_QUANT_CASES(Dequantize)
KILN_QUANT_CASES(FakeQuantize)
#undef KILN_QUANT_CASES

// (a dtype = t) x (w i8): per tensor (matmul layout) with bias; per channel (linear layout) with
// residual and relu; a 3-D a with everything. Cases 3-5 are large with K and N multiples of 4,
// for cuBLASLt's int8 path on CUDA: linear layout (w used in place), matmul layout (w transposed
// into scratch), u8 weights with zero points (shifted to i8; 72 x 48 x 64 is under the path's
// 2^18, so the exact kernel). Cases 6-8 take u8 weights: large (cuBLASLt's path) with an i8
// result, then a u8 one in the matmul layout, and small (the exact kernel) with an i8 result.
bool build_qmm(Case& c, DType t, int i) {
  const Shape shapes[] = {{9, 33},  {9, 33},  {2, 3, 40},  {64, 128}, {2, 40, 96},
                          {72, 64}, {64, 64}, {2, 32, 64}, {5, 12}};
  const int64_t ns[] = {7, 16, 16, 96, 64, 48, 64, 64, 6};
  const Shape as = shapes[i];
  const int64_t k = as.back(), n = ns[i];
  Shape out(as.begin(), as.end() - 1);
  out.push_back(n);
  const bool tw = i >= 1 && i != 4 && i != 7, per_channel = tw;
  const DType wt = i >= 5 ? u8 : i8;
  const Shape ss = per_channel ? Shape{n} : Shape{};
  auto zp = [&](const Shape& s, DType d) {
    return d == u8 ? c.ints(s, 100, 150, u8) : c.ints(s, -10, 10, i8);
  };
  const Tensor a = t == u8 ? c.ints(as, 0, 255, u8) : c.ints(as, -128, 127, i8);
  const Shape wshape = tw ? Shape{n, k} : Shape{k, n};
  const Tensor w = wt == u8 ? c.ints(wshape, 0, 255, u8) : c.ints(wshape, -128, 127, i8);
  QuantizedMatmulOptions o;
  o.transpose_w = tw;
  o.relu = i >= 1;
  const double spread = 0.66 * std::sqrt(static_cast<double>(k));
  if (i != 1) o.bias = c.rand({n}, f32, -spread, spread);
  if (i >= 1) o.residual = c.rand(out, f32, -spread, spread);
  const DType yt = i == 1 || i == 6 || i == 8 ? i8 : u8;
  c.outs = {quantized_matmul({a, c.rand({}, f32, 0.01, 0.03), zp({}, t)},
                             {w, c.rand(ss, f32, 0.002, 0.01), zp(ss, wt)},
                             c.rand({}, f32, spread / 50, spread / 30), zp({}, yt), o)};
  c.grad = false;
  c.note(fmt::format("quantized_matmul a {} n {} transpose_w {} per_channel {} w {} y {}",
                     to_string(as), n, tw, per_channel, name(wt), name(yt)));
  return true;
}
const bool kQmm = register_cases({OpId::QuantizedMatmul, 9, build_qmm, {i8, u8}});

// (x f32) i8 weights per channel with a bias, u8 weights per tensor, a K that is no multiple of
// 4, a batch of 32 (CUDA's int8 kernel), one of 80 rows (its dequantized copy and cuBLASLt), and
// one of 70 rows with u8 weights per channel.
bool build_qwl(Case& c, DType, int i) {
  const Shape xs[] = {{5, 64}, {2, 3, 48}, {6, 30}, {32, 256}, {80, 64}, {70, 32}};
  const int64_t ns[] = {24, 16, 7, 40, 12, 12};
  const int64_t k = xs[i].back(), n = ns[i];
  const DType wt = i == 1 || i == 5 ? u8 : i8;
  const Shape ss = i == 1 ? Shape{} : Shape{n};
  const Tensor w = wt == u8 ? c.ints({n, k}, 0, 255, u8) : c.ints({n, k}, -128, 127, i8);
  const Tensor zw = wt == u8 ? c.ints(ss, 100, 150, u8) : c.ints(ss, -10, 10, i8);
  const std::optional<Tensor> bias =
      i == 2 ? std::nullopt : std::optional<Tensor>(c.rand({n}, f32, -1, 1));
  c.outs = {quantized_weight_linear(c.rand(xs[i], f32, -2, 2),
                                    {w, c.rand(ss, f32, 0.002, 0.01), zw}, bias)};
  c.grad = false;
  c.note(fmt::format("quantized_weight_linear x {} n {} w {}", to_string(xs[i]), n, name(wt)));
  return true;
}
const bool kQwl = register_cases({OpId::QuantizedWeightLinear, 6, build_qwl, {f32}});

// (q = t) a global pool of a ResNet tail's shape, scaled down; uneven overlapping windows
bool build_dq_pool(Case& c, DType t, int i) {
  const Shape qs = i == 0 ? Shape{4, 64, 7, 7} : Shape{2, 3, 9, 6};
  const std::vector<int64_t> out = i == 0 ? std::vector<int64_t>{1, 1} : std::vector<int64_t>{2, 4};
  const Tensor q = t == u8 ? c.ints(qs, 0, 255, u8) : c.ints(qs, -128, 127, i8);
  const Tensor z = t == u8 ? c.ints({}, 100, 150, u8) : c.ints({}, -10, 10, i8);
  c.outs = {dequantize_adaptive_avg_pool({q, c.rand({}, f32, 0.01, 0.05), z}, out)};
  c.grad = false;
  c.note(fmt::format("dequantize_adaptive_avg_pool q {}", to_string(qs)));
  return true;
}
const bool kDqPool = register_cases({OpId::DequantizeAdaptiveAvgPool, 2, build_dq_pool, {i8, u8}});

// (x dtype = t) conv with w i8: padded 3x3 per channel with bias, residual and relu; strided,
// dilated, grouped with asymmetric pads and per-tensor weights; depthwise with relu; a 1x1 with
// u8 weights and zero points, an i32 bias; two large ones (groups 1) for CUDA's cuBLASLt path,
// the second strided with asymmetric pads, u8 weights and an i32 bias. With i8 results: a grouped
// one with u8 weights (CUDA's exact kernel), and two large ones (cuBLASLt's path), i8 weights with
// relu and an i32 bias, dilated u8 weights with a residual.
bool build_qconv(Case& c, DType t, int i) {
  struct G {
    Shape x;
    int64_t o, kh, kw, groups;
    std::vector<int64_t> stride, pads, dilation;
  };
  const G gs[] = {{{2, 4, 9, 9}, 8, 3, 3, 1, {1, 1}, {1, 1, 1, 1}, {1, 1}},
                  {{1, 6, 11, 10}, 4, 3, 2, 2, {2, 1}, {0, 1, 2, 0}, {1, 2}},
                  {{2, 8, 8, 8}, 8, 3, 3, 8, {2, 2}, {1, 1, 1, 1}, {1, 1}},
                  {{1, 5, 6, 7}, 6, 1, 1, 1, {1, 1}, {0, 0, 0, 0}, {1, 1}},
                  // large, groups 1: CUDA's im2col + cuBLASLt path
                  {{2, 16, 12, 12}, 32, 3, 3, 1, {1, 1}, {1, 1, 1, 1}, {1, 1}},
                  {{2, 16, 17, 16}, 32, 3, 3, 1, {2, 2}, {1, 0, 1, 1}, {1, 1}},
                  // i8 results
                  {{1, 4, 7, 6}, 6, 3, 3, 2, {1, 1}, {1, 1, 1, 1}, {1, 1}},
                  {{2, 8, 12, 12}, 16, 3, 3, 1, {1, 1}, {1, 1, 1, 1}, {1, 1}},
                  {{2, 8, 12, 12}, 16, 3, 3, 1, {1, 1}, {2, 2, 2, 2}, {2, 2}}};
  const G& g = gs[i];
  const int64_t k = g.x[1] / g.groups * g.kh * g.kw;
  const bool per_channel = i != 1;
  const Shape ss = per_channel ? Shape{g.o} : Shape{};
  auto zp = [&](const Shape& s, DType d) {
    return d == u8 ? c.ints(s, 100, 150, u8) : c.ints(s, -10, 10, i8);
  };
  const DType wt = i == 3 || i == 5 || i == 6 || i == 8 ? u8 : i8;
  const Tensor x = t == u8 ? c.ints(g.x, 0, 255, u8) : c.ints(g.x, -128, 127, i8);
  const Tensor w = wt == u8 ? c.ints({g.o, g.x[1] / g.groups, g.kh, g.kw}, 0, 255, u8)
                            : c.ints({g.o, g.x[1] / g.groups, g.kh, g.kw}, -128, 127, i8);
  QuantizedConvOptions o;
  o.conv.stride = g.stride;
  o.conv.padding = g.pads;
  o.conv.dilation = g.dilation;
  o.conv.groups = g.groups;
  o.relu = i == 0 || i == 2 || i == 4 || i == 7;
  const double spread = 0.66 * std::sqrt(static_cast<double>(k));
  if (i <= 1 || i == 4 || i == 6) o.bias = c.rand({g.o}, f32, -spread, spread);
  if (i == 3 || i == 5 || i == 7) o.bias = c.ints({g.o}, -500, 500, i32);
  const DType yt = i == 1 || i >= 6 ? i8 : u8;
  const Tensor xs = c.rand({}, f32, 0.01, 0.03), ys = c.rand({}, f32, spread / 50, spread / 30);
  // residuals of the output's shape
  if (i == 0) o.residual = c.rand({2, 8, 9, 9}, f32, -spread, spread);
  if (i == 4) o.residual = c.rand({2, 32, 12, 12}, f32, -spread, spread);
  if (i == 8) o.residual = c.rand({2, 16, 12, 12}, f32, -spread, spread);
  c.outs = {quantized_conv({x, xs, zp({}, t)}, {w, c.rand(ss, f32, 0.002, 0.01), zp(ss, wt)}, ys,
                           zp({}, yt), o)};
  c.grad = false;
  c.note(fmt::format("quantized_conv x {} o {} k {}x{} groups {} per_channel {} w {} y {}",
                     to_string(g.x), g.o, g.kh, g.kw, g.groups, per_channel, name(wt), name(yt)));
  return true;
}
const bool kQconv = register_cases({OpId::QuantizedConv, 9, build_qconv, {i8, u8}});

}  // namespace
}  // namespace kiln::harness
