// quantized_matmul on CUDA through quantized_conv's implicit GEMM (a 1x1 NHWC convolution over
// the rows of a; src/backends/cuda/qconv_igemm.cu, quantized_matmul_igemm): i8 weights whose zero
// points are a constant of zeros (fuse_quant then sets zero_w_zp), K a multiple of 64. Against the
// float64 reference of the op's definition within 1 LSB (its epilogue, GELU included, is f32), and
// within 1 LSB of the same graph with KILN_QCONV_IGEMM=0 (cuBLASLt's int8 GEMM and the exact
// epilogue). Fresh random data; linear's (N, K) and matmul's (K, N) weights, u8 and i8 data and
// results, per-tensor and per-channel scales, bias, f32 residual, relu, GELU exact and tanh, rows
// and columns not multiples of a tile, and a BERT-sized feed-forward product (128 x 128 tiles).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "core/graph_impl.h"
#include "kiln/kiln.h"
#include "kiln/ops/quant.h"
#include "passes/program.h"
#include "quant/conv_reference.h"
#include "support/executable_env.h"
#include "support/gpu.h"
#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;

struct Problem {
  int64_t m, k, n;
  DType at, yt;
  bool transpose_w, per_channel, bias, residual, relu;
  int gelu = 0;  // 1: exact, 2: tanh form
};

std::string describe(const Problem& p) {
  return fmt::format(
      "{}x{}x{} {}->{} transpose_w {} per_channel {} bias {} residual {} relu {} "
      "gelu {}",
      p.m, p.k, p.n, name(p.at), name(p.yt), p.transpose_w, p.per_channel, p.bias, p.residual,
      p.relu, p.gelu);
}

struct Data {
  Array a, w, sa, za, sw, zw, sy, zy, bias, res;
};

Data random_data(const Problem& p) {
  Data d;
  d.a = p.at == u8 ? random_ints({p.m, p.k}, 0, 255, u8) : random_ints({p.m, p.k}, -128, 127, i8);
  d.w = random_ints(p.transpose_w ? Shape{p.n, p.k} : Shape{p.k, p.n}, -127, 127, i8);
  const Shape ws = p.per_channel ? Shape{p.n} : Shape{};
  d.sa = random_array({}, f32, 0.01, 0.03);
  d.za = p.at == u8 ? random_ints({}, 100, 150, u8) : random_ints({}, -10, 10, i8);
  d.sw = random_array(ws, f32, 0.002, 0.01);
  d.zw = Array::zeros(ws, i8);
  // about one standard deviation of the products at 30-50 LSB of the output
  const double spread = 0.02 * 0.006 * 74 * 74 * std::sqrt(static_cast<double>(p.k));
  d.sy = random_array({}, f32, spread / 50, spread / 30);
  d.zy = p.yt == u8 ? random_ints({}, 100, 150, u8) : random_ints({}, -10, 10, i8);
  d.bias = random_array({p.n}, f32, -spread, spread);
  d.res = random_array({p.m, p.n}, f32, -spread, spread);
  return d;
}

std::vector<double> reference(const Problem& p, const Data& d) {
  const auto a = to_f64(d.a), w = to_f64(d.w), sw = to_f64(d.sw), bias = to_f64(d.bias),
             res = to_f64(d.res);
  const double sa = to_f64(d.sa)[0], za = to_f64(d.za)[0], sy = to_f64(d.sy)[0],
               zy = to_f64(d.zy)[0];
  std::vector<double> out;
  for (int64_t r = 0; r < p.m; ++r)
    for (int64_t j = 0; j < p.n; ++j) {
      double acc = 0;
      for (int64_t i = 0; i < p.k; ++i)
        acc += (a[r * p.k + i] - za) * w[p.transpose_w ? j * p.k + i : i * p.n + j];
      double v = acc * sa * sw[p.per_channel ? j : 0];
      if (p.bias) v += bias[j];
      if (p.residual) v += res[r * p.n + j];
      out.push_back(requantized(v, p.relu, p.gelu, sy, zy, p.yt));
    }
  return out;
}

Tensor build(Graph& g, const Problem& p, const Data& d, const Tensor& a) {
  QuantizedMatmulOptions o;
  o.transpose_w = p.transpose_w;
  o.relu = p.relu;
  if (p.gelu) o.gelu = p.gelu == 2 ? GeluApprox::tanh : GeluApprox::none;
  if (p.bias) o.bias = g.constant(d.bias);
  if (p.residual) o.residual = g.constant(d.res);
  return quantized_matmul({a, g.constant(d.sa), g.constant(d.za)},
                          {g.constant(d.w), g.constant(d.sw), g.constant(d.zw)}, g.constant(d.sy),
                          g.constant(d.zy), o);
}

// clang-format off
std::vector<Problem> problems() {
  return {{77, 64, 72, u8, u8, true, true, true, true, true},
          {130, 128, 130, i8, i8, true, false, true, false, false},
          {64, 192, 48, u8, i8, false, true, false, true, false},
          {200, 256, 96, i8, u8, false, true, true, false, true},
          {96, 128, 64, u8, u8, true, true, true, false, false, 1},
          {150, 64, 200, i8, i8, true, true, true, true, false, 2},
          {72, 128, 136, u8, u8, false, true, true, false, false, 1},
          // a BERT feed-forward's first product (batch 4 x 128 tokens), GELU inside
          {512, 768, 3072, u8, u8, true, true, true, false, false, 1}};
}
// clang-format on

// After fuse_quant, quantized_matmul carries zero_w_zp exactly when its weight zero points are a
// constant of zeros, whether the graph built the op or fuse_quant made it. Runs without a GPU.
TEST(QuantizedMatmulIgemm, SymmetricWeightsAreMarked) {
  for (const bool zero : {true, false}) {
    const Problem p{8, 64, 16, u8, u8, true, true, true, false, false};
    Data d = random_data(p);
    if (!zero) d.zw = random_ints({p.n}, -3, 3, i8);
    Graph g;
    auto a = g.placeholder({p.m, p.k}, p.at, "a");
    const Tensor built = build(g, p, d, a);
    // the same product as dequantize -> linear -> quantize
    const Tensor dw = dequantize(g.constant(d.w), g.constant(d.sw), g.constant(d.zw), {.axis = 0});
    const Tensor fused = quantize(linear(dequantize(a, g.constant(d.sa), g.constant(d.za)), dw),
                                  g.constant(d.sy), g.constant(d.zy));
    const Program q = fuse_quant(
        extract_program(*built.graph_impl(), {{built.node_id(), 0}, {fused.node_id(), 0}}));
    int marked = 0, products = 0;
    for (const auto& n : q.graph.nodes)
      if (n.op == OpId::QuantizedMatmul) {
        ++products;
        marked += n.attrs.b("zero_w_zp", false);
      }
    EXPECT_EQ(products, 2);
    EXPECT_EQ(marked, zero ? 2 : 0) << "zero weight zero points: " << zero;
  }
}

TEST(QuantizedMatmulIgemm, MatchesReferenceAndTheGemmPath) {
  REQUIRE_GPU();
  for (const Problem& p : problems()) {
    SCOPED_TRACE(describe(p));
    const Data d = random_data(p);
    auto run = [&](const char* igemm) {
      const ScopedEnv env("KILN_QCONV_IGEMM", igemm);
      Graph g;
      auto a = g.placeholder({p.m, p.k}, p.at, "a");
      const Tensor y = build(g, p, d, a);
      return g.compile(Device::cuda(0), {}, {y}).run({{a, d.a}})[0].to(Device::cpu());
    };
    const Array fast = run("1");
    const std::vector<double> ref = reference(p, d);
    expect_conv_within_lsb(fast, ref, 1);
    const Array gemm = run("0");
    expect_conv_within_lsb(gemm, ref, 1);
    expect_conv_within_lsb(fast, to_f64(gemm), 1);
  }
}

}  // namespace
}  // namespace kiln
