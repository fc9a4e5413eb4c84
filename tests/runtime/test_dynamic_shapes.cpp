// Dynamic executables: placeholders whose dims stay dynamic at compile time, named dims and
// ranges, the checks a feed passes before anything runs, and the specialization cache.
#include <cmath>

#include "kiln/optim.h"
#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;

Array host(const Array& a) { return a.to(Device::cpu()); }

// relu(x w + b) in float64.
std::vector<double> ref_dense(const Array& x, const Array& w, const Array& b) {
  const auto vx = to_f64(x), vw = to_f64(w), vb = to_f64(b);
  const int64_t n = x.shape()[0], k = x.shape()[1], m = w.shape()[1];
  std::vector<double> r(n * m);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < m; ++j) {
      double s = vb[j];
      for (int64_t q = 0; q < k; ++q) s += vx[i * k + q] * vw[q * m + j];
      r[i * m + j] = std::max(s, 0.0);
    }
  return r;
}

TEST(DynamicShapes, OneExecutableRunsEveryBatchSize) {
  Graph g;
  auto x = g.placeholder({-1, 24}, f32, "x");
  Array w = random_array({24, 10}, f32), b = random_array({10}, f32);
  auto y = relu(matmul(x, g.constant(w)) + g.constant(b));
  auto exe = g.compile(default_device(), {}, {y});
  EXPECT_TRUE(exe.is_dynamic());
  EXPECT_EQ(exe.inputs()[0].shape, (Shape{-1, 24}));
  EXPECT_EQ(exe.outputs()[0].shape, (Shape{-1, 10}));
  EXPECT_EQ(exe.num_steps(), 0u);  // nothing specialized yet
  for (int64_t n : {1, 7, 32, 7, 1, 3}) {
    Array v = random_array({n, 24}, f32);
    expect_close(host(exe.run({{x, v}})[0]), {n, 10}, ref_dense(v, w, b), 1e-4);
  }
  const auto c = exe.shape_cache();
  EXPECT_EQ(c.misses, 4);  // 1, 7, 32, 3
  EXPECT_EQ(c.hits, 2);
  EXPECT_EQ(c.entries, 4u);
  EXPECT_EQ(c.evictions, 0);
  EXPECT_GT(exe.num_steps(), 0u);
  EXPECT_NE(exe.report().find("4 misses"), std::string::npos) << exe.report();
  // the same by name
  Array v = random_array({5, 24}, f32);
  expect_close(host(exe.run(std::map<std::string, Array>{{"x", v}})[0]), {5, 10},
               ref_dense(v, w, b), 1e-4);
  // (packages: tests/package/test_dynamic_package.cpp)
}

// A convolution over dynamic batch and image size: output sizes follow each feed, and every
// specialization computes what an executable compiled for that shape computes.
TEST(DynamicShapes, ConvolutionMatchesFixedShapeExecutables) {
  Graph g;
  auto x = g.placeholder({-1, 3, -1, -1}, f32, "images");
  Array w = random_array({8, 3, 3, 3}, f32), b = random_array({8}, f32);
  auto y = relu(conv2d(x, g.constant(w), g.constant(b), {.stride = {2, 2}, .padding = {1, 1}}));
  auto dynamic = g.compile(default_device(), {}, {y});
  for (Shape s : {Shape{2, 3, 17, 9}, Shape{1, 3, 8, 8}, Shape{3, 3, 5, 12}}) {
    Array v = random_array(s, f32);
    auto fixed = g.compile(default_device(), {{x, s}}, {y});
    EXPECT_FALSE(fixed.is_dynamic());
    const Array want = host(fixed.run({{x, v}})[0]);
    const Array got = host(dynamic.run({{x, v}})[0]);
    const Shape out{s[0], 8, (s[2] + 1) / 2, (s[3] + 1) / 2};
    ASSERT_EQ(got.shape(), out);
    expect_equal(got, out, to_f64(want));
  }
}

// "Same" padding with a stride over dynamic spatial dims: its pads depend on each size, and are
// resolved when shapes are specialized; each shape computes what a graph built for it computes.
TEST(DynamicShapes, SamePaddingResolvesPerShape) {
  const Array w = random_array({4, 3, 3, 3}, f32);
  for (PadMode mode : {PadMode::same_upper, PadMode::same_lower}) {
    const ConvOptions o{.stride = {2, 2}, .pad_mode = mode};
    Graph g;
    auto x = g.placeholder({-1, 3, -1, -1}, f32, "images");
    auto exe = g.compile(default_device(), {}, {relu(conv2d(x, g.constant(w), std::nullopt, o))});
    for (Shape s : {Shape{2, 3, 9, 8}, Shape{1, 3, 6, 11}, Shape{1, 3, 1, 2}}) {
      Graph r;  // the same conv built for this shape: its pads resolved when built
      auto xr = r.placeholder(s, f32, "images");
      auto yr = relu(conv2d(xr, r.constant(w), std::nullopt, o));
      const Array v = random_array(s, f32);
      const Array want = host(r.compile(default_device(), {}, {yr}).run({{xr, v}})[0]);
      const Array got = host(exe.run({{x, v}})[0]);
      const Shape out{s[0], 4, (s[2] + 1) / 2, (s[3] + 1) / 2};
      ASSERT_EQ(got.shape(), out);
      expect_close(got, out, to_f64(want), 1e-5);
    }
    EXPECT_TRUE(exe.shape_cache().symbolic) << exe.shape_cache().not_symbolic;
  }
  // (its gradient: DynamicGradients.SamePaddingAndSecondOrderPoolingOverDynamicSpatialDims)
}

TEST(DynamicShapes, NamedDimsMustAgree) {
  Graph g;
  auto a = g.placeholder({-1, -1, 4}, f32, "tokens", {{0, "batch"}, {1, "seq"}});
  auto m = g.placeholder({-1, -1}, f32, "mask", {{0, "batch"}, {1, "seq"}});
  auto y = a * expand_dims(m, {-1});
  auto exe = g.compile(default_device(), {}, {y});
  Array va = random_array({2, 6, 4}, f32), vm = random_array({2, 6}, f32);
  const auto xa = to_f64(va), xm = to_f64(vm);
  std::vector<double> ref(48);
  for (int i = 0; i < 48; ++i) ref[i] = xa[i] * xm[i / 4];
  expect_close(host(exe.run({{a, va}, {m, vm}})[0]), {2, 6, 4}, ref, 1e-6);
  expect_error<ShapeError>(
      [&] {
        exe.run({{a, va}, {m, random_array({2, 5}, f32)}});
      },
      {"[run] input 'mask' dim 1 is 'seq' = 6 (from 'tokens') but the feed has 5"});
  EXPECT_EQ(exe.shape_cache().misses, 1);  // refused before any specialization
  // a name fixed by a feed shape at compile time is fixed in every placeholder sharing it
  auto fixed = g.compile(default_device(), {{a, {2, 6, 4}}}, {y});
  EXPECT_FALSE(fixed.is_dynamic());
  EXPECT_EQ(fixed.inputs()[1].shape, (Shape{2, 6}));
  expect_error<ShapeError>(
      [&] {
        g.compile(default_device(), {{a, {2, 6, 4}}, {m, {2, 7}}}, {y});
      },
      {"[compile] input 'mask' dim 1 is 'seq' = 6 (from 'tokens')", "7"});
}

TEST(DynamicShapes, RangesBoundFeedsAndCompileShapes) {
  Graph g;
  auto x = g.placeholder({-1, -1}, f32, "ids", {{0, "batch", 1, 4}, {-1, "", 2, -1}});
  auto exe = g.compile(default_device(), {}, {x * 2.0});
  EXPECT_EQ(g.dim_specs(x).size(), 2u);
  EXPECT_EQ(g.dim_specs(x)[0].name, "batch");
  EXPECT_EQ(g.dim_specs(x)[1].min, 2);
  Array v = random_array({4, 2}, f32);
  std::vector<double> ref;
  for (double e : to_f64(v)) ref.push_back(2 * e);
  expect_close(host(exe.run({{x, v}})[0]), {4, 2}, ref, 1e-6);
  expect_error<ShapeError>(
      [&] {
        exe.run({{x, random_array({5, 2}, f32)}});
      },
      {"[run] input 'ids' dim 0 ('batch') must be in [1, 4] but the feed has 5"});
  expect_error<ShapeError>(
      [&] {
        exe.run({{x, random_array({0, 3}, f32)}});
      },
      {"dim 0 ('batch') must be in [1, 4]", "has 0"});
  expect_error<ShapeError>(
      [&] {
        exe.run({{x, random_array({2, 1}, f32)}});
      },
      {"[run] input 'ids' dim 1 must be at least 2 but the feed has 1"});
  expect_error<ShapeError>(
      [&] {
        g.compile(default_device(), {{x, {9, 3}}}, {x * 2.0});
      },
      {"[compile] input 'ids' dim 0 ('batch') must be in [1, 4]", "9"});
  expect_error<ShapeError>(
      [&] {
        exe.run({{x, random_array({2, 3, 1}, f32)}});
      },
      {"'ids'", "(?, ?)", "(2, 3, 1)"});
  expect_error<DTypeError>([&] { exe.run({{x, random_array({2, 3}, f64)}}); }, {"'ids'", "f64"});
  expect_error<ValueError>([&] { exe.run(Feeds{}); }, {"'ids'", "no feed"});
}

TEST(DynamicShapes, DimSpecsAreChecked) {
  Graph g;
  expect_error<ShapeError>(
      [&] {
        g.placeholder({-1, 4}, f32, "a", {{1, "x"}});
      },
      {"'a'", "dim 1 is fixed at 4"});
  expect_error<ShapeError>(
      [&] {
        g.placeholder({-1, 4}, f32, "b", {{2, "x"}});
      },
      {"'b'", "axis 2"});
  expect_error<ShapeError>(
      [&] {
        g.placeholder({-1}, f32, "c", {{0, "x", 5, 2}});
      },
      {"'c'", "[5, 2]"});
  expect_error<ShapeError>(
      [&] {
        g.placeholder({-1}, f32, "d", {{0, "x"}, {-1, "y"}});
      },
      {"'d'", "two specs for dim 0"});
}

// An op whose shapes do not fit a feed fails when the feed's specialization is compiled, before
// anything runs; variables keep their values.
TEST(DynamicShapes, AFeedAnOpCannotTakeRunsNothing) {
  Graph g;
  auto x = g.placeholder({-1, -1}, f32, "x");
  auto v = g.variable(random_array({3}, f32), "v");
  auto w = g.constant(random_array({4, 3}, f32));
  auto y = matmul(x, w);
  auto step = assign(v, v + 1.0);
  auto exe = g.compile(default_device(), {}, {y}, Updates{step});
  const Array before = g.read_variable(v);
  expect_error<ShapeError>([&] { exe.run({{x, random_array({2, 5}, f32)}}); }, {"[matmul]"});
  expect_equal(g.read_variable(v), {3}, to_f64(before));
  exe.run({{x, random_array({2, 4}, f32)}});
  std::vector<double> plus;
  for (double e : to_f64(before)) plus.push_back(static_cast<float>(e + 1));
  expect_close(g.read_variable(v), {3}, plus, 1e-6);
}

TEST(DynamicShapes, CacheKeepsTheMostRecentlyUsedWithinItsBounds) {
  Graph g;
  auto x = g.placeholder({-1, 8}, f32, "x");
  auto y = exp(x) * 2.0 + 1.0;
  CompileOptions o;
  o.max_specializations = 2;
  auto exe = g.compile(default_device(), {}, {y}, o);
  auto run = [&](int64_t n) {
    Array v = random_array({n, 8}, f32);
    std::vector<double> ref;
    for (double e : to_f64(v)) ref.push_back(std::exp(e) * 2 + 1);
    expect_close(host(exe.run({{x, v}})[0]), {n, 8}, ref, 1e-5);
  };
  run(1);
  run(2);
  run(1);  // hit: 1 is now the most recent
  run(3);  // evicts 2
  auto c = exe.shape_cache();
  EXPECT_EQ(c.entries, 2u);
  EXPECT_EQ(c.evictions, 1);
  EXPECT_EQ(c.hits, 1);
  run(1);  // still held
  run(2);  // compiled again
  c = exe.shape_cache();
  EXPECT_EQ(c.hits, 2);
  EXPECT_EQ(c.misses, 4);
  EXPECT_EQ(c.max_entries, 2u);
  // a bound of bytes smaller than one specialization keeps only the one running
  CompileOptions tight;
  tight.max_specialization_bytes = 1;
  tight.fuse_elementwise = false;  // (intermediates, so that each specialization has an arena)
  auto small = g.compile(default_device(), {}, {y}, tight);
  for (int64_t n : {4, 5, 6}) small.run({{x, random_array({n, 8}, f32)}});
  c = small.shape_cache();
  EXPECT_EQ(c.entries, 1u);
  EXPECT_EQ(c.evictions, 2);
  EXPECT_GT(c.bytes, 0u);
}

// On the CPU every specialization takes its arena from one pool: a new shape reuses the arena a
// larger one made (no fresh memory, no page faults), and the cache holds that arena once.
TEST(DynamicShapes, CpuSpecializationsShareTheirArenas) {
  Graph g;
  auto x = g.placeholder({-1, 32}, f32, "x");
  auto y = sum(exp(x) * 2.0 + 1.0, {1});
  CompileOptions o;
  o.fuse_elementwise = false;  // intermediates: an arena per shape
  auto exe = g.compile(Device::cpu(), {}, {y}, o);
  auto run = [&](int64_t n) {
    Array v = random_array({n, 32}, f32);
    std::vector<double> ref(n, 0.0);
    const auto in = to_f64(v);
    for (int64_t i = 0; i < n * 32; ++i) ref[i / 32] += std::exp(in[i]) * 2 + 1;
    expect_close(exe.run({{x, v}})[0], {n}, ref, 1e-5);
  };
  run(4096);
  const size_t one = exe.shape_cache().bytes;
  EXPECT_GE(one, 4096 * 32 * sizeof(float)) << exe.report();
  for (int64_t n : {1, 100, 4095, 7, 100}) run(n);
  auto c = exe.shape_cache();
  EXPECT_EQ(c.entries, 5u);
  EXPECT_EQ(c.bytes, one) << exe.report();
  run(8192);  // a larger shape: a larger arena replaces the one held
  c = exe.shape_cache();
  EXPECT_GE(c.bytes, 8192 * 32 * sizeof(float));
  EXPECT_LT(c.bytes, 8192 * 32 * sizeof(float) + one) << exe.report();
}

// Folded constants (an autocast weight, say) are made once per specialization but held once.
TEST(DynamicShapes, SpecializationsShareTheirConstants) {
  Graph g;
  auto x = g.placeholder({-1, 64}, f32, "x");
  Array w = random_array({64, 64}, f32);
  auto y = matmul(x, exp(g.constant(w)));  // exp(w) folds into a constant of 16 KiB
  auto exe = g.compile(default_device(), {}, {y});
  for (int64_t n : {1, 2, 3, 4}) exe.run({{x, random_array({n, 64}, f32)}});
  const auto c = exe.shape_cache();
  EXPECT_EQ(c.entries, 4u);
  // four arenas of at most a few rows, and one copy of the folded weight
  EXPECT_LT(c.bytes, 2 * 64 * 64 * sizeof(float)) << exe.report();
  EXPECT_GE(c.bytes, 64 * 64 * sizeof(float)) << exe.report();
}

TEST(DynamicShapes, RunsAsynchronouslyOnAQueue) {
  Graph g;
  auto x = g.placeholder({-1}, f32, "x");
  auto exe = g.compile(default_device(), {}, {sqrt(abs(x))});
  Queue q(default_device());
  Array a = random_array({100}, f32), b = random_array({37}, f32);
  auto fa = exe.run_async(q, {{x, a}});
  auto fb = exe.run_async(q, {{x, b}});
  for (auto [f, v] : {std::pair{&fa, &a}, std::pair{&fb, &b}}) {
    std::vector<double> ref;
    for (double e : to_f64(*v)) ref.push_back(std::sqrt(std::abs(e)));
    expect_close(host(f->get()[0]), v->shape(), ref, 1e-6);
  }
}

// A small classifier-regressor trained with SGD: the gradient rules of the mean over the batch
// (mean, mse, cross entropy, broadcasts back) with the batch dim dynamic or static.
struct TrainNet {
  Graph g;
  Tensor x, y, labels, loss;
  std::vector<Tensor> vars, updates;
  TrainNet(int64_t batch, const std::vector<Array>& init) {
    x = g.placeholder({batch, 6}, f32, "x");
    y = g.placeholder({batch, 3}, f32, "y");
    labels = g.placeholder({batch}, i64, "labels");
    for (size_t i = 0; i < init.size(); ++i)
      vars.push_back(g.variable(init[i], "v" + std::to_string(i)));
    auto h = relu(matmul(x, vars[0]) + vars[1]);
    auto out = matmul(h, vars[2]);
    loss = mean((out - y) * (out - y)) + mse(out, y) + softmax_cross_entropy(out, labels) +
           mean(sum(h, {1}));
    updates = optim::sgd(g, vars, gradients(loss, vars), {.lr = 0.05});
  }
};

TEST(DynamicShapes, TrainingWithTwoBatchSizesMatchesFixedShapeExecutables) {
  const std::vector<Array> init = {random_array({6, 8}, f32), random_array({8}, f32),
                                   random_array({8, 3}, f32)};
  TrainNet dyn(-1, init), small(3, init), large(5, init);
  auto exe = dyn.g.compile(default_device(), {}, {dyn.loss}, dyn.updates);
  ASSERT_TRUE(exe.is_dynamic());
  auto exe3 = small.g.compile(default_device(), {}, {small.loss}, small.updates);
  auto exe5 = large.g.compile(default_device(), {}, {large.loss}, large.updates);
  for (int64_t n : {3, 5, 5, 3, 5}) {
    const Array x = random_array({n, 6}, f32), y = random_array({n, 3}, f32);
    const Array l = random_ints({n}, 0, 2);  // (hi included)
    TrainNet& fixed = n == 3 ? small : large;
    Executable& fexe = n == 3 ? exe3 : exe5;
    const Array got = host(exe.run({{dyn.x, x}, {dyn.y, y}, {dyn.labels, l}})[0]);
    const Array want = host(fexe.run({{fixed.x, x}, {fixed.y, y}, {fixed.labels, l}})[0]);
    expect_close(got, {}, to_f64(want), 1e-5);
    // the fixed nets take turns: the other one continues from these weights
    TrainNet& other = n == 3 ? large : small;
    for (size_t i = 0; i < init.size(); ++i) {
      const Array d = dyn.g.read_variable(dyn.vars[i]), f = fixed.g.read_variable(fixed.vars[i]);
      expect_close(d, f.shape(), to_f64(f), 1e-5);
      other.g.write_variable(other.vars[i], f);
    }
  }
  EXPECT_EQ(exe.shape_cache().misses, 2);
  EXPECT_EQ(exe.shape_cache().hits, 3);
}

// Gradient rules across the families a convolutional and an attention model use (conv, training
// batch norm, pooling, flatten, slice, concat, layer norm, attention, cross entropy), with the
// batch and sequence dims dynamic against the same graph built for each shape.
struct GradNet {
  Graph g;
  Tensor x, tokens, labels;
  std::vector<Tensor> vars, grads;
  GradNet(int64_t batch, int64_t seq, const std::vector<Array>& init) {
    x = g.placeholder({batch, 3, 8, 8}, f32, "x");
    tokens = g.placeholder({batch, seq, 4}, f32, "tokens");
    labels = g.placeholder({batch}, i64, "labels");
    for (size_t i = 0; i < init.size(); ++i)
      vars.push_back(g.variable(init[i], "v" + std::to_string(i)));
    auto h = conv2d(x, vars[0], vars[1], {.padding = {1, 1}});
    h = relu(batch_norm_train(h, vars[2]).y);
    h = avg_pool(max_pool(h, {.kernel = {2, 2}}), {.kernel = {2, 2}});  // (N, 4, 2, 2)
    auto flat = reshape(h, {-1, 16});
    auto t = layer_norm(tokens);
    auto q = expand_dims(t, {1});                                             // (N, 1, L, 4)
    auto a = mean(squeeze(scaled_dot_product_attention(q, q, q), {1}), {1});  // (N, 4)
    auto feats = concat({slice(flat, {0}, {12}, {}, {1}), a}, 1);             // (N, 16)
    auto logits = matmul(feats, vars[3]);
    auto loss = softmax_cross_entropy(logits, labels) + mean(flat * flat);
    grads = gradients(loss, vars);
  }
};

TEST(DynamicShapes, GradientsMatchGraphsBuiltForEachShape) {
  const std::vector<Array> init = {random_array({4, 3, 3, 3}, f32), random_array({4}, f32),
                                   random_array({4}, f32), random_array({16, 5}, f32)};
  GradNet dyn(-1, -1, init);
  auto exe = dyn.g.compile(default_device(), {}, dyn.grads);
  for (auto [n, l] : {std::pair<int64_t, int64_t>{2, 3}, {3, 5}, {2, 3}}) {
    GradNet fixed(n, l, init);
    auto fexe = fixed.g.compile(default_device(), {}, fixed.grads);
    const Array x = random_array({n, 3, 8, 8}, f32), t = random_array({n, l, 4}, f32);
    const Array y = random_ints({n}, 0, 4);
    const auto got = exe.run({{dyn.x, x}, {dyn.tokens, t}, {dyn.labels, y}});
    const auto want = fexe.run({{fixed.x, x}, {fixed.tokens, t}, {fixed.labels, y}});
    for (size_t i = 0; i < want.size(); ++i) {
      const Array w = host(want[i]);
      expect_close(host(got[i]), w.shape(), to_f64(w), 1e-5);
    }
  }
  EXPECT_EQ(exe.shape_cache().hits, 1);
}

}  // namespace
}  // namespace kiln
