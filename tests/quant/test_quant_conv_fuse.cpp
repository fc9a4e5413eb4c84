// fuse_quant on convolutions: dequantize -> conv2d (+ bias) (+ residual) (+ relu) -> quantize
// runs as one quantized_conv within 1 LSB of the same graph compiled without the pass, on fresh
// random data (tests/quant/conv_reference.h has the problems); the bias as conv's input or an add
// of a channel-shaped constant. ONNX: a QDQ conv model fuses, and QLinearConv imports as one
// quantized_conv that matches the spec's definition bit for bit.
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <string>

#include "core/graph_impl.h"
#include "kiln/onnx.h"
#include "kiln/ops/quant.h"
#include "passes/program.h"
#include "quant/conv_reference.h"
#include "support/executable_env.h"
#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;

enum class BiasForm { conv_input, add_o11, add_1o11 };

// The QDQ graph of a problem: quantized x dequantized, int8 weights dequantized (per channel
// along axis 0), conv2d, bias in `form`, residual, relu or gelu, quantize.
Tensor qdq_conv(Graph& g, const ConvProblem& p, const ConvData& d, const Tensor& x, BiasForm form) {
  const Tensor dx = dequantize(x, g.constant(d.sx), g.constant(d.zx));
  const Tensor dw = dequantize(g.constant(d.w), g.constant(d.sw), g.constant(d.zw), {.axis = 0});
  const bool in_conv = p.bias && form == BiasForm::conv_input;
  Tensor y = conv2d(dx, dw, in_conv ? std::optional<Tensor>(g.constant(d.bias)) : std::nullopt,
                    conv_options(p));
  if (p.bias && !in_conv)
    y = reshape(g.constant(d.bias),
                form == BiasForm::add_o11 ? Shape{p.o, 1, 1} : Shape{1, p.o, 1, 1}) +
        y;
  if (p.residual) y = y + g.constant(d.res);
  if (p.relu) y = relu(y);
  if (p.gelu) y = gelu(y, p.gelu == 2 ? GeluApprox::tanh : GeluApprox::none);
  return quantize(y, g.constant(d.sy), g.constant(d.zy));
}

TEST(QuantizedConvFusion, FusedEqualsUnfusedWithinOneLsb) {
  int i = 0;
  for (const ConvProblem& p : conv_problems()) {
    const auto form = static_cast<BiasForm>(i++ % 3);
    SCOPED_TRACE(describe(p) + " bias form " + std::to_string(static_cast<int>(form)));
    const ConvData d = random_conv_data(p);
    Graph g;
    auto x = g.placeholder(p.x, p.xt, "x");
    const Tensor y = qdq_conv(g, p, d, x, form);
    CompileOptions off;
    off.fuse_quant = false;
    const Executable fused = g.compile(default_device(), {}, {y});
    const Executable plain = g.compile(default_device(), {}, {y}, off);
    EXPECT_EQ(count_steps(fused, "quantized_conv"), 1) << fused.dump();
    EXPECT_EQ(count_steps(fused, "conv"), 0);
    EXPECT_EQ(count_steps(plain, "quantized_conv"), 0);
    const Array yf = fused.run({{x, d.x}})[0].to(Device::cpu());
    const Array yp = plain.run({{x, d.x}})[0].to(Device::cpu());
    expect_conv_within_lsb(yf, to_f64(yp), 1);
    expect_conv_within_lsb(yf, conv_reference(p, d), 1);
  }
}

// A residual that is a per-tensor dequantize enters the fused node as its int8 data, scale and
// zero point (quantized_residual), with no dequantize left in the run, and the kernel dequantizes
// it to the very values dequantize gives: the results equal those of the same graph whose
// residual is fed already dequantized (an f32 residual), bit for bit on CUDA (whose epilogue is
// exact either way), within 1 LSB on the CPU (where oneDNN's f32 epilogue adds a quantized
// residual's integers in other units).
TEST(QuantizedConvFusion, QuantizedResidualEqualsItsDequantizedValues) {
  int checked = 0;
  for (const ConvProblem& p : conv_problems()) {
    if (!p.residual) continue;
    SCOPED_TRACE(describe(p));
    const ConvData d = random_conv_data(p);
    const Shape ys = out_shape(p);
    const DType rt = p.yt;  // the residual as the previous layer's output would be
    const Array rq = rt == u8 ? random_ints(ys, 0, 255, u8) : random_ints(ys, -128, 127, i8);
    const Array sr = random_array({}, f32, 0.01, 0.03);
    const Array zr = rt == u8 ? random_ints({}, 90, 160, u8) : random_ints({}, -10, 10, i8);
    Graph h;
    const Tensor hq = h.placeholder(ys, rt, "rq");
    const Array rf = eval1(h, dequantize(hq, h.constant(sr), h.constant(zr)), {{hq, rq}});
    auto build = [&](Graph& g, const Tensor& x, const Tensor& residual) {
      const Tensor dx = dequantize(x, g.constant(d.sx), g.constant(d.zx));
      const Tensor dw =
          dequantize(g.constant(d.w), g.constant(d.sw), g.constant(d.zw), {.axis = 0});
      Tensor y = conv2d(dx, dw, p.bias ? std::optional<Tensor>(g.constant(d.bias)) : std::nullopt,
                        conv_options(p)) +
                 residual;
      if (p.relu) y = relu(y);
      if (p.gelu) y = gelu(y, p.gelu == 2 ? GeluApprox::tanh : GeluApprox::none);
      return quantize(y, g.constant(d.sy), g.constant(d.zy));
    };
    Graph gq, gf;
    const Tensor xq = gq.placeholder(p.x, p.xt, "x"), r = gq.placeholder(ys, rt, "r");
    const Tensor yq = build(gq, xq, dequantize(r, gq.constant(sr), gq.constant(zr)));
    const Tensor xf = gf.placeholder(p.x, p.xt, "x"), rf_in = gf.placeholder(ys, f32, "r");
    const Tensor yf = build(gf, xf, rf_in);
    const Executable eq = gq.compile(default_device(), {}, {yq});
    const Executable ef = gf.compile(default_device(), {}, {yf});
    EXPECT_EQ(count_steps(eq, "quantized_conv"), 1) << eq.dump();
    EXPECT_EQ(count_steps(eq, "dequantize"), 0) << eq.dump();
    const auto got = to_f64(eq.run({{xq, d.x}, {r, rq}})[0].to(Device::cpu()));
    const auto want = to_f64(ef.run({{xf, d.x}, {rf_in, rf}})[0].to(Device::cpu()));
    if (default_device().kind == Device::Kind::cuda)
      EXPECT_EQ(got, want);
    else
      expect_conv_within_lsb(eq.run({{xq, d.x}, {r, rq}})[0].to(Device::cpu()), want, 1);
    if (checked++ == 0) {  // a package keeps the quantized residual (its node validates on load)
      const std::string path = (std::filesystem::temp_directory_path() /
                                ("kiln_qres_" + std::to_string(seed()) + ".kiln"))
                                   .string();
      eq.save(path);
      const Executable back = Executable::load(path, default_device());
      std::remove(path.c_str());
      EXPECT_EQ(to_f64(back.run({{"x", d.x}, {"r", rq}})[0].to(Device::cpu())), got);
    }
  }
  EXPECT_GE(checked, 3);
}

// max_pool(dequantize(q)) runs as dequantize(max_pool(q)) (fuse_quant): the pool on int8 data,
// values and indices bit for bit those of the graph compiled without the pass. Fresh random
// data, u8 and i8, padding and ceil mode; a negative scale (a decreasing dequantize) and a scale
// that is not a constant leave the graph as it is.
TEST(QuantizedConvFusion, MaxPoolMovesBeforeDequantize) {
  struct Case {
    DType t;
    double scale;
    bool constant_scale;
    bool moves;
  };
  for (const Case& k : {Case{u8, 0.02, true, true}, Case{i8, 0.7, true, true},
                        Case{u8, -0.02, true, false}, Case{i8, 0.05, false, false}}) {
    SCOPED_TRACE(fmt::format("{} scale {} constant {}", name(k.t), k.scale, k.constant_scale));
    const Shape xs{2, 5, 13, 11};
    const Array q = k.t == u8 ? random_ints(xs, 0, 255, u8) : random_ints(xs, -128, 127, i8);
    const Array zp = k.t == u8 ? random_ints({}, 100, 150, u8) : random_ints({}, -10, 10, i8);
    const Array sc = Array::scalar(static_cast<float>(k.scale));
    Graph g;
    const Tensor x = g.placeholder(xs, k.t, "q");
    const Tensor s = k.constant_scale ? g.constant(sc) : g.placeholder({}, f32, "s");
    PoolOptions o;
    o.kernel = {3, 3};
    o.stride = {2, 2};
    o.padding = {1, 1};
    o.ceil_mode = true;
    auto [y, idx] = max_pool_with_indices(dequantize(x, s, g.constant(zp)), o);
    CompileOptions plain;
    plain.fuse_quant = false;
    const Executable fused = g.compile(default_device(), {}, {y, idx});
    const Executable ref = g.compile(default_device(), {}, {y, idx}, plain);
    // the pool's step reads int8 (whatever the layout pass puts around it)
    const std::string dump = fused.dump();
    bool int8_pool = false;
    std::istringstream lines(dump);
    for (std::string line; std::getline(lines, line);)
      int8_pool = int8_pool || (line.find("= max_pool(") != std::string::npos &&
                                line.find(fmt::format("-> {}(", name(k.t))) != std::string::npos);
    EXPECT_EQ(int8_pool, k.moves) << dump;
    Feeds feeds{{x, q}};
    if (!k.constant_scale) feeds.push_back({s, sc});
    const auto a = fused.run(feeds), b = ref.run(feeds);
    EXPECT_EQ(to_f64(a[0].to(Device::cpu())), to_f64(b[0].to(Device::cpu())));
    EXPECT_EQ(to_f64(a[1].to(Device::cpu())), to_f64(b[1].to(Device::cpu())));
  }
}

// A pool quantized again with its dequantize's scale and zero point (post-training quantization
// gives a max pool its input's) is the int8 pool itself: no dequantize, no quantize left, the
// indices unread (no_indices), and the values bit for bit those without the pass; also after a
// package round trip.
TEST(QuantizedConvFusion, RequantizedMaxPoolIsTheInt8Pool) {
  for (DType t : {u8, i8}) {
    SCOPED_TRACE(name(t));
    const Shape xs{3, 8, 10, 12};
    const Array q = t == u8 ? random_ints(xs, 0, 255, u8) : random_ints(xs, -128, 127, i8);
    const Array zp = t == u8 ? random_ints({}, 100, 150, u8) : random_ints({}, -10, 10, i8);
    const Array sc = random_array({}, f32, 0.01, 0.05);
    Graph g;
    const Tensor x = g.placeholder(xs, t, "q");
    PoolOptions o;
    o.kernel = {3, 3};
    o.stride = {2, 2};
    o.padding = {1, 1};
    const Tensor pooled = max_pool(dequantize(x, g.constant(sc), g.constant(zp)), o);
    // separate constants of the same values, as post-training quantization writes them
    const Tensor y = quantize(pooled, g.constant(sc), g.constant(zp));
    CompileOptions plain;
    plain.fuse_quant = false;
    const Executable fused = g.compile(default_device(), {}, {y});
    const Executable ref = g.compile(default_device(), {}, {y}, plain);
    EXPECT_EQ(count_steps(fused, "quantize"), 0) << fused.dump();
    EXPECT_EQ(count_steps(fused, "dequantize"), 0) << fused.dump();
    const Program pass = fuse_quant(extract_program(*y.graph_impl(), {{y.node_id(), 0}}));
    int pools = 0;
    for (const auto& n : pass.graph.nodes)
      if (n.op == OpId::MaxPool) {
        ++pools;
        EXPECT_TRUE(n.attrs.b("no_indices", false));
        EXPECT_EQ(pass.graph.info(n.inputs[0]).dtype, t);
      }
    EXPECT_EQ(pools, 1);
    const auto want = to_f64(ref.run({{x, q}})[0].to(Device::cpu()));
    EXPECT_EQ(to_f64(fused.run({{x, q}})[0].to(Device::cpu())), want);
    const std::string path = (std::filesystem::temp_directory_path() /
                              ("kiln_qpool_" + std::to_string(seed()) + ".kiln"))
                                 .string();
    fused.save(path);
    const Executable back = Executable::load(path, default_device());
    std::remove(path.c_str());
    EXPECT_EQ(to_f64(back.run({{"q", q}})[0].to(Device::cpu())), want);
  }
}

TEST(QuantizedConvFusion, NotFusedWhenAnIntermediateIsReadElsewhere) {
  const ConvProblem p = conv_problems()[0];
  const ConvData d = random_conv_data(p);
  Graph g;
  auto x = g.placeholder(p.x, p.xt, "x");
  const Tensor dx = dequantize(x, g.constant(d.sx), g.constant(d.zx));
  const Tensor dw = dequantize(g.constant(d.w), g.constant(d.sw), g.constant(d.zw), {.axis = 0});
  const Tensor c = conv2d(dx, dw, g.constant(d.bias), conv_options(p));
  const Tensor y = quantize(relu(c + g.constant(d.res)), g.constant(d.sy), g.constant(d.zy));
  const Executable exe = g.compile(default_device(), {}, {y, c});
  EXPECT_EQ(count_steps(exe, "quantized_conv"), 0);
  const auto out = exe.run({{x, d.x}});
  expect_conv_within_lsb(out[0].to(Device::cpu()), conv_reference(p, d), 1);
}

// A (W)-shaped add broadcasts along the width, not the channels: no bias, no fusion.
TEST(QuantizedConvFusion, WidthBroadcastIsNotABias) {
  ConvProblem p = conv_problems()[3];  // 1x1, output (2, 5, 5, 6)
  p.bias = false;
  const ConvData d = random_conv_data(p);
  Graph g;
  auto x = g.placeholder(p.x, p.xt, "x");
  const Tensor dx = dequantize(x, g.constant(d.sx), g.constant(d.zx));
  const Tensor dw = dequantize(g.constant(d.w), g.constant(d.sw), g.constant(d.zw), {.axis = 0});
  const Tensor c = conv2d(dx, dw, std::nullopt, conv_options(p));
  const Tensor y =
      quantize(c + g.constant(random_array({6}, f32)), g.constant(d.sy), g.constant(d.zy));
  EXPECT_EQ(count_steps(g.compile(default_device(), {}, {y}), "quantized_conv"), 0);
}

std::string data_file(const std::string& name) {
  return std::string(KILN_QUANT_DATA_DIR) + "/" + name;
}

TEST(QuantizedConvFusion, QdqOnnxModelFusesWithinOneLsb) {
  const onnx::Model m = onnx::import(data_file("qdq_conv.onnx"));
  CompileOptions off;
  off.fuse_quant = false;
  const Executable fused = m.graph.compile(default_device(), m.feed_shapes(), m.output_tensors());
  const Executable plain =
      m.graph.compile(default_device(), m.feed_shapes(), m.output_tensors(), off);
  EXPECT_EQ(count_steps(fused, "quantized_conv"), 2) << fused.dump();
  EXPECT_EQ(count_steps(fused, "conv"), 0);
  EXPECT_EQ(count_steps(plain, "quantized_conv"), 0);
  const Array x = random_array({2, 4, 10, 10}, f32, -2, 2);
  const Array res = random_array({2, 4, 5, 5}, f32, -1, 1);
  const auto yf = fused.run({{"x", x}, {"res", res}});
  const auto yp = plain.run({{"x", x}, {"res", res}});
  ASSERT_EQ(yf.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    SCOPED_TRACE("output " + std::to_string(i));
    expect_conv_within_lsb(yf[i].to(Device::cpu()), to_f64(yp[i].to(Device::cpu())), 1);
  }
}

// A package keeps the fused convolutions (the loader checks their inputs and geometry) and runs
// as the executable did.
TEST(QuantizedConvFusion, PackageRoundTrip) {
  const onnx::Model m = onnx::import(data_file("qdq_conv.onnx"));
  const Executable exe = m.graph.compile(Device::cpu(), m.feed_shapes(), m.output_tensors());
  const std::string path =
      (std::filesystem::temp_directory_path() / ("kiln_qconv_" + std::to_string(seed()) + ".kiln"))
          .string();
  exe.save(path);
  const Executable back = Executable::load(path, Device::cpu());
  std::remove(path.c_str());
  EXPECT_EQ(count_steps(back, "quantized_conv"), 2);
  const Array x = random_array({2, 4, 10, 10}, f32, -2, 2);
  const Array res = random_array({2, 4, 5, 5}, f32, -1, 1);
  const auto a = exe.run({{"x", x}, {"res", res}}), b = back.run({{"x", x}, {"res", res}});
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(to_f64(a[i]), to_f64(b[i]));
}

TEST(QuantizedConvFusion, QLinearConvImportsAsOneNodeMatchingTheSpec) {
  const onnx::Model m = onnx::import(data_file("qlinear_conv.onnx"));
  const Executable exe = m.graph.compile(default_device(), m.feed_shapes(), m.output_tensors());
  EXPECT_EQ(count_steps(exe, "quantized_conv"), 1) << exe.dump();
  EXPECT_EQ(count_steps(exe, "conv"), 0);
  const Array x = Array::load_npy(data_file("qlinear_conv_x.npy"));
  const Array want = Array::load_npy(data_file("qlinear_conv_y.npy"));
  const Array y = exe.run({{"x", x}})[0].to(Device::cpu());
  EXPECT_EQ(y.dtype(), u8);
  expect_conv_within_lsb(y, to_f64(want), 0);
}

}  // namespace
}  // namespace kiln
