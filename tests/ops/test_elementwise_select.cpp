// where, isnan, isinf, cast edge cases, and bitcast against std::memcpy.
#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

struct WhereCase { Shape c, x, y, out; };

TEST(Where, BroadcastsAllThree) {
  for (auto s :
       {WhereCase{{3, 4}, {3, 4}, {3, 4}, {3, 4}}, WhereCase{{3, 1}, {1, 4}, {}, {3, 4}},
        WhereCase{{4}, {2, 3, 4}, {3, 1}, {2, 3, 4}}, WhereCase{{}, {5}, {5}, {5}},
        WhereCase{{2, 1, 1}, {1}, {1, 6}, {2, 1, 6}}, WhereCase{{0, 2}, {2}, {}, {0, 2}}}) {
    for (DType t : {f32, f64, i8, i64, f16, boolean}) {
      SCOPED_TRACE(std::string(name(t)) + " " + to_string(s.out));
      Graph g;
      auto c = g.placeholder(s.c, boolean, "c");
      auto x = g.placeholder(s.x, t, "x");
      auto y = g.placeholder(s.y, t, "y");
      Array vc = random_array(s.c, boolean), vx = random_array(s.x, t, -9, 9),
            vy = random_array(s.y, t, -9, 9);
      auto fc = to_f64(vc), fx = to_f64(vx), fy = to_f64(vy);
      std::vector<double> ref;
      for (int64_t i = 0; i < numel(s.out); ++i) {
        auto idx = unravel(i, s.out);
        ref.push_back(fc[broadcast_offset(idx, s.c, s.out)] != 0
                          ? fx[broadcast_offset(idx, s.x, s.out)]
                          : fy[broadcast_offset(idx, s.y, s.out)]);
      }
      Array out = eval1(g, where(c, x, y), {{c, vc}, {x, vx}, {y, vy}});
      EXPECT_EQ(out.dtype(), t);
      expect_equal(out, s.out, ref);
    }
  }
}

TEST(Where, PromotesXAndY) {
  Graph g;
  auto c = g.placeholder({3}, boolean, "c");
  auto x = g.placeholder({3}, i32, "x");
  auto y = g.placeholder({3}, f32, "y");
  auto w = where(c, x, y);
  EXPECT_EQ(w.dtype(), f32);
  Array out = eval1(g, w, {{c, Array::from_vector<double>({1, 0, 1}, {3}).astype(boolean)},
                           {x, Array::from_vector<double>({1, 2, 3}, {3}).astype(i32)},
                           {y, Array::from_vector<double>({0.5, 1.5, 2.5}, {3}).astype(f32)}});
  expect_equal(out, {3}, {1, 1.5, 3});
}

TEST(Where, Errors) {
  Graph g;
  auto x = g.placeholder({2, 3}, f32, "x");
  expect_error<DTypeError>([&] { where(x, x, x); }, {"[where]", "f32", "bool"});
  auto c = g.placeholder({4}, boolean, "c");
  expect_error<ShapeError>([&] { where(c, x, x); }, {"[where]", "(4,)", "(2, 3)"});
}

void check_classify(Tensor (*op)(const Tensor&), bool (*ref)(double), const char* name) {
  const std::vector<double> special{kNaN, kInf, -kInf, 0.0, -1.5, 3e30};
  for (DType t : {f32, f64, f16, bf16}) {
    SCOPED_TRACE(std::string(name) + " " + kiln::name(t));
    Graph g;
    auto x = g.placeholder({6}, t, "x");
    auto y = op(x);
    EXPECT_EQ(y.dtype(), boolean);
    Array v = Array::from_vector(special, {6}).astype(t);
    std::vector<double> expected;
    for (double e : to_f64(v)) expected.push_back(ref(e));
    expect_equal(eval1(g, y, {{x, v}}), {6}, expected);
  }
  for (DType t : {i32, u8}) {  // integers are never NaN or infinite
    Graph g;
    auto x = g.placeholder({2, 5}, t, "x");
    expect_equal(eval1(g, op(x), {{x, random_array({2, 5}, t, 0, 100)}}), {2, 5},
                 std::vector<double>(10, 0.0));
  }
  Graph g;
  auto e = g.placeholder({0, 4}, f32, "e");
  expect_equal(eval1(g, op(e), {{e, Array::empty({0, 4}, f32)}}), {0, 4}, {});
  expect_error<DTypeError>([&] { op(g.placeholder({3}, boolean, "b")); },
                           {std::string("[") + name + "]", "bool"});
}

TEST(IsNan, MatchesReference) {
  check_classify(isnan, [](double x) { return std::isnan(x); }, "isnan");
}
TEST(IsInf, MatchesReference) {
  check_classify(isinf, [](double x) { return std::isinf(x); }, "isinf");
}

TEST(Cast, HalfRoundTripAndEmpty) {
  Graph g;
  auto x = g.placeholder({5}, f16, "x");
  Array v = random_array({5}, f16, -100, 100);
  expect_equal(eval1(g, cast(cast(x, f32), f16), {{x, v}}), {5}, to_f64(v));
  auto e = g.placeholder({0}, i32, "e");
  expect_equal(eval1(g, cast(e, f64), {{e, Array::empty({0}, i32)}}), {0}, {});
}

constexpr DType kAllDTypes[] = {f32, f64, f16, bf16, i8, u8, i16, i32, i64, boolean};

// Fresh random values of t: floats, integers over a wide range, bools.
Array random_of(const Shape& s, DType t) {
  if (is_floating(t)) return random_array(s, t, -1e3, 1e3);
  if (t == u8) return random_array(s, t, 0, 255);
  if (t == boolean) return random_array(s, t);
  return random_array(s, t, t == i8 ? -128 : -30000, t == i8 ? 127 : 30000);
}

// Every pair of dtypes of one element size: the output's bytes are the input's (std::memcpy),
// compared bitwise, so bit patterns that read as NaN in the target compare too.
TEST(Bitcast, EverySameSizePairMatchesMemcpy) {
  int pairs = 0;
  for (DType from : kAllDTypes)
    for (DType to : kAllDTypes) {
      if (size_of(from) != size_of(to)) continue;
      ++pairs;
      for (const Shape& s : {Shape{}, Shape{0, 3}, Shape{7}, Shape{5, 33}, Shape{2, 3, 17}}) {
        SCOPED_TRACE(fmt::format("{} -> {} {}", name(from), name(to), to_string(s)));
        if (to == boolean && from != boolean) continue;  // (bytes of 0 and 1 below)
        Graph g;
        auto x = g.placeholder(s, from, "x");
        Array v = random_of(s, from);
        auto y = bitcast(x, to);
        EXPECT_EQ(y.dtype(), to);
        EXPECT_EQ(y.shape(), s);
        Array want = Array::empty(s, to);
        if (v.nbytes() > 0) std::memcpy(want.data(), v.data(), v.nbytes());
        Array got = eval1(g, y, {{x, v}});
        ASSERT_EQ(got.dtype(), to);
        ASSERT_EQ(got.shape(), s);
        ASSERT_EQ(got.nbytes(), want.nbytes());
        EXPECT_EQ(std::memcmp(got.data(), want.data(), want.nbytes()), 0);
      }
    }
  EXPECT_EQ(pairs, 4 + 4 + 9 + 9);  // f32 i32; f64 i64; f16 bf16 i16; i8 u8 bool
}

// Bytes of 0 and 1 from i8 and u8 read as bool; a computed input (the output a view of an
// intermediate) and a round trip back to the input.
TEST(Bitcast, ToBoolAndThroughComputedValues) {
  for (DType t : {i8, u8}) {
    Graph g;
    auto x = g.placeholder({4, 9}, t, "x");
    Array v = random_ints({4, 9}, 0, 1, t);
    expect_equal(eval1(g, bitcast(x, boolean), {{x, v}}), {4, 9}, to_f64(v));
  }
  Graph g;
  auto x = g.placeholder({6, 5}, f32, "x");
  Array v = random_array({6, 5}, f32, -8, 8);
  auto bits = bitcast(x * 2.0, i32);  // an intermediate's bytes
  auto back = bitcast(bitcast(bits, f32), i32) + bitcast(x, i32) * 0;
  std::vector<Array> out = eval(g, {bitcast(back, f32), bitcast(bitcast(x, i32), f32)}, {{x, v}});
  std::vector<double> twice;
  for (double e : to_f64(v)) twice.push_back(2 * e);
  expect_equal(out[0], {6, 5}, twice);
  expect_equal(out[1], {6, 5}, to_f64(v));
}

TEST(Bitcast, KeepsDynamicDims) {
  Graph g;
  auto x = g.placeholder({-1, 3}, f64, "x");
  auto y = bitcast(x, i64);
  EXPECT_EQ(y.shape(), (Shape{-1, 3}));
  EXPECT_EQ(y.dtype(), i64);
}

TEST(Bitcast, RejectsOtherElementSizes) {
  int bad = 0;
  for (DType from : kAllDTypes)
    for (DType to : kAllDTypes) {
      if (size_of(from) == size_of(to)) continue;
      ++bad;
      Graph g;
      auto x = g.placeholder({2, 3}, from, "x");
      expect_error<DTypeError>(
          [&] { bitcast(x, to); },
          {"[bitcast]", name(from), name(to), fmt::format("{} bytes", size_of(from)),
           fmt::format("{} bytes", size_of(to)), "(2, 3)"});
    }
  EXPECT_EQ(bad, 100 - 26);
}

}  // namespace
}  // namespace kiln
