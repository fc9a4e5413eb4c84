// quantized_weight_linear and the fuse_quant rule that builds it. The op against a float64
// reference of linear(x, dequantize(w), bias), and the fused graph against the same graph
// compiled with fuse_quant off (dequantize node, f32 linear), on fresh random data. The
// tolerance allows f32 sums in any order: 1e-5 of sum |x| |w'| over K (the error of f32 sums of
// a few thousand terms is a few 1e-7 of it).
#include <fmt/format.h>

#include <cmath>

#include "kiln/ops/quant.h"
#include "support/executable_env.h"
#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;

struct Problem {
  Shape x;  // (..., K)
  int64_t n;
  DType wt;
  bool per_channel, bias;
};

std::string describe(const Problem& p) {
  return fmt::format("x {} n {} w {} per_channel {} bias {}", to_string(p.x), p.n, name(p.wt),
                     p.per_channel, p.bias);
}

struct Data {
  Array x, w, sw, zw, bias;
};

Shape out_shape(const Problem& p) {
  Shape s(p.x.begin(), p.x.end() - 1);
  s.push_back(p.n);
  return s;
}

Data random_data(const Problem& p) {
  const int64_t k = p.x.back();
  const Shape ws = p.per_channel ? Shape{p.n} : Shape{};
  Data d;
  d.x = random_array(p.x, f32, -2, 2);
  d.w = p.wt == u8 ? random_ints({p.n, k}, 0, 255, u8) : random_ints({p.n, k}, -128, 127, i8);
  d.sw = random_array(ws, f32, 0.002, 0.01);
  d.zw = p.wt == u8 ? random_ints(ws, 100, 150, u8) : random_ints(ws, -10, 10, i8);
  d.bias = random_array({p.n}, f32, -1, 1);
  return d;
}

// y and, for the tolerance, sum |x| |w'| of each output.
struct Reference {
  std::vector<double> y, magnitude;
};

Reference reference(const Problem& p, const Data& d) {
  const int64_t k = p.x.back(), m = numel(out_shape(p)) / p.n;
  const auto x = to_f64(d.x), w = to_f64(d.w), sw = to_f64(d.sw), zw = to_f64(d.zw);
  const auto bias = to_f64(d.bias);
  Reference r;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < p.n; ++j) {
      const size_t c = p.per_channel ? static_cast<size_t>(j) : 0;
      double acc = p.bias ? bias[j] : 0.0, mag = std::abs(acc);
      for (int64_t t = 0; t < k; ++t) {
        const double wv = (w[j * k + t] - zw[c]) * sw[c];
        acc += x[i * k + t] * wv;
        mag += std::abs(x[i * k + t] * wv);
      }
      r.y.push_back(acc);
      r.magnitude.push_back(mag);
    }
  return r;
}

void expect_close(const Array& y, const Reference& ref) {
  expect_close_to_magnitude(y, ref.y, ref.magnitude, 1e-5, 1e-6);
}

std::vector<Problem> problems() {
  return {{{1, 16}, 5, i8, true, true},
          {{3, 7}, 9, u8, false, true},  // K not a multiple of 4
          {{2, 5, 64}, 24, u8, true, false},
          {{32, 512}, 100, i8, true, true},  // a classifier's shape, scaled down
          {{33, 96}, 13, i8, false, false},  // a second block of rows, a partial one
          {{64, 40}, 8, u8, true, true},
          {{70, 96}, 33, i8, true, true},  // more rows than CUDA's int8 kernel takes
          {{4, 0}, 6, i8, true, true}};    // K = 0: the bias alone
}

TEST(QuantizedWeightLinear, MatchesReference) {
  for (const Problem& p : problems()) {
    SCOPED_TRACE(describe(p));
    const Data d = random_data(p);
    Graph g;
    auto px = g.placeholder(p.x, f32, "x");
    const Tensor y = quantized_weight_linear(
        px, {g.constant(d.w), g.constant(d.sw), g.constant(d.zw)},
        p.bias ? std::optional<Tensor>(g.constant(d.bias)) : std::nullopt);
    EXPECT_EQ(y.shape(), out_shape(p));
    EXPECT_EQ(y.dtype(), f32);
    expect_close(eval1(g, y, {{px, d.x}}), reference(p, d));
  }
}

TEST(QuantizedWeightLinear, FusedEqualsUnfused) {
  for (const Problem& p : problems()) {
    if (p.x.back() == 0) continue;
    SCOPED_TRACE(describe(p));
    const Data d = random_data(p);
    Graph g;
    auto px = g.placeholder(p.x, f32, "x");
    const Tensor dw = dequantize(g.constant(d.w), g.constant(d.sw), g.constant(d.zw), {.axis = 0});
    const Tensor y =
        linear(px, dw, p.bias ? std::optional<Tensor>(g.constant(d.bias)) : std::nullopt);
    CompileOptions off;
    off.fuse_quant = false;
    const Executable fused = g.compile(default_device(), {}, {y});
    const Executable plain = g.compile(default_device(), {}, {y}, off);
    EXPECT_EQ(count_steps(fused, "quantized_weight_linear"), 1) << fused.dump();
    EXPECT_EQ(count_steps(plain, "quantized_weight_linear"), 0);
    const Array yf = fused.run({{px, d.x}})[0].to(Device::cpu());
    const Array yp = plain.run({{px, d.x}})[0].to(Device::cpu());
    const Reference ref = reference(p, d);
    expect_close(yf, ref);
    expect_close(yp, ref);
    // the same f32 weights and, within the sums' order, the same products
    Reference plain_ref{to_f64(yp), ref.magnitude};
    expect_close(yf, plain_ref);
  }
}

// Scales along K (axis 1) are no per-output-channel scales: the linear stays float.
TEST(QuantizedWeightLinear, NotFusedForScalesAlongK) {
  Graph g;
  auto px = g.placeholder({4, 8}, f32, "x");
  const Array w = random_ints({6, 8}, -128, 127, i8);
  const Tensor dw = dequantize(g.constant(w), g.constant(random_array({8}, f32, 0.01, 0.02)),
                               {.axis = 1});
  const Tensor y = linear(px, dw);
  const Executable exe = g.compile(default_device(), {}, {y});
  EXPECT_EQ(count_steps(exe, "quantized_weight_linear"), 0) << exe.dump();
}

TEST(QuantizedWeightLinear, RejectsBadInputs) {
  Graph g;
  auto x = g.placeholder({4, 8}, f32, "x");
  auto s = g.constant(Array::scalar(0.1f));
  auto z8 = g.constant(Array::scalar(int8_t{0}));
  auto w = g.placeholder({3, 9}, i8, "w");
  expect_error<ShapeError>([&] { quantized_weight_linear(x, {w, s, z8}); },
                           {"[quantized_weight_linear]", "(4, 8)", "(3, 9)"});
  auto wf = g.placeholder({3, 8}, f32, "wf");
  expect_error<DTypeError>([&] { quantized_weight_linear(x, {wf, s, z8}); },
                           {"[quantized_weight_linear]", "f32"});
  auto w8 = g.placeholder({3, 8}, i8, "w8");
  auto s2 = g.constant(Array::from_vector(std::vector<float>{0.1f, 0.2f}, {2}));
  auto z2 = g.constant(Array::from_vector(std::vector<int8_t>{0, 0}, {2}));
  expect_error<ShapeError>([&] { quantized_weight_linear(x, {w8, s2, z2}); },
                           {"[quantized_weight_linear]", "(2,)", "(3,)"});
  auto xi = g.placeholder({4, 8}, i8, "xi");
  expect_error<DTypeError>([&] { quantized_weight_linear(xi, {w8, s, z8}); },
                           {"[quantized_weight_linear]", "i8"});
  auto b = g.constant(Array::from_vector(std::vector<float>{0.1f, 0.2f}, {2}));
  expect_error<ShapeError>([&] { quantized_weight_linear(x, {w8, s, z8}, b); },
                           {"[quantized_weight_linear]", "bias"});
}

}  // namespace
}  // namespace kiln
