// quantized_conv with attr quantize_x: x is an f32 NCHW image that the conv quantizes itself, as
// quantize does. On CUDA the channels_last pass gives it to an int8 conv whose x is the
// per-tensor quantize of an image of at most 4 channels, read by the conv alone (the quantize
// and the transpose to NHWC disappear; the implicit GEMM's rows mode quantizes while it makes its
// padded copy, other convs quantize into an int8 copy first). Against the float64 reference of
// the conv over the image quantized on the host (x / scale in f32, rounded half to even, plus the
// zero point, saturated: quantize's definition) within 1 LSB, and exactly against the same graph
// whose quantize is not fused (the conv then reads the same integers). Fresh random data; the
// image spread so that some values saturate.
#include <cmath>

#include "core/graph_impl.h"
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
std::vector<ConvProblem> image_problems() {
  return {
      // the implicit GEMM's rows mode: a ResNet stem; one channel with an f32 residual; four
      // channels with dilation along H
      {{2, 3, 45, 38}, 64, 7, 7, {2, 2}, {3, 3, 3, 3}, {1, 1}, 1, u8, i8, u8, true, true, false,
       true, true},
      {{3, 1, 20, 23}, 16, 5, 5, {1, 1}, {2, 1, 2, 3}, {1, 1}, 1, i8, i8, i8, false, true, true,
       false, true},
      {{2, 4, 17, 19}, 24, 3, 3, {1, 2}, {1, 1, 1, 1}, {2, 1}, 1, u8, i8, u8, true, false, false,
       true, true},
      // outside it (an int8 copy first): dilation along W, a window row of 11 x 4 bytes, a
      // weight zero point, u8 weights
      {{2, 3, 12, 12}, 8, 3, 3, {1, 1}, {1, 1, 1, 1}, {1, 2}, 1, u8, i8, u8, true, true, false,
       true, true},
      {{2, 3, 16, 16}, 8, 11, 11, {2, 2}, {5, 5, 5, 5}, {1, 1}, 1, i8, i8, u8, true, true, false,
       false, true},
      {{2, 2, 10, 9}, 8, 3, 3, {1, 1}, {1, 1, 1, 1}, {1, 1}, 1, u8, i8, i8, false, true, false,
       true, false},
      {{2, 3, 11, 10}, 12, 3, 3, {2, 1}, {0, 1, 1, 0}, {1, 1}, 1, i8, u8, u8, true, false, true,
       false, true}};
}
// clang-format on

// An f32 image and its quantized values on the host (d.x), with the conv's data.
struct ImageData {
  ConvData d;
  Array image;
};

ImageData random_image_data(const ConvProblem& p) {
  ImageData r{random_conv_data(p), random_array(p.x, f32, -4.5, 4.5)};
  const std::vector<double> xs = to_f64(r.image);
  const float s = static_cast<float>(to_f64(r.d.sx)[0]);
  const double z = to_f64(r.d.zx)[0], lo = p.xt == u8 ? 0 : -128, hi = p.xt == u8 ? 255 : 127;
  std::vector<double> q;
  int saturated = 0;
  for (double v : xs) {
    const double t = std::nearbyint(static_cast<double>(static_cast<float>(v) / s)) + z;
    saturated += t < lo || t > hi;
    q.push_back(std::clamp(t, lo, hi));
  }
  EXPECT_GT(saturated, 0) << "the image should saturate somewhere";
  if (p.xt == u8) {
    std::vector<uint8_t> b(q.begin(), q.end());
    r.d.x = Array::from_vector(b, p.x);
  } else {
    std::vector<int8_t> b(q.begin(), q.end());
    r.d.x = Array::from_vector(b, p.x);
  }
  return r;
}

struct Built {
  Tensor image, q, y;
};

// p's conv over the int8 x given, with d's weights and output parameters.
Tensor conv_of(Graph& g, const ConvProblem& p, const ConvData& d, const QTensor& x) {
  QuantizedConvOptions o;
  o.conv = conv_options(p);
  o.relu = p.relu;
  if (p.gelu) o.gelu = p.gelu == 2 ? GeluApprox::tanh : GeluApprox::none;
  if (p.bias) o.bias = g.constant(d.bias);
  if (p.residual) o.residual = g.constant(d.res);
  return quantized_conv(x, {g.constant(d.w), g.constant(d.sw), g.constant(d.zw)}, g.constant(d.sy),
                        g.constant(d.zy), o);
}

// y = quantized_conv(quantize(image, sx, zx)) with the conv's x scale and zero point the very
// tensors the quantize takes (as fuse_quant leaves them).
Built build(Graph& g, const ConvProblem& p, const ConvData& d) {
  Built b;
  b.image = g.placeholder(p.x, f32, "image");
  const Tensor sx = g.constant(d.sx), zx = g.constant(d.zx);
  b.q = quantize(b.image, sx, zx);
  b.y = conv_of(g, p, d, {b.q, sx, zx});
  return b;
}

std::vector<Device> devices() {
  std::vector<Device> r{Device::cpu()};
  if (cuda_device_count() > 0) r.push_back(Device::cuda(0));
  return r;
}

void expect_equal(const Array& a, const Array& b) {
  const auto x = to_f64(a), y = to_f64(b);
  ASSERT_EQ(x.size(), y.size());
  int bad = 0;
  for (size_t i = 0; i < x.size(); ++i)
    if (x[i] != y[i] && bad++ < 5)
      ADD_FAILURE() << "element " << i << ": " << x[i] << " vs " << y[i];
}

// On CUDA the quantize runs inside the conv; on the CPU it stays. Either way the result is the
// reference's within 1 LSB, and exactly what the graph computes when the quantize's output is
// also returned (so that it cannot be fused).
TEST(QuantizedConvImage, FusedOnCudaEqualsUnfused) {
  for (const Device& dev : devices()) {
    for (const ConvProblem& p : image_problems()) {
      SCOPED_TRACE(describe(p) + " on " + dev.str());
      const ImageData id = random_image_data(p);
      Graph g;
      const Built b = build(g, p, id.d);
      const Executable fused = g.compile(dev, {}, {b.y});
      const Executable plain = g.compile(dev, {}, {b.y, b.q});
      const bool cuda = dev.kind == Device::Kind::cuda;
      EXPECT_EQ(count_steps(fused, "quantize"), cuda ? 0 : 1) << fused.dump();
      EXPECT_EQ(count_steps(plain, "quantize"), 1) << plain.dump();
      const Array y = fused.run({{b.image, id.image}})[0].to(Device::cpu());
      const auto both = plain.run({{b.image, id.image}});
      expect_equal(both[1].to(Device::cpu()), id.d.x);  // (the host's quantize is quantize's)
      expect_conv_within_lsb(y, conv_reference(p, id.d), 1);
      expect_equal(y, both[0].to(Device::cpu()));
    }
  }
}

// The op with quantize_x built directly, on every backend, NCHW (optimize off: no channels_last
// pass) and NHWC: exactly the plain op over the quantized image.
TEST(QuantizedConvImage, EveryBackendAndLayout) {
  for (const Device& dev : devices()) {
    for (const ConvProblem& p : image_problems()) {
      for (const bool optimize : {false, true}) {
        SCOPED_TRACE(describe(p) + " on " + dev.str() + (optimize ? " optimized" : ""));
        const ImageData id = random_image_data(p);
        Graph g;
        const Built b = build(g, p, id.d);
        const detail::Node& n = g.impl().nodes[b.y.node_id()];
        Attrs a = n.attrs;
        a.set("quantize_x", true);
        std::vector<Tensor> in;
        for (size_t k = 0; k < n.inputs.size(); ++k)
          in.push_back(k == 0 ? b.image
                              : Tensor(b.y.graph_impl(), n.inputs[k].node, n.inputs[k].index));
        const Tensor y = detail::make_node1(OpId::QuantizedConv, in, a);
        EXPECT_EQ(y.shape(), b.y.shape());
        EXPECT_EQ(y.dtype(), b.y.dtype());
        CompileOptions o;
        o.optimize = optimize;
        const Executable fused = g.compile(dev, {}, {y}, o);
        const Executable plain = g.compile(dev, {}, {b.y, b.q}, o);
        EXPECT_EQ(count_steps(fused, "quantize"), 0) << fused.dump();
        const Array got = fused.run({{b.image, id.image}})[0].to(Device::cpu());
        expect_equal(got, plain.run({{b.image, id.image}})[0].to(Device::cpu()));
        expect_conv_within_lsb(got, conv_reference(p, id.d), 1);
      }
    }
  }
}

// The pass (for CUDA, run here without a GPU) fuses only the quantize it may: per tensor with the
// conv's own x scale and zero point, of an f32 image of at most 4 channels, read by the conv
// alone.
TEST(QuantizedConvImage, PassFusesOnlyWhatItMay) {
  auto fused_convs = [](const std::vector<Tensor>& outs) {
    std::vector<detail::ValueRef> refs;
    for (const Tensor& t : outs) refs.push_back({t.node_id(), 0});
    const Program q = channels_last(extract_program(*outs[0].graph_impl(), refs), Backend::cuda);
    int fused = 0, quantizes = 0;
    for (const auto& n : q.graph.nodes) {
      if (n.op == OpId::Quantize) ++quantizes;
      if (n.op != OpId::QuantizedConv || !n.attrs.b("quantize_x", false)) continue;
      ++fused;
      EXPECT_EQ(q.graph.nodes[n.inputs[0].node].op, OpId::Placeholder);
      EXPECT_TRUE(n.attrs.b("channels_last", false));
    }
    return std::pair{fused, quantizes};
  };
  ConvProblem p = image_problems()[0];
  {
    Graph g;
    const ConvData d = random_conv_data(p);
    const Built b = build(g, p, d);
    const auto [fused, quantizes] = fused_convs({b.y});
    EXPECT_EQ(fused, 1);
    (void)quantizes;  // (the dead quantize goes with dead code elimination)
  }
  {  // read twice: by the conv and as an output
    Graph g;
    const ConvData d = random_conv_data(p);
    const Built b = build(g, p, d);
    EXPECT_EQ(fused_convs({b.y, b.q}).first, 0);
  }
  {  // five channels
    ConvProblem five = p;
    five.x[1] = 5;
    Graph g;
    const ConvData d = random_conv_data(five);
    EXPECT_EQ(fused_convs({build(g, five, d).y}).first, 0);
  }
  {  // the conv's x scale is another tensor than the quantize's
    Graph g;
    const ConvData d = random_conv_data(p);
    const Tensor image = g.placeholder(p.x, f32, "image");
    const Tensor zx = g.constant(d.zx);
    const Tensor q = quantize(image, g.constant(d.sx), zx);
    EXPECT_EQ(fused_convs({conv_of(g, p, d, {q, g.constant(d.sx), zx})}).first, 0);
  }
  {  // an image that is NHWC already (the dequantized output of an int8 conv): its quantize runs
     // on NHWC and the second conv reads that, with no f32 transpose
    Graph g;
    const ConvData d = random_conv_data(p);
    const Tensor x8 = g.placeholder({2, 8, 45, 38}, u8, "x8");
    QuantizedConvOptions o1;
    o1.conv.padding = {1, 1};
    const Tensor sx = g.constant(d.sx), zx = g.constant(d.zx);
    const Tensor q1 = quantized_conv(
        {x8, g.constant(Array::scalar(0.02f)), g.constant(Array::scalar(uint8_t{128}))},
        {g.constant(random_ints({3, 8, 3, 3}, -127, 127, i8)), g.constant(Array::scalar(0.01f)),
         g.constant(Array::scalar(int8_t{0}))},
        sx, zx, o1);
    const Tensor image = dequantize(q1, sx, zx) * g.constant(Array::scalar(0.5f));
    const Tensor y = conv_of(g, p, d, {quantize(image, sx, zx), sx, zx});
    EXPECT_EQ(fused_convs({y}).first, 0);
    const Program q =
        channels_last(extract_program(*y.graph_impl(), {{y.node_id(), 0}}), Backend::cuda);
    for (const auto& n : q.graph.nodes)
      if (n.op == OpId::Transpose) EXPECT_NE(q.graph.info(n.inputs[0]).dtype, f32);
  }
  {  // an f16 image
    Graph g;
    const ConvData d = random_conv_data(p);
    const Tensor image = g.placeholder(p.x, f16, "image");
    const Tensor sx = g.constant(d.sx), zx = g.constant(d.zx);
    EXPECT_EQ(fused_convs({conv_of(g, p, d, {quantize(image, sx, zx), sx, zx})}).first, 0);
  }
}

TEST(QuantizedConvImage, RejectsBadInputs) {
  const ConvProblem p = image_problems()[0];
  const ConvData d = random_conv_data(p);
  Graph g;
  const Built b = build(g, p, d);
  const detail::Node& n = g.impl().nodes[b.y.node_id()];
  Attrs a = n.attrs;
  a.set("quantize_x", true);
  auto with = [&](const Tensor& x, const Tensor& zx) {
    std::vector<Tensor> in;
    for (size_t k = 0; k < n.inputs.size(); ++k)
      in.push_back(k == 0   ? x
                   : k == 2 ? zx
                            : Tensor(b.y.graph_impl(), n.inputs[k].node, n.inputs[k].index));
    return detail::make_node1(OpId::QuantizedConv, in, a);
  };
  const Tensor zx(b.y.graph_impl(), n.inputs[2].node, n.inputs[2].index);
  expect_error<DTypeError>([&] { with(b.q, zx); }, {"[quantized_conv]", "f32"});
  expect_error<DTypeError>([&] { with(b.image, g.constant(Array::scalar(1.f))); },
                           {"[quantized_conv]", "i8 or u8"});
  expect_error<ShapeError>(
      [&] {
        with(g.placeholder({2, 3, 45}, f32, "x3"), zx);
      },
      {"[quantized_conv]", "rank 4"});
}

}  // namespace
}  // namespace kiln
