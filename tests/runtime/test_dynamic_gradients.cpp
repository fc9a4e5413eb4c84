// Gradient rules that read sizes known only at run time (src/ops/transform_grad.cpp): gather
// (an embedding table by token ids of any batch and length, and gathers from a dynamic batch),
// slices of dynamic dims (any steps) and slices whose bounds are computed from shapes, constant,
// reflect and edge pads (also with pads computed from shapes), tiles and concats along a dynamic
// axis, scatters and batched gather_nd, convolutions and pooling over dynamic spatial dims
// (src/ops/conv.cpp, src/ops/pool.cpp), "same" padding of run-time size, the gradients of the
// pooling gradients, resize (src/ops/resize.cpp), variance, batch norm's statistics, losses over a
// dynamic class dim, stacked RNN layers and einsum over dynamic dims. One executable built on
// dynamic dims gives, at each shape, the gradients of a graph built for that shape.
#include <fmt/format.h>

#include <functional>
#include <string>
#include <vector>

#include "kiln/kiln.h"
#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;

Array host(const Array& a) { return a.to(Device::cpu()); }

struct Built {
  std::vector<Tensor> inputs;  // placeholders, fed in order
  Tensor out;
  std::vector<Tensor> wrt;  // what the gradients are of
};
using Build = std::function<Built(Graph&, const std::vector<Shape>&)>;
using Make = std::function<Array(const Shape&)>;

struct Case {
  std::string name;
  Build build;
  std::vector<Shape> dynamic;          // the inputs' shapes, -1 for dynamic dims
  std::vector<std::vector<Shape>> at;  // shapes the executable runs at
  std::vector<Make> make;              // each input's values
};

Make floats() {
  return [](const Shape& s) { return random_array(s, f32); };
}
Make ids(int64_t n) {  // indices into n rows, negative ones too
  return [n](const Shape& s) { return random_ints(s, -n, n - 1); };
}

void check(const Case& c) {
  SCOPED_TRACE(c.name);
  Graph g;
  Built d = c.build(g, c.dynamic);
  auto r = g.placeholder(Shape(d.out.shape().size(), -1), f32, "r");
  const auto grads = gradients(sum(d.out * r), d.wrt);
  Executable exe = g.compile(default_device(), {}, grads);
  ASSERT_TRUE(exe.is_dynamic());
  for (const auto& shapes : c.at) {
    SCOPED_TRACE(fmt::format("input 0 of shape {}", to_string(shapes[0])));
    Graph fg;
    Built f = c.build(fg, shapes);
    auto fr = fg.placeholder(f.out.shape(), f32, "r");
    Executable fixed = fg.compile(default_device(), {}, gradients(sum(f.out * fr), f.wrt));
    Feeds dyn_feeds, fixed_feeds;
    for (size_t i = 0; i < shapes.size(); ++i) {
      const Array v = c.make[i](shapes[i]);
      dyn_feeds.emplace_back(d.inputs[i], v);
      fixed_feeds.emplace_back(f.inputs[i], v);
    }
    const Array rv = random_array(f.out.shape(), f32);
    dyn_feeds.emplace_back(r, rv);
    fixed_feeds.emplace_back(fr, rv);
    const auto got = exe.run(dyn_feeds);
    const auto want = fixed.run(fixed_feeds);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      const Array w = host(want[i]);
      expect_close(host(got[i]), w.shape(), to_f64(w), 1e-5, 1e-6);
    }
  }
}

TEST(DynamicGradients, EmbeddingTableByTokenIdsOfAnyShape) {
  check({"embedding",
         [](Graph& g, const std::vector<Shape>& s) {
           auto table = g.placeholder(s[0], f32, "table");
           auto tokens = g.placeholder(s[1], i64, "tokens");
           return Built{{table, tokens}, tanh(gather(table, tokens)), {table}};
         },
         {{20, 6}, {-1, -1}},
         {{{20, 6}, {2, 7}}, {{20, 6}, {5, 3}}, {{20, 6}, {1, 1}}},
         {floats(), ids(20)}});
}

TEST(DynamicGradients, GatherFromADynamicBatch) {
  // along axis 1 by constant indices, and along the dynamic axis 0 by indices of dynamic length
  check({"gather axis 1",
         [](Graph& g, const std::vector<Shape>& s) {
           auto x = g.placeholder(s[0], f32, "x");
           auto at = g.constant(Array::from_vector(std::vector<int64_t>{1, 3, -2, 3}, {2, 2}));
           return Built{{x}, gather(x * x, at, 1), {x}};
         },
         {{-1, 10}},
         {{{3, 10}}, {{6, 10}}},
         {floats()}});
  check({"gather axis 0",
         [](Graph& g, const std::vector<Shape>& s) {
           auto x = g.placeholder(s[0], f32, "x");
           auto at = g.placeholder(s[1], i64, "at");
           return Built{{x, at}, gather(x, at, 0), {x}};
         },
         {{-1, 7}, {-1}},
         {{{4, 7}, {9}}, {{9, 7}, {2}}},
         {floats(), ids(4)}});
}

TEST(DynamicGradients, SlicesOfDynamicDimsAndBoundsFromShapes) {
  check({"slice [1:-1] of a dynamic dim, [:2] of the batch",
         [](Graph& g, const std::vector<Shape>& s) {
           auto x = g.placeholder(s[0], f32, "x");
           return Built{{x}, slice(x, {0, 1}, {2, -1}, {}, {0, 1}), {x}};
         },
         {{-1, -1, 4}},
         {{{3, 6, 4}}, {{5, 3, 4}}, {{1, 9, 4}}},
         {floats()}});
  check({"slice with a stop computed from the shape",
         [](Graph& g, const std::vector<Shape>& s) {
           // built for one shape, the reference: the same bounds as constants
           auto x = g.placeholder(s[0], f32, "x");
           if (s[0][1] >= 0) return Built{{x}, slice(x, {1}, {s[0][1] - 1}, {}, {1}), {x}};
           auto one = g.constant(Array::from_vector(std::vector<int64_t>{1}, {1}));
           auto stop = slice(shape_of(x), {1}, {2}) - one;  // x.shape[1] - 1
           return Built{{x}, slice(x, one, stop, {}, {1}), {x}};
         },
         {{2, -1}},
         {{{2, 5}}, {{2, 8}}},
         {floats()}});
}

TEST(DynamicGradients, SliceStepsOtherThanOneOnDynamicDims) {
  check(
      {"steps 2 and -3 on dynamic dims",
       [](Graph& g, const std::vector<Shape>& s) {
         auto x = g.placeholder(s[0], f32, "x");
         return Built{{x}, slice(x * x, {1, -1}, {-1, -(int64_t{1} << 62)}, {2, -3}, {0, 1}), {x}};
       },
       {{-1, -1}},
       {{{7, 8}}, {{4, 3}}, {{1, 10}}},
       {floats()}});
  check({"step 2 with a stop computed from the shape",
         [](Graph& g, const std::vector<Shape>& s) {
           auto x = g.placeholder(s[0], f32, "x");
           if (s[0][1] >= 0) return Built{{x}, slice(x, {0}, {s[0][1] - 1}, {2}, {1}), {x}};
           auto zero = g.constant(Array::from_vector(std::vector<int64_t>{0}, {1}));
           auto one = g.constant(Array::from_vector(std::vector<int64_t>{1}, {1}));
           auto stop = slice(shape_of(x), {1}, {2}) - one;  // x.shape[1] - 1
           return Built{{x}, slice(x, zero, stop, {2}, {1}), {x}};
         },
         {{3, -1}},
         {{{3, 6}}, {{3, 9}}},
         {floats()}});
}

TEST(DynamicGradients, PadsTilesAndConcatsOverDynamicDims) {
  check({"constant pad",
         [](Graph& g, const std::vector<Shape>& s) {
           auto x = g.placeholder(s[0], f32, "x");
           return Built{{x}, pad(x * x, {1, 2, 0, -1}), {x}};
         },
         {{-1, 4}},
         {{{3, 4}}, {{7, 4}}},
         {floats()}});
  check({"reflect and edge pads",
         [](Graph& g, const std::vector<Shape>& s) {
           auto x = g.placeholder(s[0], f32, "x");
           auto r = pad(x * x, {1, 2, 2, 1}, PadKind::reflect);
           return Built{{x}, pad(r, {2, 0, 1, 3}, PadKind::edge), {x}};
         },
         {{-1, -1}},
         {{{3, 4}}, {{5, 7}}},
         {floats()}});
  for (PadKind kind : {PadKind::constant, PadKind::reflect, PadKind::edge})
    check({fmt::format("pads computed from the shape, mode {}", static_cast<int>(kind)),
           [kind](Graph& g, const std::vector<Shape>& s) {
             // pads (1, n0 / 2) and (n1 - 1, 2): built per shape, the same as constants
             auto x = g.placeholder(s[0], f32, "x");
             if (is_static(s[0]))
               return Built{{x}, pad(x * x, {1, s[0][0] / 2, s[0][1] - 1, 2}, kind), {x}};
             const Tensor sizes = shape_of(x);
             auto ints = [&](std::vector<int64_t> v) {
               const auto n = static_cast<int64_t>(v.size());
               return g.constant(Array::from_vector(std::move(v), {n}));
             };
             const Tensor n0 = slice(sizes, {0}, {1}), n1 = slice(sizes, {1}, {2});
             const Tensor pads = concat({ints({1}), n0 / ints({2}), n1 - ints({1}), ints({2})}, 0);
             return Built{{x}, pad(x * x, pads, kind), {x}};
           },
           {{-1, -1}},
           {{{3, 4}}, {{6, 3}}},
           {floats()}});
  check({"tile",
         [](Graph& g, const std::vector<Shape>& s) {
           auto x = g.placeholder(s[0], f32, "x");
           return Built{{x}, tile(x * x, {2, 3}), {x}};
         },
         {{-1, 4}},
         {{{3, 4}}, {{1, 4}}},
         {floats()}});
  check({"concat along the batch",
         [](Graph& g, const std::vector<Shape>& s) {
           auto x = g.placeholder(s[0], f32, "x");
           auto y = g.placeholder(s[1], f32, "y");
           return Built{{x, y}, concat({x * x, y, x}, 0), {x, y}};
         },
         {{-1, 4}, {-1, 4}},
         {{{3, 4}, {2, 4}}, {{1, 4}, {6, 4}}},
         {floats(), floats()}});
}

TEST(DynamicGradients, ScattersAndGatherNdOverDynamicDims) {
  // indices within the smallest size each runs at; "none" keeps the update written last
  auto rows = [](int64_t n) { return [n](const Shape& s) { return random_ints(s, 0, n - 1); }; };
  for (ScatterReduction r :
       {ScatterReduction::none, ScatterReduction::add, ScatterReduction::max}) {
    check({fmt::format("scatter_elements along axis 0, reduction {}", static_cast<int>(r)),
           [r](Graph& g, const std::vector<Shape>& s) {
             auto x = g.placeholder(s[0], f32, "x");
             auto at = g.placeholder(s[1], i64, "at");
             auto u = g.placeholder(s[2], f32, "u");
             return Built{{x, at, u}, scatter_elements(x * x, at, u, 0, r), {x, u}};
           },
           {{-1, 5}, {-1, 5}, {-1, 5}},
           {{{6, 5}, {4, 5}, {4, 5}}, {{3, 5}, {7, 5}, {7, 5}}},
           {floats(), rows(3), floats()}});
  }
  check({"scatter_nd, reduction none",
         [](Graph& g, const std::vector<Shape>& s) {
           auto x = g.placeholder(s[0], f32, "x");
           auto at = g.placeholder(s[1], i64, "at");
           auto u = g.placeholder(s[2], f32, "u");
           return Built{{x, at, u}, scatter_nd(x * x, at, u), {x, u}};
         },
         {{-1, 4}, {-1, 1}, {-1, 4}},
         {{{5, 4}, {6, 1}, {6, 4}}, {{3, 4}, {2, 1}, {2, 4}}},
         {floats(), rows(3), floats()}});
  check({"gather_nd with a batch dim",
         [](Graph& g, const std::vector<Shape>& s) {
           auto x = g.placeholder(s[0], f32, "x");
           auto at = g.placeholder(s[1], i64, "at");
           return Built{{x, at}, gather_nd(x * x, at, 1), {x}};
         },
         {{-1, 6, 3}, {-1, 4, 1}},
         {{{2, 6, 3}, {2, 4, 1}}, {{5, 6, 3}, {5, 4, 1}}},
         {floats(), rows(6)}});
}

TEST(DynamicGradients, ConvolutionsAndPoolingOverDynamicSpatialDims) {
  // odd and even sizes: a stride-2 conv's input gradient needs a different output padding per
  // size, found at run time
  const std::vector<std::vector<Shape>> at{{{2, 3, 9, 11}, {4, 3, 3, 3}},
                                           {{1, 3, 12, 7}, {4, 3, 3, 3}}};
  check({"conv stride 2, dilated conv, bias",
         [](Graph& g, const std::vector<Shape>& s) {
           auto x = g.placeholder(s[0], f32, "x");
           auto w = g.placeholder(s[1], f32, "w");
           auto b = g.constant(Array::from_vector(std::vector<float>{0.5f, -1.f, 0.25f, 2.f}, {4}));
           auto y = conv2d(x, w, b, ConvOptions{{2, 2}, {1, 1}});
           auto z = conv2d(tanh(y), reshape(w, {3, 4, 3, 3}), std::nullopt,
                           ConvOptions{{}, {2, 2}, {2, 1}});
           return Built{{x, w}, z, {x, w}};
         },
         {{-1, 3, -1, -1}, {4, 3, 3, 3}},
         at,
         {floats(), floats()}});
  check({"conv_transpose: output padding past the stride (crop), and within it",
         [](Graph& g, const std::vector<Shape>& s) {
           auto x = g.placeholder(s[0], f32, "x");
           auto w = g.placeholder(s[1], f32, "w");
           auto y = conv_transpose2d(x, w, std::nullopt, {{1, 1}, {1, 1}, {1, 1}, {2, 2}});
           auto z = conv_transpose2d(tanh(y), reshape(w, {4, 3, 3, 3}), std::nullopt,
                                     {{2, 2}, {1, 1}, {1, 0}});
           return Built{{x, w}, z, {x, w}};
         },
         {{-1, 3, -1, -1}, {3, 4, 3, 3}},
         {{{2, 3, 9, 11}, {3, 4, 3, 3}}, {{1, 3, 6, 7}, {3, 4, 3, 3}}},
         {floats(), floats()}});
  check({"max, average and adaptive pooling",
         [](Graph& g, const std::vector<Shape>& s) {
           auto x = g.placeholder(s[0], f32, "x");
           auto m = max_pool(x * x, PoolOptions{{3, 3}, {2, 2}, {1, 1}});
           auto a = avg_pool(m, PoolOptions{{2, 2}, {}, {}, {}, true});
           auto p = adaptive_avg_pool(x, {2, 3});
           return Built{{x}, concat({reshape(a, {-1}), reshape(p, {-1})}, 0), {x}};
         },
         {{-1, 3, -1, -1}},
         {{{2, 3, 9, 11}}, {{1, 3, 12, 7}}},
         {floats()}});
}

TEST(DynamicGradients, SamePaddingAndSecondOrderPoolingOverDynamicSpatialDims) {
  for (PadMode m : {PadMode::same_upper, PadMode::same_lower})
    check({fmt::format("conv stride 2, same padding {}", static_cast<int>(m)),
           [m](Graph& g, const std::vector<Shape>& s) {
             auto x = g.placeholder(s[0], f32, "x");
             auto w = g.placeholder(s[1], f32, "w");
             ConvOptions o;
             o.stride = {2, 3};
             o.dilation = {1, 2};
             o.pad_mode = m;
             auto b = g.constant(Array::from_vector(std::vector<float>{0.5f, -1.f}, {2}));
             return Built{{x, w}, conv2d(x * x, w, b, o), {x, w}};
           },
           {{-1, 3, -1, -1}, {2, 3, 3, 2}},
           {{{2, 3, 9, 11}, {2, 3, 3, 2}}, {{1, 3, 6, 7}, {2, 3, 3, 2}}},
           {floats(), floats()}});
  // the gradient of a pooling gradient: d/dx of <r, d sum(pool(x)^2) / dx>
  check({"max, average and adaptive pooling gradients, differentiated again",
         [](Graph& g, const std::vector<Shape>& s) {
           auto x = g.placeholder(s[0], f32, "x");
           auto m = max_pool(x, PoolOptions{{3, 3}, {2, 2}, {1, 1}});
           auto a = avg_pool(x, PoolOptions{{2, 3}, {2, 1}});
           auto p = adaptive_avg_pool(x, {2, 2});
           auto gx = gradients(sum(m * m) + sum(a * a * a) + sum(p * p), {x})[0];
           return Built{{x}, gx, {x}};
         },
         {{-1, 2, -1, -1}},
         {{{2, 2, 9, 11}}, {{1, 2, 6, 8}}},
         {floats()}});
}

TEST(DynamicGradients, ResizeOverDynamicDims) {
  // sizes from the input's run-time shape (upsampling by 2 and 3), and fixed sizes from a
  // dynamic input; built per shape, the same sizes as constants
  struct Mode {
    std::string name;
    ResizeOptions o;
    bool twice;  // sizes 2x and 3x the input's, else fixed (5, 7)
  };
  std::vector<Mode> modes;
  auto add = [&](std::string name, ResizeMode m, ResizeCoordinates c, bool twice) {
    ResizeOptions o;
    o.mode = m;
    o.coordinate_transformation_mode = c;
    modes.push_back({std::move(name), o, twice});
    return &modes.back().o;
  };
  add("nearest asymmetric", ResizeMode::nearest, ResizeCoordinates::asymmetric, true);
  add("nearest half_pixel round_prefer_ceil", ResizeMode::nearest, ResizeCoordinates::half_pixel,
      false)
      ->nearest_mode = NearestMode::round_prefer_ceil;
  add("linear half_pixel", ResizeMode::linear, ResizeCoordinates::half_pixel, true);
  add("linear align_corners", ResizeMode::linear, ResizeCoordinates::align_corners, false);
  add("linear pytorch_half_pixel", ResizeMode::linear, ResizeCoordinates::pytorch_half_pixel,
      false);
  add("cubic half_pixel_symmetric", ResizeMode::cubic, ResizeCoordinates::half_pixel_symmetric,
      true);
  add("cubic asymmetric exclude_outside", ResizeMode::cubic, ResizeCoordinates::asymmetric, false)
      ->exclude_outside = true;
  ResizeOptions* crop = add("linear tf_crop_and_resize", ResizeMode::linear,
                            ResizeCoordinates::tf_crop_and_resize, false);
  crop->roi = {0, 0, -0.2, 0.1, 1, 1, 0.9, 1.3};
  crop->extrapolation_value = 0.5;
  for (const Mode& m : modes)
    check(
        {"resize " + m.name,
         [m](Graph& g, const std::vector<Shape>& s) {
           auto x = g.placeholder(s[0], f32, "x");
           auto xx = x * x;
           if (is_static(s[0])) {
             const Shape sizes =
                 m.twice ? Shape{s[0][0], 2, 2 * s[0][2], 3 * s[0][3]} : Shape{s[0][0], 2, 5, 7};
             return Built{{x}, resize(xx, sizes, m.o), {x}};
           }
           const Tensor shape = shape_of(x);
           Tensor sizes;
           if (m.twice) {
             sizes = shape * g.constant(Array::from_vector(std::vector<int64_t>{1, 1, 2, 3}, {4}));
           } else {
             auto fixed = g.constant(Array::from_vector(std::vector<int64_t>{2, 5, 7}, {3}));
             sizes = concat({slice(shape, {0}, {1}), fixed}, 0);
           }
           return Built{{x}, resize_to(xx, sizes, m.o), {x}};
         },
         {{-1, 2, -1, -1}},
         {{{2, 2, 3, 4}}, {{1, 2, 6, 9}}, {{3, 2, 1, 2}}},
         {floats()}});
}

TEST(DynamicGradients, StatisticsAndLossesOverDynamicDims) {
  check({"variance over a dynamic axis, correction 1",
         [](Graph& g, const std::vector<Shape>& s) {
           auto x = g.placeholder(s[0], f32, "x");
           return Built{{x}, variance(x * x, {1}, false, 1) + variance(x, {0, 1}, true), {x}};
         },
         {{3, -1}},
         {{{3, 5}}, {{3, 2}}},
         {floats()}});
  check({"batch norm's mean and var outputs",
         [](Graph& g, const std::vector<Shape>& s) {
           auto x = g.placeholder(s[0], f32, "x");
           auto r = batch_norm_train(x * x);
           return Built{{x}, r.y + expand_dims(r.mean * r.var, {0, 2}), {x}};
         },
         {{-1, 3, -1}},
         {{{2, 3, 5}}, {{4, 3, 1}}},
         {floats()}});
  check({"cross entropy with probability and index labels, mean over a dynamic class dim",
         [](Graph& g, const std::vector<Shape>& s) {
           auto x = g.placeholder(s[0], f32, "x");
           auto p = g.placeholder(s[1], f32, "p");
           auto t = g.placeholder(s[2], i64, "t");
           auto a = softmax_cross_entropy(x, softmax(p, 1), Reduction::mean, 1);
           auto b = softmax_cross_entropy(x * x, t, Reduction::mean, 1);
           return Built{{x, p, t}, stack({a, b}, 0), {x, p}};
         },
         {{-1, -1}, {-1, -1}, {-1}},
         {{{4, 3}, {4, 3}, {4}}, {{2, 6}, {2, 6}, {2}}},
         {floats(), floats(), [](const Shape& sh) { return random_ints(sh, 0, 2); }}});
}

TEST(DynamicGradients, StackedRnnLayersAndEinsumOverDynamicDims) {
  check({"two LSTM layers, time and batch dynamic",
         [](Graph& g, const std::vector<Shape>& s) {
           auto x = g.placeholder(s[0], f32, "x");
           auto w0 = g.placeholder(s[1], f32, "w0");
           auto r0 = g.placeholder(s[2], f32, "r0");
           auto w1 = g.placeholder(s[3], f32, "w1");
           auto r1 = g.placeholder(s[4], f32, "r1");
           RnnOptions o;
           o.training = true;
           auto res = lstm(x, {{w0, r0}, {w1, r1}}, std::nullopt, std::nullopt, std::nullopt, o);
           return Built{{x, w0, r0, w1, r1}, res.y, {x, w0, w1}};
         },
         {{-1, -1, 3}, {1, 16, 3}, {1, 16, 4}, {1, 16, 4}, {1, 16, 4}},
         {{{5, 2, 3}, {1, 16, 3}, {1, 16, 4}, {1, 16, 4}, {1, 16, 4}},
          {{2, 3, 3}, {1, 16, 3}, {1, 16, 4}, {1, 16, 4}, {1, 16, 4}}},
         {floats(), floats(), floats(), floats(), floats()}});
  check({"einsum contractions over dynamic dims, batch broadcast from 1",
         [](Graph& g, const std::vector<Shape>& s) {
           auto a = g.placeholder(s[0], f32, "a");
           auto b = g.placeholder(s[1], f32, "b");
           auto c = g.placeholder(s[2], f32, "c");
           auto ab = einsum("bij,bjk->bik", {a, b});
           auto abc = einsum("...ik,...kl->...il", {ab, c});
           return Built{{a, b, c}, abc, {a, b, c}};
         },
         {{-1, -1, 4}, {-1, 4, 3}, {1, 3, -1}},
         {{{2, 5, 4}, {2, 4, 3}, {1, 3, 6}}, {{3, 1, 4}, {3, 4, 3}, {1, 3, 2}}},
         {floats(), floats(), floats()}});
}

}  // namespace
}  // namespace kiln
