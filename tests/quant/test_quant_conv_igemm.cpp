// CUDA's NHWC implicit-GEMM int8 convolution (src/backends/cuda/qconv_igemm.cu, qconv_igemm; on by
// default, KILN_QCONV_IGEMM=0 turns it off): channels_last convs with groups 1, zero weight zero
// points, and C a multiple of 64 or few channels (a stem's: window rows of at most 32 bytes, C
// padded to pc = 4, 8, 16 or 32, read from a padded copy of x). Against the float64 reference of
// the op's definition (tests/quant/conv_reference.h) within 1 LSB (its epilogue is f32), and within
// 1 LSB of the same graph without it (im2col + cuBLASLt's int8 GEMM + the exact epilogue kernel).
// Fresh random data; each tile shape (128 x 128, 128 x 64, 64 x 64), tile edges (pixels and
// channels not multiples of a tile), strides, asymmetric pads, dilation, u8 and i8 data, input zero
// points 0 and not (the kernel sums the weights only for the latter), f32 and int8 residuals,
// per-tensor and per-channel scales; and a chain of them under programmatic dependent launch
// (KILN_PDL=1) against the same chain without.
#include "core/graph_impl.h"
#include "core/op_registry.h"
#include "kiln/kiln.h"
#include "kiln/ops/quant.h"
#include "passes/program.h"
#include "quant/conv_reference.h"
#include "support/executable_env.h"
#include "support/gpu.h"
#include "support/interpret.h"
#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;

// clang-format off
std::vector<ConvProblem> igemm_problems() {
  return {
      {{2, 64, 13, 13}, 72, 3, 3, {1, 1}, {1, 1, 1, 1}, {1, 1}, 1, u8, i8, u8, true, true, true,
       true, true},
      {{2, 64, 15, 15}, 64, 3, 3, {2, 2}, {1, 0, 2, 1}, {1, 1}, 1, i8, i8, i8, false, false, true,
       false, true},
      {{3, 128, 7, 7}, 130, 1, 1, {1, 1}, {0, 0, 0, 0}, {1, 1}, 1, u8, i8, u8, true, true, false,
       true, true},
      {{2, 64, 14, 14}, 256, 1, 1, {2, 2}, {0, 0, 0, 0}, {1, 1}, 1, i8, i8, u8, true, true, true,
       true, true},
      {{1, 64, 12, 12}, 64, 3, 3, {1, 1}, {2, 2, 2, 2}, {2, 2}, 1, u8, i8, u8, true, false, false,
       false, true},
      {{4, 256, 9, 9}, 70, 3, 3, {1, 1}, {1, 1, 1, 1}, {1, 1}, 1, u8, i8, i8, true, true, true,
       false, true, true},
      // enough tiles for 128 x 128 (1x1) and split-K 128 x 64 (3x3: 200 of them, 400 of 64 x 64
      // leave the busiest SM as much) blocks on the H200's 132 SMs
      {{4, 64, 48, 48}, 256, 1, 1, {1, 1}, {0, 0, 0, 0}, {1, 1}, 1, u8, i8, u8, true, true, true,
       true, true},
      {{4, 64, 40, 40}, 256, 3, 3, {1, 1}, {1, 1, 1, 1}, {1, 1}, 1, i8, i8, u8, true, true, false,
       true, true},
      // window rows of at most 32 bytes: a ResNet stem (7 x 4, copied 8 bytes at a time), a
      // 3 x 3 with dilation over 5 channels (3 x 8, 16 bytes), odd KH; one channel, stride 1
      // (5 x 4, 4 bytes)
      {{2, 3, 45, 38}, 64, 7, 7, {2, 2}, {3, 3, 3, 3}, {1, 1}, 1, u8, i8, u8, true, true, false,
       true, true},
      {{3, 5, 17, 19}, 24, 3, 3, {1, 2}, {2, 1, 0, 2}, {2, 1}, 1, i8, i8, i8, false, true, true,
       false, true},
      {{2, 1, 20, 23}, 16, 5, 5, {1, 1}, {2, 1, 2, 3}, {1, 1}, 1, u8, i8, i8, true, true, true,
       false, true},
      // GELU in the epilogue (exact; tanh with a residual), and a stem's window rows with it
      {{2, 64, 13, 13}, 72, 3, 3, {1, 1}, {1, 1, 1, 1}, {1, 1}, 1, u8, i8, u8, true, true, false,
       false, true, false, 1},
      {{3, 128, 7, 7}, 128, 1, 1, {1, 1}, {0, 0, 0, 0}, {1, 1}, 1, i8, i8, i8, true, true, true,
       false, true, false, 2},
      {{2, 3, 45, 38}, 64, 7, 7, {2, 2}, {3, 3, 3, 3}, {1, 1}, 1, u8, i8, u8, true, true, false,
       false, true, false, 1}};
}
// clang-format on

Tensor build(Graph& g, const ConvProblem& p, const ConvData& d, const Tensor& x) {
  QuantizedConvOptions o;
  o.conv = conv_options(p);
  o.relu = p.relu;
  if (p.gelu) o.gelu = p.gelu == 2 ? GeluApprox::tanh : GeluApprox::none;
  if (p.bias) o.bias = g.constant(d.bias);
  if (p.residual) o.residual = g.constant(d.res);
  return quantized_conv({x, g.constant(d.sx), g.constant(d.zx)},
                        {g.constant(d.w), g.constant(d.sw), g.constant(d.zw)}, g.constant(d.sy),
                        g.constant(d.zy), o);
}

Array run_on_cuda(const ConvProblem& p, const ConvData& d) {
  Graph g;
  auto x = g.placeholder(p.x, p.xt, "x");
  const Tensor y = build(g, p, d, x);
  return g.compile(Device::cuda(0), {}, {y}).run({{x, d.x}})[0].to(Device::cpu());
}

// Every problem meets the kernel's conditions once compiled for CUDA (so the comparison below
// compares two different paths): the pass gives the conv channels_last, zero_w_zp and its
// constant weights permuted to (O, kh, kw, C) (weights_ohwi); groups 1, C a multiple of 64 or
// KW pc <= 32 (pc: C rounded up to 4, 8, 16 or 32) without dilation along W, i8 weights. That
// program, run on the CPU's kernels (which take weights_ohwi too), is within 1 LSB of the
// reference. Runs without a GPU.
TEST(QuantizedConvIgemm, ProblemsMeetTheKernelsConditions) {
#ifdef NDEBUG
  constexpr size_t kEvery = 1;
#else  // the sanitizer builds run the reference's loops far slower: a third of the problems, a
  // different third from seed to seed
  constexpr size_t kEvery = 3;
#endif
  const std::vector<ConvProblem> problems = igemm_problems();
  for (size_t i = static_cast<size_t>(seed() % kEvery); i < problems.size(); i += kEvery) {
    const ConvProblem& p = problems[i];
    SCOPED_TRACE(describe(p));
    EXPECT_EQ(p.groups, 1);
    const int64_t c = p.x[1], pc = c <= 4 ? 4 : c <= 8 ? 8 : c <= 16 ? 16 : c <= 32 ? 32 : 64;
    EXPECT_TRUE(c % 64 == 0 || (pc * p.kw <= 32 && p.dilation[1] == 1));
    EXPECT_EQ(p.wt, i8);
    const ConvData d = random_conv_data(p);
    Graph g;
    const Tensor y = build(g, p, d, g.placeholder(p.x, p.xt, "x"));
    const Program q =
        channels_last(extract_program(*y.graph_impl(), {{y.node_id(), 0}}), Backend::cuda);
    int convs = 0;
    for (const auto& n : q.graph.nodes)
      if (n.op == OpId::QuantizedConv) {
        ++convs;
        EXPECT_TRUE(n.attrs.b("channels_last", false));
        EXPECT_TRUE(n.attrs.b("zero_w_zp", false));
        EXPECT_TRUE(n.attrs.b("weights_ohwi", false));
        const detail::Node& w = q.graph.nodes[n.inputs[3].node];
        ASSERT_EQ(w.op, OpId::Constant);
        EXPECT_EQ(w.value.shape(), (Shape{p.o, p.kh, p.kw, p.x[1]}));
      }
    EXPECT_EQ(convs, 1);
    expect_conv_within_lsb(interpret(q, {{"x", d.x}})[0], conv_reference(p, d), 1);
  }
}

TEST(QuantizedConvIgemm, MatchesReferenceAndTheGemmPath) {
  REQUIRE_GPU();
  for (const ConvProblem& p : igemm_problems()) {
    SCOPED_TRACE(describe(p));
    const ConvData d = random_conv_data(p);
    Array fast;
    {
      const ScopedEnv on("KILN_QCONV_IGEMM", "1");  // (the default)
      fast = run_on_cuda(p, d);
    }
    expect_conv_within_lsb(fast, conv_reference(p, d), 1);
    Array gemm;
    {
      const ScopedEnv off("KILN_QCONV_IGEMM", "0");
      gemm = run_on_cuda(p, d);
    }
    expect_conv_within_lsb(fast, to_f64(gemm), 1);
  }
}

// Each tile of the kernel (conv_igemm: the largest that still gives every SM a block) for each
// pairing of u8 / i8 data and output, within 1 LSB of the reference: 1x1 convs over 64 channels
// (K 64) with as many output pixels M as the choice needs on the H200's 132 SMs:
//   128 x 128:          O >= 128 and ceil(M / 128) ceil(O / 128) >= 132 blocks: M 8464 and O 132
//                       or 136 give 67 x 2 = 134;
//   128 x 64, 3 stages: O < 128 (so not 128 x 128) and ceil(M / 128) ceil(O / 64) >= 264 blocks
//                       (two an SM): M 33856 and O <= 64 give 265;
//   128 x 64, split K:  132 to 263 blocks of 128 x 64 that leave the busiest SM no more output than
//                       64 x 64 ones: M 16896 and O <= 64 give 132 (one an SM, 8192 outputs),
//                       against 264 of 64 x 64 (two an SM, 8192 too).
// (Other GPUs pick other tiles for the same problems: the results are the same within 1 LSB.)
TEST(QuantizedConvIgemm, EachTileWithEachDataAndOutputType) {
  REQUIRE_GPU();
  // clang-format off
  const std::vector<ConvProblem> problems = {
      // 128 x 128 (u8 data and output: MatchesReferenceAndTheGemmPath)
      {{1, 64, 92, 92}, 132, 1, 1, {1, 1}, {0, 0, 0, 0}, {1, 1}, 1, i8, i8, i8, true, true, true,
       false, true},
      {{2, 64, 46, 92}, 136, 1, 1, {1, 1}, {0, 0, 0, 0}, {1, 1}, 1, i8, i8, u8, false, true, false,
       true, true, true},
      {{1, 64, 183, 183}, 132, 1, 1, {2, 2}, {0, 0, 0, 0}, {1, 1}, 1, u8, i8, i8, true, false,
       true, true, true},
      // 128 x 64, three stages
      {{4, 64, 92, 92}, 16, 1, 1, {1, 1}, {0, 0, 0, 0}, {1, 1}, 1, i8, i8, i8, true, true, false,
       true, true},
      {{1, 64, 184, 184}, 20, 1, 1, {1, 1}, {0, 0, 0, 0}, {1, 1}, 1, i8, i8, u8, true, false,
       true, true, true, true},
      {{2, 64, 92, 184}, 24, 1, 1, {1, 1}, {0, 0, 0, 0}, {1, 1}, 1, u8, i8, i8, false, true,
       true, false, true},
      {{4, 64, 92, 92}, 32, 1, 1, {1, 1}, {0, 0, 0, 0}, {1, 1}, 1, u8, i8, u8, true, true, true,
       true, true},
      // 128 x 64 split over K (i8 data, u8 output: MatchesReferenceAndTheGemmPath)
      {{1, 64, 128, 132}, 16, 1, 1, {1, 1}, {0, 0, 0, 0}, {1, 1}, 1, i8, i8, i8, false, true,
       true, true, true},
      {{2, 64, 96, 88}, 24, 1, 1, {1, 1}, {0, 0, 0, 0}, {1, 1}, 1, u8, i8, i8, true, true, false,
       true, true, true},
      {{4, 64, 64, 66}, 48, 1, 1, {1, 1}, {0, 0, 0, 0}, {1, 1}, 1, u8, i8, u8, true, false, true,
       false, true}};
  // clang-format on
  for (const ConvProblem& p : problems) {
    SCOPED_TRACE(describe(p));
    const ConvData d = random_conv_data(p);
    expect_conv_within_lsb(run_on_cuda(p, d), conv_reference(p, d), 1);
  }
}

// Convs just outside the kernel's conditions take the im2col + cuBLASLt path, within 1 LSB of the
// reference: 33 to 63 channels (more than a 32-byte window row holds, not a multiple of 64), a
// few channels with dilation along W, a window row of more than 32 bytes; and u8 weights (shifted
// to i8 and permuted to the NHWC rows' (kh, kw, c) order, the epilogue four channels a thread) with
// each pairing of u8 / i8 data and output: 16 channels (16-byte im2col copies), 12 (a byte at a
// time), 5 (rows of K 45 padded to 48).
TEST(QuantizedConvIgemm, ConvsOutsideItsConditionsStillAgree) {
  REQUIRE_GPU();
  // clang-format off
  const std::vector<ConvProblem> problems = {
      {{2, 40, 9, 11}, 24, 1, 1, {1, 1}, {0, 0, 0, 0}, {1, 1}, 1, u8, i8, u8, true, true, true,
       true, true},
      {{2, 33, 8, 8}, 16, 3, 3, {1, 1}, {1, 1, 1, 1}, {1, 1}, 1, i8, i8, i8, false, true, false,
       false, true},
      {{2, 3, 12, 12}, 8, 3, 3, {1, 1}, {1, 1, 1, 1}, {1, 2}, 1, u8, i8, u8, true, false, false,
       true, true},
      {{2, 5, 12, 12}, 8, 1, 5, {1, 1}, {0, 2, 0, 2}, {1, 1}, 1, u8, i8, u8, true, true, false,
       false, true},
      {{2, 16, 12, 12}, 32, 3, 3, {1, 1}, {1, 1, 1, 1}, {1, 1}, 1, u8, u8, u8, true, true, true,
       true},
      {{2, 16, 12, 12}, 32, 3, 3, {2, 2}, {1, 0, 1, 1}, {1, 1}, 1, u8, u8, i8, false, false, true,
       false},
      {{2, 12, 10, 10}, 24, 3, 3, {1, 1}, {1, 1, 1, 1}, {1, 1}, 1, i8, u8, u8, true, true, false,
       true},
      {{2, 5, 16, 16}, 16, 3, 3, {1, 1}, {2, 2, 2, 2}, {2, 2}, 1, i8, u8, i8, true, true, true,
       false}};
  // clang-format on
  for (const ConvProblem& p : problems) {
    SCOPED_TRACE(describe(p));
    const ConvData d = random_conv_data(p);
    expect_conv_within_lsb(run_on_cuda(p, d), conv_reference(p, d), 1);
  }
}

// A residual that is the dequantize of an int8 tensor enters the kernel as its int8 data
// (quantized_residual): through shared memory when the channels are a multiple of 16, element by
// element else. Against the reference fed the dequantized values, and the path without the kernel.
TEST(QuantizedConvIgemm, QuantizedResidual) {
  REQUIRE_GPU();
  int checked = 0;
  for (ConvProblem p : igemm_problems()) {
    p.residual = true;
    SCOPED_TRACE(describe(p));
    ConvData d = random_conv_data(p);
    const Shape ys = out_shape(p);
    const Array rq = p.yt == u8 ? random_ints(ys, 0, 255, u8) : random_ints(ys, -128, 127, i8);
    const Array sr = random_array({}, f32, 0.01, 0.03);
    const Array zr = p.yt == u8 ? random_ints({}, 90, 160, u8) : random_ints({}, -10, 10, i8);
    Graph h;
    const Tensor hq = h.placeholder(ys, p.yt, "rq");
    d.res = eval1(h, dequantize(hq, h.constant(sr), h.constant(zr)), {{hq, rq}});
    auto run = [&] {
      Graph g;
      const Tensor x = g.placeholder(p.x, p.xt, "x"), r = g.placeholder(ys, p.yt, "r");
      const Tensor dx = dequantize(x, g.constant(d.sx), g.constant(d.zx));
      const Tensor dw =
          dequantize(g.constant(d.w), g.constant(d.sw), g.constant(d.zw), {.axis = 0});
      Tensor y = conv2d(dx, dw, p.bias ? std::optional<Tensor>(g.constant(d.bias)) : std::nullopt,
                        conv_options(p)) +
                 dequantize(r, g.constant(sr), g.constant(zr));
      if (p.relu) y = relu(y);
      if (p.gelu) y = gelu(y, p.gelu == 2 ? GeluApprox::tanh : GeluApprox::none);
      const Executable exe =
          g.compile(Device::cuda(0), {}, {quantize(y, g.constant(d.sy), g.constant(d.zy))});
      EXPECT_EQ(count_steps(exe, "quantized_conv"), 1) << exe.dump();
      EXPECT_EQ(count_steps(exe, "dequantize"), 0) << exe.dump();
      return exe.run({{x, d.x}, {r, rq}})[0].to(Device::cpu());
    };
    const Array fast = run();
    expect_conv_within_lsb(fast, conv_reference(p, d), 1);
    Array gemm;
    {
      const ScopedEnv off("KILN_QCONV_IGEMM", "0");
      gemm = run();
    }
    expect_conv_within_lsb(fast, to_f64(gemm), 1);
    ++checked;
  }
  EXPECT_GE(checked, 8);
}

// Hopper's programmatic dependent launch (KILN_PDL=1, src/backends/cuda/mma_util.cuh): each
// implicit GEMM may start while the conv before it finishes and must wait for it before it reads
// x or the residual. A chain of four convs (each reading the last one's output, the fourth also
// the first one's as its int8 residual tile), run on three different inputs (launched, recorded,
// replayed: a read before its producer finished would see the last input's values), gives bit
// for bit what the same executable gives without it (same kernels, same arithmetic).
TEST(QuantizedConvIgemm, ChainUnderProgrammaticDependentLaunch) {
  REQUIRE_GPU();
  // clang-format off
  const std::vector<ConvProblem> chain = {
      {{8, 64, 28, 28}, 64, 3, 3, {1, 1}, {1, 1, 1, 1}, {1, 1}, 1, u8, i8, u8, true, true, false,
       true, true},
      {{8, 64, 28, 28}, 256, 1, 1, {1, 1}, {0, 0, 0, 0}, {1, 1}, 1, u8, i8, u8, true, true, false,
       true, true},
      {{8, 256, 28, 28}, 64, 1, 1, {1, 1}, {0, 0, 0, 0}, {1, 1}, 1, u8, i8, u8, true, true, false,
       true, true},
      {{8, 64, 28, 28}, 64, 3, 3, {1, 1}, {1, 1, 1, 1}, {1, 1}, 1, u8, i8, u8, true, true, false,
       true, true}};
  // clang-format on
  std::vector<ConvData> data;
  for (const ConvProblem& p : chain) data.push_back(random_conv_data(p));
  Graph g;
  const Tensor x = g.placeholder(chain[0].x, u8, "x");
  Tensor y = x, first;
  for (size_t i = 0; i + 1 < chain.size(); ++i) {
    y = build(g, chain[i], data[i], y);
    if (i == 0) first = y;
  }
  {  // the last as the float graph the pass fuses, the first conv's output its int8 residual
    const ConvProblem& p = chain.back();
    const ConvData& d = data.back();
    const Tensor dx = dequantize(y, g.constant(d.sx), g.constant(d.zx));
    const Tensor dw = dequantize(g.constant(d.w), g.constant(d.sw), g.constant(d.zw), {.axis = 0});
    const Tensor r = dequantize(first, g.constant(data[0].sy), g.constant(data[0].zy));
    y = quantize(relu(conv2d(dx, dw, g.constant(d.bias), conv_options(p)) + r), g.constant(d.sy),
                 g.constant(d.zy));
  }
  std::vector<Array> inputs;
  for (int i = 0; i < 3; ++i) inputs.push_back(random_ints(chain[0].x, 0, 255, u8));
  auto runs = [&](bool pdl) {
    CompileOptions o;
    o.kernels.programmatic_launch = pdl;
    const Executable exe = g.compile(Device::cuda(0), {}, {y}, o);
    EXPECT_EQ(count_steps(exe, "quantized_conv"), 4) << exe.dump();
    EXPECT_EQ(count_steps(exe, "dequantize"), 0) << exe.dump();
    std::vector<Array> out;
    for (const Array& in : inputs) out.push_back(exe.run({{x, in}})[0].to(Device::cpu()));
    return out;
  };
  const std::vector<Array> with = runs(true), without = runs(false);
  for (size_t i = 0; i < inputs.size(); ++i) {
    SCOPED_TRACE(fmt::format("run {}", i + 1));
    expect_conv_within_lsb(with[i], to_f64(without[i]), 0);
  }
  // (the inputs differ, and so do the outputs: a stale read could not pass unseen)
  EXPECT_NE(to_f64(without[0]), to_f64(without[1]));
}

}  // namespace
}  // namespace kiln
