// CUDA's NHWC implicit-GEMM int8 convolution (src/backends/cuda/quant_conv.cu, qconv_igemm; opt-in
// with KILN_QCONV_IGEMM=1): channels_last convs with groups 1, C a multiple of 64 and zero weight
// zero points. Against the float64 reference of the op's definition (tests/quant/conv_reference.h)
// within 1 LSB (the kernel's epilogue multiplies by sx * sw, the reference by sx then sw), and bit
// for bit against the same graph without it (im2col + cuBLASLt's int8 GEMM + the epilogue kernel:
// the same integers, the same epilogue). Fresh random data; tile edges (pixels and channels not
// multiples of the 128 x 64 tile), strides, asymmetric pads, dilation, u8 and i8 data,
// residuals, per-tensor and per-channel scales.
#include "kiln/kiln.h"
#include "kiln/ops/quant.h"
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

Array run_on_cuda(const ConvProblem& p, const ConvData& d) {
  Graph g;
  auto x = g.placeholder(p.x, p.xt, "x");
  QuantizedConvOptions o;
  o.conv = conv_options(p);
  o.relu = p.relu;
  if (p.bias) o.bias = g.constant(d.bias);
  if (p.residual) o.residual = g.constant(d.res);
  const Tensor y = quantized_conv({x, g.constant(d.sx), g.constant(d.zx)},
                                  {g.constant(d.w), g.constant(d.sw), g.constant(d.zw)},
                                  g.constant(d.sy), g.constant(d.zy), o);
  return g.compile(Device::cuda(0), {}, {y}).run({{x, d.x}})[0].to(Device::cpu());
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
