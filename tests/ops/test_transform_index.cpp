// Indexing ops of the transform family: Gather, GatherElements, ScatterElements, OneHot,
// CoordinateAlongAxis, HammingDistance.
#include <cmath>

#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;

int64_t wrap(double k, int64_t n) {
  return k < 0 ? static_cast<int64_t>(k) + n : static_cast<int64_t>(k);
}

TEST(Gather, NumpyTakeWithNegativeIndices) {
  struct Case {
    Shape x, idx;
    int64_t axis;
  };
  for (auto c : {Case{{3, 5, 4}, {2, 3}, 1}, Case{{3, 5, 4}, {7}, -1}, Case{{6}, {}, 0},
                 Case{{4, 3}, {0}, 0}, Case{{2, 1, 3}, {4, 1}, -2}}) {
    for (DType t : {f32, i64, boolean, f16, u8}) {
      for (DType it : {i32, i64, i8}) {
        Graph g;
        auto x = g.placeholder(c.x, t, "x");
        auto idx = g.placeholder(c.idx, it, "idx");
        const int axis = static_cast<int>(c.axis < 0 ? c.axis + c.x.size() : c.axis);
        const int64_t n = c.x[axis];
        Array vx = random_array(c.x, t, -50, 50), vi = random_ints(c.idx, -n, n - 1, it);
        Array y = eval1(g, gather(x, idx, c.axis), {{x, vx}, {idx, vi}});
        Shape out(c.x.begin(), c.x.begin() + axis);
        out.insert(out.end(), c.idx.begin(), c.idx.end());
        out.insert(out.end(), c.x.begin() + axis + 1, c.x.end());
        const auto fx = to_f64(vx), fi = to_f64(vi);
        std::vector<double> ref;
        for (int64_t i = 0; i < numel(out); ++i) {
          const auto o = unravel(i, out);
          std::vector<int64_t> src(o.begin(), o.begin() + axis);
          const std::vector<int64_t> io(o.begin() + axis, o.begin() + axis + c.idx.size());
          src.push_back(wrap(fi[ravel(io, c.idx)], n));
          src.insert(src.end(), o.begin() + axis + c.idx.size(), o.end());
          ref.push_back(fx[ravel(src, c.x)]);
        }
        expect_equal(y, out, ref);
      }
    }
  }
}

TEST(Gather, ErrorsNameOpAndShapes) {
  Graph g;
  auto x = g.placeholder({2, 5}, f32, "x");
  auto idx = g.placeholder({3}, i32, "idx");
  auto y = gather(x, idx, 1);
  const int32_t bad[] = {1, 7, -9};
  expect_error<ValueError>(
      [&] {
        eval1(g, y, {{x, random_array({2, 5}, f32)}, {idx, Array::from_data(bad, {3}, i32)}});
      },
      {"[gather]", "index 7 out of range for axis 1 of size 5", "(2, 5)", "(3,)"});
  expect_error<ValueError>([&] { gather(x, idx, 2); }, {"[gather]", "axis 2", "(2, 5)"});
  expect_error<DTypeError>([&] { gather(x, g.placeholder({3}, f32, "f"), 0); },
                           {"[gather]", "f32"});
}

TEST(Gather, LargeReportsFirstBadIndexByPosition) {
  Graph g;
  auto x = g.placeholder({1000, 64}, f32, "x");
  auto idx = g.placeholder({5000}, i64, "idx");
  Array vi = random_ints({5000}, -1000, 999);
  vi.data<int64_t>()[4000] = 1000;
  vi.data<int64_t>()[1200] = -1001;
  expect_error<ValueError>(
      [&] {
        eval1(g, gather(x, idx), {{x, random_array({1000, 64}, f32)}, {idx, vi}});
      },
      {"[gather]", "index -1001 out of range for axis 0 of size 1000"});
}

// x[..., wrap(idx), ...] along axis at every index position.
std::vector<double> ref_gather_elements(const Array& x, const Array& idx, int axis) {
  const auto fx = to_f64(x), fi = to_f64(idx);
  std::vector<double> r;
  for (int64_t i = 0; i < idx.numel(); ++i) {
    auto o = unravel(i, idx.shape());
    o[axis] = wrap(fi[i], x.shape()[axis]);
    r.push_back(fx[ravel(o, x.shape())]);
  }
  return r;
}

TEST(GatherElements, MatchesReference) {
  struct Case {
    Shape x, idx;
    int axis;
  };
  for (auto c : {Case{{4, 5, 3}, {4, 7, 3}, 1}, Case{{4, 5, 3}, {2, 3, 1}, -1}, Case{{6}, {9}, 0},
                 Case{{3, 4}, {3, 0}, 1}}) {
    for (DType t : {f64, i32, boolean, bf16}) {
      Graph g;
      auto x = g.placeholder(c.x, t, "x");
      auto idx = g.placeholder(c.idx, i64, "idx");
      const int axis = c.axis < 0 ? c.axis + static_cast<int>(c.x.size()) : c.axis;
      const int64_t n = c.x[axis];
      Array vx = random_array(c.x, t, -50, 50), vi = random_ints(c.idx, -n, n - 1);
      Array y = eval1(g, gather_elements(x, idx, c.axis), {{x, vx}, {idx, vi}});
      expect_equal(y, c.idx, ref_gather_elements(vx, vi, axis));
    }
  }
}

TEST(GatherElements, ErrorsNameOpAndShapes) {
  Graph g;
  auto x = g.placeholder({2, 3}, f32, "x");
  expect_error<ShapeError>([&] { gather_elements(x, g.placeholder({2}, i64, "i"), 0); },
                           {"[gather_elements]", "(2,)", "(2, 3)"});
  expect_error<ShapeError>(
      [&] {
        gather_elements(x, g.placeholder({3, 3}, i64, "j"), 1);
      },
      {"[gather_elements]", "(3, 3)", "(2, 3)"});
  auto idx = g.placeholder({2, 2}, i64, "idx");
  const int64_t bad[] = {0, 1, 2, 3};
  expect_error<ValueError>(
      [&] {
        eval1(g, gather_elements(x, idx, 1),
              {{x, random_array({2, 3}, f32)}, {idx, Array::from_data(bad, {2, 2}, i64)}});
      },
      {"[gather_elements]", "index 3 out of range for axis 1 of size 3"});
}

TEST(ScatterElements, AllReductionsWithDuplicates) {
  const Shape sx{4, 5, 3}, si{4, 6, 2};
  const ScatterReduction kinds[] = {ScatterReduction::none, ScatterReduction::add,
                                    ScatterReduction::mul, ScatterReduction::max,
                                    ScatterReduction::min};
  for (ScatterReduction r : kinds) {
    for (DType t : {f32, f64, i32, f16}) {
      Graph g;
      auto x = g.placeholder(sx, t, "x");
      auto idx = g.placeholder(si, i32, "idx");
      auto upd = g.placeholder(si, t, "upd");
      // 6 indices into 5 slots: duplicates are certain
      Array vx = random_array(sx, t, -4, 4), vi = random_ints(si, -5, 4, i32),
            vu = random_array(si, t, -4, 4);
      Array y = eval1(g, scatter_elements(x, idx, upd, 1, r), {{x, vx}, {idx, vi}, {upd, vu}});
      auto ref = to_f64(vx);
      const auto fi = to_f64(vi), fu = to_f64(vu);
      for (int64_t i = 0; i < numel(si); ++i) {
        auto o = unravel(i, si);
        o[1] = wrap(fi[i], 5);
        double& d = ref[ravel(o, sx)];
        switch (r) {
          case ScatterReduction::none:
            d = fu[i];
            break;
          case ScatterReduction::add:
            d += fu[i];
            break;
          case ScatterReduction::mul:
            d *= fu[i];
            break;
          case ScatterReduction::max:
            d = std::max(d, fu[i]);
            break;
          case ScatterReduction::min:
            d = std::min(d, fu[i]);
            break;
        }
      }
      // f16 rounds each partial result of add/mul, so compare loosely there
      const bool rounded = t == f16 && (r == ScatterReduction::add || r == ScatterReduction::mul);
      expect_close(y, sx, ref, rounded ? 2e-2 : 1e-6, rounded ? 5e-2 : 1e-6);
    }
  }
}

TEST(ScatterElements, LargeLinesRunInParallel) {
  const Shape sx{300, 200}, si{250, 500};
  Graph g;
  auto x = g.placeholder(sx, i64, "x");
  auto idx = g.placeholder(si, i32, "idx");
  auto upd = g.placeholder(si, i64, "upd");
  Array vx = random_ints(sx, -9, 9), vi = random_ints(si, -200, 199, i32),
        vu = random_ints(si, -9, 9);
  Array y = eval1(g, scatter_elements(x, idx, upd, -1, ScatterReduction::add),
                  {{x, vx}, {idx, vi}, {upd, vu}});
  auto ref = to_f64(vx);
  const auto fi = to_f64(vi), fu = to_f64(vu);
  for (int64_t i = 0; i < numel(si); ++i) {
    auto o = unravel(i, si);
    o[1] = wrap(fi[i], 200);
    ref[ravel(o, sx)] += fu[i];
  }
  expect_equal(y, sx, ref);
}

TEST(ScatterElements, ErrorsNameOpAndShapes) {
  Graph g;
  auto x = g.placeholder({3, 4}, f32, "x");
  auto idx = g.placeholder({2, 2}, i64, "idx");
  expect_error<ShapeError>(
      [&] {
        scatter_elements(x, idx, g.placeholder({2, 3}, f32, "u"), 0);
      },
      {"[scatter_elements]", "(2, 3)", "(2, 2)"});
  auto upd = g.placeholder({2, 2}, f32, "upd");
  const int64_t bad[] = {0, 1, -5, 2};
  expect_error<ValueError>(
      [&] {
        eval1(g, scatter_elements(x, idx, upd, 0, ScatterReduction::add),
              {{x, random_array({3, 4}, f32)},
               {idx, Array::from_data(bad, {2, 2}, i64)},
               {upd, random_array({2, 2}, f32)}});
      },
      {"[scatter_elements]", "index -5 out of range for axis 0 of size 3"});
}

TEST(OneHot, AxesDtypesAndOutOfRange) {
  struct Case {
    Shape idx;
    int64_t axis;
    Shape out;
  };
  for (auto c : {Case{{3, 4}, -1, {3, 4, 5}}, Case{{3, 4}, 0, {5, 3, 4}},
                 Case{{3, 4}, 1, {3, 5, 4}}, Case{{}, -1, {5}}, Case{{0}, 0, {5, 0}}}) {
    for (DType it : {i32, i64, u8}) {
      for (DType t : {f32, i64, boolean, bf16}) {
        Graph g;
        auto idx = g.placeholder(c.idx, it, "idx");
        Array vi = random_ints(c.idx, it == u8 ? 0 : -2, 7, it);  // outside [0, 5): all off
        Array y = eval1(g, one_hot(idx, 5, c.axis, t, 3, -2), {{idx, vi}});
        const int axis = static_cast<int>(c.axis < 0 ? c.axis + c.out.size() : c.axis);
        const auto fi = to_f64(vi);
        std::vector<double> ref;
        for (int64_t i = 0; i < numel(c.out); ++i) {
          auto o = unravel(i, c.out);
          const int64_t d = o[axis];
          o.erase(o.begin() + axis);
          const bool on = fi[ravel(o, c.idx)] == d;
          ref.push_back(t == boolean ? 1 : on ? 3 : -2);
        }
        expect_equal(y, c.out, ref);
      }
    }
  }
  Graph g;
  auto idx = g.placeholder({2}, f32, "idx");
  expect_error<DTypeError>([&] { one_hot(idx, 3); }, {"[one_hot]", "f32", "(2,)"});
  expect_error<ValueError>([&] { one_hot(g.placeholder({2}, i32, "i"), 3, 2); },
                           {"[one_hot]", "axis 2"});
}

TEST(CoordinateAlongAxis, EachAxisAndDtype) {
  for (Shape s : {Shape{3, 4, 5}, Shape{1, 7}, Shape{4}, Shape{2, 0, 3}}) {
    for (int64_t axis = -static_cast<int64_t>(s.size()); axis < static_cast<int64_t>(s.size());
         ++axis) {
      for (DType t : {i32, i64, f32, f16}) {
        Graph g;
        auto x = g.placeholder(s, boolean, "x");
        Array y = eval1(g, coordinate_along_axis(x, axis, t), {{x, random_array(s, boolean)}});
        EXPECT_EQ(y.dtype(), t);
        const int a = static_cast<int>(axis < 0 ? axis + static_cast<int64_t>(s.size()) : axis);
        std::vector<double> ref;
        for (int64_t i = 0; i < numel(s); ++i) ref.push_back(static_cast<double>(unravel(i, s)[a]));
        expect_equal(y, s, ref);
      }
    }
  }
  Graph g;
  auto x = g.placeholder({2, 3}, f32, "x");
  expect_error<ValueError>([&] { coordinate_along_axis(x, 2); },
                           {"[coordinate_along_axis]", "axis 2", "(2, 3)"});
  expect_error<DTypeError>([&] { coordinate_along_axis(x, 0, boolean); },
                           {"[coordinate_along_axis]", "bool", "(2, 3)"});
}

int popcount_ref(uint64_t v, int bits) {
  int c = 0;
  for (int b = 0; b < bits; ++b) c += (v >> b) & 1;
  return c;
}

TEST(HammingDistance, BroadcastsLeadingDims) {
  struct Case {
    Shape a, b, out;
  };
  for (auto c : {Case{{3, 1, 4}, {5, 4}, {3, 5}}, Case{{6}, {6}, {}}, Case{{2, 3}, {1, 3}, {2}},
                 Case{{2, 0}, {2, 0}, {2}}}) {
    for (DType t : {i8, u8, i16, i32, i64}) {
      for (DType out : {i32, i64, f32}) {
        Graph g;
        auto a = g.placeholder(c.a, t, "a");
        auto b = g.placeholder(c.b, t, "b");
        const double lo = is_signed(t) ? -100 : 0;
        Array va = random_array(c.a, t, lo, 100), vb = random_array(c.b, t, lo, 100);
        if (t == i64) {
          va = random_ints(c.a, -(int64_t{1} << 62), int64_t{1} << 62);
          vb = random_ints(c.b, -(int64_t{1} << 62), int64_t{1} << 62);
        }
        Array y = eval1(g, hamming_distance(a, b, out), {{a, va}, {b, vb}});
        EXPECT_EQ(y.dtype(), out);
        const auto ia = va.astype(i64).to_vector<int64_t>(),
                   ib = vb.astype(i64).to_vector<int64_t>();
        const int64_t n = c.a.back();
        const int bits = static_cast<int>(size_of(t) * 8);
        const Shape la(c.a.begin(), c.a.end() - 1), lb(c.b.begin(), c.b.end() - 1);
        std::vector<double> ref;
        for (int64_t i = 0; i < numel(c.out); ++i) {
          const auto o = unravel(i, c.out);
          const int64_t oa = broadcast_offset(o, la, c.out), ob = broadcast_offset(o, lb, c.out);
          int d = 0;
          for (int64_t k = 0; k < n; ++k)
            d += popcount_ref(static_cast<uint64_t>(ia[oa * n + k] ^ ib[ob * n + k]), bits);
          ref.push_back(d);
        }
        expect_equal(y, c.out, ref);
      }
    }
  }
}

TEST(HammingDistance, ErrorsNameOpAndShapes) {
  Graph g;
  auto a = g.placeholder({2, 4}, i32, "a");
  expect_error<ShapeError>(
      [&] {
        hamming_distance(a, g.placeholder({2, 3}, i32, "b"));
      },
      {"[hamming_distance]", "(2, 4)", "(2, 3)"});
  expect_error<DTypeError>(
      [&] {
        hamming_distance(a, g.placeholder({2, 4}, f32, "c"));
      },
      {"[hamming_distance]", "f32"});
  expect_error<DTypeError>(
      [&] {
        hamming_distance(a, g.placeholder({2, 4}, i64, "d"));
      },
      {"[hamming_distance]", "i32", "i64"});
}

}  // namespace
}  // namespace kiln
