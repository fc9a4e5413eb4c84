// The channels_last pass on training programs (src/passes/channels_last.cpp), without a GPU:
// for a CUDA target the convolutions, their gradients, batch norm, pooling and the pooling
// gradients of a training step go NHWC with transposes only at the edges (the input, the weights,
// the weight gradients); the CPU target and f32 (TF32 allowed or not) keep the program as it was;
// and the rewritten program, run node by node on the CPU (which runs channels_last nodes through
// NCHW copies), gives the loss and gradients of the program as written.
#include <cmath>
#include <map>
#include <string>

#include "core/op_registry.h"
#include "kiln/kiln.h"
#include "passes/program.h"
#include "runtime/executable_impl.h"
#include "support/interpret.h"
#include "support/nets.h"
#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;
using detail::Node;

// The training step as the pass sees it: the loss and every parameter's gradient, after
// autocast or allow_tf32 as compiling runs them.
struct Step {
  Graph g;
  TrainNet net;
  Program p;
};

void build_step(Step& s, bool variables) {
  s.net = train_net(s.g, variables);
  std::vector<detail::ValueRef> outs{{s.net.loss.node_id(), s.net.loss.output_index()}};
  for (const Tensor& d : gradients(s.net.loss, s.net.params))
    outs.push_back({d.node_id(), d.output_index()});
  s.p = extract_program(*s.net.loss.graph_impl(), outs);
  s.p.num_returned = outs.size();
}

std::map<OpId, int> count_ops(const Program& p) {
  std::map<OpId, int> c;
  for (const Node& n : p.graph.nodes) ++c[n.op];
  return c;
}

// The ops the pass must give channels_last in a CUDA training program.
bool layout_op(OpId op) {
  switch (op) {
    case OpId::Conv:
    case OpId::ConvTranspose:
    case OpId::ConvGradWeight:
    case OpId::BatchNormTrain:
    case OpId::BatchNormTrainGrad:
    case OpId::MaxPool:
    case OpId::MaxPoolGrad:
    case OpId::AdaptiveAvgPool:
    case OpId::AdaptiveAvgPoolGrad:
      return true;
    default:
      return false;
  }
}

TEST(ChannelsLastTraining, CudaTargetRunsTheStepNhwc) {
  for (const bool f16_step : {true, false}) {
    SCOPED_TRACE(f16_step ? "f16 autocast" : "bf16 autocast");
    Step s;
    build_step(s, true);
    const Program p = autocast(s.p, f16_step ? f16 : bf16);
    const Program q = channels_last(p, Backend::cuda);
    verify_program(q, "channels_last");
    auto before = count_ops(p), after = count_ops(q);
    for (OpId op : {OpId::Conv, OpId::ConvTranspose, OpId::ConvGradWeight, OpId::BatchNormTrain,
                    OpId::BatchNormTrainGrad, OpId::MaxPool, OpId::MaxPoolGrad,
                    OpId::AdaptiveAvgPool, OpId::AdaptiveAvgPoolGrad}) {
      EXPECT_GT(before[op], 0) << op_name(op);
      EXPECT_EQ(after[op], before[op]) << op_name(op);
    }
    for (const Node& n : q.graph.nodes)
      if (layout_op(n.op)) EXPECT_TRUE(n.attrs.b("channels_last", false)) << op_name(n.op);
    // transposes: the input image in; per conv its weight in (shared by the conv and its data
    // gradient) and its weight gradient out (reshapes for the 1x1 conv); nothing between the
    // layers (the program's own transposes are 2-D: the linear layer's)
    int convs = 0;
    for (const Node& n : p.graph.nodes)
      convs += n.op == OpId::Conv && p.graph.info(n.inputs[1]).shape[2] > 1;
    EXPECT_EQ(convs, 5);
    EXPECT_EQ(after[OpId::Transpose] - before[OpId::Transpose], 1 + 2 * convs);
    int x_in = 0, weights_in = 0, grads_out = 0;
    for (const Node& n : q.graph.nodes) {
      if (n.op != OpId::Transpose || n.outputs[0].shape.size() != 4) continue;
      const Node& src = q.graph.nodes[n.inputs[0].node];
      const auto& perm = n.attrs.ints("perm");
      const Shape& in = q.graph.info(n.inputs[0]).shape;
      if (src.op == OpId::ConvGradWeight) {
        ++grads_out;
        EXPECT_EQ(perm, (std::vector<int64_t>{0, 3, 1, 2}));
      } else if (in == Shape{4, 3, 16, 16}) {
        ++x_in;  // x, or its bf16 cast
      } else {
        ++weights_in;  // a variable's low-precision cast
        EXPECT_EQ(src.op, OpId::Cast) << op_name(src.op);
        EXPECT_EQ(perm, (std::vector<int64_t>{0, 2, 3, 1}));
      }
    }
    EXPECT_EQ(x_in, 1);
    EXPECT_EQ(weights_in, convs);
    EXPECT_EQ(grads_out, convs);
    // the batch norms' statistics (C) stay as they were: no transposes on them
    for (const Node& n : q.graph.nodes)
      if (n.op == OpId::BatchNormTrain) {
        EXPECT_EQ(n.outputs[1].shape.size(), 1u);
        EXPECT_EQ(n.outputs[0].shape[3], n.outputs[1].shape[0]);  // (N, H, W, C)
      }
  }
}

// The CPU target, plain f32, and f32 with TF32 allowed (tf32_nhwc: cuDNN's NHWC TF32 backward
// algorithms were seen up to 12% away from f32 in weight gradients) keep a training step NCHW.
TEST(ChannelsLastTraining, CpuTargetAndF32KeepTheProgram) {
  Step s;
  build_step(s, true);
  for (const auto& [p, target] : {std::pair{autocast(s.p, bf16), Backend::cpu},
                                  {allow_tf32(s.p), Backend::cpu},
                                  {allow_tf32(s.p), Backend::cuda},
                                  {s.p, Backend::cuda}}) {
    const Program q = channels_last(p, target);
    EXPECT_EQ(q.graph.nodes.size(), p.graph.nodes.size());
    EXPECT_EQ(count_ops(q)[OpId::Transpose], count_ops(p)[OpId::Transpose]);
    for (const Node& n : q.graph.nodes)
      EXPECT_FALSE(n.attrs.b("channels_last", false)) << op_name(n.op);
  }
}

// A conv_transpose whose output size is not the one cuDNN computes from the conv (output_padding)
// stays NCHW; the convs around it still go NHWC.
TEST(ChannelsLastTraining, ConvTransposeWithOutputPaddingStaysNchw) {
  Graph g;
  const Tensor x = g.placeholder({2, 8, 5, 5}, bf16, "x");
  const Tensor w = g.placeholder({8, 8, 3, 3}, bf16, "w");
  // 5 -> 6: the conv of 6 (pads 2, dilation 2) gives 6, not 5
  ConvTransposeOptions o;
  o.padding = {2, 2};
  o.dilation = {2, 2};
  o.output_padding = {1, 1};
  const Tensor up = conv_transpose2d(x, w, std::nullopt, o);
  ConvTransposeOptions same_o;
  same_o.padding = {1, 1};
  const Tensor same = conv_transpose2d(x, w, std::nullopt, same_o);
  const Tensor y = conv2d(up, w);
  const Program p =
      extract_program(*y.graph_impl(), {{y.node_id(), 0}, {same.node_id(), 0}});
  const Program q = channels_last(p, Backend::cuda);
  verify_program(q, "channels_last");
  int nhwc_t = 0, nchw_t = 0;
  for (const Node& n : q.graph.nodes) {
    if (n.op == OpId::ConvTranspose) (n.attrs.b("channels_last", false) ? nhwc_t : nchw_t)++;
    if (n.op == OpId::Conv) EXPECT_TRUE(n.attrs.b("channels_last", false));
  }
  EXPECT_EQ(nhwc_t, 1);  // `same`
  EXPECT_EQ(nchw_t, 1);  // `up`
}

TEST(ChannelsLastTraining, RewrittenStepMatchesOnTheCpu) {
  Step s;
  build_step(s, false);
  // bf16 convs that CUDA would run NHWC, on the CPU both ways: oneDNN's native bf16 kernels for
  // NHWC and NCHW operands may add in other orders (AMX machines do), and a sum that lands on
  // the other side of a bf16 rounding boundary moves by an ulp (2^-8), and further where a relu
  // or a max-pool near a tie then goes the other way: the two steps agree as whole outputs (a
  // few percent at most), while a wrong rewrite (a transposed operand, a missed layout) is off
  // by O(1)
  const Program p = autocast(s.p, bf16);
  const Program q = channels_last(p, Backend::cuda);
  int nhwc = 0;
  for (const Node& n : q.graph.nodes) nhwc += n.attrs.b("channels_last", false);
  ASSERT_GT(nhwc, 20);
  std::map<std::string, Array> feeds{{"x", random_array({4, 3, 16, 16}, f32)},
                                     {"labels", random_ints({4}, 0, 9)}};
  for (size_t i = 0; i < s.net.params.size(); ++i)
    feeds[s.net.params[i].name()] = s.net.values[i];
  const auto want = interpret(p, feeds), got = interpret(q, feeds);
  ASSERT_EQ(got.size(), want.size());
  ASSERT_EQ(got.size(), s.net.params.size() + 1);
  for (size_t i = 0; i < got.size(); ++i) {
    SCOPED_TRACE(i == 0 ? std::string("loss") : "gradient of " + s.net.params[i - 1].name());
    const auto w = to_f64(want[i]);
    double scale = 0;
    for (double v : w) scale = std::max(scale, std::abs(v));
    EXPECT_GT(scale, 1e-4);
    // As a whole: bf16 sums in other orders move single elements by many ulps where a relu or a
    // max-pool near a tie goes the other way (one seed moved 14 of 324 by 10% of the largest),
    // while a wrong rewrite (a transposed operand, a missed layout) is off by the gradient's size
    const auto g = to_f64(got[i]);
    ASSERT_EQ(g.size(), w.size());
    double err = 0, norm = 0, worst = 0;
    for (size_t k = 0; k < w.size(); ++k) {
      err += (g[k] - w[k]) * (g[k] - w[k]);
      norm += w[k] * w[k];
      worst = std::max(worst, std::abs(g[k] - w[k]));
    }
    EXPECT_LE(std::sqrt(err / norm), 0.1) << "relative L2 error of the whole output";
    EXPECT_LE(worst, 0.25 * scale) << "largest error against the output's largest value";
  }
}

}  // namespace
}  // namespace kiln
