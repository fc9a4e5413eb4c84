// Variables, assign, assign_slice, host access and checkpoints.
#include <cstdio>
#include <fstream>

#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;

std::vector<double> plus(const std::vector<double>& a, double k) {
  std::vector<double> r;
  for (double v : a) r.push_back(v + k);
  return r;
}

TEST(Assign, PersistsAcrossRunsAndReadsSeeTheOldValue) {
  Graph g;
  Array init = random_array({3, 4}, f32);
  auto w = g.variable(init, "w");
  auto doubled = w * 2.0;
  auto step = assign(w, w + 1.0);
  auto exe = g.compile(Device::cpu(), {}, {doubled}, {step});
  auto v0 = to_f64(init);
  for (int run = 0; run < 3; ++run) {
    std::vector<double> want;
    for (double v : v0) want.push_back(2 * (static_cast<float>(v) + run));
    // doubled reads w as it was when the run started, although the assign comes later
    expect_close(exe.run(Feeds{})[0], {3, 4}, want, 1e-6, 1e-6);
  }
  expect_close(g.read_variable(w), {3, 4}, plus(v0, 3), 1e-6, 1e-6);
}

TEST(Assign, ResultCanBeATarget) {
  Graph g;
  auto w = g.variable(Array::from_vector<float>({1, 2}, {2}), "w");
  auto x = g.placeholder({2}, f32, "x");
  auto next = assign(w, w * x);
  auto exe = g.compile(Device::cpu(), {}, {next});
  Array xv = Array::from_vector<float>({3, 5}, {2});
  expect_equal(exe.run({{x, xv}})[0], {2}, {3, 10});
  expect_equal(exe.run({{x, xv}})[0], {2}, {9, 50});
  expect_equal(g.read_variable(w), {2}, {9, 50});
}

// The reference: `var` (row-major, dims `vs`) with `up` (dims `us`) written at `starts`.
void write_region(std::vector<double>& var, const Shape& vs, const std::vector<double>& up,
                  const Shape& us, const std::vector<int64_t>& starts) {
  const int r = static_cast<int>(vs.size());
  for (int64_t i = 0; i < numel(us); ++i) {
    int64_t rest = i, off = 0, stride = 1;
    for (int d = r - 1; d >= 0; --d) {
      off += (rest % us[d] + starts[d]) * stride;
      rest /= us[d];
      stride *= vs[d];
    }
    var[off] = up[i];
  }
}

Array int64s(const std::vector<int64_t>& v) {
  return Array::from_vector<int64_t>(v, {static_cast<int64_t>(v.size())});
}

TEST(AssignSlice, WritesOnlyTheRegionAtFedStartsRunAfterRun) {
  const Device dev = default_device();
  Graph g;
  const Shape vs{6, 5, 4}, us{2, 5, 3};
  Array init = random_array(vs, f32);
  auto w = g.variable(init, "w");
  auto up = g.placeholder(us, f32, "up");
  auto starts = g.placeholder({3}, i64, "starts");
  auto before = sum(w * 1.0);  // reads w as it was when the run started
  auto exe = g.compile(dev, {}, {before}, {assign_slice(w, up, starts)});
  std::vector<double> want = to_f64(init);
  for (int run = 0; run < 4; ++run) {
    const std::vector<int64_t> s = {run % 5, 0, (run * 7) % 2};
    Array u = random_array(us, f32);
    double old = 0;
    for (double v : want) old += static_cast<float>(v);
    expect_close(exe.run({{up, u}, {starts, int64s(s)}})[0], {}, {old}, 1e-4, 1e-5);
    write_region(want, vs, to_f64(u), us, s);
    expect_equal(exe.read_variable("w"), vs, want);
  }
}

TEST(AssignSlice, AppendsAnyNumberOfTokensInOneDynamicExecutable) {
  const Device dev = default_device();
  Graph g;
  const Shape vs{16, 2, 3};  // positions, heads, head dim
  Array init = random_array(vs, bf16);
  auto cache = g.variable(init, "kv");
  auto kv = g.placeholder({-1, 2, 3}, f32, "kv_new");
  auto pos = g.placeholder({1}, i32, "pos");
  auto starts = concat({pos, g.constant(Array::from_vector<int32_t>({0, 0}, {2}))}, 0);
  auto updated = assign_slice(cache, kv, starts);  // cast to bf16, starts to int64
  auto exe = g.compile(dev, {}, {sum(cast(updated, f32))});
  ASSERT_TRUE(exe.is_dynamic());
  std::vector<double> want = to_f64(init);
  int64_t at = 0;
  for (int64_t n : {1, 3, 1, 5}) {
    Array u = random_array({n, 2, 3}, f32);
    const Array p = Array::from_vector<int32_t>({static_cast<int32_t>(at)}, {1});
    const double got = to_f64(exe.run({{kv, u}, {pos, p}})[0])[0];
    write_region(want, vs, to_f64(u.astype(bf16)), {n, 2, 3}, {at, 0, 0});
    double total = 0;
    for (double v : want) total += v;
    EXPECT_NEAR(got, total, 1e-3 * (1 + std::fabs(total)));  // the readers see the new value
    expect_equal(exe.read_variable("kv"), vs, want);
    at += n;
  }
}

TEST(AssignSlice, AStartOutOfRangeFailsNamingTheVariableAndWritesNothing) {
  const Device dev = default_device();
  Graph g;
  Array init = random_array({6, 5}, f32);
  auto cache = g.variable(init, "cache");
  auto up = g.placeholder({3, 5}, f32, "up");
  auto starts = g.placeholder({2}, i64, "starts");
  auto exe = g.compile(dev, {}, {}, {assign_slice(cache, up, starts)});
  const Array u = random_array({3, 5}, f32);
  expect_error<ValueError>(
      [&] {
        exe.run({{up, u}, {starts, int64s({4, 0})}});
      },
      {"[assign_slice]", "'cache'", "(6, 5)", "start 4 of dim 0", "[0, 3]"});
  expect_error<ValueError>(
      [&] {
        exe.run({{up, u}, {starts, int64s({1, -1})}});
      },
      {"'cache'", "start -1 of dim 1", "[0, 0]"});
  expect_equal(exe.read_variable("cache"), {6, 5}, to_f64(init));
  // and the executable keeps working
  exe.run({{up, u}, {starts, int64s({3, 0})}});
  std::vector<double> want = to_f64(init);
  write_region(want, {6, 5}, to_f64(u), {3, 5}, {3, 0});
  expect_equal(exe.read_variable("cache"), {6, 5}, want);
}

TEST(AssignSlice, BuildErrorsNameTheShapes) {
  Graph g;
  auto v = g.variable(random_array({4, 6}, f32), "v");
  auto x = g.placeholder({2, 6}, f32, "x");
  expect_error<ShapeError>(
      [&] {
        assign_slice(v, g.placeholder({6}, f32), {0, 0});
      },
      {"[assign_slice]", "rank 1", "(4, 6)"});
  expect_error<ShapeError>(
      [&] {
        assign_slice(v, g.placeholder({5, 6}, f32), {0, 0});
      },
      {"[assign_slice]", "(5, 6)", "dim 0"});
  expect_error<ShapeError>([&] { assign_slice(v, x, {0, 0, 0}); }, {"[assign_slice]", "(3,)"});
  expect_error<DTypeError>([&] { assign_slice(v, x, g.placeholder({2}, f32)); },
                           {"[assign_slice]", "f32"});
  expect_error<ValueError>([&] { assign_slice(v * 1.0, x, {0, 0}); }, {"[assign_slice]"});
}

TEST(Variable, SharedByExecutablesAndHostWrites) {
  Graph g;
  auto w = g.variable(Array::zeros({4}, f64), "w");
  auto inc = g.compile(Device::cpu(), {}, {}, {assign(w, w + 1.0)});
  auto read = g.compile(Device::cpu(), {}, {w * 1.0});
  inc.run(Feeds{});
  inc.run(Feeds{});
  expect_equal(read.run(Feeds{})[0], {4}, {2, 2, 2, 2});
  Array v = random_array({4}, f64);
  g.write_variable(w, v);
  expect_equal(read.run(Feeds{})[0], {4}, to_f64(v));
  expect_error<ShapeError>([&] { g.write_variable(w, Array::zeros({5}, f64)); },
                           {"[write_variable]", "'w'", "(4,)", "(5,)"});
  expect_error<ValueError>([&] { g.variable(v, "w"); }, {"[variable]", "'w'"});
  expect_error<ValueError>([&] { assign(w * 1.0, w); }, {"[assign]"});
}

TEST(Variable, NotFoldedOrMerged) {
  Graph g;
  auto a = g.variable(Array::from_vector<float>({1}, {1}), "a");
  auto b = g.variable(Array::from_vector<float>({1}, {1}), "b");
  auto exe = g.compile(Device::cpu(), {}, {a + b}, {assign(a, a + b)});
  expect_equal(exe.run(Feeds{})[0], {1}, {2});
  expect_equal(exe.run(Feeds{})[0], {1}, {3});
}

TEST(Checkpoint, SaveAndRestore) {
  const std::string path = ::testing::TempDir() + "kiln_ckpt_" + std::to_string(seed());
  Graph g;
  Array wa = random_array({2, 3}, f32), wb = random_array({5}, i64, -9, 9);
  auto a = g.variable(wa, "layer.weight");
  auto b = g.variable(wb, "steps");
  g.save_variables(path);
  g.write_variable(a, Array::zeros({2, 3}, f32));
  g.write_variable(b, Array::zeros({5}, i64));
  g.load_variables(path);
  expect_equal(g.read_variable(a), {2, 3}, to_f64(wa));
  expect_equal(g.read_variable(b), {5}, to_f64(wb));

  Graph other;
  other.variable(Array::zeros({3, 2}, f32), "layer.weight");
  expect_error<ShapeError>([&] { other.load_variables(path); }, {"[checkpoint]", "layer.weight", "(2, 3)", "(3, 2)"});
  Graph missing;
  missing.variable(Array::zeros({1}, f32), "bias");
  expect_error<ValueError>([&] { missing.load_variables(path); }, {"[checkpoint]", "'bias'"});

  // truncated and foreign files are rejected without touching the variables
  {
    std::ifstream in(path, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), {});
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size() - 7));
  }
  g.write_variable(a, Array::zeros({2, 3}, f32));
  expect_error<FormatError>([&] { g.load_variables(path); }, {"[checkpoint]", "offset"});
  expect_equal(g.read_variable(a), {2, 3}, std::vector<double>(6, 0.0));
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << "definitely not a checkpoint";
  }
  expect_error<FormatError>([&] { g.load_variables(path); }, {"[checkpoint]", "not a kiln checkpoint"});
  std::remove(path.c_str());
  expect_error<IoError>([&] { g.load_variables(path); }, {"[checkpoint]", "cannot open"});
}

}  // namespace
}  // namespace kiln
