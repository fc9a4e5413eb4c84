// Batch buckets (DimSpec::buckets): a feed runs as the smallest bucket at least its size, padded
// with zeros; outputs whose first dim is the bucketed dim come back cut to the feed's size.
#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;

// relu(x w + b) and the row sums of x * m, in float64.
struct Reference {
  std::vector<double> dense, sums;
};
Reference reference(const Array& x, const Array& m, const Array& w, const Array& b) {
  const auto vx = to_f64(x), vm = to_f64(m), vw = to_f64(w), vb = to_f64(b);
  const int64_t n = x.shape()[0], k = x.shape()[1], o = w.shape()[1];
  Reference r{std::vector<double>(n * o), std::vector<double>(n, 0.0)};
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < o; ++j) {
      double s = vb[j];
      for (int64_t q = 0; q < k; ++q) s += vx[i * k + q] * vw[q * o + j];
      r.dense[i * o + j] = std::max(s, 0.0);
    }
    for (int64_t q = 0; q < k; ++q) r.sums[i] += vx[i * k + q] * vm[i * k + q];
  }
  return r;
}

TEST(BatchBuckets, FeedsRunAsTheirBucketAndOutputsComeBackCut) {
  Graph g;
  const DimSpec batch{.axis = 0, .name = "batch", .min = 1, .max = 64, .buckets = {4, 8}};
  auto x = g.placeholder({-1, 6}, f32, "x", {batch});
  auto m = g.placeholder({-1, 6}, f32, "m", {DimSpec{.axis = 0, .name = "batch"}});
  const Array w = random_array({6, 5}, f32), b = random_array({5}, f32);
  auto dense = relu(matmul(x, g.constant(w)) + g.constant(b));
  auto sums = sum(x * m, {1});
  auto exe = g.compile(default_device(), {}, {dense, sums});
  for (int64_t n : {1, 3, 4, 2, 5, 8, 9, 6, 9}) {
    const Array xv = random_array({n, 6}, f32), mv = random_array({n, 6}, f32);
    const auto out = exe.run({{x, xv}, {m, mv}});
    const Reference want = reference(xv, mv, w, b);
    expect_close(out[0].to(Device::cpu()), {n, 5}, want.dense, 1e-4);
    expect_close(out[1].to(Device::cpu()), {n}, want.sums, 1e-4);
  }
  // buckets 4 (1-4) and 8 (5-8), and 9 at its own size
  EXPECT_EQ(exe.shape_cache().misses, 3);
  EXPECT_EQ(exe.shape_cache().hits, 6);
  EXPECT_EQ(g.dim_specs(x).at(0).buckets, (std::vector<int64_t>{4, 8}));
}

TEST(BatchBuckets, RunAsyncCutsItsOutputs) {
  Graph g;
  auto x = g.placeholder({-1, 3}, f32, "x", {DimSpec{.axis = 0, .buckets = {16}}});
  auto exe = g.compile(default_device(), {}, {x * 2.0});
  Queue q(default_device());
  const Array xv = random_array({5, 3}, f32);
  auto v = to_f64(xv);
  for (double& e : v) e *= 2;
  expect_close(exe.run_async(q, {{x, xv}}).get()[0].to(Device::cpu()), {5, 3}, v, 1e-6);
}

TEST(BatchBuckets, WhatCannotBeCutFailsClearly) {
  Graph g;
  auto x = g.placeholder({-1, 3}, f32, "x", {DimSpec{.axis = 0, .buckets = {4}}});
  auto exe = g.compile(default_device(), {}, {transpose(x, {1, 0})});
  expect_error<UnsupportedError>(
      [&] {
        exe.run({{x, random_array({2, 3}, f32)}});
      },
      {"output 0 has shape (3, x.0)", "depends on a padded bucketed dim"});
  // a feed that needs no padding runs
  EXPECT_EQ(exe.run({{x, random_array({4, 3}, f32)}})[0].shape(), (Shape{3, 4}));
  // buckets ascend within the dim's range; dims that share a name share them
  Graph h;
  expect_error<ShapeError>(
      [&] {
        h.placeholder({-1}, f32, "a", {DimSpec{.axis = 0, .buckets = {8, 4}}});
      },
      {"[placeholder] 'a': dim 0 has buckets (8, 4), which must ascend"});
  expect_error<ShapeError>(
      [&] { h.placeholder({-1}, f32, "a", {DimSpec{.axis = 0, .max = 6, .buckets = {8}}}); },
      {"must ascend within its range [0, 6]"});
  auto a = h.placeholder({-1}, f32, "a", {DimSpec{.axis = 0, .name = "n", .buckets = {4}}});
  auto c = h.placeholder({-1}, f32, "c", {DimSpec{.axis = 0, .name = "n", .buckets = {8}}});
  expect_error<ShapeError>([&] { h.compile(default_device(), {}, {a + c}); },
                           {"the dims named 'n' have different buckets: (4) and (8)"});
}

TEST(BatchBuckets, ArraysPadWithZeros) {
  const Array a = random_array({2, 3, 2}, f32);
  const Array p = a.padded({4, 3, 5}).to(Device::cpu());
  const auto va = to_f64(a), vp = to_f64(p);
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t j = 0; j < 3; ++j)
      for (int64_t k = 0; k < 5; ++k)
        EXPECT_EQ(vp[(i * 3 + j) * 5 + k], i < 2 && k < 2 ? va[(i * 3 + j) * 2 + k] : 0.0);
  // on the executable's device too
  const Array d = a.to(default_device()).padded({3, 4, 2}).to(Device::cpu());
  const auto vd = to_f64(d);
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 4; ++j)
      for (int64_t k = 0; k < 2; ++k)
        EXPECT_EQ(vd[(i * 4 + j) * 2 + k], i < 2 && j < 3 ? va[(i * 3 + j) * 2 + k] : 0.0);
  EXPECT_EQ(a.first_rows(1).shape(), (Shape{1, 3, 2}));
  EXPECT_THROW(a.padded({1, 3, 2}), ShapeError);
  EXPECT_THROW(a.first_rows(3), ShapeError);
}

}  // namespace
}  // namespace kiln
