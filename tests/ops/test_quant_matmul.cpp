// quantized_matmul and the fuse_quant pass. The op against a float64 reference of its definition
// (exact integer products, scale, bias, residual, relu or GELU, round half to even, saturate; within
// 1 LSB where the weights' zero points are 0 and the CPU runs the epilogue in f32 inside
// oneDNN); the fused
// graph against the same graph compiled with fuse_quant off (dequantize, f32 matmul, quantize):
// at most 1 LSB apart, on fresh random data.
#include <fmt/format.h>

#include <cmath>
#include <numeric>

#include "kiln/ops/quant.h"
#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;

struct Problem {
  Shape a;  // (..., K)
  int64_t n;
  DType at, wt, yt;
  bool per_channel, transpose_w, bias, residual, relu;
  bool w_zero = false;  // weight zero points 0 (symmetric weights: the CPU's fused oneDNN path)
  int gelu = 0;         // 1: gelu after the additions, 2: its tanh approximation
};

std::string describe(const Problem& p) {
  return fmt::format(
      "a {} n {} {}x{}->{} per_channel {} transpose_w {} bias {} residual {} relu {} w_zero {} "
      "gelu {}",
      to_string(p.a), p.n, name(p.at), name(p.wt), name(p.yt), p.per_channel, p.transpose_w, p.bias,
      p.residual, p.relu, p.w_zero, p.gelu);
}

struct Data {
  Array a, w, sa, za, sw, zw, sy, zy, bias, res;
};

Shape out_shape(const Problem& p) {
  Shape s(p.a.begin(), p.a.end() - 1);
  s.push_back(p.n);
  return s;
}

Data random_data(const Problem& p) {
  const int64_t k = p.a.back();
  Data d;
  auto ints = [](const Shape& s, DType t) {
    return t == u8 ? random_ints(s, 0, 255, u8) : random_ints(s, -128, 127, i8);
  };
  auto zero = [](const Shape& s, DType t) {
    return t == u8 ? random_ints(s, 100, 150, u8) : random_ints(s, -10, 10, i8);
  };
  d.a = ints(p.a, p.at);
  d.w = ints(p.transpose_w ? Shape{p.n, k} : Shape{k, p.n}, p.wt);
  const Shape ws = p.per_channel ? Shape{p.n} : Shape{};
  d.sa = random_array({}, f32, 0.01, 0.03);
  d.za = zero({}, p.at);
  d.sw = random_array(ws, f32, 0.002, 0.01);
  d.zw = p.w_zero ? Array::zeros(ws, p.wt) : zero(ws, p.wt);
  // about one standard deviation of the products (|a - za|, |w - zw| ~ 74 on average) at the
  // scales drawn above; the output scale puts it at 30-50 LSB
  const auto sw = to_f64(d.sw);
  const double mean_sw =
      std::accumulate(sw.begin(), sw.end(), 0.0) / static_cast<double>(sw.size());
  const double spread = to_f64(d.sa)[0] * mean_sw * 74 * 74 * std::sqrt(static_cast<double>(k));
  d.sy = random_array({}, f32, spread / 50, spread / 30);
  d.zy = zero({}, p.yt);
  d.bias = random_array({p.n}, f32, -spread, spread);
  d.res = random_array(out_shape(p), f32, -spread, spread);
  return d;
}

std::vector<double> reference(const Problem& p, const Data& d) {
  const int64_t k = p.a.back(), m = d.a.numel() / k;
  const auto a = to_f64(d.a), w = to_f64(d.w), sw = to_f64(d.sw), zw = to_f64(d.zw);
  const auto bias = to_f64(d.bias), res = to_f64(d.res);
  const double sa = to_f64(d.sa)[0], za = to_f64(d.za)[0], sy = to_f64(d.sy)[0],
               zy = to_f64(d.zy)[0];
  std::vector<double> out;
  for (int64_t r = 0; r < m; ++r)
    for (int64_t j = 0; j < p.n; ++j) {
      const size_t c = p.per_channel ? static_cast<size_t>(j) : 0;
      double acc = 0;
      for (int64_t i = 0; i < k; ++i)
        acc += (a[r * k + i] - za) * (w[p.transpose_w ? j * k + i : i * p.n + j] - zw[c]);
      double v = acc * sa * sw[c];
      if (p.bias) v += bias[j];
      if (p.residual) v += res[r * p.n + j];
      out.push_back(requantized(v, p.relu, p.gelu, sy, zy, p.yt));
    }
  return out;
}

void expect_within_lsb(const Array& y, const std::vector<double>& ref, int lsb) {
  const auto v = to_f64(y);
  ASSERT_EQ(v.size(), ref.size());
  int off = 0, bad = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    const double e = std::abs(v[i] - ref[i]);
    off += e > 0;
    if (e > lsb && bad++ < 5) ADD_FAILURE() << "element " << i << ": " << v[i] << " vs " << ref[i];
  }
  // the outputs must not be saturated or constant: the test would prove little
  double lo = 1e9, hi = -1e9;
  for (double x : ref) lo = std::min(lo, x), hi = std::max(hi, x);
  if (ref.size() >= 20) EXPECT_GT(hi - lo, 20) << "outputs span too little of the range";
  if (lsb > 0) EXPECT_LE(off, static_cast<int>(v.size()) / 10 + 1) << "too many 1-LSB differences";
}

std::vector<Problem> problems() {
  return {{{7, 33}, 17, u8, i8, u8, true, false, true, true, true},
          {{2, 3, 64}, 8, i8, i8, i8, false, true, true, false, false},
          {{5, 16}, 31, u8, u8, i8, true, true, false, true, true},
          {{64}, 5, i8, i8, u8, true, false, false, false, true},
          {{1, 257}, 3, u8, i8, u8, false, false, true, false, false},
          // large enough for the CPU's oneDNN path (where the CPU has VNNI)
          {{64, 96}, 48, u8, i8, u8, true, false, true, true, true},
          {{2, 16, 128}, 40, i8, i8, i8, true, true, true, false, false},
          // symmetric weights: the CPU's oneDNN matmul with the epilogue inside (f32: 1 LSB)
          {{64, 96}, 48, u8, i8, u8, true, false, true, true, true, true},
          {{2, 16, 128}, 40, i8, i8, i8, false, true, true, false, false, true},
          {{3, 40, 72}, 96, u8, i8, i8, true, true, false, false, true, true},
          {{50, 64}, 33, i8, i8, u8, true, true, true, true, false, true},
          // GELU after the additions (BERT's feed-forward), exact and tanh-approximated: the exact
          // epilogue and oneDNN's (with the GELU as a post-op on the real values)
          {{7, 33}, 17, u8, i8, u8, true, false, true, false, false, false, 1},
          {{5, 16}, 31, u8, u8, i8, true, true, false, true, false, false, 2},
          {{64, 96}, 48, u8, i8, u8, true, false, true, true, false, true, 1},
          {{2, 16, 128}, 40, i8, i8, i8, false, true, true, false, false, true, 2},
          {{3, 40, 72}, 96, u8, i8, u8, true, true, true, false, false, true, 1}};
}

TEST(QuantizedMatmul, MatchesReference) {
  for (const Problem& p : problems()) {
    SCOPED_TRACE(describe(p));
    const Data d = random_data(p);
    Graph g;
    auto pa = g.placeholder(p.a, p.at, "a");
    QuantizedMatmulOptions o;
    o.transpose_w = p.transpose_w;
    o.relu = p.relu;
    if (p.gelu) o.gelu = p.gelu == 2 ? GeluApprox::tanh : GeluApprox::none;
    if (p.bias) o.bias = g.constant(d.bias);
    if (p.residual) o.residual = g.constant(d.res);
    const Tensor y = quantized_matmul({pa, g.constant(d.sa), g.constant(d.za)},
                                      {g.constant(d.w), g.constant(d.sw), g.constant(d.zw)},
                                      g.constant(d.sy), g.constant(d.zy), o);
    EXPECT_EQ(y.shape(), out_shape(p));
    EXPECT_EQ(y.dtype(), p.yt);
    // (exact, but for the epilogue in f32 of symmetric weights)
    expect_within_lsb(eval1(g, y, {{pa, d.a}}), reference(p, d), p.w_zero ? 1 : 0);
  }
}

// The QDQ graph of a problem: float a quantized and dequantized, int8 weights dequantized,
// matmul or linear, bias, residual, relu or gelu, quantize.
Tensor qdq_graph(Graph& g, const Problem& p, const Data& d, const Tensor& xa) {
  const Tensor da = dequantize(xa, g.constant(d.sa), g.constant(d.za));
  const Tensor dw = dequantize(g.constant(d.w), g.constant(d.sw), g.constant(d.zw),
                               {.axis = p.transpose_w ? 0 : 1});
  Tensor y;
  if (p.transpose_w) {
    y = linear(da, dw, p.bias ? std::optional<Tensor>(g.constant(d.bias)) : std::nullopt);
  } else {
    y = matmul(da, dw);
    if (p.bias) y = g.constant(d.bias) + y;
  }
  if (p.residual) y = y + g.constant(d.res);
  if (p.relu) y = relu(y);
  if (p.gelu) y = gelu(y, p.gelu == 2 ? GeluApprox::tanh : GeluApprox::none);
  return quantize(y, g.constant(d.sy), g.constant(d.zy));
}

int count_steps(const Executable& exe, const std::string& op) {
  int c = 0;
  for (const auto& s : exe.placement()) c += s.op == op;
  return c;
}

TEST(QuantizedMatmul, FusedEqualsUnfusedWithinOneLsb) {
  for (const Problem& p : problems()) {
    SCOPED_TRACE(describe(p));
    const Data d = random_data(p);
    Graph g;
    auto pa = g.placeholder(p.a, p.at, "a");
    const Tensor y = qdq_graph(g, p, d, pa);
    CompileOptions off;
    off.fuse_quant = false;
    const Executable fused = g.compile(default_device(), {}, {y});
    const Executable plain = g.compile(default_device(), {}, {y}, off);
    EXPECT_EQ(count_steps(fused, "quantized_matmul"), 1) << fused.dump();
    EXPECT_EQ(fused.num_steps(), 1u) << fused.dump();  // the activation inside too
    EXPECT_EQ(count_steps(plain, "quantized_matmul"), 0);
    const Array yf = fused.run({{pa, d.a}})[0].to(Device::cpu());
    const Array yp = plain.run({{pa, d.a}})[0].to(Device::cpu());
    expect_within_lsb(yf, to_f64(yp), 1);
  }
}

TEST(QuantizedMatmul, NotFusedWhenAnIntermediateIsReadElsewhere) {
  const Problem p{{64, 16}, 12, u8, i8, u8, false, false, true, false, true};
  const Data d = random_data(p);
  Graph g;
  auto pa = g.placeholder(p.a, p.at, "a");
  const Tensor da = dequantize(pa, g.constant(d.sa), g.constant(d.za));
  const Tensor mm =
      matmul(da, dequantize(g.constant(d.w), g.constant(d.sw), g.constant(d.zw), {.axis = 1}));
  const Tensor y = quantize(relu(mm), g.constant(d.sy), g.constant(d.zy));
  const Executable exe = g.compile(default_device(), {}, {y, mm});
  EXPECT_EQ(count_steps(exe, "quantized_matmul"), 0);
  const auto out = exe.run({{pa, d.a}});
  // the float product is still returned, and the quantized result matches the reference
  Problem r = p;
  r.bias = false;
  expect_within_lsb(out[0].to(Device::cpu()), reference(r, d), 1);
}

TEST(QuantizedMatmul, RejectsBadInputs) {
  Graph g;
  auto a = g.placeholder({4, 8}, i8, "a");
  auto s = g.constant(Array::scalar(0.1f));
  auto z8 = g.constant(Array::scalar(int8_t{0}));
  auto w = g.placeholder({9, 3}, i8, "w");
  expect_error<ShapeError>(
      [&] {
        quantized_matmul({a, s, z8}, {w, s, z8}, s, z8);
      },
      {"[quantized_matmul]", "(4, 8)", "(9, 3)"});
  auto wf = g.placeholder({8, 3}, f32, "wf");
  expect_error<DTypeError>(
      [&] {
        quantized_matmul({a, s, z8}, {wf, s, z8}, s, z8);
      },
      {"[quantized_matmul]", "f32"});
  auto w8 = g.placeholder({8, 3}, i8, "w8");
  auto s2 = g.constant(Array::from_vector(std::vector<float>{0.1f, 0.2f}, {2}));
  expect_error<ShapeError>(
      [&] {
        quantized_matmul({a, s2, z8}, {w8, s, z8}, s, z8);
      },
      {"[quantized_matmul]", "0-d"});
  QuantizedMatmulOptions both;
  both.relu = true;
  both.gelu = GeluApprox::none;
  expect_error<ValueError>(
      [&] {
        quantized_matmul({a, s, z8}, {w8, s, z8}, s, z8, both);
      },
      {"[quantized_matmul]", "relu or gelu"});
}

// A conv's relu or gelu fuses into quantized_conv like a matmul's (the values: the conv fusion
// tests' GELU problems).
TEST(QuantizedMatmul, ConvActivationsFuse) {
  const Array w = random_ints({8, 4, 3, 3}, -127, 127, i8);
  for (bool with_gelu : {true, false}) {
    SCOPED_TRACE(with_gelu ? "gelu" : "relu");
    Graph g;
    auto x = g.placeholder({1, 4, 6, 6}, u8, "x");
    const Tensor dx =
        dequantize(x, g.constant(Array::scalar(0.02f)), g.constant(Array::scalar(uint8_t{128})));
    const Tensor c = conv2d(dx, dequantize(g.constant(w), g.constant(Array::scalar(0.01f))));
    const Tensor y = quantize(with_gelu ? gelu(c) : relu(c), g.constant(Array::scalar(0.05f)),
                              g.constant(Array::scalar(uint8_t{100})));
    const Executable exe = g.compile(Device::cpu(), {}, {y});
    EXPECT_EQ(count_steps(exe, "quantized_conv"), 1) << exe.dump();
    EXPECT_EQ(count_steps(exe, with_gelu ? "gelu" : "relu"), 0) << exe.dump();
    EXPECT_EQ(count_steps(exe, "quantize") + count_steps(exe, "dequantize"), 0) << exe.dump();
  }
}

}  // namespace
}  // namespace kiln
