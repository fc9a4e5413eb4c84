// quantized_conv against a float64 reference of its definition (tests/quant/conv_reference.h):
// exact integer window sums with padding at the real 0, scale, bias, residual, relu, round half
// to even, saturate. Bit for bit on fresh random data; the fused pass is tested in
// tests/quant/test_quant_conv_fuse.cpp.
#include "core/graph_impl.h"
#include "core/op_registry.h"
#include "kiln/ops/quant.h"
#include "quant/conv_reference.h"
#include "support/executable_env.h"
#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;

Tensor build(Graph& g, const ConvProblem& p, const ConvData& d, const Tensor& x,
             std::optional<Tensor> bias = std::nullopt) {
  QuantizedConvOptions o;
  o.conv = conv_options(p);
  o.relu = p.relu;
  if (p.gelu) o.gelu = p.gelu == 2 ? GeluApprox::tanh : GeluApprox::none;
  if (p.bias) o.bias = bias ? *bias : g.constant(d.bias);
  if (p.residual) o.residual = g.constant(d.res);
  return quantized_conv({x, g.constant(d.sx), g.constant(d.zx)},
                        {g.constant(d.w), g.constant(d.sw), g.constant(d.zw)}, g.constant(d.sy),
                        g.constant(d.zy), o);
}

// On NCHW data (the channels_last pass off) every kernel computes the exact epilogue: bit for
// bit the reference.
TEST(QuantizedConv, MatchesReference) {
  const ScopedEnv off("KILN_CHANNELS_LAST", "0");
  for (const ConvProblem& p : conv_problems()) {
    SCOPED_TRACE(describe(p));
    const ConvData d = random_conv_data(p);
    Graph g;
    auto x = g.placeholder(p.x, p.xt, "x");
    const Tensor y = build(g, p, d, x);
    EXPECT_EQ(y.shape(), out_shape(p));
    EXPECT_EQ(y.dtype(), p.yt);
    expect_conv_within_lsb(eval1(g, y, {{x, d.x}}), conv_reference(p, d), 0);
  }
}

// NHWC: the node given channels_last directly (x and residual transposed in, the output
// transposed back), and the channels_last pass (on by default) choosing it. The CPU's oneDNN
// path then runs the epilogue in f32: within 1 LSB.
TEST(QuantizedConv, ChannelsLastWithinOneLsb) {
  const std::vector<int64_t> to_nhwc{0, 2, 3, 1}, to_nchw{0, 3, 1, 2};
  for (const ConvProblem& p : conv_problems()) {
    SCOPED_TRACE(describe(p));
    const ConvData d = random_conv_data(p);
    const auto ref = conv_reference(p, d);
    {
      Graph g;
      auto x = g.placeholder(p.x, p.xt, "x");
      expect_conv_within_lsb(eval1(g, build(g, p, d, x), {{x, d.x}}), ref, 1);
    }
    Graph g;
    auto x = g.placeholder(p.x, p.xt, "x");
    const Tensor nchw = build(g, p, d, x);
    const detail::Node& node = nchw.graph_impl()->nodes[nchw.node_id()];
    std::vector<Tensor> in;
    for (size_t k = 0; k < node.inputs.size(); ++k)
      in.push_back(Tensor(nchw.graph_impl(), node.inputs[k].node, node.inputs[k].index));
    in[0] = transpose(x, to_nhwc);
    if (p.residual) in.back() = transpose(in.back(), to_nhwc);
    Attrs attrs = node.attrs;
    attrs.set("channels_last", true);
    const Tensor nhwc = detail::make_node1(OpId::QuantizedConv, in, attrs);
    const Shape os = out_shape(p);
    EXPECT_EQ(nhwc.shape(), (Shape{os[0], os[2], os[3], os[1]}));
    expect_conv_within_lsb(eval1(g, transpose(nhwc, to_nchw), {{x, d.x}}), ref, 1);
  }
}

// A bias of shape (O, 1, 1) or (1, O, 1, 1), as the pass keeps it, reads the same values.
TEST(QuantizedConv, ChannelShapedBias) {
  ConvProblem p = conv_problems()[0];
  const ConvData d = random_conv_data(p);
  for (const Shape& bs : {Shape{p.o, 1, 1}, Shape{1, p.o, 1, 1}}) {
    Graph g;
    auto x = g.placeholder(p.x, p.xt, "x");
    const Tensor y = build(g, p, d, x, reshape(g.constant(d.bias), bs));
    expect_conv_within_lsb(eval1(g, y, {{x, d.x}}), conv_reference(p, d), 0);
  }
}

// An i32 bias (ONNX QLinearConv's) adds to the integer sum: the same as a float bias of
// b * x_scale * w_scale up to the rounding of that product.
TEST(QuantizedConv, IntegerBiasAddsToTheSum) {
  ConvProblem p = conv_problems()[1];
  ConvData d = random_conv_data(p);
  const Array ib = random_ints({p.o}, -2000, 2000, i32);
  const auto b = to_f64(ib);
  const double sx = to_f64(d.sx)[0], sw = to_f64(d.sw)[0];
  std::vector<float> fb;
  for (double v : b) fb.push_back(static_cast<float>(v * sx * sw));
  d.bias = Array::from_vector(fb, {p.o});
  Graph g;
  auto x = g.placeholder(p.x, p.xt, "x");
  const Tensor y = build(g, p, d, x, g.constant(ib));
  expect_conv_within_lsb(eval1(g, y, {{x, d.x}}), conv_reference(p, d), 1);
}

TEST(QuantizedConv, RejectsBadInputs) {
  Graph g;
  auto x = g.placeholder({1, 4, 8, 8}, u8, "x");
  auto s = g.constant(Array::scalar(0.1f));
  auto zu = g.constant(Array::scalar(uint8_t{0}));
  auto z8 = g.constant(Array::scalar(int8_t{0}));
  auto w = g.placeholder({6, 3, 3, 3}, i8, "w");
  expect_error<ShapeError>(
      [&] {
        quantized_conv({x, s, zu}, {w, s, z8}, s, zu);
      },
      {"[conv]", "(1, 4, 8, 8)", "(6, 3, 3, 3)"});
  auto w3 = g.placeholder({6, 4, 3}, i8, "w3");
  expect_error<ShapeError>(
      [&] {
        quantized_conv({x, s, zu}, {w3, s, z8}, s, zu);
      },
      {"[quantized_conv]", "rank 4", "(6, 4, 3)"});
  auto wf = g.placeholder({6, 4, 3, 3}, f32, "wf");
  expect_error<DTypeError>(
      [&] {
        quantized_conv({x, s, zu}, {wf, s, z8}, s, zu);
      },
      {"[quantized_conv]", "f32"});
  auto w4 = g.placeholder({6, 4, 3, 3}, i8, "w4");
  auto s2 = g.constant(Array::from_vector(std::vector<float>{0.1f, 0.2f}, {2}));
  expect_error<ShapeError>(
      [&] {
        quantized_conv({x, s, zu}, {w4, s2, z8}, s, zu);
      },
      {"[quantized_conv]", "(2,)"});
  expect_error<DTypeError>(
      [&] {
        quantized_conv({x, s, z8}, {w4, s, z8}, s, zu);
      },
      {"[quantized_conv]", "zero points"});
  QuantizedConvOptions o;
  o.bias = g.constant(random_array({5}, f32));
  expect_error<ShapeError>(
      [&] {
        quantized_conv({x, s, zu}, {w4, s, z8}, s, zu, o);
      },
      {"[quantized_conv]", "bias", "(5,)"});
  o.bias.reset();
  o.residual = g.constant(random_array({1, 6, 8, 8}, f32));
  expect_error<ShapeError>(
      [&] {
        quantized_conv({x, s, zu}, {w4, s, z8}, s, zu, o);
      },
      {"[quantized_conv]", "residual", "(1, 6, 6, 6)"});
}

// Integer in and out: no gradient rule (gradients() stops at its integer output).
TEST(QuantizedConv, NotDifferentiable) {
  EXPECT_EQ(op_def(OpId::QuantizedConv).grad_kind, GradKind::none);
}

}  // namespace
}  // namespace kiln
