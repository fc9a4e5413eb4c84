// Custom ops from an op library built by the test suite (ops_lib.cpp), loaded at run time:
// results against float64 loops, gradients against finite differences, ABI and name errors,
// packages, and the CUDA kernels on a GPU (skipped without one).
#include <cmath>
#include <filesystem>

#include "kiln/custom_op.h"
#include "support/gradcheck.h"
#include "support/reference.h"

namespace kiln {
namespace {

using test::expect_error;

void load_test_ops() { load_op_library(KILN_TEST_OPS_LIB); }

double softshrink_ref(double x, double l) { return x > l ? x - l : x < -l ? x + l : 0.0; }

// Random values kept 0.05 away from the kinks at +-l (finite differences straddle them).
Array away_from_kinks(const Shape& s, DType t, double l) {
  Array a = test::random_array(s, f64, -2, 2);
  double* p = a.data<double>();
  for (int64_t i = 0; i < a.numel(); ++i)
    for (double k : {l, -l})
      if (std::abs(p[i] - k) < 0.05) p[i] = k + (p[i] < k ? -0.05 : 0.05);
  return t == f64 ? a : a.astype(t);
}

std::vector<Array> run_on(Device d, const std::function<std::vector<Tensor>(Graph&, Tensor)>& f,
                          const Array& x, bool strict = false) {
  Graph g;
  Tensor px = g.placeholder(x.shape(), x.dtype(), "x");
  auto outs = f(g, px);
  CompileOptions o;
  o.strict_placement = strict;
  return g.compile(d, {}, outs, o).run({{px, x}});
}

TEST(CustomOpLibrary, SoftshrinkMatchesReference) {
  load_test_ops();
  ASSERT_TRUE(is_custom_op_registered("test.softshrink"));
  for (DType t : {f32, f64}) {
    const double l = 0.3;
    const Array x = test::random_array({7, 129}, t, -2, 2);
    auto got = run_on(
        Device::cpu(),
        [&](Graph&, Tensor px) {
          return custom_op("test.softshrink", {px}, {{"lambda", l}});
        },
        x);
    ASSERT_EQ(got[0].dtype(), t);
    std::vector<double> want;
    for (double v : test::to_f64(x)) want.push_back(softshrink_ref(v, l));
    test::expect_close(got[0], {7, 129}, want, test::tolerance(t), test::tolerance(t));
  }
}

TEST(CustomOpLibrary, AttributesDefaultsAndTwoOutputs) {
  load_test_ops();
  const Array x = test::random_array({5, 33}, f32, -1.5, 1.5);
  const Array z = test::random_array({5, 33}, f32, -1.5, 1.5);
  Graph g;
  Tensor px = g.placeholder({5, 33}, f32, "x"), pz = g.placeholder({5, 33}, f32, "z");
  // a is an int given for a float attribute; b keeps its default (2); power 3
  auto y = custom_op("test.mix", {px, pz}, {{"a", int64_t{3}}, {"power", int64_t{3}}});
  ASSERT_EQ(y.size(), 2u);
  auto got = g.compile(Device::cpu(), {}, y).run({{px, x}, {pz, z}});
  std::vector<double> w0, w1;
  const auto xs = test::to_f64(x), zs = test::to_f64(z);
  for (size_t i = 0; i < xs.size(); ++i) {
    w0.push_back(3 * xs[i] + 2 * zs[i]);
    w1.push_back(xs[i] * xs[i] * xs[i] * zs[i]);
  }
  test::expect_close(got[0], {5, 33}, w0, 2e-5, 2e-5);
  test::expect_close(got[1], {5, 33}, w1, 2e-5, 2e-5);
}

TEST(CustomOpLibrary, BadUseNamesTheOp) {
  load_test_ops();
  Graph g;
  Tensor x = g.placeholder({4}, f32, "x"), z = g.placeholder({5}, f32, "z");
  Tensor xi = g.placeholder({4}, i32, "xi");
  expect_error<ShapeError>([&] { custom_op("test.mix", {x, z}); }, {"[test.mix]", "(4,)", "(5,)"});
  expect_error<ValueError>(
      [&] {
        custom_op("test.mix", {x, x}, {{"power", int64_t{9}}});
      },
      {"[test.mix]", "power"});
  expect_error<DTypeError>([&] { custom_op("test.softshrink", {xi}); },
                           {"[test.softshrink]", "i32"});
  expect_error<ValueError>(
      [&] {
        custom_op("test.softshrink", {x}, {{"lamda", 0.1}});
      },
      {"[test.softshrink]", "lamda"});
  expect_error<ValueError>(
      [&] {
        custom_op("test.softshrink", {x}, {{"lambda", "big"}});
      },
      {"[test.softshrink]", "lambda", "float", "string"});
  expect_error<ValueError>(
      [&] {
        custom_op("test.softshrink", {x, x});
      },
      {"[test.softshrink]", "1 inputs"});
  expect_error<ValueError>([&] { custom_op("test.nope", {x}); }, {"test.nope"});
}

TEST(CustomOpLibrary, GradientsMatchFiniteDifferences) {
  load_test_ops();
  const double l = 0.4;
  test::check_gradients(
      [&](const std::vector<Tensor>& in) {
        return custom_op1("test.softshrink", {in[0]}, {{"lambda", l}});
      },
      {away_from_kinks({6, 11}, f64, l)});
  test::check_gradients(
      [](Graph&, const std::vector<Tensor>& in) {
        return custom_op("test.mix", {in[0], in[1]}, {{"a", -0.5}, {"power", int64_t{3}}});
      },
      {test::random_array({3, 17}, f32, -1, 1), test::random_array({3, 17}, f32, -1, 1)},
      {.eps = 1e-3, .atol = 2e-3, .rtol = 2e-2});
}

TEST(CustomOpLibrary, AbiMismatchIsRefused) {
  expect_error<UnsupportedError>(
      [] { load_op_library(KILN_TEST_BAD_ABI_LIB); },
      {"[load_op_library]", "op ABI version 1001", "takes version 1", "rebuild"});
}

TEST(CustomOpLibrary, DuplicateNamesAreRefused) {
  load_test_ops();
  expect_error<ValueError>([] { load_op_library(KILN_TEST_DUP_LIB); },
                           {"test.softshrink", "registered already", KILN_TEST_OPS_LIB_NAME});
  // nothing of the refused library was registered
  EXPECT_FALSE(is_custom_op_registered("test.dup_fresh"));
  CustomOpDef d;
  d.name = "test.softshrink";
  d.inputs = {{"x"}};
  d.outputs = {{"y"}};
  expect_error<ValueError>([&] { register_custom_op(d); },
                           {"[register_custom_op]", "test.softshrink", "registered already"});
  // loading the same library again is a no-op
  EXPECT_NO_THROW(load_test_ops());
}

TEST(CustomOpLibrary, NotALibrary) {
  expect_error<IoError>([] { load_op_library("/nonexistent/libnothing.so"); },
                        {"[load_op_library]", "libnothing.so"});
}

TEST(CustomOpLibrary, PackageRoundTrip) {
  load_test_ops();
  Graph g;
  Tensor x = g.placeholder({9, 13}, f32, "x");
  Tensor s = custom_op1("test.softshrink", {x}, {{"lambda", 0.2}});
  auto m = custom_op("test.mix", {s, x}, {{"b", -1.0}});
  auto exe = g.compile(Device::cpu(), {}, {m[0], m[1]});
  const Array xa = test::random_array({9, 13}, f32, -1, 1);
  auto want = exe.run({{x, xa}});
  const std::string path = testing::TempDir() + "custom_op_round_trip.kiln";
  exe.save(path);
  auto loaded = Executable::load(path, Device::cpu());
  auto got = loaded.run(std::map<std::string, Array>{{"x", xa}});
  ASSERT_EQ(got.size(), 2u);
  for (int k = 0; k < 2; ++k) test::expect_close(got[k], {9, 13}, test::to_f64(want[k]), 0, 0);
  std::filesystem::remove(path);
}

// A package whose custom op is not registered names the op and the library to load.
TEST(CustomOpLibrary, PackageNeedsItsOp) {
  CustomOpDef d;
  d.name = "test.vanishing";
  d.inputs = {{"x"}};
  d.outputs = {{"y"}};
  d.library = "libvanishing_ops.so";
  register_custom_op(d);
  register_custom_kernel("test.vanishing", Backend::cpu, [](KernelContext& c, Stream&) {
    for (int64_t i = 0; i < c.in(0).numel(); ++i)
      c.out(0).ptr<float>()[i] = 2 * c.in(0).ptr<float>()[i];
  });
  Graph g;
  Tensor x = g.placeholder({3}, f32, "x");
  const std::string path = testing::TempDir() + "custom_op_vanishing.kiln";
  Tensor y = custom_op1("test.vanishing", {x});
  g.compile(Device::cpu(), {}, {y}).save(path);
  ASSERT_TRUE(unregister_custom_op("test.vanishing"));
  expect_error<UnsupportedError>(
      [&] { Executable::load(path, Device::cpu()); },
      {"[package]", "test.vanishing", "libvanishing_ops.so", "load_op_library"});
  // and a graph built before still names what is missing when compiled
  expect_error<UnsupportedError>([&] { g.compile(Device::cpu(), {}, {y}); },
                                 {"test.vanishing", "libvanishing_ops.so"});
  std::filesystem::remove(path);
}

TEST(CustomOpLibrary, CudaMatchesCpu) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  load_test_ops();
  for (DType t : {f32, f64}) {
    const Array x = test::random_array({1000, 3}, t, -2, 2);
    auto f = [](Graph&, Tensor px) {
      auto s = custom_op1("test.softshrink", {px}, {{"lambda", 0.25}});
      return std::vector<Tensor>{s};
    };
    auto cpu = run_on(Device::cpu(), f, x);
    auto gpu = run_on(Device::cuda(0), f, x, /*strict=*/true);
    test::expect_close(gpu[0], {1000, 3}, test::to_f64(cpu[0]), 0, 0);
  }
  // gradients on the device through the custom op
  test::check_gradients(
      [](const std::vector<Tensor>& in) {
        return custom_op("test.mix", {in[0], in[1]})[1];
      },
      {test::random_array({4, 9}, f32, -1, 1), test::random_array({4, 9}, f32, -1, 1)},
      {.eps = 1e-3, .atol = 2e-3, .rtol = 2e-2});
}

// An op without a CUDA kernel falls back to the CPU, or fails under strict placement.
TEST(CustomOpLibrary, CudaFallbackToCpu) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  if (!is_custom_op_registered("test.cpu_only")) {
    CustomOpDef d;
    d.name = "test.cpu_only";
    d.inputs = {{"x"}};
    d.outputs = {{"y"}};
    register_custom_op(d);
    register_custom_kernel("test.cpu_only", Backend::cpu, [](KernelContext& c, Stream& s) {
      EXPECT_EQ(s.native_handle(), nullptr);
      for (int64_t i = 0; i < c.in(0).numel(); ++i)
        c.out(0).ptr<float>()[i] = c.in(0).ptr<float>()[i] + 1;
    });
  }
  const Array x = test::random_array({64}, f32);
  auto f = [](Graph&, Tensor px) {
    return std::vector<Tensor>{custom_op1("test.cpu_only", {px}) * 2.0};
  };
  auto got = run_on(Device::cuda(0), f, x);
  std::vector<double> want;
  for (double v : test::to_f64(x)) want.push_back((v + 1) * 2);
  test::expect_close(got[0], {64}, want, 1e-6, 1e-6);
  expect_error<UnsupportedError>([&] { run_on(Device::cuda(0), f, x, true); },
                                 {"test.cpu_only", "no cuda kernel"});
}

}  // namespace
}  // namespace kiln
