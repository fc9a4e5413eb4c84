// Conv, ConvTranspose and ConvGradWeight against float64 reference loops.
#include <fmt/format.h>

#include <thread>

#include "core/device_backend.h"
#include "core/graph_impl.h"
#include "core/op_registry.h"
#include "support/executable_env.h"
#include "support/gpu.h"
#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;

// Everything a reference needs, with padding as begins then ends.
struct Geo {
  std::vector<int64_t> stride, pads, dilation, output_padding;
  int64_t groups = 1;
};

int spatial(const Shape& s) { return static_cast<int>(s.size()) - 2; }

Shape conv_shape(const Shape& x, const Shape& w, const Geo& p) {
  const int nd = spatial(x);
  Shape out{x[0], w[0]};
  for (int i = 0; i < nd; ++i)
    out.push_back((x[2 + i] + p.pads[i] + p.pads[nd + i] - p.dilation[i] * (w[2 + i] - 1) - 1) /
                      p.stride[i] + 1);
  return out;
}

// Direct convolution:
//   y[n, o, p] = bias[o] + sum over c in o's group and k of x[n, c, p*s - pad + k*d] w[o, c, k].
std::vector<double> ref_conv(const Array& x, const Array& w, const Array* bias, const Geo& p) {
  const Shape xs = x.shape(), ws = w.shape(), ys = conv_shape(xs, ws, p);
  const int nd = spatial(xs);
  const auto vx = to_f64(x), vw = to_f64(w);
  const auto vb = bias ? to_f64(*bias) : std::vector<double>(ws[0], 0.0);
  const int64_t Cg = ws[1], Og = ws[0] / p.groups;
  const Shape kernel(ws.begin() + 2, ws.end());
  std::vector<double> r(numel(ys));
  for (int64_t i = 0; i < numel(ys); ++i) {
    const auto yi = unravel(i, ys);
    const int64_t n = yi[0], o = yi[1];
    double acc = vb[o];
    for (int64_t c = 0; c < Cg; ++c)
      for (int64_t k = 0; k < numel(kernel); ++k) {
        const auto ki = unravel(k, kernel);
        std::vector<int64_t> xi{n, (o / Og) * Cg + c};
        bool inside = true;
        for (int d = 0; d < nd; ++d) {
          const int64_t pos = yi[2 + d] * p.stride[d] - p.pads[d] + ki[d] * p.dilation[d];
          inside = inside && pos >= 0 && pos < xs[2 + d];
          xi.push_back(pos);
        }
        if (!inside) continue;
        std::vector<int64_t> wi{o, c};
        wi.insert(wi.end(), ki.begin(), ki.end());
        acc += vx[ravel(xi, xs)] * vw[ravel(wi, ws)];
      }
    r[i] = acc;
  }
  return r;
}

// fused_conv: relu?(conv + residual), residual and relu optional.
std::vector<double> ref_fused_conv(const Array& x, const Array& w, const Array* bias,
                                   const Array* residual, bool relu, const Geo& p) {
  std::vector<double> r = ref_conv(x, w, bias, p);
  const std::vector<double> res = residual ? to_f64(*residual) : std::vector<double>(r.size(), 0);
  for (size_t i = 0; i < r.size(); ++i) {
    r[i] += res[i];
    if (relu) r[i] = std::max(r[i], 0.0);
  }
  return r;
}

Shape conv_transpose_shape(const Shape& x, const Shape& w, const Geo& p) {
  const int nd = spatial(x);
  Shape out{x[0], w[1] * p.groups};
  for (int i = 0; i < nd; ++i)
    out.push_back((x[2 + i] - 1) * p.stride[i] - p.pads[i] - p.pads[nd + i] +
                  p.dilation[i] * (w[2 + i] - 1) + p.output_padding[i] + 1);
  return out;
}

// Gather form of the transposed convolution: y[n, o, q] sums x[n, c, i] w[c, o, k] over all
// (i, k) with i*s - pad + k*d == q.
std::vector<double> ref_conv_transpose(const Array& x, const Array& w, const Array* bias,
                                       const Geo& p) {
  const Shape xs = x.shape(), ws = w.shape(), ys = conv_transpose_shape(xs, ws, p);
  const int nd = spatial(xs);
  const auto vx = to_f64(x), vw = to_f64(w);
  const int64_t Og = ws[1], Cg = xs[1] / p.groups;
  const auto vb = bias ? to_f64(*bias) : std::vector<double>(Og * p.groups, 0.0);
  const Shape kernel(ws.begin() + 2, ws.end());
  std::vector<double> r(numel(ys));
  for (int64_t i = 0; i < numel(ys); ++i) {
    const auto yi = unravel(i, ys);
    const int64_t n = yi[0], o = yi[1];
    double acc = vb[o];
    for (int64_t c = (o / Og) * Cg; c < (o / Og + 1) * Cg; ++c)
      for (int64_t k = 0; k < numel(kernel); ++k) {
        const auto ki = unravel(k, kernel);
        std::vector<int64_t> xi{n, c};
        bool hit = true;
        for (int d = 0; d < nd; ++d) {
          const int64_t num = yi[2 + d] + p.pads[d] - ki[d] * p.dilation[d];
          hit = hit && num >= 0 && num % p.stride[d] == 0 && num / p.stride[d] < xs[2 + d];
          xi.push_back(num / p.stride[d]);
        }
        if (!hit) continue;
        std::vector<int64_t> wi{c, o % Og};
        wi.insert(wi.end(), ki.begin(), ki.end());
        acc += vx[ravel(xi, xs)] * vw[ravel(wi, ws)];
      }
    r[i] = acc;
  }
  return r;
}

Tensor build_conv(const Tensor& x, const Tensor& w, const std::optional<Tensor>& b,
                  const ConvOptions& o) {
  switch (x.shape().size()) {
    case 3: return conv1d(x, w, b, o);
    case 4: return conv2d(x, w, b, o);
    default: return conv3d(x, w, b, o);
  }
}
Tensor build_conv_transpose(const Tensor& x, const Tensor& w, const std::optional<Tensor>& b,
                            const ConvTransposeOptions& o) {
  switch (x.shape().size()) {
    case 3: return conv_transpose1d(x, w, b, o);
    case 4: return conv_transpose2d(x, w, b, o);
    default: return conv_transpose3d(x, w, b, o);
  }
}

double tol_for(DType t) { return t == f64 ? 1e-10 : t == f32 ? 1e-4 : 2e-2; }

struct ConvCase {
  Shape x, w;
  ConvOptions opts;
  Geo ref;  // the same options in explicit form
};

void check_conv(const ConvCase& c, DType t, bool with_bias) {
  SCOPED_TRACE(::testing::Message() << "conv x " << to_string(c.x) << " w " << to_string(c.w)
                                    << " " << name(t) << (with_bias ? " bias" : ""));
  Graph g;
  auto x = g.placeholder(c.x, t, "x");
  auto w = g.placeholder(c.w, t, "w");
  auto b = g.placeholder({c.w[0]}, t, "b");
  Array vx = random_array(c.x, t), vw = random_array(c.w, t), vb = random_array({c.w[0]}, t);
  Feeds feeds{{x, vx}, {w, vw}};
  if (with_bias) feeds.push_back({b, vb});
  auto y = build_conv(x, w, with_bias ? std::optional<Tensor>(b) : std::nullopt, c.opts);
  const double tol = tol_for(t);
  expect_close(eval1(g, y, feeds), conv_shape(c.x, c.w, c.ref),
               ref_conv(vx, vw, with_bias ? &vb : nullptr, c.ref), tol, tol);
}

const std::vector<ConvCase>& conv_cases() {
  static const std::vector<ConvCase> cases = {
      // 2-D: strides, asymmetric padding, dilation
      {{2, 3, 7, 6}, {4, 3, 3, 2}, {{2, 1}, {1, 0, 2, 1}, {1, 2}}, {{2, 1}, {1, 0, 2, 1}, {1, 2}}},
      // 1-D with groups and symmetric padding
      {{2, 4, 11}, {6, 2, 3}, {{2}, {1}, {}, PadMode::explicit_, 2}, {{2}, {1, 1}, {1}, {}, 2}},
      // 3-D
      {{1, 2, 5, 6, 4}, {3, 2, 2, 3, 2}, {{1, 2, 1}, {1, 0, 1}, {2, 1, 1}},
       {{1, 2, 1}, {1, 0, 1, 1, 0, 1}, {2, 1, 1}}},
      // depthwise with a channel multiplier of 2
      {{2, 6, 8, 8}, {12, 1, 3, 3}, {{1, 1}, {1, 1}, {}, PadMode::explicit_, 6},
       {{1, 1}, {1, 1, 1, 1}, {1, 1}, {}, 6}},
      // pointwise and a larger 3x3 (blocked layouts chosen by oneDNN)
      {{2, 32, 14, 14}, {16, 32, 1, 1}, {}, {{1, 1}, {0, 0, 0, 0}, {1, 1}}},
      {{2, 16, 12, 12}, {32, 16, 3, 3}, {{1, 1}, {1, 1}}, {{1, 1}, {1, 1, 1, 1}, {1, 1}}},
      // size-1 dims
      {{1, 1, 1, 1}, {1, 1, 1, 1}, {}, {{1, 1}, {0, 0, 0, 0}, {1, 1}}},
      // valid: no padding
      {{1, 3, 6, 5}, {2, 3, 3, 3}, {{2, 2}, {}, {}, PadMode::valid},
       {{2, 2}, {0, 0, 0, 0}, {1, 1}}},
  };
  return cases;
}

TEST(Conv, MatchesReferenceF32F64) {
  for (const ConvCase& c : conv_cases())
    for (DType t : {f32, f64})
      for (bool bias : {false, true}) check_conv(c, t, bias);
}

TEST(Conv, HalfTypesComputeInF32) {
  check_conv(conv_cases()[0], bf16, true);
  check_conv(conv_cases()[3], f16, true);
}

TEST(Conv, SamePaddingPutsTheOddPixelAtTheRightEnd) {
  // input 7x8, kernel 4x3, stride 2: totals 3 (rows) and 1 (cols); out = ceil(in / 2)
  const Shape xs{1, 2, 7, 8}, ws{3, 2, 4, 3};
  ConvCase upper{xs, ws, {{2, 2}, {}, {}, PadMode::same_upper}, {{2, 2}, {1, 0, 2, 1}, {1, 1}}};
  ConvCase lower{xs, ws, {{2, 2}, {}, {}, PadMode::same_lower}, {{2, 2}, {2, 1, 1, 0}, {1, 1}}};
  EXPECT_EQ(conv_shape(xs, ws, upper.ref), (Shape{1, 3, 4, 4}));
  for (DType t : {f32, f64}) {
    check_conv(upper, t, true);
    check_conv(lower, t, false);
  }
  // stride 1 with dilation: the total pad is (k - 1) * d, even for dynamic sizes
  Graph g;
  auto x = g.placeholder({-1, 2, -1, -1}, f32, "x");
  auto w = g.placeholder({3, 2, 3, 3}, f32, "w");
  auto y = conv2d(x, w, std::nullopt, {{}, {}, {2, 1}, PadMode::same_lower});
  EXPECT_EQ(y.shape(), (Shape{-1, 3, -1, -1}));
  check_conv({{2, 2, 9, 5}, {3, 2, 3, 3}, {{}, {}, {2, 1}, PadMode::same_lower},
              {{1, 1}, {2, 1, 2, 1}, {2, 1}}},
             f32, false);
}

TEST(Conv, EmptyBatchAndNoInputChannels) {
  check_conv({{0, 3, 5, 5}, {4, 3, 3, 3}, {}, {{1, 1}, {0, 0, 0, 0}, {1, 1}}}, f32, true);
  // no input channels: the output is the bias alone
  check_conv({{2, 0, 5, 5}, {4, 0, 3, 3}, {}, {{1, 1}, {0, 0, 0, 0}, {1, 1}}}, f32, true);
}

TEST(Conv, ErrorsNameOpAndShapes) {
  Graph g;
  auto p = [&](const Shape& s, DType t = f32) { return g.placeholder(s, t); };
  expect_error<ShapeError>([&] { conv2d(p({1, 3, 8, 8}), p({4, 2, 3, 3})); },
                           {"[conv]", "(1, 3, 8, 8)", "(4, 2, 3, 3)"});
  expect_error<ShapeError>([&] { conv2d(p({1, 3, 8, 8}), p({4, 3, 3})); },
                           {"[conv]", "conv2d", "(4, 3, 3)"});
  expect_error<ShapeError>([&] { conv2d(p({1, 3, 8}), p({4, 3, 3, 3})); },
                           {"[conv]", "conv2d", "(1, 3, 8)"});
  ConvOptions g3;
  g3.groups = 3;
  expect_error<ShapeError>([&] { conv2d(p({1, 4, 8, 8}), p({6, 2, 3, 3}), std::nullopt, g3); },
                           {"[conv]", "groups=3", "(1, 4, 8, 8)"});
  expect_error<ShapeError>([&] { conv2d(p({1, 6, 8, 8}), p({4, 2, 3, 3}), std::nullopt, g3); },
                           {"[conv]", "groups=3", "(4, 2, 3, 3)"});
  expect_error<ShapeError>([&] { conv2d(p({1, 1, 2, 2}), p({1, 1, 3, 3})); },
                           {"[conv]", "(1, 1, 2, 2)", "(1, 1, 3, 3)"});
  expect_error<ShapeError>([&] { conv2d(p({1, 3, 8, 8}), p({4, 3, 3, 3}), p({5})); },
                           {"[conv]", "(5,)"});
  expect_error<ValueError>([&] { conv2d(p({1, 3, 8, 8}), p({4, 3, 3, 3}), std::nullopt, {{1}}); },
                           {"[conv]", "stride"});
  expect_error<ValueError>(
      [&] { conv2d(p({1, 3, 8, 8}), p({4, 3, 3, 3}), std::nullopt, {{}, {1, 2, 3}}); },
      {"[conv]", "padding", "1, 2, 3"});
  expect_error<DTypeError>([&] { conv2d(p({1, 3, 8, 8}, i32), p({4, 3, 3, 3}, i32)); },
                           {"[conv]", "i32"});
}

// A conv node with channels_last (what the channels_last pass makes of GPU f16/bf16 inference
// convs): x and w transposed in, the output transposed back, equal to the NCHW conv. Runs on
// the test device (the CPU through NCHW copies, CUDA through cuDNN's NHWC kernels).
TEST(Conv, ChannelsLastEqualsNchw) {
  struct Case {
    Shape x, w;
    std::vector<int64_t> stride, pads;
    int64_t groups;
    bool bias;
  };
  const Case cases[] = {{{2, 8, 9, 9}, {16, 8, 3, 3}, {1, 1}, {1, 1, 1, 1}, 1, true},
                        {{1, 16, 12, 10}, {8, 16, 1, 1}, {2, 2}, {0, 0, 0, 0}, 1, false},
                        {{2, 8, 7, 7}, {8, 2, 3, 3}, {1, 1}, {1, 1, 1, 1}, 4, true}};
  for (DType t : {f32, bf16})
    for (const Case& c : cases) {
      SCOPED_TRACE(fmt::format("{} x {} w {} groups {}", name(t), to_string(c.x), to_string(c.w), c.groups));
      Graph g;
      auto x = g.placeholder(c.x, t, "x");
      const Tensor w = g.constant(random_array(c.w, t), "w");
      std::optional<Tensor> b;
      if (c.bias) b = g.constant(random_array({c.w[0]}, t), "b");
      ConvOptions o;
      o.stride = c.stride;
      o.padding = c.pads;
      o.groups = c.groups;
      const Tensor nchw = conv2d(x, w, b, o);
      Attrs attrs = nchw.graph_impl()->nodes[nchw.node_id()].attrs;
      attrs.set("channels_last", true);
      std::vector<Tensor> in{transpose(x, {0, 2, 3, 1}), transpose(w, {0, 2, 3, 1})};
      if (b) in.push_back(*b);
      const Tensor nhwc = detail::make_node1(OpId::Conv, in, attrs);
      const Shape ys = nchw.shape();
      EXPECT_EQ(nhwc.shape(), (Shape{ys[0], ys[2], ys[3], ys[1]}));
      // the fused epilogue: relu(conv + residual)
      const Tensor res = g.constant(random_array(ys, t), "residual");
      Attrs fused = attrs;
      fused.set("relu", true);
      fused.set("has_residual", true);
      in.push_back(transpose(res, {0, 2, 3, 1}));
      const Tensor nhwc_fused = detail::make_node1(OpId::FusedConv, in, fused);
      const Array xv = random_array(c.x, t);
      const auto out = eval(g,
                            {nchw, transpose(nhwc, {0, 3, 1, 2}), relu(nchw + res),
                             transpose(nhwc_fused, {0, 3, 1, 2})},
                            {{x, xv}});
      expect_close(out[1], out[0].shape(), to_f64(out[0]), tolerance(t) * 4, tolerance(t) * 4);
      expect_close(out[3], out[2].shape(), to_f64(out[2]), tolerance(t) * 4, tolerance(t) * 4);
    }
  // a relu or residual is fused_conv's, not conv's
  Graph g;
  auto x = g.placeholder({1, 2, 4, 4}, f32, "x");
  const Tensor y = conv2d(x, g.constant(random_array({2, 2, 1, 1}, f32)));
  Attrs attrs = y.graph_impl()->nodes[y.node_id()].attrs;
  attrs.set("relu", true);
  expect_error<ValueError>(
      [&] {
        detail::make_node1(OpId::Conv, {x, y}, attrs);
      },
      {"[conv]", "fused_conv"});
}

// fused_conv (plain layout) is conv, then + residual, then relu, in 1-3 spatial dims, with and
// without bias, against float64 loops, on the test device.
TEST(FusedConv, MatchesConvThenResidualAndRelu) {
  struct Case {
    Shape x, w;
    Geo geo;
    bool bias, residual, relu;
  };
  const Case cases[] = {
      {{2, 4, 9, 7}, {6, 4, 3, 3}, {{1, 1}, {1, 1, 1, 1}, {1, 1}, {}, 1}, true, true, true},
      {{1, 6, 8, 8}, {6, 2, 3, 3}, {{2, 2}, {1, 0, 1, 0}, {1, 1}, {}, 3}, false, true, false},
      {{2, 3, 11}, {5, 3, 3}, {{1}, {2, 2}, {2}, {}, 1}, true, false, true},
      {{1, 2, 4, 5, 3},
       {4, 2, 2, 2, 2},
       {{1, 1, 1}, {0, 0, 0, 0, 0, 0}, {1, 1, 1}, {}, 1},
       false,
       true,
       true},
  };
  for (DType t : {f32, f64, bf16})
    for (const Case& c : cases) {
      SCOPED_TRACE(fmt::format("{} x {} w {} bias {} residual {} relu {}", name(t), to_string(c.x),
                               to_string(c.w), c.bias, c.residual, c.relu));
      const Shape ys = conv_shape(c.x, c.w, c.geo);
      const Array xv = random_array(c.x, t), wv = random_array(c.w, t),
                  bv = random_array({c.w[0]}, t), rv = random_array(ys, t);
      const std::vector<double> want =
          ref_fused_conv(xv, wv, c.bias ? &bv : nullptr, c.residual ? &rv : nullptr, c.relu, c.geo);
      Graph g;
      const Tensor x = g.placeholder(c.x, t, "x");
      const Tensor w = g.constant(wv, "w");
      ConvOptions o;
      o.stride = c.geo.stride;
      o.padding = c.geo.pads;
      o.dilation = c.geo.dilation;
      o.groups = c.geo.groups;
      const Tensor conv = build_conv(x, w, std::nullopt, o);
      Attrs attrs = conv.graph_impl()->nodes[conv.node_id()].attrs;
      attrs.set("has_bias", c.bias);
      attrs.set("has_residual", c.residual);
      attrs.set("relu", c.relu);
      std::vector<Tensor> in{x, w};
      if (c.bias) in.push_back(g.constant(bv, "b"));
      if (c.residual) in.push_back(g.constant(rv, "r"));
      const Tensor y = detail::make_node1(OpId::FusedConv, in, attrs);
      EXPECT_EQ(y.shape(), ys);
      const double tol = tol_for(t) * (t == bf16 ? 2 : 1);
      expect_close(eval1(g, y, {{x, xv}}), ys, want, tol, tol);
    }
  // a residual of another shape or dtype, and the missing gradient rule
  Graph g;
  const Tensor x = g.placeholder({1, 2, 5, 5}, f32, "x");
  const Tensor w = g.placeholder({3, 2, 3, 3}, f32, "w");
  const Tensor conv = conv2d(x, w);
  Attrs attrs = conv.graph_impl()->nodes[conv.node_id()].attrs;
  attrs.set("has_residual", true);
  expect_error<ShapeError>(
      [&] {
        detail::make_node1(OpId::FusedConv, {x, w, g.placeholder({1, 3, 5, 5}, f32)}, attrs);
      },
      {"[fused_conv]", "residual", "(1, 3, 3, 3)"});
  expect_error<Error>(
      [&] {
        detail::make_node1(OpId::FusedConv, {x, w, g.placeholder({1, 3, 3, 3}, f64)}, attrs);
      },
      {"fused_conv", "f64"});
  const Tensor y =
      detail::make_node1(OpId::FusedConv, {x, w, g.placeholder({1, 3, 3, 3}, f32)}, attrs);
  expect_error<Error>([&] { gradients(sum(y), {w}); }, {"fused_conv"});
}

// Layout channels_last is a dispatch key of the conv family: the node infers its NHWC shape, has
// its own kernels, and refuses a gradient (the pass runs after autodiff); malformed geometry is
// rejected when the node is built, before any kernel sees it.
TEST(Conv, ChannelsLastIsALayout) {
  Graph g;
  auto x = g.placeholder({2, 5, 6, 3}, f32, "x");  // NHWC
  auto w = g.placeholder({4, 3, 3, 3}, f32, "w");  // (O, kh, kw, C)
  const Tensor ref = conv2d(transpose(x, {0, 3, 1, 2}), transpose(w, {0, 3, 1, 2}));
  Attrs attrs = ref.graph_impl()->nodes[ref.node_id()].attrs;
  EXPECT_EQ(layout_of(OpId::Conv, attrs), Layout::plain);
  attrs.set("channels_last", true);
  EXPECT_EQ(layout_of(OpId::Conv, attrs), Layout::channels_last);
  const Tensor y = detail::make_node1(OpId::Conv, {x, w}, attrs);
  EXPECT_EQ(y.shape(), (Shape{2, 3, 4, 4}));
  for (Backend b : {Backend::cpu, Backend::cuda}) {
    const KernelEntry* plain = find_kernel(OpId::Conv, b);
    const KernelEntry* nhwc = find_kernel(OpId::Conv, b, Layout::channels_last);
    if (!plain) continue;  // (a build without that backend)
    ASSERT_NE(nhwc, nullptr) << backend_name(b);
    EXPECT_NE(plain->fn, nhwc->fn) << backend_name(b);
  }
  // an op without the layout ignores an attribute of that name (depth_to_space's own option)
  EXPECT_EQ(layout_of(OpId::DepthToSpace, attrs), Layout::plain);
  expect_error<UnsupportedError>([&] { gradients(sum(y), {x}); },
                                 {"[gradients]", "conv", "layout channels_last"});
  Attrs bad = attrs;
  bad.set("pads", std::vector<int64_t>{1, 1});
  expect_error<Error>([&] { detail::make_node1(OpId::Conv, {x, w}, bad); }, {"conv"});
}

// channels_last convolutions with each epilogue (bias, residual, relu) on `device` against
// float64 loops, for ResNet-50's kinds of convolutions and for shapes tensor cores do not like;
// each compiled once per value of KILN_CUDNN_GRAPH in `graph_modes`.
// (`wide`: ResNet-50's channel counts, for the GPU; else a quarter of them, which the CPU's
// reference loops take in seconds under sanitizers)
void check_channels_last_epilogues(Device device, const std::vector<DType>& types,
                                   const std::vector<const char*>& graph_modes, bool wide) {
  struct Case {
    Shape x, w;
    std::vector<int64_t> stride, pads;
    int64_t groups;
    bool bias, residual, relu;
  };
  const int64_t c = wide ? 64 : 16, n = wide ? 2 : 1;
  const Case cases[] = {
      // a block, a shortcut, the stem, groups, odd sizes, plain
      {{n, c, 14, 14}, {c, c, 3, 3}, {1, 1}, {1, 1, 1, 1}, 1, true, true, true},
      {{n, c, 14, 14}, {2 * c, c, 1, 1}, {2, 2}, {0, 0, 0, 0}, 1, true, false, false},
      {{n, 3, 32, 32}, {c, 3, 7, 7}, {2, 2}, {3, 3, 3, 3}, 1, true, false, true},
      {{1, 32, 9, 9}, {32, 8, 3, 3}, {1, 1}, {1, 1, 1, 1}, 4, true, false, true},
      {{1, 5, 8, 8}, {7, 5, 3, 3}, {1, 1}, {1, 1, 1, 1}, 1, false, true, false},
      {{1, 16, 10, 10}, {24, 16, 3, 3}, {2, 2}, {1, 1, 1, 1}, 1, false, false, false},
  };
  for (DType t : types)
    for (const Case& c : cases) {
      SCOPED_TRACE(fmt::format("{} x {} w {} stride {} groups {} bias {} residual {} relu {}",
                               name(t), to_string(c.x), to_string(c.w), c.stride[0], c.groups,
                               c.bias, c.residual, c.relu));
      const Geo geo{c.stride, c.pads, {1, 1}, {}, c.groups};
      const Shape ys = conv_shape(c.x, c.w, geo);
      const Array xv = random_array(c.x, t), wv = random_array(c.w, t),
                  bv = random_array({c.w[0]}, t), rv = random_array(ys, t);
      const std::vector<double> want =
          ref_fused_conv(xv, wv, c.bias ? &bv : nullptr, c.residual ? &rv : nullptr, c.relu, geo);
      Graph g;
      const Tensor x = g.placeholder(c.x, t, "x");
      const Tensor w = g.constant(wv, "w");
      ConvOptions o;
      o.stride = c.stride;
      o.padding = c.pads;
      o.groups = c.groups;
      const Tensor nchw = conv2d(x, w, std::nullopt, o);
      Attrs attrs = nchw.graph_impl()->nodes[nchw.node_id()].attrs;
      attrs.set("channels_last", true);
      attrs.set("has_bias", c.bias);
      attrs.set("relu", c.relu);
      attrs.set("has_residual", c.residual);
      std::vector<Tensor> in{transpose(x, {0, 2, 3, 1}), transpose(w, {0, 2, 3, 1})};
      if (c.bias) in.push_back(g.constant(bv, "b"));
      if (c.residual) in.push_back(transpose(g.constant(rv, "r"), {0, 2, 3, 1}));
      const OpId op = c.residual || c.relu ? OpId::FusedConv : OpId::Conv;
      const Tensor y = transpose(detail::make_node1(op, in, attrs), {0, 3, 1, 2});
      // sums in f32 round once (fused) or twice (the conv's output, then the epilogue's)
      const double k = static_cast<double>(c.w[1] * c.w[2] * c.w[3]);
      for (const char* graph : graph_modes) {
        SCOPED_TRACE(fmt::format("KILN_CUDNN_GRAPH={}", graph));
        const ScopedEnv env("KILN_CUDNN_GRAPH", graph);
        Executable exe = g.compile(device, {}, {y});
        for (int run = 0; run < 2; ++run)  // the first run chooses, the second runs the choice
          expect_close(exe.run({{x, xv}})[0].to(Device::cpu()), ys, want, tolerance(t),
                       tolerance(t) * std::sqrt(k));
      }
    }
}

TEST(Conv, ChannelsLastEpiloguesMatchReference) {
  check_channels_last_epilogues(Device::cpu(), {f32, bf16}, {"1"}, false);
}

// On CUDA, f16/bf16 channels_last convolutions run by a plan of cuDNN's graph API
// (conv_graph.cpp: the epilogue fused in, or the convolution alone and kiln's epilogue pass) or
// by the legacy algorithm, whichever was faster on the first run: both ways
// (KILN_CUDNN_GRAPH=0 forces the legacy one).
TEST(Conv, CudaChannelsLastGraphPlansMatchReference) {
  REQUIRE_GPU();
  DeviceBackend& backend = *cuda_backend();
  backend.clear_tuning();
  check_channels_last_epilogues(Device::cuda(0), {bf16, f16, f32}, {"1", "0"}, true);
  EXPECT_GE(backend.tuning_stats().graph_offered, 1)
      << "cuDNN's graph API offered no plan for any problem";
}

TEST(Conv, ConcurrentRunsShareCachedKernels) {
  // several threads run one executable at once; inputs are drawn up front (the rng is shared)
  const Shape xs{2, 16, 12, 12}, ws{32, 16, 3, 3};
  const Geo geo{{1, 1}, {1, 1, 1, 1}, {1, 1}};
  Graph g;
  auto x = g.placeholder(xs, f32, "x");
  auto w = g.placeholder(ws, f32, "w");
  auto exe = g.compile(Device::cpu(), {}, {conv2d(x, w, std::nullopt, {{}, {1, 1}})});
  constexpr int kThreads = 4;
  std::vector<Array> vx, vw, out(kThreads);
  for (int i = 0; i < kThreads; ++i) {
    vx.push_back(random_array(xs, f32));
    vw.push_back(random_array(ws, f32));
  }
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i)
    threads.emplace_back([&, i] {
      for (int rep = 0; rep < 3; ++rep) out[i] = exe.run({{x, vx[i]}, {w, vw[i]}})[0];
    });
  for (auto& t : threads) t.join();
  for (int i = 0; i < kThreads; ++i)
    expect_close(out[i], conv_shape(xs, ws, geo), ref_conv(vx[i], vw[i], nullptr, geo), 1e-4, 1e-4);
}

struct ConvTCase {
  Shape x, w;
  ConvTransposeOptions opts;
  Geo ref;
};

void check_conv_transpose(const ConvTCase& c, DType t, bool with_bias) {
  SCOPED_TRACE(::testing::Message() << "conv_transpose x " << to_string(c.x) << " w "
                                    << to_string(c.w) << " " << name(t)
                                    << (with_bias ? " bias" : ""));
  Graph g;
  const int64_t O = c.w[1] * c.ref.groups;
  auto x = g.placeholder(c.x, t, "x");
  auto w = g.placeholder(c.w, t, "w");
  auto b = g.placeholder({O}, t, "b");
  Array vx = random_array(c.x, t), vw = random_array(c.w, t), vb = random_array({O}, t);
  Feeds feeds{{x, vx}, {w, vw}};
  if (with_bias) feeds.push_back({b, vb});
  auto y = build_conv_transpose(x, w, with_bias ? std::optional<Tensor>(b) : std::nullopt, c.opts);
  const double tol = tol_for(t);
  expect_close(eval1(g, y, feeds), conv_transpose_shape(c.x, c.w, c.ref),
               ref_conv_transpose(vx, vw, with_bias ? &vb : nullptr, c.ref), tol, tol);
}

const std::vector<ConvTCase>& conv_transpose_cases() {
  static const std::vector<ConvTCase> cases = {
      // stride with output padding
      {{2, 4, 5, 4}, {4, 3, 3, 3}, {{2, 2}, {1, 0}, {1, 0}},
       {{2, 2}, {1, 0, 1, 0}, {1, 1}, {1, 0}}},
      // groups, dilation, asymmetric padding
      {{1, 6, 4, 5}, {6, 2, 2, 3}, {{2, 3}, {0, 1, 1, 2}, {}, {1, 2}, 3},
       {{2, 3}, {0, 1, 1, 2}, {1, 2}, {0, 0}, 3}},
      // output padding >= stride, allowed because it is below the dilation
      {{1, 2, 4, 4}, {2, 3, 3, 3}, {{1, 1}, {}, {1, 1}, {2, 2}},
       {{1, 1}, {0, 0, 0, 0}, {2, 2}, {1, 1}}},
      // 1-D and 3-D
      {{2, 3, 7}, {3, 2, 4}, {{3}, {2}, {2}}, {{3}, {2, 2}, {1}, {2}}},
      {{1, 2, 3, 4, 3}, {2, 2, 2, 2, 3}, {{2, 1, 2}, {0, 1, 1}, {1, 0, 0}},
       {{2, 1, 2}, {0, 1, 1, 0, 1, 1}, {1, 1, 1}, {1, 0, 0}}},
      // size-1 dims
      {{1, 1, 1, 1}, {1, 1, 1, 1}, {}, {{1, 1}, {0, 0, 0, 0}, {1, 1}, {0, 0}}},
  };
  return cases;
}

TEST(ConvTranspose, MatchesReferenceF32F64) {
  for (const ConvTCase& c : conv_transpose_cases())
    for (DType t : {f32, f64})
      for (bool bias : {false, true}) check_conv_transpose(c, t, bias);
}

TEST(ConvTranspose, HalfTypesAndEmptyBatch) {
  check_conv_transpose(conv_transpose_cases()[0], bf16, true);
  const Geo geo{{2, 2}, {0, 0, 0, 0}, {1, 1}, {0, 0}};
  check_conv_transpose({{0, 4, 5, 4}, {4, 3, 3, 3}, {{2, 2}}, geo}, f32, true);
}

TEST(ConvTranspose, ErrorsNameOpAndShapes) {
  Graph g;
  auto p = [&](const Shape& s) { return g.placeholder(s, f32); };
  expect_error<ShapeError>([&] { conv_transpose2d(p({1, 3, 8, 8}), p({4, 2, 3, 3})); },
                           {"[conv_transpose]", "(1, 3, 8, 8)", "(4, 2, 3, 3)"});
  expect_error<ShapeError>([&] { conv_transpose2d(p({1, 3, 8, 8}), p({3, 2, 3})); },
                           {"[conv_transpose]", "(3, 2, 3)"});
  ConvTransposeOptions g2;
  g2.groups = 2;
  expect_error<ShapeError>(
      [&] { conv_transpose2d(p({1, 3, 8, 8}), p({3, 2, 3, 3}), std::nullopt, g2); },
      {"[conv_transpose]", "groups=2", "(1, 3, 8, 8)"});
  const ConvTransposeOptions too_much{{2, 2}, {}, {2, 0}};
  expect_error<ValueError>(
      [&] { conv_transpose2d(p({1, 3, 8, 8}), p({3, 2, 3, 3}), std::nullopt, too_much); },
      {"[conv_transpose]", "output_padding"});
}

// Conv's weight gradient:
//   dw[o, c, k] = sum over n and p of dy[n, o, p] x[n, c in o's group, p*s - pad + k*d].
std::vector<double> ref_conv_grad_weight(const Array& x, const Array& dy, const Shape& ws,
                                         const Geo& p) {
  const Shape xs = x.shape(), ys = dy.shape();
  const int nd = spatial(xs);
  const auto vx = to_f64(x), vy = to_f64(dy);
  const int64_t Cg = ws[1], Og = ws[0] / p.groups;
  const Shape plane(ys.begin() + 2, ys.end());
  std::vector<double> r(numel(ws));
  for (int64_t i = 0; i < numel(ws); ++i) {
    const auto wi = unravel(i, ws);
    const int64_t o = wi[0], c = (o / Og) * Cg + wi[1];
    double acc = 0;
    for (int64_t n = 0; n < ys[0]; ++n)
      for (int64_t q = 0; q < numel(plane); ++q) {
        const auto yi = unravel(q, plane);
        std::vector<int64_t> xi{n, c};
        bool inside = true;
        for (int d = 0; d < nd; ++d) {
          const int64_t pos = yi[d] * p.stride[d] - p.pads[d] + wi[2 + d] * p.dilation[d];
          inside = inside && pos >= 0 && pos < xs[2 + d];
          xi.push_back(pos);
        }
        if (inside) acc += vy[(n * ys[1] + o) * numel(plane) + q] * vx[ravel(xi, xs)];
      }
    r[i] = acc;
  }
  return r;
}

void check_conv_grad_weight(const Shape& xs, const Shape& ys, const Shape& ws,
                            const ConvOptions& opts, const Geo& ref, DType t) {
  SCOPED_TRACE(::testing::Message() << "conv_grad_weight x " << to_string(xs) << " dy "
                                    << to_string(ys) << " w " << to_string(ws) << " " << name(t));
  Graph g;
  auto x = g.placeholder(xs, t, "x");
  auto dy = g.placeholder(ys, t, "dy");
  Array vx = random_array(xs, t), vy = random_array(ys, t);
  const double tol = t == f64 ? 1e-10 : t == f32 ? 1e-3 : 5e-2;
  expect_close(eval1(g, conv_grad_weight(x, dy, ws, opts), {{x, vx}, {dy, vy}}), ws,
               ref_conv_grad_weight(vx, vy, ws, ref), tol, tol);
}

TEST(ConvGradWeight, MatchesReferenceF32F64) {
  for (const ConvCase& c : conv_cases())
    for (DType t : {f32, f64})
      check_conv_grad_weight(c.x, conv_shape(c.x, c.w, c.ref), c.w, c.opts, c.ref, t);
}

TEST(ConvGradWeight, HalfTypesComputeInF32) {
  const ConvCase& c = conv_cases()[3];
  for (DType t : {f16, bf16})
    check_conv_grad_weight(c.x, conv_shape(c.x, c.w, c.ref), c.w, c.opts, c.ref, t);
}

TEST(ConvGradWeight, OutputGradientSmallerThanTheInputCovers) {
  // a conv_transpose's weight gradient with output_padding >= stride: dy is one row short of
  // what x and the kernel would give, so the oneDNN path cannot take it
  const Geo geo{{1, 1}, {0, 0, 0, 0}, {2, 2}, {}};
  for (DType t : {f32, f64})
    check_conv_grad_weight({1, 2, 8, 8}, {1, 3, 3, 3}, {3, 2, 3, 3}, {{1, 1}, {}, {2, 2}}, geo, t);
}

TEST(ConvGradWeight, ErrorsNameOpAndShapes) {
  Graph g;
  auto p = [&](const Shape& s) { return g.placeholder(s, f32); };
  auto dw = [&](const Shape& w) { conv_grad_weight(p({1, 3, 8, 8}), p({1, 4, 6, 6}), w); };
  expect_error<ShapeError>([&] { dw({4, 2, 3, 3}); },
                           {"[conv_grad_weight]", "(1, 3, 8, 8)", "(4, 2, 3, 3)"});
  expect_error<ShapeError>([&] { dw({4, 3, 3}); }, {"[conv_grad_weight]", "(4, 3, 3)"});
}

}  // namespace
}  // namespace kiln
