// shape_of and the ops that take their shape, bounds or range from values computed from shapes
// (reshape, expand, full, arange and slice fed by tensors): computed on the host when a run's
// shapes are known, against numpy-style float64 loops, on fresh random data.
#include <algorithm>

#include "kiln/autodiff.h"
#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;

Array host(const Array& a) { return a.to(Device::cpu()); }
Tensor ints(Graph& g, std::vector<int64_t> v) {
  const auto n = static_cast<int64_t>(v.size());
  return g.constant(Array::from_vector(v, {n}));
}
Tensor int0(Graph& g, int64_t v) { return g.constant(Array::scalar<int64_t>(v)); }

TEST(ShapeOf, StaticShapesAreConstantsWhenBuilt) {
  Graph g;
  auto x = g.placeholder({2, 3, 4}, f32, "x");
  auto s = shape_of(x);
  EXPECT_EQ(s.op_name(), std::string("constant"));
  expect_equal(eval1(g, s), {3}, {2, 3, 4});
  // arithmetic on it is computed when the graph is compiled
  auto y = reshape_to(x, concat({gather(s, ints(g, {0})), ints(g, {-1})}));
  EXPECT_EQ(y.shape(), (Shape{-1, -1}));
  auto exe = g.compile(default_device(), {}, {y});
  EXPECT_FALSE(exe.is_dynamic());
  EXPECT_EQ(exe.outputs()[0].shape, (Shape{2, 12}));
  const Array xv = random_array({2, 3, 4}, f32);
  expect_equal(host(exe.run({{x, xv}})[0]), {2, 12}, to_f64(xv));
}

// A transformer's shape arithmetic on a batch and sequence that change from run to run: split
// heads, position ids, a position table sliced to the sequence, a mask expanded to (batch, seq).
TEST(ShapeOf, ShapeArithmeticFollowsEveryRunsShapes) {
  Graph g;
  auto x = g.placeholder({-1, -1, 12}, f32, "x");
  ASSERT_EQ(shape_of(x).op_name(), std::string("shape_of"));
  auto s = shape_of(x);
  auto b = gather(s, ints(g, {0})), l = gather(s, ints(g, {1}));
  auto heads = reshape_to(x, concat({b, l, ints(g, {3}), ints(g, {-1})}));
  EXPECT_EQ(heads.shape(), (Shape{-1, -1, -1, -1}));
  auto merged =
      reshape_to(transpose(heads, {0, 2, 1, 3}), ints(g, {0, 0, -1}), /*zero_copies=*/true);
  auto flat = reshape_to(x, concat({b, l * ints(g, {12})}));
  auto pos = arange(int0(g, 0), gather(s, int0(g, 1)), int0(g, 1), i64);
  const Array table = random_array({16, 12}, f32);
  auto sliced = x + slice(g.constant(table), ints(g, {0}), l, {}, {0});
  auto mask =
      expand(g.constant(Array::from_vector(std::vector<float>{1}, {1, 1})), concat({b, l})) *
      full(concat({b, l}), 2.5, f32);
  auto exe = g.compile(default_device(), {}, {heads, merged, flat, pos, sliced, mask});
  ASSERT_TRUE(exe.is_dynamic());
  for (auto [n, len] : {std::pair<int64_t, int64_t>{2, 5}, {3, 1}, {2, 5}, {1, 16}}) {
    const Array xv = random_array({n, len, 12}, f32);
    const auto out = exe.run({{x, xv}});
    const auto vx = to_f64(xv), vt = to_f64(table);
    expect_equal(host(out[0]), {n, len, 3, 4}, vx);
    std::vector<double> m(n * 3 * len * 4);  // (n, 3, len, 4) read back as (n, 3, len * 4)
    for (int64_t i = 0; i < n; ++i)
      for (int64_t h = 0; h < 3; ++h)
        for (int64_t t = 0; t < len; ++t)
          for (int64_t d = 0; d < 4; ++d)
            m[((i * 3 + h) * len + t) * 4 + d] = vx[(i * len + t) * 12 + h * 4 + d];
    expect_equal(host(out[1]), {n, 3, len * 4}, m);
    expect_equal(host(out[2]), {n, len * 12}, vx);
    std::vector<double> ids(len), sum(n * len * 12), twos(n * len, 2.5);
    for (int64_t t = 0; t < len; ++t) ids[t] = static_cast<double>(t);
    for (int64_t i = 0; i < n * len * 12; ++i) sum[i] = vx[i] + vt[i % (len * 12)];
    expect_equal(host(out[3]), {len}, ids);
    expect_close(host(out[4]), {n, len, 12}, sum, 1e-6);
    expect_equal(host(out[5]), {n, len}, twos);
  }
  EXPECT_EQ(exe.shape_cache().misses, 3);
  EXPECT_EQ(exe.shape_cache().hits, 1);
}

// Upsampling by 2 of a dynamic image: sizes computed from its shape, against a static resize.
TEST(ShapeOf, ResizeToComputedSizes) {
  Graph g;
  auto x = g.placeholder({-1, 2, -1, -1}, f32, "x");
  auto sizes = cast(floor(cast(shape_of(x), f64) *
                          g.constant(Array::from_vector(std::vector<double>{1, 1, 2, 2}, {4}))),
                    i64);
  ResizeOptions o;
  o.mode = ResizeMode::linear;
  auto exe = g.compile(default_device(), {}, {resize_to(x, sizes, o)});
  for (auto [h, w] : {std::pair<int64_t, int64_t>{3, 5}, {4, 4}}) {
    const Array xv = random_array({2, 2, h, w}, f32);
    Graph s;
    auto xs = s.placeholder({2, 2, h, w}, f32, "x");
    const Array want = eval1(s, resize(xs, {2, 2, 2 * h, 2 * w}, o), {{xs, xv}});
    expect_close(host(exe.run({{x, xv}})[0]), {2, 2, 2 * h, 2 * w}, to_f64(want), 1e-6);
  }
  expect_error<ValueError>([&] { resize_to(x, g.constant(random_array({4}, f32)), o); },
                           {"[resize] sizes must be a 1-d integer tensor"});
}

// Gradients through reshape_to fed by computed shapes: d/dx of sum(reshape_to(x, (b, 2, 2))^3)
// against the closed form 3x^2; and of a product with a constant broadcast against that result,
// whose dims are all unknown until specialized (its gradient is summed back to them then).
TEST(ShapeOf, GradientsFlowThroughComputedShapes) {
  Graph g;
  auto x = g.placeholder({-1, 4}, f32, "x");
  auto b = gather(shape_of(x), ints(g, {0}));
  auto parts = reshape_to(x, concat({b, ints(g, {2, 2})}));
  auto exe = g.compile(default_device(), {}, {gradients(sum(parts * parts * parts), {x})[0]});
  for (int64_t n : {2, 5}) {
    const Array xv = random_array({n, 4}, f32);
    std::vector<double> want = to_f64(xv);
    for (double& v : want) v = 3 * v * v;
    expect_close(host(exe.run({{x, xv}})[0]), {n, 4}, want, 1e-5);
  }
  const Array c = random_array({2, 2}, f32);
  auto scaled = g.compile(default_device(), {}, {gradients(sum(parts * g.constant(c)), {x})[0]});
  for (int64_t n : {3, 1}) {
    std::vector<double> want;
    for (int64_t i = 0; i < n; ++i)
      for (double v : to_f64(c)) want.push_back(v);
    expect_close(host(scaled.run({{x, random_array({n, 4}, f32)}})[0]), {n, 4}, want, 1e-6);
  }
}

// The gradient of a broadcast between operands with several dynamic dims each: d/db of
// sum((a + b)^2) with a of shape (?, 5) and b of shape (?, ?), and of a mask-like (?, 1, ?)
// broadcast over (?, 3, ?), against their closed forms.
TEST(ShapeOf, BroadcastGradientsWithSeveralDynamicDims) {
  Graph g;
  auto a = g.placeholder({-1, 5}, f32, "a");
  auto b = g.placeholder({-1, -1}, f32, "b");
  auto s = a + b;
  auto x = g.placeholder({-1, 3, -1}, f32, "x");
  auto m = g.placeholder({-1, 1, -1}, f32, "m");
  auto grads = gradients(sum(s * s) + sum(x * m), {b, m});
  auto exe = g.compile(default_device(), {}, {grads[0], grads[1]});
  for (auto [n, len] : {std::pair<int64_t, int64_t>{2, 4}, {3, 1}}) {
    const Array av = random_array({n, 5}, f32), bv = random_array({n, 5}, f32);
    const Array xv = random_array({n, 3, len}, f32), mv = random_array({n, 1, len}, f32);
    const auto out = exe.run({{a, av}, {b, bv}, {x, xv}, {m, mv}});
    std::vector<double> db, dm(n * len, 0.0);
    const auto va = to_f64(av), vb = to_f64(bv), vx = to_f64(xv);
    for (size_t i = 0; i < va.size(); ++i) db.push_back(2 * (va[i] + vb[i]));
    for (int64_t i = 0; i < n; ++i)
      for (int64_t r = 0; r < 3; ++r)
        for (int64_t j = 0; j < len; ++j) dm[i * len + j] += vx[(i * 3 + r) * len + j];
    expect_close(host(out[0]), {n, 5}, db, 1e-5);
    expect_close(host(out[1]), {n, 1, len}, dm, 1e-5);
  }
  // a dynamic dim that broadcasts at run time (b's 1 rows against a's 3) is not summed over: it
  // fails when that shape is specialized, before anything runs, rather than giving (3, 5)
  expect_error<ShapeError>(
      [&] {
        exe.run({{a, random_array({3, 5}, f32)},
                 {b, random_array({1, 5}, f32)},
                 {x, random_array({1, 3, 2}, f32)},
                 {m, random_array({1, 1, 2}, f32)}});
      },
      {"[reshape] cannot reshape (3, 5)"});
}

TEST(ShapeOf, ValuesFromARunsDataAreRefusedBeforeAnythingRuns) {
  Graph g;
  auto x = g.placeholder({-1, 6}, f32, "x");
  auto target = g.placeholder({2}, i64, "target");
  auto y = reshape_to(x, target);
  EXPECT_EQ(y.shape(), (Shape{-1, -1}));
  auto exe = g.compile(default_device(), {}, {y});
  expect_error<ShapeError>(
      [&] {
        exe.run({{x, random_array({2, 6}, f32)},
                 {target, Array::from_vector(std::vector<int64_t>{3, 4}, {2})}});
      },
      {"reshape (node %", "takes attribute shape from a value computed from the run's data"});
  expect_error<ShapeError>(
      [&] {
        g.compile(default_device(), {{x, {2, 6}}}, {y});
      },
      {"reshape", "computed from the run's data"});
}

TEST(ShapeOf, BuildersCheckTheirValues) {
  Graph g;
  auto x = g.placeholder({-1, 6}, f32, "x");
  expect_error<DTypeError>([&] { reshape_to(x, g.constant(random_array({2}, f32))); },
                           {"[reshape] the shape value has dtype f32"});
  expect_error<DTypeError>([&] { full(g.constant(random_array({2}, f32)), 1.0); },
                           {"[full] the shape value has dtype f32"});
  expect_error<ShapeError>(
      [&] {
        reshape_to(x, g.constant(Array::from_vector(std::vector<int64_t>{1, 2, 3, 4}, {2, 2})));
      },
      {"[reshape] the shape value must be 1-d"});
  expect_error<ShapeError>([&] { arange(int0(g, 0), shape_of(x), int0(g, 1), i64); },
                           {"[arange] the stop value must hold one element, got shape (2,)"});
  expect_error<ValueError>(
      [&] {
        slice(x, ints(g, {0}), ints(g, {1, 2}), {}, {0});
      },
      {"[slice] starts (1 values) and stops (2 values) differ in length"});
  // a value that reaches an impossible shape fails when that shape is specialized, naming it
  auto y = reshape_to(x, concat({gather(shape_of(x), ints(g, {0})), ints(g, {5})}));
  auto exe = g.compile(default_device(), {}, {y});
  expect_error<ShapeError>(
      [&] {
        exe.run({{x, random_array({2, 6}, f32)}});
      },
      {"[reshape] cannot reshape (2, 6)"});
}

// Tile and pad sized by the run's shapes (ONNX Tile and Pad on computed repeats and pads): a
// sequence padded at its end by its own length, rows repeated batch-size times.
TEST(ShapeOf, TileAndPadTakeComputedValues) {
  Graph g;
  auto x = g.placeholder({-1, -1}, f32, "x");
  auto s = shape_of(x);
  auto b = gather(s, ints(g, {0})), l = gather(s, ints(g, {1}));
  auto padded = pad(x, concat({ints(g, {1, 0, 0}), l}), PadKind::constant, 7.5);
  auto tiled = tile(x, concat({ints(g, {2}), b}));
  auto edged = pad(x, concat({ints(g, {0, 0, 1}), b}), PadKind::edge);
  EXPECT_EQ(padded.shape(), (Shape{-1, -1}));
  auto exe = g.compile(default_device(), {}, {padded, tiled, edged});
  ASSERT_TRUE(exe.is_dynamic());
  for (auto [n, len] : {std::pair<int64_t, int64_t>{2, 3}, {3, 1}, {1, 5}}) {
    const Array xv = random_array({n, len}, f32);
    const auto v = to_f64(xv);
    const auto out = exe.run({{x, xv}});
    std::vector<double> p((n + 1) * 2 * len, 7.5), t, e;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < len; ++j) p[(i + 1) * 2 * len + j] = v[i * len + j];
    for (int64_t r = 0; r < 2; ++r)
      for (int64_t i = 0; i < n; ++i)
        for (int64_t k = 0; k < n; ++k)
          for (int64_t j = 0; j < len; ++j) t.push_back(v[i * len + j]);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = -1; j < len + n; ++j)
        e.push_back(v[i * len + std::clamp<int64_t>(j, 0, len - 1)]);
    expect_equal(host(out[0]), {n + 1, 2 * len}, p);
    expect_equal(host(out[1]), {2 * n, n * len}, t);
    expect_equal(host(out[2]), {n, len + n + 1}, e);
  }
  // the tile's gradient reads the repeats (2, n) when the shapes are known: each element of x
  // is copied 2n times, so d sum(tiled^2) / dx = 4n x
  auto gexe = g.compile(default_device(), {}, {gradients(sum(tiled * tiled), {x})[0]});
  for (auto [n, len] : {std::pair<int64_t, int64_t>{2, 3}, {3, 1}}) {
    const Array xv = random_array({n, len}, f32);
    std::vector<double> want = to_f64(xv);
    for (double& w : want) w *= 4.0 * static_cast<double>(n);
    expect_close(host(gexe.run({{x, xv}})[0]), {n, len}, want, 1e-5);
  }
  expect_error<ShapeError>([&] { tile(x, ints(g, {2}) + b); },
                           {"[tile] the reps value has 1 entries; shape (?, ?) needs one per dim"});
  expect_error<ShapeError>(
      [&] {
        pad(x, concat({b, l}));
      },
      {"[pad] the pads value has 2 entries; shape (?, ?) needs 2 per dim"});
}

// Constant values are written in while building: the result is the attribute form.
TEST(ShapeOf, ConstantValuesBuildTheAttributeForm) {
  Graph g;
  auto x = g.placeholder({2, 6}, f32, "x");
  EXPECT_EQ(reshape_to(x, ints(g, {0, 3, -1}), /*zero_copies=*/true).shape(), (Shape{2, 3, 2}));
  EXPECT_EQ(expand(x, ints(g, {4, 1, 1})).shape(), (Shape{4, 2, 6}));
  EXPECT_EQ(full(ints(g, {2, 5}), 1.0).shape(), (Shape{2, 5}));
  EXPECT_EQ(arange(int0(g, 2), int0(g, 9), int0(g, 3), i64).shape(), (Shape{3}));
  EXPECT_EQ(slice(x, ints(g, {1}), ints(g, {-1}), {}, {1}).shape(), (Shape{2, 4}));
  EXPECT_EQ(tile(x, ints(g, {3, 1})).shape(), (Shape{6, 6}));
  EXPECT_EQ(pad(x, ints(g, {0, 1, 2, 0})).shape(), (Shape{3, 8}));
  expect_error<ShapeError>(
      [&] {
        expand(x, ints(g, {3, 6}));
      },
      {"[broadcast_to] shape (2, 6) does not broadcast with (3, 6)"});
}

}  // namespace
}  // namespace kiln
