// Inference batch norms folded into the convolutions before them (the fold_batch_norms pass).
#include <fmt/format.h>

#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;

struct BnModel {
  Tensor x, conv_out, out;
};

// x -> conv (constant weight, optional bias) -> batch_norm (constant stats and affine) -> relu
BnModel build(Graph& g, DType t, bool conv_bias, bool affine, bool stats_as_variables) {
  BnModel m;
  m.x = g.placeholder({2, 3, 9, 9}, t, "x");
  auto w = g.constant(random_array({8, 3, 3, 3}, t), "w");
  std::optional<Tensor> b;
  if (conv_bias) b = g.constant(random_array({8}, t), "b");
  ConvOptions o;
  o.padding = {1, 1};
  m.conv_out = conv2d(m.x, w, b, o);
  auto mean = g.constant(random_array({8}, t), "mean");
  Tensor var = stats_as_variables ? g.variable(random_array({8}, t, 0.5, 2.0), "var")
                                  : g.constant(random_array({8}, t, 0.5, 2.0), "var");
  std::optional<Tensor> gamma, beta;
  if (affine) {
    gamma = g.constant(random_array({8}, t), "gamma");
    beta = g.constant(random_array({8}, t), "beta");
  }
  m.out = relu(batch_norm(m.conv_out, mean, var, gamma, beta, 1e-3));
  return m;
}

// Steps other than the transposes around the CPU's NHWC convolutions.
int steps_but_transposes(const Executable& exe) {
  int steps = 0;
  for (const auto& s : exe.placement()) steps += s.op != "transpose";
  return steps;
}

TEST(FoldBatchNorm, FoldsIntoTheConvAndKeepsResults) {
  for (DType t : {f32, f64})
    for (int mask = 0; mask < 4; ++mask) {
      SCOPED_TRACE(fmt::format("{} mask {}", name(t), mask));
      Graph g;
      const BnModel m = build(g, t, mask & 1, mask & 2, false);
      Array xv = random_array({2, 3, 9, 9}, t);
      auto folded = g.compile(Device::cpu(), {}, {m.out});
      auto plain = g.compile(Device::cpu(), {}, {m.out}, CompileOptions{.optimize = false});
      // conv, relu (f32: one fused_conv on NHWC, the relu a post-op of its oneDNN primitive)
      EXPECT_EQ(steps_but_transposes(folded), t == f32 ? 1 : 2) << folded.dump();
      EXPECT_EQ(plain.num_steps(), 3u);
      const Array want = plain.run({{m.x, xv}})[0];
      expect_close(folded.run({{m.x, xv}})[0], want.shape(), to_f64(want), tolerance(t) * 10,
                   tolerance(t) * 10);
    }
}

// Under autocast the batch norm folds before the conv goes low (the casts around a low conv
// would stand between them): the conv in bf16 / f16 with the folded bias, no batch_norm step.
TEST(FoldBatchNorm, FoldsUnderAutocast) {
  for (DType low : {bf16, f16}) {
    SCOPED_TRACE(name(low));
    Graph g;
    const BnModel m = build(g, f32, true, true, false);
    Array xv = random_array({2, 3, 9, 9}, f32);
    auto folded = g.compile(Device::cpu(), {}, {m.out}, CompileOptions{.autocast = low});
    for (const auto& s : folded.placement()) EXPECT_NE(s.op, "batch_norm") << folded.dump();
    auto plain = g.compile(Device::cpu(), {}, {m.out}, CompileOptions{.optimize = false});
    const Array want = plain.run({{m.x, xv}})[0];
    // the conv's inputs and weights rounded to the low type: 27 products of O(1) values
    expect_close(folded.run({{m.x, xv}})[0], want.shape(), to_f64(want), tolerance(low) * 4,
                 tolerance(low) * 8);
  }
}

TEST(FoldBatchNorm, LeavesSharedConvsAndVariablesAlone) {
  {
    // the conv output is also returned: folding would change what that reader sees
    Graph g;
    const BnModel m = build(g, f32, true, true, false);
    auto exe = g.compile(Device::cpu(), {}, {m.out, m.conv_out});
    EXPECT_EQ(steps_but_transposes(exe), 3) << exe.dump();
    Array xv = random_array({2, 3, 9, 9}, f32);
    auto plain =
        g.compile(Device::cpu(), {}, {m.out, m.conv_out}, CompileOptions{.optimize = false});
    auto a = exe.run({{m.x, xv}}), b = plain.run({{m.x, xv}});
    for (int k = 0; k < 2; ++k) expect_close(a[k], b[k].shape(), to_f64(b[k]), 1e-6, 1e-6);
  }
  {
    // statistics in a variable can change between runs: not folded
    Graph g;
    const BnModel m = build(g, f32, false, true, true);
    EXPECT_EQ(steps_but_transposes(g.compile(Device::cpu(), {}, {m.out})), 3);
  }
}

}  // namespace
}  // namespace kiln
