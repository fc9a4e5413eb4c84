// An ONNX QDQ model (tests/quant/make_golden.py writes it): QuantizeLinear, int8 per-channel
// weights through DequantizeLinear, MatMul, Add bias, Relu, QuantizeLinear. The importer keeps the
// weights int8 and fuse_quant runs the product as one quantized_matmul, within 1 LSB of the same
// model compiled without the pass.
#include <string>

#include "kiln/onnx.h"
#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;

int steps_of(const Executable& exe, const std::string& op) {
  int c = 0;
  for (const auto& s : exe.placement()) c += s.op == op;
  return c;
}

TEST(QdqOnnx, MatmulModelFusesWithinOneLsb) {
  const onnx::Model m = onnx::import(std::string(KILN_QUANT_DATA_DIR) + "/qdq_matmul.onnx");
  CompileOptions off;
  off.fuse_quant = false;
  const Executable fused = m.graph.compile(default_device(), m.feed_shapes(), m.output_tensors());
  const Executable plain =
      m.graph.compile(default_device(), m.feed_shapes(), m.output_tensors(), off);
  EXPECT_EQ(steps_of(fused, "quantized_matmul"), 1) << fused.dump();
  EXPECT_EQ(steps_of(fused, "matmul"), 0);
  EXPECT_EQ(steps_of(plain, "quantized_matmul"), 0);
  const Array x = random_array({8, 32}, f32, -2, 2);
  const auto yf = to_f64(fused.run({{"x", x}})[0].to(Device::cpu()));
  const auto yp = to_f64(plain.run({{"x", x}})[0].to(Device::cpu()));
  ASSERT_EQ(yf.size(), yp.size());
  int differ = 0;
  double lo = 255, hi = 0;
  for (size_t i = 0; i < yf.size(); ++i) {
    EXPECT_LE(std::abs(yf[i] - yp[i]), 1) << "element " << i;
    differ += yf[i] != yp[i];
    lo = std::min(lo, yp[i]), hi = std::max(hi, yp[i]);
  }
  EXPECT_LE(differ, static_cast<int>(yf.size()) / 10);
  EXPECT_GT(hi - lo, 20);  // not all saturated or zero
}

}  // namespace
}  // namespace kiln
