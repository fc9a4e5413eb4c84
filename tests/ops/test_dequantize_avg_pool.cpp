// dequantize_adaptive_avg_pool and the fuse_quant rule that builds it: against a float64
// reference of adaptive_avg_pool(dequantize(q)), and the fused graph against the same graph
// compiled with fuse_quant off, on fresh random data. The tolerance allows f32 sums of the window
// in any order: 1e-6 of the window's mean magnitude (windows here have at most 64 taps).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "kiln/ops/nn.h"
#include "kiln/ops/quant.h"
#include "support/executable_env.h"
#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;

struct Problem {
  Shape q;  // (N, C, H, W)
  std::vector<int64_t> out;
  DType t;
};

std::string describe(const Problem& p) {
  return fmt::format("q {} output_size {} {}", to_string(p.q), fmt::join(p.out, "x"), name(p.t));
}

struct Data {
  Array q, s, z;
};

Data random_data(const Problem& p) {
  Data d;
  d.q = p.t == u8 ? random_ints(p.q, 0, 255, u8) : random_ints(p.q, -128, 127, i8);
  d.s = random_array({}, f32, 0.01, 0.05);
  d.z = p.t == u8 ? random_ints({}, 100, 150, u8) : random_ints({}, -10, 10, i8);
  return d;
}

// NCHW results and the mean magnitude of each window.
struct Reference {
  std::vector<double> y, magnitude;
};

Reference reference(const Problem& p, const Data& d) {
  const auto q = to_f64(d.q);
  const double s = to_f64(d.s)[0], z = to_f64(d.z)[0];
  const int64_t N = p.q[0], C = p.q[1], H = p.q[2], W = p.q[3], OH = p.out[0], OW = p.out[1];
  Reference r;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) {
          // PyTorch's adaptive windows: [floor(o in / out), ceil((o + 1) in / out))
          const int64_t h0 = oh * H / OH, h1 = ((oh + 1) * H + OH - 1) / OH;
          const int64_t w0 = ow * W / OW, w1 = ((ow + 1) * W + OW - 1) / OW;
          double sum = 0, mag = 0;
          for (int64_t h = h0; h < h1; ++h)
            for (int64_t w = w0; w < w1; ++w) {
              const double v = (q[((n * C + c) * H + h) * W + w] - z) * s;
              sum += v;
              mag += std::abs(v);
            }
          const double count = static_cast<double>((h1 - h0) * (w1 - w0));
          r.y.push_back(sum / count);
          r.magnitude.push_back(mag / count);
        }
  return r;
}

void expect_close(const Array& y, const Reference& ref) {
  expect_close_to_magnitude(y, ref.y, ref.magnitude, 1e-6, 1e-9);
}

std::vector<Problem> problems() {
  return {{{2, 5, 7, 7}, {1, 1}, u8},
          {{1, 3, 9, 6}, {2, 4}, i8},  // windows of uneven sizes, overlapping
          {{4, 64, 8, 8}, {1, 1}, i8},
          {{3, 16, 5, 7}, {5, 7}, u8}};  // one tap a window
}

TEST(DequantizeAdaptiveAvgPool, MatchesReference) {
  for (const Problem& p : problems()) {
    SCOPED_TRACE(describe(p));
    const Data d = random_data(p);
    Graph g;
    auto pq = g.placeholder(p.q, p.t, "q");
    const Tensor y = dequantize_adaptive_avg_pool({pq, g.constant(d.s), g.constant(d.z)}, p.out);
    EXPECT_EQ(y.shape(), (Shape{p.q[0], p.q[1], p.out[0], p.out[1]}));
    expect_close(eval1(g, y, {{pq, d.q}}), reference(p, d));
  }
}

// With a quantized conv before it the pool runs on NHWC data on CUDA (the channels_last pass).
TEST(DequantizeAdaptiveAvgPool, FusedEqualsUnfused) {
  for (const Problem& p : problems()) {
    SCOPED_TRACE(describe(p));
    const Data d = random_data(p);
    Graph g;
    auto pq = g.placeholder(p.q, p.t, "q");
    const Tensor y = adaptive_avg_pool(dequantize(pq, g.constant(d.s), g.constant(d.z)), p.out);
    CompileOptions off;
    off.fuse_quant = false;
    const Executable fused = g.compile(default_device(), {}, {y});
    const Executable plain = g.compile(default_device(), {}, {y}, off);
    EXPECT_EQ(count_steps(fused, "dequantize_adaptive_avg_pool"), 1) << fused.dump();
    EXPECT_EQ(count_steps(fused, "dequantize"), 0) << fused.dump();
    EXPECT_EQ(count_steps(plain, "dequantize_adaptive_avg_pool"), 0);
    const Reference ref = reference(p, d);
    expect_close(fused.run({{pq, d.q}})[0].to(Device::cpu()), ref);
    expect_close(plain.run({{pq, d.q}})[0].to(Device::cpu()), ref);
  }
}

// After an int8 conv (NHWC on CUDA and the CPU) the pool reads its NHWC output on CUDA.
TEST(DequantizeAdaptiveAvgPool, AfterAQuantizedConv) {
  Graph g;
  auto px = g.placeholder({2, 16, 9, 9}, u8, "x");
  const Array x = random_ints({2, 16, 9, 9}, 0, 255, u8),
              w = random_ints({64, 16, 3, 3}, -127, 127, i8);
  QuantizedConvOptions o;
  o.conv.padding = {1, 1};
  const Tensor s = g.constant(Array::scalar(0.02f)), sy = g.constant(Array::scalar(0.5f));
  const Tensor zx = g.constant(Array::scalar(uint8_t{128})),
               zy = g.constant(Array::scalar(uint8_t{120}));
  const Tensor q =
      quantized_conv({px, s, zx},
                     {g.constant(w), g.constant(random_array({64}, f32, 0.01, 0.02)),
                      g.constant(Array::from_vector(std::vector<int8_t>(64, 0), {64}))},
                     sy, zy, o);
  const Tensor y = adaptive_avg_pool(dequantize(q, sy, zy), {1, 1});
  CompileOptions off;
  off.fuse_quant = false;
  const Executable fused = g.compile(default_device(), {}, {y, q});
  const Executable plain = g.compile(default_device(), {}, {y}, off);
  EXPECT_EQ(count_steps(fused, "dequantize_adaptive_avg_pool"), 1) << fused.dump();
  const auto out = fused.run({{px, x}});
  const Array yp = plain.run({{px, x}})[0].to(Device::cpu());
  // the reference pools the conv's int8 result as the fused graph computed it
  const Array qv = out[1].to(Device::cpu());
  const std::vector<double> qs = to_f64(qv);
  ASSERT_GT(*std::max_element(qs.begin(), qs.end()) - *std::min_element(qs.begin(), qs.end()), 20)
      << "the conv's outputs span too little of the range";
  const Problem p{{2, 64, 9, 9}, {1, 1}, u8};
  const Reference ref = reference(p, {qv, Array::scalar(0.5f), Array::scalar(uint8_t{120})});
  expect_close(out[0].to(Device::cpu()), ref);
  expect_close(yp, ref);
}

// Per-channel scales are not fused (the op takes a per-tensor scale).
TEST(DequantizeAdaptiveAvgPool, NotFusedForPerChannelScales) {
  Graph g;
  auto pq = g.placeholder({2, 4, 5, 5}, i8, "q");
  const Tensor dq = dequantize(pq, g.constant(random_array({4}, f32, 0.01, 0.02)), {.axis = 1});
  const Executable exe = g.compile(default_device(), {}, {adaptive_avg_pool(dq, {1, 1})});
  EXPECT_EQ(count_steps(exe, "dequantize_adaptive_avg_pool"), 0) << exe.dump();
}

TEST(DequantizeAdaptiveAvgPool, RejectsBadInputs) {
  Graph g;
  auto s = g.constant(Array::scalar(0.1f));
  auto z8 = g.constant(Array::scalar(int8_t{0}));
  auto q3 = g.placeholder({2, 4, 5}, i8, "q3");
  expect_error<ShapeError>(
      [&] {
        dequantize_adaptive_avg_pool({q3, s, z8}, {1, 1});
      },
      {"[dequantize_adaptive_avg_pool]", "(2, 4, 5)"});
  auto qf = g.placeholder({2, 4, 5, 5}, f32, "qf");
  expect_error<DTypeError>(
      [&] {
        dequantize_adaptive_avg_pool({qf, s, z8}, {1, 1});
      },
      {"[dequantize_adaptive_avg_pool]", "f32"});
  auto q = g.placeholder({2, 4, 5, 5}, i8, "q");
  auto s2 = g.constant(Array::from_vector(std::vector<float>{0.1f, 0.2f}, {2}));
  auto z2 = g.constant(Array::from_vector(std::vector<int8_t>{0, 0}, {2}));
  expect_error<ShapeError>(
      [&] {
        dequantize_adaptive_avg_pool({q, s2, z2}, {1, 1});
      },
      {"[dequantize_adaptive_avg_pool]", "0-d"});
  auto zu = g.constant(Array::scalar(uint8_t{0}));
  expect_error<DTypeError>(
      [&] {
        dequantize_adaptive_avg_pool({q, s, zu}, {1, 1});
      },
      {"[dequantize_adaptive_avg_pool]", "u8"});
}

}  // namespace
}  // namespace kiln
