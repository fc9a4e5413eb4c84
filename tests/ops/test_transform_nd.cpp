// N-d indexing ops of the transform family: GatherNd, ScatterNd (ONNX GatherND, ScatterND),
// against float64 loops over the ONNX definitions.
#include <cmath>

#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;

int64_t wrap(double k, int64_t n) {
  return k < 0 ? static_cast<int64_t>(k) + n : static_cast<int64_t>(k);
}

// Random index tuples (..., m) valid for dims x[first .. first + m), negative ones included.
Array random_tuples(const Shape& idx, const Shape& x, int64_t first, DType t) {
  Array a = random_ints(idx, 0, 0, i64);
  auto* p = a.data<int64_t>();
  const int64_t m = idx.back();
  std::uniform_real_distribution<double> u(0, 1);
  for (int64_t i = 0; i < numel(idx); ++i) {
    const int64_t n = x[first + i % m];
    p[i] = static_cast<int64_t>(std::floor(u(rng()) * 2 * n)) - n;  // in [-n, n)
  }
  return a.astype(t);
}

// ONNX GatherND: out[b..., i..., s...] = x[b..., idx[b..., i..., :], s...].
std::vector<double> ref_gather_nd(const Array& x, const Array& idx, int64_t b, Shape& out) {
  const Shape &xs = x.shape(), &is = idx.shape();
  const int64_t m = is.back();
  out.assign(is.begin(), is.end() - 1);
  out.insert(out.end(), xs.begin() + b + m, xs.end());
  const auto fx = to_f64(x), fi = to_f64(idx);
  std::vector<double> r;
  for (int64_t i = 0; i < numel(out); ++i) {
    const auto o = unravel(i, out);
    std::vector<int64_t> tuple(o.begin(), o.begin() + (is.size() - 1));
    tuple.push_back(0);
    std::vector<int64_t> src(o.begin(), o.begin() + b);
    for (int64_t k = 0; k < m; ++k) {
      tuple.back() = k;
      src.push_back(wrap(fi[ravel(tuple, is)], xs[b + k]));
    }
    src.insert(src.end(), o.begin() + (is.size() - 1), o.end());
    r.push_back(fx[ravel(src, xs)]);
  }
  return r;
}

TEST(GatherNd, MatchesOnnxDefinition) {
  struct Case {
    Shape x, idx;
    int64_t batch;
  };
  for (auto c : {Case{{4, 5, 3}, {6, 2}, 0}, Case{{4, 5, 3}, {2, 3, 3}, 0}, Case{{7}, {5, 1}, 0},
                 Case{{3, 4, 5, 2}, {3, 6, 1}, 1}, Case{{2, 3, 4, 5}, {2, 3, 2}, 2},
                 Case{{2, 3, 4}, {2, 0, 2}, 1}, Case{{5, 6}, {1}, 0}}) {
    for (DType t : {f32, f64, i64, boolean, f16, bf16, u8}) {
      for (DType it : {i32, i64}) {
        Graph g;
        auto x = g.placeholder(c.x, t, "x");
        auto idx = g.placeholder(c.idx, it, "idx");
        Array vx = random_array(c.x, t, -50, 50), vi = random_tuples(c.idx, c.x, c.batch, it);
        Array y = eval1(g, gather_nd(x, idx, c.batch), {{x, vx}, {idx, vi}});
        Shape out;
        const auto ref = ref_gather_nd(vx, vi, c.batch, out);
        expect_equal(y, out, ref);
      }
    }
  }
}

TEST(GatherNd, OnnxExamples) {
  // the GatherND examples of the ONNX operator documentation (examples 4 and 5)
  Graph g;
  const int32_t d4[] = {0, 1, 2, 3, 4, 5, 6, 7};
  const int64_t i4[] = {0, 1, 1, 0}, i5[] = {1, 0};
  auto x = g.constant(Array::from_data(d4, {2, 2, 2}, i32));
  auto y4 = gather_nd(x, g.constant(Array::from_data(i4, {2, 1, 2}, i64)));
  auto y5 = gather_nd(x, g.constant(Array::from_data(i5, {2, 1}, i64)), 1);
  expect_equal(eval1(g, y4), {2, 1, 2}, {2, 3, 4, 5});
  expect_equal(eval1(g, y5), {2, 2}, {2, 3, 4, 5});
}

TEST(GatherNd, ErrorsNameOpAndShapes) {
  Graph g;
  auto x = g.placeholder({2, 5, 3}, f32, "x");
  auto idx = g.placeholder({4, 2}, i32, "idx");
  const int32_t bad[] = {1, 4, 0, -5, -2, 5, 1, 1};
  expect_error<ValueError>(
      [&] {
        eval1(g, gather_nd(x, idx),
              {{x, random_array({2, 5, 3}, f32)}, {idx, Array::from_data(bad, {4, 2}, i32)}});
      },
      {"[gather_nd]", "index 5 out of range for axis 1 of size 5", "(2, 5, 3)", "(4, 2)"});
  expect_error<ShapeError>([&] { gather_nd(x, g.placeholder({4, 4}, i32, "i")); },
                           {"[gather_nd]", "(4, 4)", "(2, 5, 3)"});
  expect_error<ShapeError>([&] { gather_nd(x, g.placeholder({3, 1}, i32, "i"), 1); },
                           {"[gather_nd]", "batch dim 0", "(3, 1)"});
  expect_error<ShapeError>([&] { gather_nd(x, g.placeholder({2, 1}, i32, "i"), 2); },
                           {"[gather_nd]", "batch_dims 2"});
  expect_error<DTypeError>([&] { gather_nd(x, g.placeholder({3, 1}, f32, "f")); },
                           {"[gather_nd]", "f32"});
}

// ONNX ScatterND: updates applied in index order with `r`.
std::vector<double> ref_scatter_nd(const Array& x, const Array& idx, const Array& upd,
                                   ScatterReduction r) {
  const Shape &xs = x.shape(), &is = idx.shape();
  const int64_t m = is.back(), tuples = numel(is) / m;
  int64_t slice = 1;
  for (size_t d = static_cast<size_t>(m); d < xs.size(); ++d) slice *= xs[d];
  auto out = to_f64(x);
  const auto fi = to_f64(idx), fu = to_f64(upd);
  for (int64_t t = 0; t < tuples; ++t) {
    std::vector<int64_t> at(xs.size(), 0);
    for (int64_t k = 0; k < m; ++k) at[k] = wrap(fi[t * m + k], xs[k]);
    const int64_t base = ravel(at, xs);
    for (int64_t j = 0; j < slice; ++j) {
      double& d = out[base + j];
      const double u = fu[t * slice + j];
      switch (r) {
        case ScatterReduction::none: d = u; break;
        case ScatterReduction::add: d += u; break;
        case ScatterReduction::mul: d *= u; break;
        case ScatterReduction::max: d = std::max(d, u); break;
        case ScatterReduction::min: d = std::min(d, u); break;
      }
    }
  }
  return out;
}

TEST(ScatterNd, AllReductionsWithDuplicates) {
  struct Case {
    Shape x, idx;
  };
  const ScatterReduction kinds[] = {ScatterReduction::none, ScatterReduction::add,
                                    ScatterReduction::mul, ScatterReduction::max,
                                    ScatterReduction::min};
  for (auto c : {Case{{4, 5, 3}, {9, 2}}, Case{{6}, {10, 1}}, Case{{3, 4}, {2, 5, 1}},
                 Case{{2, 3, 4}, {7, 3}}, Case{{3, 2}, {0, 1}}}) {
    for (ScatterReduction r : kinds) {
      for (DType t : {f32, f64, i32, f16}) {
        Graph g;
        Shape us(c.idx.begin(), c.idx.end() - 1);
        us.insert(us.end(), c.x.begin() + c.idx.back(), c.x.end());
        auto x = g.placeholder(c.x, t, "x");
        auto idx = g.placeholder(c.idx, i64, "idx");
        auto upd = g.placeholder(us, t, "upd");
        // more tuples than targets in most cases: duplicates are certain
        Array vx = random_array(c.x, t, -4, 4), vi = random_tuples(c.idx, c.x, 0, i64),
              vu = random_array(us, t, -4, 4);
        Array y = eval1(g, scatter_nd(x, idx, upd, r), {{x, vx}, {idx, vi}, {upd, vu}});
        const bool rounded = t == f16 && (r == ScatterReduction::add || r == ScatterReduction::mul);
        expect_close(y, c.x, ref_scatter_nd(vx, vi, vu, r), rounded ? 2e-2 : 1e-6,
                     rounded ? 5e-2 : 1e-6);
      }
    }
  }
}

TEST(AssignScatterNd, WritesTheIndexedSlicesOfAVariableRunAfterRun) {
  const Shape vs{7, 3, 4}, is{5, 1}, us{5, 3, 4};
  for (ScatterReduction r : {ScatterReduction::none, ScatterReduction::add}) {
    Graph g;
    const Array init = random_array(vs, f32, -4, 4);
    auto table = g.variable(init, "table");
    auto idx = g.placeholder(is, i64, "idx");
    auto upd = g.placeholder(us, f32, "upd");
    auto before = sum(table * 1.0);  // reads the variable as it was when the run started
    auto exe = g.compile(default_device(), {}, {before}, {assign_scatter_nd(table, idx, upd, r)});
    std::vector<double> want = to_f64(init);
    for (int run = 0; run < 3; ++run) {
      // repeated and negative indices: none keeps the last update of a row, add sums them
      const Array vi = random_tuples(is, vs, 0, i64), vu = random_array(us, f32, -4, 4);
      double old = 0;
      for (double v : want) old += v;
      expect_close(exe.run({{idx, vi}, {upd, vu}})[0], {}, {old}, 1e-4, 1e-4);
      want = ref_scatter_nd(Array::from_vector<double>(want, vs), vi, vu, r);
      expect_close(exe.read_variable("table"), vs, want, 1e-5, 1e-5);
    }
  }
}

TEST(AssignScatterNd, AnIndexOutOfRangeWritesNothing) {
  Graph g;
  const Array init = random_array({6, 2}, f32);
  auto table = g.variable(init, "table");
  auto idx = g.placeholder({3, 1}, i64, "idx");
  auto upd = g.placeholder({3, 2}, f32, "upd");
  auto exe = g.compile(default_device(), {}, {}, {assign_scatter_nd(table, idx, upd)});
  const Array bad = Array::from_vector<int64_t>({1, 6, 2}, {3, 1});
  expect_error<ValueError>(
      [&] {
        exe.run({{idx, bad}, {upd, random_array({3, 2}, f32)}});
      },
      {"[assign_scatter_nd]", "6"});
  expect_equal(exe.read_variable("table"), {6, 2}, to_f64(init));
  expect_error<ValueError>([&] { assign_scatter_nd(table * 1.0, idx, upd); },
                           {"[assign_scatter_nd]", "variable"});
  expect_error<ShapeError>(
      [&] {
        assign_scatter_nd(table, idx, g.placeholder({3, 5}, f32, "u"));
      },
      {"[assign_scatter_nd]", "(3, 5)"});
}

TEST(ScatterNd, LargeSlicesRunInParallel) {
  const Shape sx{50, 40, 300}, si{80, 2}, su{80, 300};
  Graph g;
  auto x = g.placeholder(sx, i64, "x");
  auto idx = g.placeholder(si, i32, "idx");
  auto upd = g.placeholder(su, i64, "upd");
  Array vx = random_ints(sx, -9, 9), vi = random_tuples(si, sx, 0, i32),
        vu = random_ints(su, -9, 9);
  Array y = eval1(g, scatter_nd(x, idx, upd, ScatterReduction::add),
                  {{x, vx}, {idx, vi}, {upd, vu}});
  expect_equal(y, sx, ref_scatter_nd(vx, vi, vu, ScatterReduction::add));
}

TEST(ScatterNd, ErrorsNameOpAndShapes) {
  Graph g;
  auto x = g.placeholder({3, 4}, f32, "x");
  auto idx = g.placeholder({2, 2}, i64, "idx");
  auto upd = g.placeholder({2}, f32, "upd");
  const int64_t bad[] = {0, 1, -4, 0};
  expect_error<ValueError>(
      [&] {
        eval1(g, scatter_nd(x, idx, upd),
              {{x, random_array({3, 4}, f32)},
               {idx, Array::from_data(bad, {2, 2}, i64)},
               {upd, random_array({2}, f32)}});
      },
      {"[scatter_nd]", "index -4 out of range for axis 0 of size 3", "(3, 4)", "(2, 2)"});
  expect_error<ShapeError>([&] { scatter_nd(x, idx, g.placeholder({2, 4}, f32, "u")); },
                           {"[scatter_nd]", "(2, 4)", "(2,)"});
  expect_error<ShapeError>([&] { scatter_nd(x, g.placeholder({2, 3}, i64, "i"), upd); },
                           {"[scatter_nd]", "(2, 3)", "(3, 4)"});
}

}  // namespace
}  // namespace kiln
