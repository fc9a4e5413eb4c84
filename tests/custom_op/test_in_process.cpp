// Custom ops registered from the program itself (no library): purity (CSE merges pure nodes,
// never impure ones), the Stream a CPU kernel gets, and errors. Part of kiln_op_tests, whose
// coverage test wants the suites Custom and CustomImpure.
#include <atomic>
#include <set>
#include <thread>

#include "kiln/custom_op.h"
#include "support/reference.h"

namespace kiln {
namespace {

std::atomic<int> g_calls{0};

void plus_one(KernelContext& c, Stream& s) {
  g_calls++;
  EXPECT_EQ(s.native_handle(), nullptr);
  EXPECT_EQ(s.backend(), Backend::cpu);
  const float* x = c.in(0).ptr<float>();
  float* y = c.out(0).ptr<float>();
  const float add = static_cast<float>(c.attrs().f("add"));
  // encode from several threads through the serial dispatch
  std::vector<int64_t> order;
  c.parallel_for(c.in(0).numel(), 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) y[i] = x[i] + add;
    s.dispatch([&] { order.push_back(b); });
  });
  s.commit();
  s.commit_and_wait();
  EXPECT_FALSE(order.empty());
}

void register_once(const std::string& name, bool pure) {
  if (is_custom_op_registered(name)) return;
  CustomOpDef d;
  d.name = name;
  d.inputs = {{"x"}};
  d.outputs = {{"y"}};
  d.attrs = {{"add", 1.0}};
  d.pure = pure;
  register_custom_op(d);
  register_custom_kernel(name, Backend::cpu, plus_one);
}

// Two identical nodes: a pure op runs once (CSE merged them), an impure op twice.
int calls_for_two_nodes(const std::string& name) {
  Graph g;
  Tensor x = g.placeholder({100}, f32, "x");
  Tensor a = custom_op1(name, {x}, {{"add", 0.5}}), b = custom_op1(name, {x}, {{"add", 0.5}});
  auto exe = g.compile(Device::cpu(), {}, {a + b});
  const Array xa = test::random_array({100}, f32);
  g_calls = 0;
  auto got = exe.run({{x, xa}});
  std::vector<double> want;
  for (double v : test::to_f64(xa)) want.push_back(2 * (v + 0.5));
  test::expect_close(got[0], {100}, want, 1e-6, 1e-6);
  return g_calls.load();
}

TEST(Custom, PureNodesMerge) {
  register_once("inproc.plus", true);
  EXPECT_EQ(calls_for_two_nodes("inproc.plus"), 1);
  Graph g;
  Tensor x = g.placeholder({3}, f32, "x");
  EXPECT_EQ(custom_op1("inproc.plus", {x}).op_name(), "custom");
}

TEST(Custom, NotDifferentiableWithoutBuilder) {
  register_once("inproc.plus", true);
  Graph g;
  Tensor x = g.placeholder({3}, f32, "x");
  Tensor y = sum(custom_op1("inproc.plus", {x}));
  test::expect_error<UnsupportedError>([&] { gradients(y, {x}); },
                                       {"[inproc.plus]", "not differentiable"});
}

TEST(Custom, MalformedDefinitionsAreRefused) {
  CustomOpDef d;
  d.name = "bad name";
  d.inputs = {{"x"}};
  d.outputs = {{"y"}};
  test::expect_error<ValueError>([&] { register_custom_op(d); }, {"bad name"});
  d.name = "inproc.bad";
  d.attrs = {{"custom_op", 1.0}};
  test::expect_error<ValueError>([&] { register_custom_op(d); }, {"custom_"});
  d.attrs = {};
  d.outputs = {{"y", f32, 3}};
  test::expect_error<ValueError>([&] { register_custom_op(d); }, {"input 3"});
  test::expect_error<ValueError>(
      [&] { register_custom_kernel("inproc.never", Backend::cpu, plus_one); },
      {"inproc.never", "not registered"});
  EXPECT_FALSE(unregister_custom_op("inproc.never"));
}

TEST(CustomImpure, NodesNeverMerge) {
  register_once("inproc.plus_impure", false);
  EXPECT_EQ(calls_for_two_nodes("inproc.plus_impure"), 2);
  Graph g;
  Tensor x = g.placeholder({3}, f32, "x");
  EXPECT_EQ(custom_op1("inproc.plus_impure", {x}).op_name(), "custom_impure");
  const auto names = custom_op_names();
  EXPECT_TRUE(std::set<std::string>(names.begin(), names.end()).count("inproc.plus_impure"));
}

}  // namespace
}  // namespace kiln
