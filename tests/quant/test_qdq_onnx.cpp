// An ONNX QDQ model (tests/quant/make_golden.py writes it): QuantizeLinear, int8 per-channel
// weights through DequantizeLinear, MatMul, Add bias, Relu, QuantizeLinear. The importer keeps the
// weights int8 and fuse_quant runs the product as one quantized_matmul, within 1 LSB of the same
// model compiled without the pass.
#include <cstdio>
#include <filesystem>
#include <string>

#include "kiln/onnx.h"
#include "support/executable_env.h"
#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;

TEST(QdqOnnx, MatmulModelFusesWithinOneLsb) {
  const onnx::Model m = onnx::import(std::string(KILN_QUANT_DATA_DIR) + "/qdq_matmul.onnx");
  CompileOptions off;
  off.fuse_quant = false;
  off.fuse_elementwise = false;  // (nor the CPU's product epilogues, which shrink the manifest)
  const Executable fused = m.graph.compile(default_device(), m.feed_shapes(), m.output_tensors());
  const Executable plain =
      m.graph.compile(default_device(), m.feed_shapes(), m.output_tensors(), off);
  EXPECT_EQ(count_steps(fused, "quantized_matmul"), 1) << fused.dump();
  EXPECT_EQ(count_steps(fused, "matmul"), 0);
  EXPECT_EQ(count_steps(plain, "quantized_matmul"), 0);
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

// A package keeps the int8 weights and the fused node, and runs as the executable did. Without
// the pass, folding stores the dequantized weights as f32: 3 bytes more for each of them.
TEST(QdqOnnx, PackageKeepsInt8Weights) {
  const onnx::Model m = onnx::import(std::string(KILN_QUANT_DATA_DIR) + "/qdq_matmul.onnx");
  auto saved_size = [&](const Executable& e, const std::string& path) {
    e.save(path);
    return std::filesystem::file_size(path);
  };
  const std::string dir = std::filesystem::temp_directory_path().string();
  const std::string path = dir + "/kiln_qdq_" + std::to_string(seed()) + ".kiln";
  const std::string plain_path = dir + "/kiln_qdq_plain_" + std::to_string(seed()) + ".kiln";
  CompileOptions off;
  off.fuse_quant = false;
  off.fuse_elementwise = false;  // (nor the CPU's product epilogues, which shrink the manifest)
  const Executable exe = m.graph.compile(Device::cpu(), m.feed_shapes(), m.output_tensors());
  const auto bytes = saved_size(exe, path);
  const auto plain_bytes = saved_size(
      m.graph.compile(Device::cpu(), m.feed_shapes(), m.output_tensors(), off), plain_path);
  const Executable back = Executable::load(path, Device::cpu());
  std::remove(path.c_str());
  std::remove(plain_path.c_str());
  EXPECT_GE(plain_bytes, bytes + 32u * 24u * 3u) << bytes << " vs " << plain_bytes;
  EXPECT_EQ(count_steps(back, "quantized_matmul"), 1);
  const Array x = random_array({8, 32}, f32, -2, 2);
  const Array a = exe.run({{"x", x}})[0], b = back.run({{"x", x}})[0];
  EXPECT_EQ(to_f64(a), to_f64(b));
}

}  // namespace
}  // namespace kiln
