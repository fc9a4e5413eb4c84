// The CPU's convolution preparation (prepare_cpu_convs): conv -> add(residual) -> relu fused into
// one fused_conv whose oneDNN primitive applies them as post-ops, constant weights laid out once,
// and max_pool without indices where nothing reads them (drop_unread_pool_indices). Each result is
// checked against the same graph in f64 without optimization (kiln's loops, not oneDNN).
#include <fmt/format.h>

#include <functional>
#include <random>
#include <thread>
#include <tuple>

#include "core/graph_impl.h"
#include "runtime/executable_impl.h"
#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;

std::vector<std::string> ops_of(const Executable& exe) {
  std::vector<std::string> ops;
  for (const auto& s : exe.placement()) ops.push_back(s.op);
  return ops;
}
int count(const std::vector<std::string>& ops, const std::string& op) {
  return static_cast<int>(std::count(ops.begin(), ops.end(), op));
}

struct Block {
  Tensor x, r, out, conv_out;
};

// relu?(conv(x, w, b?) (+ r)), with the weight a constant (or a variable), in dtype t
Block build(Graph& g, DType t, const Array& w, const Array& b, bool bias, bool residual, bool relu_,
            bool weight_variable, int groups) {
  Block m;
  m.x = g.placeholder({2, 8, 11, 9}, t, "x");
  const Tensor wt = weight_variable ? g.variable(w.astype(t), "w") : g.constant(w.astype(t), "w");
  std::optional<Tensor> bt;
  if (bias) bt = g.constant(b.astype(t), "b");
  ConvOptions o;
  o.padding = {1, 1};
  o.groups = groups;
  m.conv_out = conv2d(m.x, wt, bt, o);
  Tensor y = m.conv_out;
  if (residual) {
    m.r = g.placeholder({2, 12, 11, 9}, t, "r");
    y = y + m.r;
  }
  m.out = relu_ ? relu(y) : y;
  return m;
}

// NHWC (the channels_last pass, which fuses the epilogue itself) or NCHW (prepare_cpu_convs)
CompileOptions layout(bool nhwc) {
  CompileOptions o;
  o.kernels.channels_last = nhwc;
  return o;
}

TEST(CpuConvs, EpilogueFusesAndMatchesTheF64Loops) {
  for (bool nhwc : {false, true})
    for (int groups : {1, 4})
      for (int mask = 0; mask < 6; ++mask) {  // (an epilogue: a residual, a relu or both)
        const bool bias = mask & 1, residual = mask / 2 != 1, relu_ = mask / 2 != 0;
        SCOPED_TRACE(fmt::format("nhwc {} groups {} bias {} residual {} relu {}", nhwc, groups,
                                 bias, residual, relu_));
        const Array w = random_array({12, 8 / groups, 3, 3}, f64), b = random_array({12}, f64);
        const Array xv = random_array({2, 8, 11, 9}, f64), rv = random_array({2, 12, 11, 9}, f64);
        Graph g32, g64;
        const Block m = build(g32, f32, w, b, bias, residual, relu_, false, groups);
        const Block ref = build(g64, f64, w, b, bias, residual, relu_, false, groups);
        auto exe = g32.compile(Device::cpu(), {}, {m.out}, layout(nhwc));
        const auto ops = ops_of(exe);
        EXPECT_EQ(count(ops, "fused_conv"), 1) << exe.dump();
        EXPECT_EQ(count(ops, "transpose") > 0, nhwc) << exe.dump();
        EXPECT_EQ(count(ops, "relu") + count(ops, "add") + count(ops, "fused_elementwise"), 0)
            << exe.dump();
        Feeds f32_feeds{{m.x, xv.astype(f32)}}, f64_feeds{{ref.x, xv}};
        if (residual) {
          f32_feeds.emplace_back(m.r, rv.astype(f32));
          f64_feeds.emplace_back(ref.r, rv);
        }
        auto plain = g64.compile(Device::cpu(), {}, {ref.out}, CompileOptions{.optimize = false});
        const Array want = plain.run(f64_feeds)[0];
        // 72 products of O(1) values in f32; twice, the second from the weights laid out once
        for (int run = 0; run < 2; ++run)
          expect_close(exe.run(f32_feeds)[0], want.shape(), to_f64(want), 1e-5, 1e-5);
      }
}

// A style transfer network's residual block on the CPU: reflect pads, convolutions, instance
// norms and relus all on NHWC (pads permuted, instance norm's NHWC kernel), one transpose at the
// end; against the same graph in f64 through kiln's loops.
TEST(CpuConvs, ReflectPadsAndInstanceNormsStayNhwc) {
  const Array w1 = random_array({16, 3, 3, 3}, f64),
              w2 = random_array({16, 16, 3, 3}, f64, -0.3, 0.3);
  const Array s1 = random_array({16}, f64, 0.5, 1.5), b1 = random_array({16}, f64);
  const Array s2 = random_array({16}, f64, 0.5, 1.5), b2 = random_array({16}, f64);
  const std::vector<int64_t> reflect1{0, 0, 0, 0, 1, 1, 1, 1};
  auto build_net = [&](Graph& g, DType t, Tensor* x) {
    *x = g.placeholder({2, 3, 13, 10}, t, "x");
    auto c = [&](const Array& a) { return g.constant(a.astype(t)); };
    const Tensor h =
        relu(instance_norm(conv2d(pad(*x, reflect1, PadKind::reflect), c(w1)), c(s1), c(b1), 1e-5));
    const Tensor h2 =
        instance_norm(conv2d(pad(h, reflect1, PadKind::reflect), c(w2)), c(s2), c(b2), 1e-5);
    return relu(h2) + h;
  };
  Graph g32, g64;
  Tensor x32, x64;
  const Tensor out32 = build_net(g32, f32, &x32), out64 = build_net(g64, f64, &x64);
  auto exe = g32.compile(Device::cpu(), {}, {out32}, layout(true));
  const auto ops = ops_of(exe);
  EXPECT_EQ(count(ops, "transpose"), 1) << exe.dump();
  EXPECT_EQ(count(ops, "instance_norm"), 2) << exe.dump();
  auto plain = g64.compile(Device::cpu(), {}, {out64}, CompileOptions{.optimize = false});
  for (int run = 0; run < 2; ++run) {
    const Array xv = random_array({2, 3, 13, 10}, f64);
    const Array want = plain.run({{x64, xv}})[0];
    expect_close(exe.run({{x32, xv.astype(f32)}})[0], want.shape(), to_f64(want), 1e-4, 1e-4);
  }
}

// An NHWC instance norm over more channels than one block (80: 64 and 16) and more positions
// than one chunk (33 x 29, four chunks, the last partial), on values far from zero (the two-pass
// statistics keep the variance of x + 50), against the f64 loops.
TEST(CpuConvs, NhwcInstanceNormOverBlocksAndChunks) {
  const Array w = random_array({80, 8, 3, 3}, f64, -0.3, 0.3),
              s = random_array({80}, f64, 0.5, 1.5), b = random_array({80}, f64),
              w2 = random_array({8, 80, 3, 3}, f64, -0.1, 0.1);
  auto build_net = [&](Graph& g, DType t, Tensor* x) {
    *x = g.placeholder({2, 8, 35, 31}, t, "x");
    auto c = [&](const Array& a) { return g.constant(a.astype(t)); };
    const Tensor h = conv2d(*x, c(w)) + 50.0;
    return relu(conv2d(instance_norm(h, c(s), c(b), 1e-5), c(w2)));
  };
  Graph g32, g64;
  Tensor x32, x64;
  const Tensor out32 = build_net(g32, f32, &x32), out64 = build_net(g64, f64, &x64);
  auto exe = g32.compile(Device::cpu(), {}, {out32}, layout(true));
  EXPECT_EQ(count(ops_of(exe), "instance_norm"), 1) << exe.dump();
  auto plain = g64.compile(Device::cpu(), {}, {out64}, CompileOptions{.optimize = false});
  const Array xv = random_array({2, 8, 35, 31}, f64);
  const Array want = plain.run({{x64, xv}})[0];
  expect_close(exe.run({{x32, xv.astype(f32)}})[0], want.shape(), to_f64(want), 1e-4, 1e-4);
}

// ShuffleNet's blocks: two branches joined along the channels, shuffled (reshape, transpose,
// reshape) and parted again stay on NHWC, each shuffle one transpose of the last dims; a shuffle
// whose middle value another node reads too runs on NCHW. Against f64 loops.
TEST(CpuConvs, ChannelShufflesStayNhwc) {
  const Array w1 = random_array({8, 8, 1, 1}, f64), w2 = random_array({8, 8, 3, 3}, f64, -0.3, 0.3),
              w3 = random_array({8, 8, 1, 1}, f64), w4 = random_array({8, 16, 1, 1}, f64);
  auto shuffle = [](const Tensor& v, Tensor* middle = nullptr) {
    const Shape s = v.shape();
    const Tensor t = permute(reshape(v, {s[0], 2, s[1] / 2, s[2], s[3]}), {0, 2, 1, 3, 4});
    if (middle) *middle = t;
    return reshape(t, s);
  };
  for (bool shared_middle : {false, true}) {
    SCOPED_TRACE(shared_middle ? "a shuffle's middle read twice" : "every shuffle whole");
    auto build_net = [&](Graph& g, DType t, Tensor* x, std::vector<Tensor>* outs) {
      *x = g.placeholder({2, 8, 7, 5}, t, "x");
      auto c = [&](const Array& a) { return g.constant(a.astype(t)); };
      ConvOptions pad1;
      pad1.padding = {1, 1};
      const Tensor a = relu(conv2d(*x, c(w1))), b = conv2d(*x, c(w2), std::nullopt, pad1);
      Tensor middle;
      const Tensor s1 = shuffle(concat({a, b}, 1), shared_middle ? &middle : nullptr);
      const std::vector<Tensor> halves = split(s1, 2, 1);
      const Tensor s2 = shuffle(concat({halves[0], relu(conv2d(halves[1], c(w3)))}, 1));
      outs->push_back(conv2d(s2, c(w4)));
      if (shared_middle) outs->push_back(middle * 2.0);
    };
    Graph g32, g64;
    Tensor x32, x64;
    std::vector<Tensor> out32, out64;
    build_net(g32, f32, &x32, &out32);
    build_net(g64, f64, &x64, &out64);
    auto exe = g32.compile(Device::cpu(), {}, out32, layout(true));
    if (!shared_middle) EXPECT_LE(count(ops_of(exe), "transpose"), 4) << exe.dump();
    auto plain = g64.compile(Device::cpu(), {}, out64, CompileOptions{.optimize = false});
    for (int run = 0; run < 2; ++run) {
      const Array xv = random_array({2, 8, 7, 5}, f64);
      const auto want = plain.run({{x64, xv}});
      const auto got = exe.run({{x32, xv.astype(f32)}});
      for (size_t k = 0; k < want.size(); ++k)
        expect_close(got[k], want[k].shape(), to_f64(want[k]), 1e-4, 1e-4);
    }
  }
}

// Transposed convolutions on NHWC (oneDNN's deconvolution over kiln's (C, kh, kw, O/G) weights),
// with groups, strides, output padding and a bias, between NHWC convs; against f64 loops.
TEST(CpuConvs, TransposedConvolutionsRunOnNhwc) {
  for (int64_t groups : {1, 2})
    for (int64_t stride : {1, 2}) {
      SCOPED_TRACE(fmt::format("groups {} stride {}", groups, stride));
      const Array w0 = random_array({8, 6, 3, 3}, f64, -0.3, 0.3);
      const Array wt = random_array({8, 10 / groups, 3, 3}, f64, -0.3, 0.3);
      const Array bt = random_array({10}, f64);
      auto build_net = [&](Graph& g, DType t, Tensor* x) {
        *x = g.placeholder({2, 6, 7, 9}, t, "x");
        auto c = [&](const Array& a) { return g.constant(a.astype(t)); };
        const Tensor h = relu(conv2d(*x, c(w0), std::nullopt, {.padding = {1, 1}}));
        ConvTransposeOptions o;
        o.stride = {stride, stride};
        o.padding = {1, 1};
        o.output_padding = {stride - 1, stride - 1};
        o.groups = groups;
        return relu(conv_transpose2d(h, c(wt), c(bt), o));
      };
      Graph g32, g64;
      Tensor x32, x64;
      const Tensor out32 = build_net(g32, f32, &x32), out64 = build_net(g64, f64, &x64);
      auto exe = g32.compile(Device::cpu(), {}, {out32}, layout(true));
      EXPECT_EQ(count(ops_of(exe), "transpose"), 2) << exe.dump();  // x in, the result out
      auto plain = g64.compile(Device::cpu(), {}, {out64}, CompileOptions{.optimize = false});
      const Array xv = random_array({2, 6, 7, 9}, f64);
      const Array want = plain.run({{x64, xv}})[0];
      for (int run = 0; run < 2; ++run)
        expect_close(exe.run({{x32, xv.astype(f32)}})[0], want.shape(), to_f64(want), 1e-4, 1e-4);
    }
}

// clip (relu6), hardswish, sigmoid and silu after a conv (and its residual) are oneDNN post-ops
// too; the loops' f64 conv and the ops' own math are the reference.
TEST(CpuConvs, ActivationEpiloguesMatchTheF64Loops) {
  const std::vector<std::pair<std::string, std::function<Tensor(const Tensor&)>>> acts{
      {"clip", [](const Tensor& t) { return clip(t, 0.0, 6.0); }},
      {"hardswish", [](const Tensor& t) { return hardswish(t); }},
      {"sigmoid", [](const Tensor& t) { return sigmoid(t); }},
      {"silu", [](const Tensor& t) { return silu(t); }}};
  for (bool nhwc : {false, true})
    for (bool residual : {false, true})
      for (const auto& named : acts) {
        // (not a structured binding: clang 14 cannot capture one in the lambda below)
        const std::string& name = named.first;
        const auto& act = named.second;
        SCOPED_TRACE(fmt::format("nhwc {} residual {} {}", nhwc, residual, name));
        const Array w = random_array({12, 8, 3, 3}, f64, -2, 2), b = random_array({12}, f64);
        const Array xv = random_array({2, 8, 11, 9}, f64), rv = random_array({2, 12, 11, 9}, f64);
        auto net = [&](Graph& g, DType t) {
          const Tensor x = g.placeholder({2, 8, 11, 9}, t, "x");
          const Tensor r = g.placeholder({2, 12, 11, 9}, t, "r");
          Tensor y =
              conv2d(x, g.constant(w.astype(t)), g.constant(b.astype(t)), {.padding = {1, 1}});
          return std::tuple{x, r, act(residual ? y + r : y)};
        };
        Graph g, g64;
        const auto [x, r, y] = net(g, f32);
        const auto [x64, r64, y64] = net(g64, f64);
        auto exe = g.compile(Device::cpu(), {}, {y}, layout(nhwc));
        const auto ops = ops_of(exe);
        EXPECT_EQ(count(ops, "fused_conv"), 1) << exe.dump();
        EXPECT_EQ(count(ops, name) + count(ops, "add") + count(ops, "fused_elementwise"), 0)
            << exe.dump();
        auto plain = g64.compile(Device::cpu(), {}, {y64}, CompileOptions{.optimize = false});
        Feeds f64_feeds{{x64, xv}}, f32_feeds{{x, xv.astype(f32)}};
        if (residual) {
          f64_feeds.emplace_back(r64, rv);
          f32_feeds.emplace_back(r, rv.astype(f32));
        }
        const Array want = plain.run(f64_feeds)[0];
        expect_close(exe.run(f32_feeds)[0], want.shape(), to_f64(want), 2e-5, 2e-5);
      }
}

// A package keeps the CPU's epilogues (activation and its bounds, const_weight, nchw_x): loaded,
// it runs the same fused nodes and gives the same bits.
// The CPU's plan gives a fused_conv's output its residual's buffer where the residual dies there
// (no copy into the output first), never where the residual is also what the conv reads; both
// layouts, and f64's loops (a hand-made node: their conv would write over the residual first).
TEST(CpuConvs, ResidualsAreAddedInPlace) {
  const Array wa = random_array({8, 8, 3, 3}, f64), wb = random_array({8, 8, 3, 3}, f64),
              wc = random_array({8, 8, 1, 1}, f64), xv = random_array({2, 8, 7, 6}, f64);
  ConvOptions o;
  o.padding = {1, 1};
  // relu(conv_b(relu(conv_a(x))) + conv_c(x)): the residual dies at conv_b's fused node;
  // relu(conv_b(h) + h): the residual is the conv's own input
  for (bool own_input : {false, true})
    for (DType t : {f32, f64})
      for (bool nhwc : {false, true}) {
        SCOPED_TRACE(fmt::format("{} {} {}", own_input ? "own input" : "another conv", name(t),
                                 nhwc ? "NHWC" : "NCHW"));
        auto build_block = [&](Graph& g, DType dt, bool hand_made) {
          const Tensor x = g.placeholder({2, 8, 7, 6}, dt, "x");
          const Tensor h = relu(conv2d(x, g.constant(wa.astype(dt)), std::nullopt, o));
          const Tensor r = own_input ? h : conv2d(x, g.constant(wc.astype(dt)), std::nullopt, {});
          const Tensor wbt = g.constant(wb.astype(dt));
          // (then doubled: the block's output is no returned value, which has its own buffer)
          if (!hand_made) return relu(conv2d(h, wbt, std::nullopt, o) + r) * 2.0;
          Attrs a = conv2d(h, wbt, std::nullopt, o).graph_impl()->nodes.back().attrs;
          a.set("has_residual", true);
          a.set("relu", true);
          return detail::make_node1(OpId::FusedConv, {h, wbt, r}, a) * 2.0;
        };
        Graph g;
        const Tensor y = build_block(g, t, t == f64);
        auto exe = g.compile(Device::cpu(), {}, {y}, layout(nhwc));
        const auto& nodes = exe.impl().program.graph.nodes;
        int fused = 0, aliased = 0;
        for (size_t i = 0; i < nodes.size(); ++i) {
          if (nodes[i].op != OpId::FusedConv || !nodes[i].attrs.b("has_residual", false)) continue;
          ++fused;
          const auto& out = exe.impl().plan.slots[i][0];
          const auto res = nodes[i].inputs.back();
          const auto& in = exe.impl().plan.slots[res.node][res.index];
          aliased += in.where == out.where && in.offset == out.offset &&
                     out.where == ValueSlot::Where::arena;
        }
        EXPECT_EQ(fused, 1) << exe.dump();
        EXPECT_EQ(aliased, own_input ? 0 : 1) << exe.dump();
        Graph r;
        const Tensor ry = build_block(r, f64, false);
        auto plain = r.compile(Device::cpu(), {}, {ry}, CompileOptions{.optimize = false});
        const Array want = plain.run({{"x", xv}})[0];
        // (f32: two stacked convolutions of 72 terms each, whose sums cancel: 1e-5 failed in
        // about one seed of 100, 1.6e-5 off a value of 0.28)
        const double tol = t == f32 ? 2e-4 : 1e-9;
        expect_close(exe.run({{"x", xv.astype(t)}})[0], want.shape(), to_f64(want), tol, tol);
      }
}

TEST(CpuConvs, PackagesKeepTheEpilogues) {
  Graph g;
  const Tensor x = g.placeholder({2, 3, 12, 10}, f32, "x");
  const Tensor w1 = g.constant(random_array({8, 3, 3, 3}, f32)),
               w2 = g.constant(random_array({8, 8, 1, 1}, f32));
  Tensor y = clip(conv2d(x, w1, std::nullopt, {.padding = {1, 1}}), 0.0, 6.0);
  y = hardswish(conv2d(y, w2) + y);
  auto exe = g.compile(Device::cpu(), {}, {y});
  EXPECT_EQ(count(ops_of(exe), "fused_conv"), 2) << exe.dump();
  const std::string path = ::testing::TempDir() + "cpu_epilogues.kiln";
  exe.save(path);
  const Executable loaded = Executable::load(path, Device::cpu());
  EXPECT_EQ(count(ops_of(loaded), "fused_conv"), 2) << loaded.dump();
  const Array xv = random_array({2, 3, 12, 10}, f32);
  const auto a = exe.run({{x, xv}})[0].to_vector<float>();
  const auto b = loaded.run({{"x", xv}})[0].to_vector<float>();
  EXPECT_EQ(a, b);
  // on CUDA, which has no such kernels (an activation other than relu, nchw_x), a run fails loudly
  if (cuda_device_count() > 0)
    expect_error<UnsupportedError>(
        [&] {
          Executable::load(path, Device::cuda(0)).run({{"x", xv}});
        },
        {"made for the CPU"});
}

TEST(CpuConvs, NothingFusesWhereAnotherReaderSeesTheConv) {
  for (bool nhwc : {false, true}) {
    SCOPED_TRACE(nhwc ? "nhwc" : "nchw");
    const Array w = random_array({12, 8, 3, 3}, f64), b = random_array({12}, f64);
    Graph g;
    const Block m = build(g, f32, w, b, true, false, true, false, 1);
    auto exe = g.compile(Device::cpu(), {}, {m.out, m.conv_out}, layout(nhwc));
    const auto ops = ops_of(exe);
    EXPECT_EQ(count(ops, "fused_conv"), 0) << exe.dump();
    EXPECT_EQ(count(ops, "conv"), 1) << exe.dump();
    const Array xv = random_array({2, 8, 11, 9}, f32);
    const auto got = exe.run({{m.x, xv}});
    auto plain =
        g.compile(Device::cpu(), {}, {m.out, m.conv_out}, CompileOptions{.optimize = false});
    const auto want = plain.run({{m.x, xv}});
    for (int i = 0; i < 2; ++i) expect_close(got[i], want[i].shape(), to_f64(want[i]), 1e-5, 1e-5);
  }
}

// (the channels_last pass fuses its convs' epilogues whatever fuse_elementwise says, as on CUDA)
TEST(CpuConvs, FusionOffKeepsTheSteps) {
  const Array w = random_array({12, 8, 3, 3}, f64), b = random_array({12}, f64);
  Graph g;
  const Block m = build(g, f32, w, b, true, true, true, false, 1);
  CompileOptions o = layout(false);
  o.fuse_elementwise = false;
  auto exe = g.compile(Device::cpu(), {}, {m.out}, o);
  EXPECT_EQ(count(ops_of(exe), "fused_conv"), 0) << exe.dump();
  EXPECT_EQ(count(ops_of(exe), "conv"), 1) << exe.dump();
}

// A small CNN on NHWC (conv of the NCHW image, max_pool, conv with a residual, broadcast scale,
// adaptive average pools): one transpose, out, and the f64 loops' results on NCHW.
TEST(CpuConvs, NhwcChainsMatchTheF64Loops) {
  auto net = [](Graph& g, DType t, const std::vector<Array>& ws) {
    const Tensor x = g.placeholder({2, 3, 20, 18}, t, "x");
    ConvOptions same;
    same.padding = {1, 1};
    PoolOptions pool;
    pool.kernel = {3, 3};
    pool.stride = {2, 2};
    pool.padding = {1, 1};
    Tensor y = relu(conv2d(x, g.constant(ws[0].astype(t)), g.constant(ws[1].astype(t)), same));
    y = max_pool(y, pool);
    Tensor z = relu(conv2d(y, g.constant(ws[2].astype(t)), std::nullopt, same) + y);
    z = z * sigmoid(adaptive_avg_pool(z, {1, 1}));  // a squeeze-and-excitation scale
    return std::pair{x, adaptive_avg_pool(z, {3, 2})};
  };
  const std::vector<Array> ws{random_array({8, 3, 3, 3}, f64), random_array({8}, f64),
                              random_array({8, 8, 3, 3}, f64, -0.3, 0.3)};
  Graph g, g64;
  const auto [x, y] = net(g, f32, ws);
  const auto [x64, y64] = net(g64, f64, ws);
  auto exe = g.compile(Device::cpu(), {}, {y});
  const auto ops = ops_of(exe);
  // (the first conv reads the 3-channel image as NCHW: nchw_x; one transpose, out)
  EXPECT_EQ(count(ops, "transpose"), 1) << exe.dump();
  EXPECT_EQ(count(ops, "fused_conv"), 2) << exe.dump();
  EXPECT_EQ(count(ops, "max_pool") + count(ops, "adaptive_avg_pool"), 3) << exe.dump();
  auto plain = g64.compile(Device::cpu(), {}, {y64}, CompileOptions{.optimize = false});
  const Array xv = random_array({2, 3, 20, 18}, f64);
  const Array want = plain.run({{x64, xv}})[0];
  expect_close(exe.run({{x, xv.astype(f32)}})[0], want.shape(), to_f64(want), 1e-5, 1e-5);
}

// A network's first convolution reads the NCHW image and writes NHWC: at 8 and 16 output
// channels oneDNN's direct kernel writes NHWC itself (one channel block), at other widths the
// image is copied to NHWC first. Each width, kernel, stride and activation against the f64 loops,
// with a max_pool after it as in a stem.
TEST(CpuConvs, FirstConvolutionsOfEachWidthMatchTheF64Loops) {
  enum class Act { relu, hardswish, clip };
  const struct {
    int64_t o, k, stride, batch;
    Act act;
  } cases[] = {{16, 7, 2, 2, Act::relu}, {16, 3, 2, 1, Act::hardswish}, {8, 3, 1, 3, Act::relu},
               {8, 5, 2, 1, Act::clip},  {24, 3, 2, 2, Act::relu},      {32, 7, 2, 1, Act::relu}};
  for (const auto& c : cases) {
    SCOPED_TRACE(fmt::format("O {} k {} stride {} batch {} act {}", c.o, c.k, c.stride, c.batch,
                             static_cast<int>(c.act)));
    const Array w = random_array({c.o, 3, c.k, c.k}, f64), b = random_array({c.o}, f64);
    auto net = [&](Graph& g, DType t) {
      const Tensor x = g.placeholder({c.batch, 3, 23, 18}, t, "x");
      ConvOptions o;
      o.padding = {c.k / 2, c.k / 2};
      o.stride = {c.stride, c.stride};
      Tensor y = conv2d(x, g.constant(w.astype(t)), g.constant(b.astype(t)), o);
      if (c.act == Act::relu) y = relu(y);
      if (c.act == Act::hardswish) y = hardswish(y);
      if (c.act == Act::clip) y = clip(y, 0.0, 6.0);
      PoolOptions pool;
      pool.kernel = {3, 3};
      pool.stride = {2, 2};
      pool.padding = {1, 1};
      return std::pair{x, max_pool(y, pool)};
    };
    Graph g, g64;
    const auto [x, y] = net(g, f32);
    const auto [x64, y64] = net(g64, f64);
    auto exe = g.compile(Device::cpu(), {}, {y});
    EXPECT_EQ(count(ops_of(exe), "fused_conv"), 1) << exe.dump();
    auto plain = g64.compile(Device::cpu(), {}, {y64}, CompileOptions{.optimize = false});
    for (int run = 0; run < 2; ++run) {
      const Array xv = random_array({c.batch, 3, 23, 18}, f64);
      const Array want = plain.run({{x64, xv}})[0];
      expect_close(exe.run({{x, xv.astype(f32)}})[0], want.shape(), to_f64(want), 1e-5, 1e-5);
    }
  }
}

// A weight that is a variable is read at every run: a new value shows at once (nothing laid out
// once from the old one).
TEST(CpuConvs, VariableWeightsAreReadEveryRun) {
  const Array w = random_array({12, 8, 3, 3}, f64), w2 = random_array({12, 8, 3, 3}, f64);
  const Array b = random_array({12}, f64), xv = random_array({2, 8, 11, 9}, f64);
  Graph g;
  const Block m = build(g, f32, w, b, true, false, true, true, 1);
  auto exe = g.compile(Device::cpu(), {}, {m.out});
  exe.run({{m.x, xv.astype(f32)}});
  exe.write_variable("w", w2.astype(f32));
  Graph g64;
  const Block ref = build(g64, f64, w2, b, true, false, true, false, 1);
  auto plain = g64.compile(Device::cpu(), {}, {ref.out}, CompileOptions{.optimize = false});
  const Array want = plain.run({{ref.x, xv}})[0];
  expect_close(exe.run({{m.x, xv.astype(f32)}})[0], want.shape(), to_f64(want), 1e-5, 1e-5);
}

// Runs of one executable from several threads share the weights laid out once.
TEST(CpuConvs, ConcurrentRunsShareTheLaidOutWeights) {
  const Array w = random_array({12, 8, 3, 3}, f64), b = random_array({12}, f64);
  Graph g, g64;
  const Block m = build(g, f32, w, b, true, false, true, false, 1);
  const Block ref = build(g64, f64, w, b, true, false, true, false, 1);
  auto exe = g.compile(Device::cpu(), {}, {m.out});
  auto plain = g64.compile(Device::cpu(), {}, {ref.out}, CompileOptions{.optimize = false});
  std::vector<Array> xs, wants, gots(4);
  for (int i = 0; i < 4; ++i) {
    xs.push_back(random_array({2, 8, 11, 9}, f64));
    wants.push_back(plain.run({{ref.x, xs.back()}})[0]);
  }
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i)
    threads.emplace_back([&, i] { gots[i] = exe.run({{m.x, xs[i].astype(f32)}})[0]; });
  for (auto& t : threads) t.join();
  for (int i = 0; i < 4; ++i) expect_close(gots[i], wants[i].shape(), to_f64(wants[i]), 1e-5, 1e-5);
}

// max_pool whose indices nothing reads leaves them unwritten; its maxima are those of the f64
// loops, NaN (which wins) and -inf included, for strides 1, 2 and 3 and padded borders.
TEST(CpuConvs, MaxPoolWithoutIndicesMatches) {
  for (int stride : {1, 2, 3}) {
    SCOPED_TRACE(fmt::format("stride {}", stride));
    Array xv = random_array({2, 3, 13, 17}, f32);
    auto* p = static_cast<float*>(xv.data());
    p[5] = std::nanf("");
    p[40] = -std::numeric_limits<float>::infinity();
    p[41] = -std::numeric_limits<float>::infinity();
    PoolOptions o;
    o.kernel = {3, 3};
    o.stride = {stride, stride};
    o.padding = {1, 1};
    Graph g, g64;
    const Tensor x = g.placeholder({2, 3, 13, 17}, f32, "x");
    const Tensor x64 = g64.placeholder({2, 3, 13, 17}, f64, "x");
    auto exe = g.compile(Device::cpu(), {}, {max_pool(x, o)});
    auto plain =
        g64.compile(Device::cpu(), {}, {max_pool(x64, o)}, CompileOptions{.optimize = false});
    const Array want = plain.run({{x64, xv.astype(f64)}})[0];
    expect_close(exe.run({{x, xv}})[0], want.shape(), to_f64(want), 0, 0);
    // with the indices read, both outputs as before
    Graph gi;
    const Tensor xi = gi.placeholder({2, 3, 13, 17}, f32, "x");
    const auto [values, indices] = max_pool_with_indices(xi, o);
    auto both = gi.compile(Device::cpu(), {}, {values, indices});
    const auto got = both.run({{xi, xv}});
    expect_close(got[0], want.shape(), to_f64(want), 0, 0);
    EXPECT_EQ(got[1].shape(), want.shape());
  }
}

// NHWC max pools between convolutions, their indices unread, with channel counts that are
// multiples of 16 (AVX-512's register path, where the CPU has it) and not: the maxima of the f64
// loops bit for bit (integer data: the convs are exact), NaN (which wins) and -inf added after the
// conv included, for strides, dilations, ceil mode and padded borders.
TEST(CpuConvs, NhwcMaxPoolsMatchTheF64Loops) {
  std::vector<std::pair<int64_t, PoolOptions>> cases;
  for (int64_t c : {16, 48, 20}) {
    cases.push_back({c, {{3, 3}, {2, 2}, {1, 1}}});
    cases.push_back({c, {{2, 2}, {1, 1}, {}, {2, 2}}});
    cases.push_back(
        {c, {.kernel = {3, 2}, .stride = {3, 1}, .padding = {1, 1}, .ceil_mode = true}});
  }
  std::mt19937 rng(static_cast<uint32_t>(seed()));
  auto integers = [&](const Shape& shape, int lo, int hi) {
    std::uniform_int_distribution<int> d(lo, hi);
    std::vector<double> v(static_cast<size_t>(numel(shape)));
    for (double& e : v) e = d(rng);
    return Array::from_vector(v, shape);
  };
  for (const auto& one : cases) {
    const int64_t channels = one.first;
    const PoolOptions& pool = one.second;  // (captured below: not a structured binding)
    SCOPED_TRACE(fmt::format("{} channels, kernel {}", channels, to_string(pool.kernel)));
    const Array w = integers({channels, 8, 3, 3}, -3, 3), xv = integers({2, 8, 11, 13}, -8, 8);
    Array marks = Array::zeros({1, channels, 11, 13}, f64);
    auto* m = static_cast<double*>(marks.data());
    for (int k = 0; k < 6; ++k) {
      m[rng() % marks.numel()] = std::nan("");
      m[rng() % marks.numel()] = -std::numeric_limits<double>::infinity();
    }
    auto net = [&](Graph& g, DType t) {
      const Tensor x = g.placeholder({2, 8, 11, 13}, t, "x");
      ConvOptions same;
      same.padding = {1, 1};
      const Tensor y =
          conv2d(x, g.constant(w.astype(t)), std::nullopt, same) + g.constant(marks.astype(t));
      return std::pair{x, max_pool(y, pool)};
    };
    Graph g, g64;
    const auto [x, p] = net(g, f32);
    const auto [x64, p64] = net(g64, f64);
    // a conv after the pool keeps it NHWC; the pooled values are read too
    const Tensor w2 = g.constant(integers({4, channels, 1, 1}, -2, 2).astype(f32));
    auto exe = g.compile(Device::cpu(), {}, {conv2d(p, w2), p});
    const std::string dump = exe.dump();  // (the pool's output is NHWC: channels last)
    const size_t at = dump.find("max_pool(");
    ASSERT_NE(at, std::string::npos) << dump;
    EXPECT_NE(dump.substr(at, dump.find('\n', at) - at).find(fmt::format(", {}) @", channels)),
              std::string::npos)
        << dump;
    auto plain = g64.compile(Device::cpu(), {}, {p64}, CompileOptions{.optimize = false});
    const Array want = plain.run({{x64, xv}})[0];
    expect_close(exe.run({{x, xv.astype(f32)}})[1], want.shape(), to_f64(want), 0, 0);
  }
}

}  // namespace
}  // namespace kiln
