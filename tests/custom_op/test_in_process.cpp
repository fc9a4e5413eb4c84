// Custom ops registered from the program itself (no library): purity (CSE merges pure nodes,
// never impure ones), the Stream a CPU kernel gets, and errors. Part of kiln_op_tests, whose
// coverage test wants the suites Custom and CustomImpure.
#include <omp.h>

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

// The OpenMP thread count a kernel sees is its executable's: oneDNN's primitives take their
// threads from it. Each calling thread keeps its own count, and gets it back after the run.
thread_local int t_seen_threads = 0;

void record_threads(KernelContext& c, Stream&) {
  t_seen_threads = omp_get_max_threads();
  std::copy_n(c.in(0).ptr<float>(), c.in(0).numel(), c.out(0).ptr<float>());
}

int threads_seen_by_a_run(int threads) {
  if (!is_custom_op_registered("inproc.threads")) {
    CustomOpDef d;
    d.name = "inproc.threads";
    d.inputs = {{"x"}};
    d.outputs = {{"y"}};
    d.pure = false;
    register_custom_op(d);
    register_custom_kernel("inproc.threads", Backend::cpu, record_threads);
  }
  Graph g;
  Tensor x = g.placeholder({8}, f32, "x");
  CompileOptions opts;
  opts.num_threads = threads;
  auto exe = g.compile(Device::cpu(), {}, {custom_op1("inproc.threads", {x})}, opts);
  const Array xa = test::random_array({8}, f32);
  t_seen_threads = 0;
  const Array y = exe.run({{x, xa}})[0];
  test::expect_close(y, {8}, test::to_f64(xa), 0, 0);
  return t_seen_threads;
}

TEST(Custom, KernelsSeeTheirExecutablesThreadCount) {
  const int before = omp_get_max_threads();
  for (int threads : {1, 3, 7}) {
    EXPECT_EQ(threads_seen_by_a_run(threads), threads);
    EXPECT_EQ(omp_get_max_threads(), before);
  }
  // two threads at once, each with its own count on every run
  auto runs = [](int threads, int& wrong) {
    for (int i = 0; i < 20; ++i) wrong += threads_seen_by_a_run(threads) != threads;
  };
  int wrong_a = 0, wrong_b = 0;
  std::thread a(runs, 2, std::ref(wrong_a)), b(runs, 5, std::ref(wrong_b));
  a.join();
  b.join();
  EXPECT_EQ(wrong_a, 0);
  EXPECT_EQ(wrong_b, 0);
}

}  // namespace
}  // namespace kiln
