// Compile and run: feed checks, passes, memory planning.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <thread>

#include "core/op_registry.h"
#include "kiln/optim.h"
#include "ops/elementwise_records.h"
#include "runtime/executable_impl.h"
#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;

TEST(Compile, FeedShapeMismatchNamesPlaceholderAndShapes) {
  Graph g;
  auto x = g.placeholder({-1, 4}, f32, "images");
  auto exe = g.compile(Device::cpu(), {{x, {2, 4}}}, {relu(x)});
  expect_error<ShapeError>([&] { exe.run({{x, random_array({3, 4}, f32)}}); },
                           {"[run]", "images", "(2, 4)", "(3, 4)"});
  expect_error<DTypeError>([&] { exe.run({{x, random_array({2, 4}, f64)}}); },
                           {"[run]", "images", "f32", "f64"});
  expect_error<ValueError>([&] { exe.run(Feeds{}); }, {"images", "no feed"});
}

TEST(Compile, DynamicPlaceholderTakesOnlyShapesThatFit) {
  Graph g;
  auto x = g.placeholder({-1, 4}, f32, "x");
  // (more in tests/runtime/test_dynamic_shapes.cpp)
  EXPECT_TRUE(g.compile(Device::cpu(), {}, {relu(x)}).is_dynamic());
  EXPECT_FALSE(g.compile(Device::cpu(), {{x, {2, 4}}}, {relu(x)}).is_dynamic());
  expect_error<ShapeError>(
      [&] {
        g.compile(Device::cpu(), {{x, {2, 5}}}, {relu(x)});
      },
      {"[compile] input 'x' dim 1 is 4 but the shape given has 5"});
  expect_error<ShapeError>(
      [&] {
        g.compile(Device::cpu(), {{x, {2, 4, 1}}}, {relu(x)});
      },
      {"'x'", "(?, 4)", "(2, 4, 1)"});
}

TEST(Compile, RunsByName) {
  Graph g;
  auto x = g.placeholder({3}, f32, "x");
  auto exe = g.compile(Device::cpu(), {}, {x * 2.0});
  Array v = random_array({3}, f32);
  auto out = exe.run(std::map<std::string, Array>{{"x", v}});
  std::vector<double> ref;
  for (double e : to_f64(v)) ref.push_back(2 * e);
  expect_close(out[0], {3}, ref);
  expect_error<ValueError>([&] { exe.run(std::map<std::string, Array>{{"y", v}}); }, {"'y'"});
}

TEST(Compile, ConstantFoldingRemovesConstantWork) {
  Graph g;
  auto x = g.placeholder({4}, f32, "x");
  Array c = random_array({4}, f32);
  auto k = exp(g.constant(c)) * 3.0;  // all constant
  auto exe = g.compile(Device::cpu(), {}, {x + k});
  EXPECT_EQ(exe.num_steps(), 1u) << exe.dump();
  Array v = random_array({4}, f32);
  auto vc = to_f64(c), vx = to_f64(v);
  std::vector<double> ref;
  for (int i = 0; i < 4; ++i) ref.push_back(vx[i] + std::exp(vc[i]) * 3);
  expect_close(exe.run({{x, v}})[0], {4}, ref, 1e-6);
  // the same without optimization runs every op
  auto plain = g.compile(Device::cpu(), {}, {x + k}, {.optimize = false});
  EXPECT_EQ(plain.num_steps(), 3u);
  expect_close(plain.run({{x, v}})[0], {4}, ref, 1e-6);
}

TEST(Compile, CommonSubexpressionsMerge) {
  Graph g;
  auto x = g.placeholder({8}, f32, "x");
  auto a = exp(x) + 1.0;
  auto b = exp(x) + 1.0;  // same again
  auto exe = g.compile(Device::cpu(), {}, {a * b}, {.fuse_elementwise = false});
  EXPECT_EQ(exe.num_steps(), 3u) << exe.dump();  // exp, add, mul
  Array v = random_array({8}, f32);
  std::vector<double> ref;
  for (double e : to_f64(v)) ref.push_back((std::exp(e) + 1) * (std::exp(e) + 1));
  expect_close(exe.run({{x, v}})[0], {8}, ref, 1e-5);
}

TEST(Compile, DeadCodeIsNotRun) {
  Graph g;
  auto x = g.placeholder({8}, f32, "x");
  auto unused = exp(exp(x));
  (void)unused;
  auto exe = g.compile(Device::cpu(), {}, {relu(x)});
  EXPECT_EQ(exe.num_steps(), 1u);
}

TEST(Compile, OutputsThatArePlaceholdersOrRepeated) {
  Graph g;
  auto x = g.placeholder({5}, f32, "x");
  auto y = relu(x);
  auto exe = g.compile(Device::cpu(), {}, {y, x, y});
  Array v = random_array({5}, f32);
  auto out = exe.run({{x, v}});
  ASSERT_EQ(out.size(), 3u);
  expect_equal(out[1], {5}, to_f64(v));
  expect_equal(out[2], {5}, to_f64(out[0]));
}

// A chain of 50 elementwise ops on 1M floats needs at most 3 buffers of intermediates.
TEST(MemoryPlan, ElementwiseChainReusesBuffers) {
  const int64_t n = 1 << 20;
  Graph g;
  auto x = g.placeholder({n}, f32, "x");
  Tensor y = x;
  for (int i = 0; i < 50; ++i) y = (i % 3 == 0) ? relu(y) : (i % 3 == 1) ? y * 0.5 : y + 1.0;
  // unfused, so there are intermediates to plan (fused, the chain is one node)
  auto planned = g.compile(Device::cpu(), {}, {y}, {.fuse_elementwise = false});
  auto unplanned =
      g.compile(Device::cpu(), {}, {y}, {.plan_memory = false, .fuse_elementwise = false});
  const size_t buf = n * sizeof(float);
  EXPECT_LE(planned.peak_intermediate_bytes(), 3 * buf) << planned.dump();
  EXPECT_GE(unplanned.peak_intermediate_bytes(), 40 * buf);
  Array v = random_array({n}, f32, -4, 4);
  auto a = planned.run({{x, v}})[0];
  auto b = unplanned.run({{x, v}})[0];
  auto va = to_f64(a);
  expect_equal(b, {n}, va);
  // and a reference for a few elements
  auto vx = to_f64(v);
  for (int64_t i = 0; i < n; i += 4099) {
    float r = static_cast<float>(vx[i]);
    for (int k = 0; k < 50; ++k)
      r = (k % 3 == 0) ? std::max(r, 0.0f) : (k % 3 == 1) ? r * 0.5f : r + 1.0f;
    EXPECT_EQ(static_cast<float>(va[i]), r) << i;
  }
}

TEST(MemoryPlan, InPlaceNeverOverwritesALiveValue) {
  Graph g;
  auto x = g.placeholder({1000}, f32, "x");
  auto a = exp(x);
  auto b = relu(a);  // a is still read below, so relu must not write over it
  auto c = a + b;
  auto exe = g.compile(Device::cpu(), {}, {c});
  Array v = random_array({1000}, f32, -2, 2);
  std::vector<double> ref;
  for (double e : to_f64(v)) ref.push_back(std::exp(e) + std::max(std::exp(e), 0.0));
  expect_close(exe.run({{x, v}})[0], {1000}, ref, 1e-6);
}

// Nodes (not views, not sources) whose output the plan puts in a variable's storage.
int updates_in_variables(const Executable& e) {
  const auto& nodes = e.impl().program.graph.nodes;
  int n = 0;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const auto& s = e.impl().plan.slots[i];
    n += !s.empty() && s[0].where == ValueSlot::Where::constant &&
         nodes[i].op != OpId::Variable && nodes[i].op != OpId::Constant &&
         nodes[i].op != OpId::Assign && !op_def(nodes[i].op).alias_input0;
  }
  return n;
}

// SGD with momentum on a linear layer: the updates of the weights, the bias and both momentum
// buffers are made in the variables' storage (their assigns copy nothing), and three steps give
// the bits of the plan that keeps them apart (in_place off: every update copied by its assign).
TEST(MemoryPlan, UpdatesWriteIntoTheirVariable) {
  const Array w0 = random_array({8, 16}, f32), b0 = random_array({8}, f32);
  const Array xs = random_array({4, 16}, f32), ys = random_array({4, 8}, f32);
  std::vector<std::vector<double>> got;
  for (bool in_place : {true, false}) {
    Graph g;
    auto x = g.placeholder({4, 16}, f32, "x");
    auto y = g.placeholder({4, 8}, f32, "y");
    auto w = g.variable(w0, "w");
    auto b = g.variable(b0, "b");
    auto d = linear(x, w, b) - y;
    auto loss = sum(d * d);
    auto step = optim::sgd(g, {w, b}, gradients(loss, {w, b}), {.lr = 0.01, .momentum = 0.9});
    Executable e = g.compile(Device::cpu(), {}, {loss}, step, {.in_place = in_place});
    if (in_place)
      EXPECT_EQ(updates_in_variables(e), 4) << e.dump();
    else
      EXPECT_EQ(updates_in_variables(e), 0);
    for (int i = 0; i < 3; ++i) e.run({{x, xs}, {y, ys}});
    got.push_back(to_f64(g.read_variable(w)));
    const auto bv = to_f64(g.read_variable(b));
    got.back().insert(got.back().end(), bv.begin(), bv.end());
  }
  EXPECT_EQ(got[0], got[1]);
  EXPECT_NE(got[0], std::vector<double>(got[0].size(), 0.0));
}

// A node that reads the variable's old value after its next value is made: the next value keeps
// its own buffer, and the reader sees the old value.
TEST(MemoryPlan, UpdateStaysApartWhileTheOldValueIsRead) {
  Graph g;
  const Array w0 = random_array({64}, f32);
  auto w = g.variable(w0, "w");
  auto next = w * 2.0;
  auto old_plus = w + 1.0;  // after `next` in the graph's order
  auto a = assign(w, next);
  Executable e = g.compile(Device::cpu(), {}, {old_plus}, {a}, {.fuse_elementwise = false});
  EXPECT_EQ(updates_in_variables(e), 0) << e.dump();
  const Array r = e.run(Feeds{})[0];
  std::vector<double> want, want_w;
  for (double v : to_f64(w0)) {
    want.push_back(static_cast<float>(v) + 1.0f);
    want_w.push_back(static_cast<float>(v) * 2.0f);
  }
  expect_equal(r, {64}, want);
  expect_equal(g.read_variable(w), {64}, want_w);
}

TEST(MemoryPlan, ConcurrentRunsUseSeparateArenas) {
  Graph g;
  auto x = g.placeholder({4096}, f32, "x");
  Tensor y = x;
  for (int i = 0; i < 10; ++i) y = exp(y * 0.1);
  auto exe = g.compile(Device::cpu(), {}, {y});
  Array v = random_array({4096}, f32);
  auto want = to_f64(exe.run({{x, v}})[0]);
  std::vector<std::thread> ts;
  std::atomic<int> bad{0};
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&] {
      for (int k = 0; k < 20; ++k)
        if (to_f64(exe.run({{x, v}})[0]) != want) bad++;
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(bad.load(), 0);
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {
using namespace kiln::test;

// Ops that declare a params struct are decoded once per executable (after every pass, for compile
// and load alike) and checked when built; their kernels then compute from the decoded values.
TEST(Compile, OpParamsAreDecodedOnceForTheKernelsAndCheckedWhenBuilt) {
  Graph g;
  auto x = g.placeholder({257}, f32, "x");
  const double alpha = 0.01 + 0.3 * to_f64(random_array({1}, f64, 0, 1))[0];
  const Tensor y = clip(leaky_relu(x, alpha), -0.5, 0.75);
  CompileOptions o;
  o.fuse_elementwise = false;  // (each op its own kernel, with its own node)
  const Executable exe = g.compile(Device::cpu(), {}, {y}, o);
  int decoded = 0;
  for (const auto& n : exe.impl().program.graph.nodes) {
    if (n.op == OpId::LeakyRelu) {
      ASSERT_TRUE(n.params);
      EXPECT_EQ(static_cast<const math::RecordParams&>(*n.params).a0, alpha);
      ++decoded;
    } else if (n.op == OpId::Clip) {
      ASSERT_TRUE(n.params);
      const auto& p = static_cast<const math::ClipParams&>(*n.params);
      EXPECT_EQ(p.lo, -0.5);
      EXPECT_EQ(p.hi, 0.75);
      ++decoded;
    } else if (n.op == OpId::Placeholder) {
      EXPECT_FALSE(n.params);  // (an op without a params struct)
    }
  }
  EXPECT_EQ(decoded, 2) << exe.dump();
  const Array v = random_array({257}, f32, -3, 3);
  std::vector<double> ref;
  for (double e : to_f64(v)) ref.push_back(std::clamp(e > 0 ? e : alpha * e, -0.5, 0.75));
  expect_close(exe.run({{x, v}})[0], {257}, ref, 1e-6);
  // the builder's node without its attribute, or with bounds the kernels cannot take
  expect_error<ValueError>([&] { detail::make_node1(OpId::LeakyRelu, {x}, Attrs{}); }, {"alpha"});
  Attrs crossed;
  crossed.set("min", 2.0);
  crossed.set("max", 1.0);
  expect_error<ValueError>([&] { detail::make_node1(OpId::Clip, {x}, crossed); },
                           {"[clip]", "min <= max"});
}

}  // namespace
}  // namespace kiln
