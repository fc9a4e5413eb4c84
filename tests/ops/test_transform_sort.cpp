// Sorting ops of the transform family: Topk, Sort, Argsort. Inputs are small random integers so
// ties are common; the references are plain selection/insertion sorts.
#include <cmath>
#include <limits>

#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;

// Each line of `shape` along `axis`: its flat offsets.
std::vector<std::vector<int64_t>> lines(const Shape& shape, int axis) {
  std::vector<std::vector<int64_t>> r;
  for (int64_t i = 0; i < numel(shape); ++i) {
    auto idx = unravel(i, shape);
    if (idx[axis] != 0) continue;
    std::vector<int64_t> line;
    for (int64_t j = 0; j < shape[axis]; ++j) {
      idx[axis] = j;
      line.push_back(ravel(idx, shape));
    }
    r.push_back(line);
  }
  return r;
}

// Positions 0..n-1 of v ordered by insertion sort: stable, so equal values keep index order.
std::vector<int64_t> stable_order(const std::vector<double>& v, bool descending) {
  std::vector<int64_t> order;
  for (int64_t i = 0; i < static_cast<int64_t>(v.size()); ++i) {
    auto at = order.end();
    while (at != order.begin()) {
      const double prev = v[*(at - 1)];
      if (descending ? prev >= v[i] : prev <= v[i]) break;
      --at;
    }
    order.insert(at, i);
  }
  return order;
}

struct Sorted {
  std::vector<double> values, indices;
};

// Sorts every line of x along axis, keeping the first k of each.
Sorted ref_sort(const Array& x, int axis, bool descending, int64_t k) {
  const auto fx = to_f64(x);
  Shape out = x.shape();
  out[axis] = k;
  Sorted r{std::vector<double>(numel(out)), std::vector<double>(numel(out))};
  const auto in_lines = lines(x.shape(), axis), out_lines = lines(out, axis);
  for (size_t l = 0; l < in_lines.size(); ++l) {
    std::vector<double> v;
    for (int64_t o : in_lines[l]) v.push_back(fx[o]);
    const auto order = stable_order(v, descending);
    for (int64_t j = 0; j < k; ++j) {
      r.values[out_lines[l][j]] = v[order[j]];
      r.indices[out_lines[l][j]] = static_cast<double>(order[j]);
    }
  }
  return r;
}

TEST(Topk, TiesKeepLowerIndex) {
  struct Case {
    Shape x;
    int64_t k, axis;
  };
  for (auto c : {Case{{4, 9}, 3, -1}, Case{{7, 3, 2}, 7, 0}, Case{{5, 6}, 0, 1},
                 Case{{1, 40}, 39, -1}, Case{{3, 0}, 0, 1}}) {
    for (DType t : {f32, i32, f64, bf16}) {
      for (bool largest : {true, false}) {
        Graph g;
        auto x = g.placeholder(c.x, t, "x");
        Array v = random_ints(c.x, -3, 3, t);
        auto [vals, idx] = topk(x, c.k, c.axis, largest);
        EXPECT_EQ(idx.dtype(), i64);
        auto outs = eval(g, {vals, idx}, {{x, v}});
        const int axis = static_cast<int>(c.axis < 0 ? c.axis + c.x.size() : c.axis);
        Shape out = c.x;
        out[axis] = c.k;
        const Sorted ref = ref_sort(v, axis, largest, c.k);
        expect_equal(outs[0], out, ref.values);
        expect_equal(outs[1], out, ref.indices);
      }
    }
  }
}

TEST(Topk, ErrorsNameOpAndShapes) {
  Graph g;
  auto x = g.placeholder({2, 3}, f32, "x");
  expect_error<ShapeError>([&] { topk(x, 4, 1); }, {"[topk]", "k = 4", "(2, 3)"});
  expect_error<ValueError>([&] { topk(x, 1, 2); }, {"[topk]", "axis 2", "(2, 3)"});
}

TEST(Sort, StableWithDuplicateKeys) {
  struct Case {
    Shape x;
    int64_t axis;
  };
  for (auto c : {Case{{5, 17}, -1}, Case{{12, 3, 2}, 0}, Case{{1}, 0}, Case{{4, 0}, 1}}) {
    for (DType t : {f32, i64, u8, f16, boolean}) {
      for (bool descending : {false, true}) {
        Graph g;
        auto x = g.placeholder(c.x, t, "x");
        Array v = random_ints(c.x, t == u8 ? 0 : -4, 4, t);
        auto outs =
            eval(g, {sort(x, c.axis, descending), argsort(x, c.axis, descending)}, {{x, v}});
        const int axis = static_cast<int>(c.axis < 0 ? c.axis + c.x.size() : c.axis);
        const Sorted ref = ref_sort(v, axis, descending, c.x[axis]);
        expect_equal(outs[0], c.x, ref.values);
        expect_equal(outs[1], c.x, ref.indices);
        EXPECT_EQ(outs[1].dtype(), i64);
      }
    }
  }
}

TEST(Sort, LargeRunsInParallel) {
  Graph g;
  auto x = g.placeholder({64, 1000}, i32, "x");
  Array v = random_ints({64, 1000}, -50, 50, i32);
  auto outs = eval(g, {sort(x, 1, true), argsort(x, 0)}, {{x, v}});
  expect_equal(outs[0], {64, 1000}, ref_sort(v, 1, true, 1000).values);
  expect_equal(outs[1], {64, 1000}, ref_sort(v, 0, false, 64).indices);
}

TEST(Sort, NanSortsAboveNumbers) {
  Graph g;
  auto x = g.placeholder({5}, f32, "x");
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float data[] = {2, nan, -1, 2, 0};
  Array v = Array::from_data(data, {5}, f32);
  auto outs = eval(g, {sort(x), argsort(x, 0, true)}, {{x, v}});
  expect_equal(outs[0], {5}, {-1, 0, 2, 2, std::nan("")});
  expect_equal(outs[1], {5}, {1, 0, 3, 4, 2});
}

TEST(Argsort, ErrorsNameOpAndShapes) {
  Graph g;
  auto x = g.placeholder({2, 3}, f32, "x");
  expect_error<ValueError>([&] { argsort(x, -3); }, {"[argsort]", "axis -3", "(2, 3)"});
  expect_error<ValueError>([&] { sort(x, 2); }, {"[sort]", "axis 2", "(2, 3)"});
}

TEST(Argsort, MatchesReferenceOnFloats) {
  Graph g;
  auto x = g.placeholder({6, 33}, f64, "x");
  Array v = random_array({6, 33}, f64);
  auto y = argsort(x, 1);
  expect_equal(eval1(g, y, {{x, v}}), {6, 33}, ref_sort(v, 1, false, 33).indices);
}

}  // namespace
}  // namespace kiln
