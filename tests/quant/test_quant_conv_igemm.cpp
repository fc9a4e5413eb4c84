// CUDA's NHWC implicit-GEMM int8 convolution (src/backends/cuda/quant_conv.cu, qconv_igemm; opt-in
// with KILN_QCONV_IGEMM=1): channels_last convs with groups 1, C a multiple of 64 and zero weight
// zero points. Against the float64 reference of the op's definition (tests/quant/conv_reference.h)
// within 1 LSB (the kernel's epilogue multiplies by sx * sw, the reference by sx then sw), and bit
// for bit against the same graph without it (im2col + cuBLASLt's int8 GEMM + the epilogue kernel:
// the same integers, the same epilogue). Fresh random data; tile edges (pixels and channels not
// multiples of the 128 x 64 tile), strides, asymmetric pads, dilation, u8 and i8 data,
// residuals, per-tensor and per-channel scales.
#include "core/graph_impl.h"
#include "core/op_registry.h"
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
       false, true, true}};
}
// clang-format on

Tensor build(Graph& g, const ConvProblem& p, const ConvData& d, const Tensor& x) {
  QuantizedConvOptions o;
  o.conv = conv_options(p);
  o.relu = p.relu;
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
// compares two different paths): the pass gives the conv channels_last and zero_w_zp; groups 1,
// C a multiple of 64, i8 weights. Runs without a GPU.
TEST(QuantizedConvIgemm, ProblemsMeetTheKernelsConditions) {
  for (const ConvProblem& p : igemm_problems()) {
    SCOPED_TRACE(describe(p));
    EXPECT_EQ(p.groups, 1);
    EXPECT_EQ(p.x[1] % 64, 0);
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
      }
    EXPECT_EQ(convs, 1);
  }
}

TEST(QuantizedConvIgemm, MatchesReferenceAndTheGemmPath) {
  REQUIRE_GPU();
  for (const ConvProblem& p : igemm_problems()) {
    SCOPED_TRACE(describe(p));
    const ConvData d = random_conv_data(p);
    Array fast;
    {
      const ScopedEnv on("KILN_QCONV_IGEMM", "1");
      fast = run_on_cuda(p, d);
    }
    expect_conv_within_lsb(fast, conv_reference(p, d), 1);
    Array gemm;
    {
      const ScopedEnv off("KILN_QCONV_IGEMM", "0");
      gemm = run_on_cuda(p, d);
    }
    const auto a = to_f64(fast), b = to_f64(gemm);
    ASSERT_EQ(a.size(), b.size());
    int differ = 0;
    for (size_t i = 0; i < a.size(); ++i)
      if (a[i] != b[i] && differ++ < 5) ADD_FAILURE() << "element " << i << ": " << a[i]
                                                      << " vs " << b[i] << " without the kernel";
  }
}

}  // namespace
}  // namespace kiln
