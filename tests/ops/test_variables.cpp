// Variables, assign, host access and checkpoints.
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
