// The channels_last pass (src/passes/channels_last.cpp): a QDQ residual block of two int8
// convolutions keeps its int8 values NHWC between them on the CPU, with transposes only where
// NCHW readers meet them, and computes within 1 LSB of the same graph compiled with the pass off
// (KILN_CHANNELS_LAST=0), on fresh random data. On CUDA a bf16 residual block of float convs
// goes NHWC likewise (cuDNN's tensor-core layout) and keeps its results.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <string>

#include "core/graph_impl.h"
#include "core/op_registry.h"
#include "kiln/kiln.h"
#include "kiln/ops/quant.h"
#include "passes/program.h"
#include "support/executable_env.h"
#include "support/gpu.h"
#include "support/nets.h"
#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;

struct Block {
  Graph g;
  Tensor x, y, pooled;
};

// x (u8) -> conv a + relu -> quantize -> conv b + residual dequantize(x) + relu -> quantize (y,
// returned int8) -> dequantize -> max_pool (pooled, returned f32).
void build_block(Block& b, int64_t n, int64_t c, int64_t hw) {
  Graph& g = b.g;
  b.x = g.placeholder({n, c, hw, hw}, u8, "x");
  const float sx = 0.05f;
  const Tensor s_x = g.constant(Array::scalar(sx)), z_x = g.constant(Array::scalar(uint8_t{3}));
  auto weights = [&](int64_t o, int64_t ci, int64_t k) {
    const Tensor w = g.constant(random_ints({o, ci, k, k}, -90, 90, i8));
    const Tensor sw = g.constant(random_array({o}, f32, 0.002, 0.004));
    const Tensor zw = g.constant(Array::zeros({o}, i8));
    return dequantize(w, sw, zw, {.axis = 0});
  };
  const Tensor dx = dequantize(b.x, s_x, z_x);
  ConvOptions same;
  same.padding = {1, 1, 1, 1};
  const Tensor a =
      relu(conv2d(dx, weights(c, c, 3), g.constant(random_array({c}, f32, -0.2, 0.2)), same));
  const Tensor s_a = g.constant(Array::scalar(0.04f)), z_a = g.constant(Array::scalar(uint8_t{0}));
  const Tensor da = dequantize(quantize(a, s_a, z_a), s_a, z_a);
  const Tensor r = relu(conv2d(da, weights(c, c, 1), std::nullopt, {}) + dx);
  const Tensor s_y = g.constant(Array::scalar(0.06f)), z_y = g.constant(Array::scalar(uint8_t{0}));
  b.y = quantize(r, s_y, z_y);
  b.pooled = max_pool(dequantize(b.y, s_y, z_y), {.kernel = {2, 2}});
}

TEST(ChannelsLast, ResidualBlockStaysNhwcWithinOneLsb) {
  Block b;
  build_block(b, 2, 16, 12);
  const Array x = random_ints({2, 16, 12, 12}, 0, 255, u8);
  const Executable on = b.g.compile(Device::cpu(), {}, {b.y, b.pooled});
  std::optional<Executable> off;
  {
    const ScopedEnv env("KILN_CHANNELS_LAST", "0");
    off = b.g.compile(Device::cpu(), {}, {b.y, b.pooled});
  }
  EXPECT_EQ(count_steps(on, "quantized_conv"), 2) << on.dump();
  EXPECT_EQ(count_steps(*off, "quantized_conv"), 2);
  // x in; y out (int8, before its dequantize: max_pool reads NCHW); nothing between the convs
  EXPECT_EQ(count_steps(on, "transpose"), 2) << on.dump();
  EXPECT_EQ(count_steps(*off, "transpose"), 0);
  const auto want = off->run({{b.x, x}});
  const auto got = on.run({{b.x, x}});
  ASSERT_EQ(got[0].shape(), want[0].shape());
  const auto y1 = to_f64(got[0]), y0 = to_f64(want[0]);
  int differ = 0;
  double lo = 1e9, hi = -1e9;
  for (size_t i = 0; i < y0.size(); ++i) {
    EXPECT_LE(std::abs(y1[i] - y0[i]), 1) << "element " << i;
    differ += y1[i] != y0[i];
    lo = std::min(lo, y0[i]), hi = std::max(hi, y0[i]);
  }
  EXPECT_LE(differ, static_cast<int>(y0.size()) / 10 + 1);
  EXPECT_GT(hi - lo, 20) << "outputs span too little of the range";
  // the pooled values within one LSB of y's scale
  expect_close(got[1], want[1].shape(), to_f64(want[1]), 0, 0.06 + 1e-6);
}

// A quantized conv whose weight zero points are a constant of zeros is marked so (zero_w_zp: the
// CUDA kernel then skips the window sums of x); one with other zero points is not.
// CompileOptions::kernels.channels_last turns the pass off per executable; KILN_CHANNELS_LAST,
// when set, overrides the option either way at compile time (and only then).
TEST(ChannelsLast, OptionTurnsThePassOffAndTheEnvironmentOverridesIt) {
  Block b;
  build_block(b, 1, 8, 6);
  CompileOptions off;
  off.kernels.channels_last = false;
  auto transposes = [&](const CompileOptions& o) {
    return count_steps(b.g.compile(Device::cpu(), {}, {b.y}, o), "transpose");
  };
  EXPECT_EQ(transposes({}), 2);
  EXPECT_EQ(transposes(off), 0);
  std::optional<Executable> compiled_under_zero;
  {
    const ScopedEnv env("KILN_CHANNELS_LAST", "0");
    EXPECT_EQ(transposes({}), 0);
    compiled_under_zero = b.g.compile(Device::cpu(), {}, {b.y});
  }
  {
    const ScopedEnv env("KILN_CHANNELS_LAST", "1");
    EXPECT_EQ(transposes(off), 2);
  }
  EXPECT_EQ(count_steps(*compiled_under_zero, "transpose"), 0);
  const Array x = random_ints({1, 8, 6, 6}, 0, 255, u8);
  const Array want = compiled_under_zero->run({{b.x, x}})[0];
  const Array got = b.g.compile(Device::cpu(), {}, {b.y}).run({{b.x, x}})[0];
  const auto y0 = to_f64(want), y1 = to_f64(got);
  ASSERT_EQ(y0.size(), y1.size());
  for (size_t i = 0; i < y0.size(); ++i) EXPECT_LE(std::abs(y1[i] - y0[i]), 1) << "element " << i;
}

TEST(ChannelsLast, MarksSymmetricWeightZeroPoints) {
  for (bool zero : {true, false}) {
    Graph g;
    const Tensor x = g.placeholder({2, 32, 12, 12}, u8, "x");
    const Tensor s_x = g.constant(Array::scalar(0.05f)), z_x = g.constant(Array::scalar(uint8_t{3}));
    const Tensor w = dequantize(g.constant(random_ints({32, 32, 3, 3}, -90, 90, i8)),
                                g.constant(random_array({32}, f32, 0.001, 0.002)),
                                g.constant(zero ? Array::zeros({32}, i8) : random_ints({32}, 1, 5, i8)),
                                {.axis = 0});
    ConvOptions same;
    same.padding = {1, 1, 1, 1};
    const Tensor y = quantize(relu(conv2d(dequantize(x, s_x, z_x), w, std::nullopt, same)),
                              g.constant(Array::scalar(0.1f)), g.constant(Array::scalar(uint8_t{0})));
    const Program p = fuse_quant(extract_program(*y.graph_impl(), {{y.node_id(), 0}}));
    const Program q = channels_last(p, Backend::cpu);
    int convs = 0;
    for (const auto& n : q.graph.nodes)
      if (n.op == OpId::QuantizedConv) {
        ++convs;
        EXPECT_EQ(n.attrs.b("zero_w_zp", false), zero);
      }
    EXPECT_EQ(convs, 1);
    if (cuda_device_count() == 0) continue;
    // CUDA's int8 GEMM path (big enough for it; with and without the window sums) against the
    // CPU, within 1 LSB
    const Array xv = random_ints({2, 32, 12, 12}, 0, 255, u8);
    const auto want = to_f64(g.compile(Device::cpu(), {}, {y}).run({{x, xv}})[0]);
    const auto got =
        to_f64(g.compile(Device::cuda(0), {}, {y}).run({{x, xv}})[0].to(Device::cpu()));
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_LE(std::abs(got[i] - want[i]), 1) << i;
  }
}

// Readers of an NHWC value that need NCHW share one transpose; an output of the program is NCHW.
TEST(ChannelsLast, OutputsStayNchwAndTransposesAreShared) {
  Block b;
  build_block(b, 1, 8, 8);
  const Tensor extra = relu(
      dequantize(b.y, b.g.constant(Array::scalar(0.06f)), b.g.constant(Array::scalar(uint8_t{0}))));
  const Executable on = b.g.compile(Device::cpu(), {}, {b.y, b.pooled, extra});
  EXPECT_EQ(count_steps(on, "transpose"), 2) << on.dump();
  const Array x = random_ints({1, 8, 8, 8}, 0, 255, u8);
  const auto out = on.run({{b.x, x}});
  EXPECT_EQ(out[0].shape(), (Shape{1, 8, 8, 8}));
  EXPECT_EQ(out[2].shape(), (Shape{1, 8, 8, 8}));
}

// The pass for a CUDA target, on the program alone (no GPU needed): bf16 convs go NHWC with
// their weights permuted once, the residual add and relus fold into the convs' epilogues, and
// transposes stand only at the edges.
TEST(ChannelsLast, CudaTargetProgramShape) {
  Graph g;
  const Tensor x = g.placeholder({2, 8, 6, 6}, bf16, "x");
  const Array w3 = random_array({8, 8, 3, 3}, bf16);
  ConvOptions same;
  same.padding = {1, 1, 1, 1};
  const Tensor a = relu(conv2d(x, g.constant(w3), g.constant(random_array({8}, bf16)), same));
  const Tensor r =
      relu(conv2d(a, g.constant(random_array({8, 8, 1, 1}, bf16)), std::nullopt, {}) + x);
  const Tensor y = max_pool(r, {.kernel = {2, 2}});
  Program p = extract_program(*y.graph_impl(), {{y.node_id(), 0}});
  const Program q = channels_last(p, Backend::cuda);
  int convs = 0, transposes = 0, others = 0;
  for (const auto& n : q.graph.nodes) {
    EXPECT_NE(n.op, OpId::Conv);  // each conv has an epilogue: fused_conv
    if (n.op == OpId::FusedConv) {
      ++convs;
      EXPECT_TRUE(n.attrs.b("channels_last", false));
      EXPECT_TRUE(n.attrs.b("relu", false));
      const auto& ws = q.graph.info(n.inputs[1]).shape;
      EXPECT_EQ(q.graph.nodes[n.inputs[1].node].op, OpId::Constant);  // permuted at compile time
      if (ws[1] == 3) {
        // (O, kh, kw, C): element (o, h, w, c) is w3's (o, c, h, w)
        const auto got = to_f64(q.graph.nodes[n.inputs[1].node].value), want = to_f64(w3);
        for (int64_t o = 0; o < 8; ++o)
          for (int64_t c = 0; c < 8; ++c)
            for (int64_t h = 0; h < 3; ++h)
              for (int64_t w = 0; w < 3; ++w)
                ASSERT_EQ(got[((o * 3 + h) * 3 + w) * 8 + c], want[((o * 8 + c) * 3 + h) * 3 + w]);
      } else {
        EXPECT_TRUE(n.attrs.b("has_residual", false));  // the 1x1 conv takes x as its residual
      }
    }
    if (n.op == OpId::MaxPool) EXPECT_TRUE(n.attrs.b("channels_last", false));
    transposes += n.op == OpId::Transpose;
    others += n.op == OpId::Relu || n.op == OpId::Add;
  }
  EXPECT_EQ(convs, 2);
  EXPECT_EQ(transposes, 2);  // x in, the max-pool's NHWC output out
  EXPECT_EQ(others, 0);
  // for the CPU target float convs stay as they were
  const Program cpu = channels_last(p, Backend::cpu);
  for (const auto& n : cpu.graph.nodes) EXPECT_FALSE(n.attrs.b("channels_last", false));
}

// A ResNet-like stem and head for a CUDA target: max pooling and global average pooling between
// NHWC convs run on NHWC too, and the pooled (N, 1, 1, C) value reaches the classifier through a
// reshape, not a transpose: one transpose in all, the input's.
Graph pooled_net(Tensor& x, Tensor& logits) { return test::pooled_net(x, logits, bf16); }

TEST(ChannelsLast, CudaTargetPoolsStayNhwc) {
  Tensor x, logits;
  const Graph g = pooled_net(x, logits);
  const Program p = extract_program(*logits.graph_impl(), {{logits.node_id(), 0}});
  const Program q = channels_last(p, Backend::cuda);
  int transposes = 0, reshapes = 0, pools = 0;
  for (const auto& n : q.graph.nodes) {
    if (n.op == OpId::MaxPool || n.op == OpId::AdaptiveAvgPool) {
      ++pools;
      EXPECT_TRUE(n.attrs.b("channels_last", false)) << op_name(n.op);
    }
    transposes += n.op == OpId::Transpose;
    reshapes += n.op == OpId::Reshape;
  }
  EXPECT_EQ(pools, 2);
  EXPECT_EQ(transposes, 1);  // the input's
  EXPECT_EQ(reshapes, 2);    // (N, 1, 1, C) -> (N, C, 1, 1), then the program's own
  // the CPU target keeps float pools as they were
  for (const auto& n : channels_last(p, Backend::cpu).graph.nodes)
    EXPECT_FALSE(n.attrs.b("channels_last", false));
}

TEST(ChannelsLast, CudaPooledNetMatchesNchw) {
  REQUIRE_GPU();
  Tensor x, logits;
  const Graph g = pooled_net(x, logits);
  const Executable on = g.compile(Device::cuda(0), {}, {logits});
  std::optional<Executable> off;
  {
    const ScopedEnv env("KILN_CHANNELS_LAST", "0");
    off = g.compile(Device::cuda(0), {}, {logits});
  }
  EXPECT_EQ(count_steps(on, "transpose"), 1) << on.dump();
  const Array xv = random_array({2, 3, 20, 20}, bf16);
  const Array want = off->run({{x, xv}})[0].to(Device::cpu());
  // Two bf16 runs whose convolutions may take other cuDNN algorithms (timed per process; under
  // compute-sanitizer other ones again): each layer rounds to bf16 (8 bits) at other points, so
  // a logit that is a small sum of larger terms may differ by a few hundredths (0.04 of a logit
  // of 0.10 under memcheck); the bound scales with the logits, a layout fault would move them
  // by their own size.
  const std::vector<double> ref = to_f64(want);
  double scale = 0;
  for (double v : ref) scale = std::max(scale, std::fabs(v));
  for (int run = 0; run < 2; ++run)
    expect_close(on.run({{x, xv}})[0].to(Device::cpu()), want.shape(), ref, 3e-2,
                 std::max(3e-2, 3e-2 * scale));
}

// A dequantize and global average pool of an int8 conv's i8 result: for a CUDA target the fused
// dequantize_adaptive_avg_pool reads the conv's NHWC output (channels_last); on CUDA four channels
// a thread (32 channels), within f32 rounding of a float64 pool of the conv's int8 result.
TEST(ChannelsLast, CudaDequantizedPoolOfAnI8Conv) {
  Graph g;
  const Tensor x = g.placeholder({2, 16, 9, 9}, u8, "x");
  QuantizedConvOptions o;
  o.conv.padding = {1, 1};
  const Tensor sy = g.constant(Array::scalar(0.5f)), zy = g.constant(Array::scalar(int8_t{-5}));
  const Tensor q = quantized_conv(
      {x, g.constant(Array::scalar(0.02f)), g.constant(Array::scalar(uint8_t{128}))},
      {g.constant(random_ints({32, 16, 3, 3}, -127, 127, i8)),
       g.constant(random_array({32}, f32, 0.01, 0.02)), g.constant(Array::zeros({32}, i8))},
      sy, zy, o);
  const Tensor y = adaptive_avg_pool(dequantize(q, sy, zy), {1, 1});
  const Program p = channels_last(fuse_quant(extract_program(*y.graph_impl(), {{y.node_id(), 0}})),
                                  Backend::cuda);
  int pools = 0;
  for (const auto& n : p.graph.nodes)
    if (n.op == OpId::DequantizeAdaptiveAvgPool) {
      ++pools;
      EXPECT_TRUE(n.attrs.b("channels_last", false));
    }
  EXPECT_EQ(pools, 1);
  if (cuda_device_count() == 0) return;
  const Executable exe = g.compile(Device::cuda(0), {}, {y, q});
  EXPECT_EQ(count_steps(exe, "dequantize_adaptive_avg_pool"), 1) << exe.dump();
  const auto out = exe.run({{x, random_ints({2, 16, 9, 9}, 0, 255, u8)}});
  const std::vector<double> qv = to_f64(out[1].to(Device::cpu()));
  ASSERT_GT(*std::max_element(qv.begin(), qv.end()) - *std::min_element(qv.begin(), qv.end()), 20)
      << "the conv's outputs span too little of the range";
  std::vector<double> want(2 * 32, 0.0);
  for (size_t i = 0; i < qv.size(); ++i) want[i / 81] += (qv[i] + 5) * 0.5 / 81;
  expect_close(out[0].to(Device::cpu()), Shape{2, 32, 1, 1}, want, 1e-6, 1e-6);
}

// A downsampling block adds two convs: one of them takes the add and relu (and the other's
// output as its residual), whichever comes first; the program stays in order.
TEST(ChannelsLast, CudaTargetTwoConvsIntoOneAdd) {
  for (bool downsample_first : {false, true}) {
    SCOPED_TRACE(downsample_first);
    Graph g;
    const Tensor x = g.placeholder({2, 8, 6, 6}, bf16, "x");
    auto conv1x1 = [&](const Tensor& t) {
      return conv2d(t, g.constant(random_array({16, 8, 1, 1}, bf16)),
                    g.constant(random_array({16}, bf16)), {});
    };
    Tensor d, c;
    if (downsample_first) {
      d = conv1x1(x);
      c = conv1x1(relu(x));
    } else {
      c = conv1x1(relu(x));
      d = conv1x1(x);
    }
    const Tensor y = max_pool(relu(c + d), {.kernel = {2, 2}});
    const Program q =
        channels_last(extract_program(*y.graph_impl(), {{y.node_id(), 0}}), Backend::cuda);
    verify_program(q, "channels_last");
    int fused = 0, relus = 0;
    for (const auto& n : q.graph.nodes) {
      fused += n.op == OpId::FusedConv && n.attrs.b("has_residual", false);
      relus += n.op == OpId::Relu;
    }
    EXPECT_EQ(fused, 1);
    EXPECT_EQ(relus, 1);  // relu(x) before the convs; the last relu is an epilogue's
  }
}

TEST(ChannelsLast, CudaBf16ResidualBlockStaysNhwc) {
  REQUIRE_GPU();
  Graph g;
  const Tensor x = g.placeholder({2, 16, 12, 12}, bf16, "x");
  auto w = [&](int64_t o, int64_t c, int64_t k) {
    return g.constant(random_array({o, c, k, k}, bf16, -0.2, 0.2));
  };
  ConvOptions same;
  same.padding = {1, 1, 1, 1};
  const Tensor a = relu(conv2d(x, w(16, 16, 3), g.constant(random_array({16}, bf16)), same));
  const Tensor r = relu(conv2d(a, w(16, 16, 1), std::nullopt, {}) + x);
  const Tensor y = max_pool(r, {.kernel = {2, 2}});
  const Executable on = g.compile(Device::cuda(0), {}, {y});
  std::optional<Executable> off;
  {
    const ScopedEnv env("KILN_CHANNELS_LAST", "0");
    off = g.compile(Device::cuda(0), {}, {y});
  }
  EXPECT_EQ(count_steps(on, "fused_conv"), 2) << on.dump();
  EXPECT_EQ(count_steps(on, "transpose"), 2) << on.dump();  // x in, max_pool's output out
  // the relus and the residual add run in the convs' epilogues
  for (const char* op : {"relu", "add", "fused_elementwise"})
    EXPECT_EQ(count_steps(on, op), 0) << op;
  EXPECT_EQ(count_steps(*off, "transpose"), 0);
  const Array xv = random_array({2, 16, 12, 12}, bf16);
  const Array want = off->run({{x, xv}})[0].to(Device::cpu());
  const Array got = on.run({{x, xv}})[0].to(Device::cpu());
  expect_close(got, want.shape(), to_f64(want), 2e-2, 2e-2);
}

}  // namespace
}  // namespace kiln
