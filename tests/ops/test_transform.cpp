// Layout ops of the transform family: Reshape (+ expand_dims, squeeze), Transpose (+ permute),
// Split, Concat (+ stack), Slice, Pad, Tile, BroadcastTo, Flip. They move data, so results must
// equal the reference exactly for every dtype, f16/bf16 and bool included.
#include <algorithm>
#include <limits>

#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;

const DType kMoveTypes[] = {f32, f64, i64, i32, i16, u8, boolean, f16, bf16};
constexpr int64_t kBig = std::numeric_limits<int64_t>::max();

// out[idx] = x[src(idx)], or `fill` where src gives a negative first index.
template <typename F>
std::vector<double> ref_map(const Array& x, const Shape& out, F src, double fill = 0) {
  const auto v = to_f64(x);
  std::vector<double> r(static_cast<size_t>(numel(out)));
  for (int64_t i = 0; i < numel(out); ++i) {
    const std::vector<int64_t> s = src(unravel(i, out));
    r[i] = !s.empty() && s[0] < 0 ? fill : v[ravel(s, x.shape())];
  }
  return r;
}

Array run1(const Shape& shape, DType t, const std::function<Tensor(const Tensor&)>& f, Array* in) {
  Graph g;
  auto x = g.placeholder(shape, t, "x");
  *in = random_array(shape, t, -100, 100);
  return eval1(g, f(x), {{x, *in}});
}

TEST(Reshape, InfersMinusOneForEveryDtype) {
  struct Case {
    Shape in, want, out;
  };
  for (auto c :
       {Case{{2, 3, 4}, {4, -1}, {4, 6}}, Case{{2, 3, 4}, {-1}, {24}},
        Case{{6}, {1, -1, 1, 2}, {1, 3, 1, 2}}, Case{{}, {1, 1}, {1, 1}}, Case{{1, 1}, {}, {}},
        Case{{0, 3}, {-1, 3}, {0, 3}}, Case{{0, 3}, {3, 0}, {3, 0}}}) {
    for (DType t : kMoveTypes) {
      Array x;
      Array y = run1(
          c.in, t, [&](const Tensor& v) { return reshape(v, c.want); }, &x);
      EXPECT_EQ(y.dtype(), t);
      expect_equal(y, c.out, to_f64(x));
    }
  }
}

TEST(Reshape, ViewOfIntermediateAndCopyAsOutput) {
  for (bool plan : {true, false}) {
    Graph g;
    auto x = g.placeholder({4, 6}, f32, "x");
    auto r = reshape(x * 2.0, {3, 8});  // a view of the product's buffer when planned
    auto s = reshape(r, {24});          // a graph output: copied out
    Array v = random_array({4, 6}, f32);
    CompileOptions opts;
    opts.plan_memory = plan;
    auto outs = eval(g, {reshape(r + 1.0, {2, 12}), s}, {{x, v}}, opts);
    std::vector<double> plus, twice;
    for (double e : to_f64(v)) {
      plus.push_back(e * 2 + 1);
      twice.push_back(e * 2);
    }
    expect_close(outs[0], {2, 12}, plus);
    expect_close(outs[1], {24}, twice);
  }
}

TEST(Reshape, SharesItsInputBuffer) {
  Graph g;
  auto x = g.placeholder({4, 6}, f32, "x");
  auto y = reshape(x * 2.0, {24}) + 1.0;
  Executable exe = g.compile(Device::cpu(), {}, {y});
  // one 96-byte intermediate (64-byte aligned): the product and its reshape share it
  EXPECT_EQ(exe.peak_intermediate_bytes(), 128u);
}

TEST(Reshape, DynamicDimsResolveAtCompile) {
  Graph g;
  auto x = g.placeholder({-1, -1, 4}, f32, "x");
  auto y = reshape(x, {-1, 2});
  EXPECT_EQ(y.shape(), (Shape{-1, 2}));
  auto e = expand_dims(x, {0, -1});
  EXPECT_EQ(e.shape(), (Shape{1, -1, -1, 4, 1}));
  auto s = squeeze(e, {0});
  Array v = random_array({3, 5, 4}, f32);
  auto outs = eval(g, {y, e, s}, {{x, v}});
  expect_equal(outs[0], {30, 2}, to_f64(v));
  expect_equal(outs[1], {1, 3, 5, 4, 1}, to_f64(v));
  expect_equal(outs[2], {3, 5, 4, 1}, to_f64(v));
}

TEST(Reshape, ExpandDimsAndSqueeze) {
  Graph g;
  auto x = g.placeholder({3, 1, 4, 1}, bf16, "x");
  EXPECT_EQ(squeeze(x).shape(), (Shape{3, 4}));
  EXPECT_EQ(squeeze(x, {-1}).shape(), (Shape{3, 1, 4}));
  EXPECT_EQ(expand_dims(x, {0, 2}).shape(), (Shape{1, 3, 1, 1, 4, 1}));
  EXPECT_EQ(expand_dims(x, {-1}).shape(), (Shape{3, 1, 4, 1, 1}));
  Array v = random_array({3, 1, 4, 1}, bf16);
  expect_equal(eval1(g, squeeze(expand_dims(x, {1}), {}), {{x, v}}), {3, 4}, to_f64(v));
  expect_error<ShapeError>([&] { squeeze(x, {0}); }, {"[squeeze]", "axis 0", "(3, 1, 4, 1)"});
  expect_error<ValueError>([&] { expand_dims(x, {6}); }, {"[expand_dims]", "(3, 1, 4, 1)"});
}

TEST(Reshape, ErrorsNameOpAndShapes) {
  Graph g;
  auto x = g.placeholder({2, 3}, f32, "x");
  expect_error<ShapeError>([&] { reshape(x, {4, 2}); }, {"[reshape]", "(2, 3)", "(4, 2)"});
  expect_error<ShapeError>([&] { reshape(x, {4, -1}); }, {"[reshape]", "(2, 3)", "(4, -1)"});
  expect_error<ValueError>([&] { reshape(x, {-1, -1}); }, {"[reshape]", "more than one -1"});
  auto d = g.placeholder({-1, 3}, f32, "d");
  auto y = reshape(d, {5, 2});  // checked when the shape is known
  expect_error<ShapeError>(
      [&] {
        eval1(g, y, {{d, random_array({3, 3}, f32)}});
      },
      {"[reshape]", "(3, 3)", "(5, 2)"});
}

TEST(Transpose, MatchesReferenceForAllPaths) {
  struct Case {
    Shape in;
    std::vector<int64_t> perm;
  };
  // small, tiled (large strided last dim), row-copy, size-1 dims, empty, scalar, NCHW <-> NHWC
  for (auto c : {Case{{2, 3}, {1, 0}}, Case{{3, 67, 45}, {0, 2, 1}}, Case{{70, 130}, {-1, -2}},
                 Case{{2, 3, 4, 5}, {3, 1, 0, 2}}, Case{{4, 3, 5}, {1, 0, 2}},
                 Case{{1, 5, 1, 3}, {2, 3, 0, 1}}, Case{{0, 3}, {1, 0}}, Case{{}, {}},
                 Case{{33, 1, 40}, {2, 1, 0}},
                 // an image's channels moving last (CUDA's short-last-dim kernel) and back
                 Case{{2, 3, 17, 19}, {0, 2, 3, 1}}, Case{{2, 17, 19, 3}, {0, 3, 1, 2}}}) {
    for (DType t : kMoveTypes) {
      Array x;
      Array y = run1(
          c.in, t, [&](const Tensor& v) { return permute(v, c.perm); }, &x);
      Shape out;
      std::vector<int64_t> perm;
      for (int64_t p : c.perm) perm.push_back(p < 0 ? p + static_cast<int64_t>(c.in.size()) : p);
      for (int64_t p : perm) out.push_back(c.in[p]);
      expect_equal(y, out, ref_map(x, out, [&](const std::vector<int64_t>& o) {
                     std::vector<int64_t> s(o.size());
                     for (size_t d = 0; d < o.size(); ++d) s[perm[d]] = o[d];
                     return s;
                   }));
    }
  }
}

TEST(Transpose, LargeRunsInParallel) {
  struct Case {
    Shape in;
    std::vector<int64_t> perm;
    DType t;
  };
  for (auto c : {Case{{3, 257, 300}, {0, 2, 1}, f32}, Case{{2, 64, 3, 50}, {3, 1, 2, 0}, u8},
                 Case{{300, 2, 129}, {2, 0, 1}, i64}}) {
    Array x;
    Array y = run1(
        c.in, c.t, [&](const Tensor& v) { return permute(v, c.perm); }, &x);
    Shape out;
    for (int64_t p : c.perm) out.push_back(c.in[p]);
    expect_equal(y, out, ref_map(x, out, [&](const std::vector<int64_t>& o) {
                   std::vector<int64_t> s(o.size());
                   for (size_t d = 0; d < o.size(); ++d) s[c.perm[d]] = o[d];
                   return s;
                 }));
  }
}

TEST(Transpose, EmptyPermReversesAndErrors) {
  Graph g;
  auto x = g.placeholder({2, 3, 4}, i32, "x");
  EXPECT_EQ(transpose(x).shape(), (Shape{4, 3, 2}));
  expect_error<ValueError>(
      [&] {
        transpose(x, {0, 0, 1});
      },
      {"[transpose]", "(0, 0, 1)", "(2, 3, 4)"});
  expect_error<ValueError>([&] { permute(x, {1, 0}); }, {"[transpose]", "(1, 0)", "(2, 3, 4)"});
}

TEST(Split, PartsAndSizes) {
  for (DType t : {f32, i64, boolean, f16}) {
    Graph g;
    auto x = g.placeholder({4, 6, 3}, t, "x");
    Array v = random_array({4, 6, 3}, t, -9, 9);
    auto parts = split(x, 3, -2);
    auto sized = split(x, std::vector<int64_t>{1, 0, 3}, 0);
    std::vector<Tensor> all = parts;
    all.insert(all.end(), sized.begin(), sized.end());
    auto outs = eval(g, all, {{x, v}});
    for (int k = 0; k < 3; ++k)
      expect_equal(outs[k], {4, 2, 3}, ref_map(v, {4, 2, 3}, [&](std::vector<int64_t> o) {
                     o[1] += 2 * k;
                     return o;
                   }));
    const int64_t begin[] = {0, 1, 1}, len[] = {1, 0, 3};
    for (int k = 0; k < 3; ++k)
      expect_equal(outs[3 + k], {len[k], 6, 3},
                   ref_map(v, {len[k], 6, 3}, [&](std::vector<int64_t> o) {
                     o[0] += begin[k];
                     return o;
                   }));
  }
}

TEST(Split, DynamicDimsResolveAtCompile) {
  Graph g;
  auto x = g.placeholder({-1, 6}, i32, "x");
  auto parts = split(x, 2, 0);
  auto joined = concat({parts[1], parts[0]}, 0);
  auto padded = pad(joined, {1, 0, 0, 2});
  EXPECT_EQ(parts[0].shape(), (Shape{-1, 6}));
  EXPECT_EQ(joined.shape(), (Shape{-1, 6}));
  EXPECT_EQ(padded.shape(), (Shape{-1, 8}));
  Array v = random_array({4, 6}, i32, -9, 9);
  expect_equal(eval1(g, padded, {{x, v}}), {5, 8}, ref_map(v, {5, 8}, [](std::vector<int64_t> o) {
                 if (o[0] == 0 || o[1] >= 6) return std::vector<int64_t>{-1};
                 return std::vector<int64_t>{(o[0] + 1) % 4, o[1]};
               }));
  expect_error<ShapeError>(
      [&] {
        eval1(g, parts[0], {{x, random_array({3, 6}, i32)}});
      },
      {"[split]", "(3, 6)", "2 equal parts"});
}

TEST(Split, ErrorsNameOpAndShapes) {
  Graph g;
  auto x = g.placeholder({2, 5}, f32, "x");
  expect_error<ShapeError>([&] { split(x, 3, 1); }, {"[split]", "(2, 5)", "3 equal parts"});
  expect_error<ShapeError>(
      [&] {
        split(x, std::vector<int64_t>{1, 2}, 1);
      },
      {"[split]", "(1, 2)", "(2, 5)"});
  expect_error<ValueError>([&] { split(x, 1, 2); }, {"[split]", "axis 2", "(2, 5)"});
}

TEST(Concat, MatchesReferenceAndPromotes) {
  for (DType t : {f64, i16, u8, boolean, bf16}) {
    Graph g;
    Shape sa{2, 3, 4}, sb{2, 1, 4}, sc{2, 0, 4};
    auto a = g.placeholder(sa, t, "a");
    auto b = g.placeholder(sb, t, "b");
    auto c = g.placeholder(sc, t, "c");
    Array va = random_array(sa, t, 0, 50), vb = random_array(sb, t, 0, 50),
          vc = random_array(sc, t);
    Array y = eval1(g, concat({a, c, b}, -2), {{a, va}, {b, vb}, {c, vc}});
    auto fa = to_f64(va), fb = to_f64(vb);
    std::vector<double> ref;
    for (int64_t i = 0; i < 2 * 4 * 4; ++i) {
      auto idx = unravel(i, {2, 4, 4});
      ref.push_back(idx[1] < 3 ? fa[ravel(idx, sa)] : fb[ravel({idx[0], 0, idx[2]}, sb)]);
    }
    expect_equal(y, {2, 4, 4}, ref);
  }
  Graph g;
  auto a = g.placeholder({2}, i32, "a");
  auto b = g.placeholder({3}, f32, "b");
  EXPECT_EQ(concat({a, b}).dtype(), f32);
}

TEST(Concat, StackInsertsAxis) {
  Graph g;
  auto a = g.placeholder({2, 3}, f16, "a");
  auto b = g.placeholder({2, 3}, f16, "b");
  Array va = random_array({2, 3}, f16), vb = random_array({2, 3}, f16);
  Array y = eval1(g, stack({a, b}, -1), {{a, va}, {b, vb}});
  auto fa = to_f64(va), fb = to_f64(vb);
  std::vector<double> ref;
  for (int64_t i = 0; i < 6; ++i) {
    ref.push_back(fa[i]);
    ref.push_back(fb[i]);
  }
  expect_equal(y, {2, 3, 2}, ref);
  expect_error<ShapeError>(
      [&] {
        stack({a, g.placeholder({3, 2}, f16, "c")});
      },
      {"[stack]", "(3, 2)", "(2, 3)"});
}

TEST(Concat, ErrorsNameOpAndShapes) {
  Graph g;
  auto a = g.placeholder({2, 3}, f32, "a");
  auto b = g.placeholder({3, 4}, f32, "b");
  expect_error<ShapeError>([&] { concat({a, b}, 1); }, {"[concat]", "(2, 3)", "(3, 4)"});
  expect_error<ShapeError>(
      [&] {
        concat({a, g.placeholder({2}, f32, "c")}, 0);
      },
      {"[concat]", "(2, 3)", "(2,)"});
  expect_error<ValueError>([&] { concat({a, a}, -3); }, {"[concat]", "axis -3", "(2, 3)"});
}

// Python's slice(start, stop, step).indices(n), enumerated.
std::vector<int64_t> py_slice(int64_t n, int64_t start, int64_t stop, int64_t step) {
  const int64_t lower = step > 0 ? 0 : -1, upper = step > 0 ? n : n - 1;
  auto fix = [&](int64_t v) { return v < 0 ? std::max(v + n, lower) : std::min(v, upper); };
  std::vector<int64_t> r;
  for (int64_t i = fix(start); step > 0 ? i < fix(stop) : i > fix(stop); i += step) r.push_back(i);
  return r;
}

TEST(Slice, RandomPythonSlices) {
  std::uniform_int_distribution<int64_t> bound(-9, 9), stepd(-3, 3);
  for (int trial = 0; trial < 60; ++trial) {
    const Shape in = trial % 3 == 0 ? Shape{7} : trial % 3 == 1 ? Shape{4, 6} : Shape{3, 1, 5};
    std::vector<int64_t> starts, stops, steps, axes;
    for (size_t d = 0; d < in.size(); ++d) {
      if (trial % 4 == 0 && d == 0) continue;  // an axis left whole
      int64_t st = 0;
      while (st == 0) st = stepd(rng());
      starts.push_back(trial % 7 == 0 ? kBig : bound(rng()));
      stops.push_back(trial % 5 == 0 ? -kBig - 1 : bound(rng()));
      steps.push_back(st);
      axes.push_back(static_cast<int64_t>(d) - static_cast<int64_t>(in.size()));  // negative
    }
    const DType t = kMoveTypes[trial % 9];
    Array x;
    Array y = run1(
        in, t, [&](const Tensor& v) { return slice(v, starts, stops, steps, axes); }, &x);
    std::vector<std::vector<int64_t>> pos(in.size());
    for (size_t d = 0; d < in.size(); ++d) pos[d] = py_slice(in[d], 0, in[d], 1);
    const size_t skip = in.size() - starts.size();
    for (size_t i = 0; i < starts.size(); ++i)
      pos[skip + i] = py_slice(in[skip + i], starts[i], stops[i], steps[i]);
    Shape out;
    for (auto& p : pos) out.push_back(static_cast<int64_t>(p.size()));
    expect_equal(y, out, ref_map(x, out, [&](const std::vector<int64_t>& o) {
                   std::vector<int64_t> s(o.size());
                   for (size_t d = 0; d < o.size(); ++d) s[d] = pos[d][o[d]];
                   return s;
                 }));
  }
}

TEST(Slice, DynamicDimAndErrors) {
  Graph g;
  auto x = g.placeholder({-1, 4}, i32, "x");
  auto y = slice(x, {-2, 1}, {kBig, -1});
  EXPECT_EQ(y.shape(), (Shape{-1, 2}));
  Array v = random_array({5, 4}, i32, -9, 9);
  expect_equal(eval1(g, y, {{x, v}}), {2, 2}, ref_map(v, {2, 2}, [](std::vector<int64_t> o) {
                 return std::vector<int64_t>{o[0] + 3, o[1] + 1};
               }));
  expect_error<ValueError>([&] { slice(x, {0}, {2}, {0}); }, {"[slice]", "step 0", "(?, 4)"});
  expect_error<ValueError>([&] { slice(x, {0}, {2}, {1}, {2}); }, {"[slice]", "axis 2", "(?, 4)"});
  expect_error<ValueError>([&] { slice(x, {0, 1}, {2}); }, {"[slice]", "(?, 4)"});
}

// numpy.pad index lists for one dim (pads >= 0), then negative pads crop.
std::vector<int64_t> pad_positions(int64_t n, int64_t b, int64_t e, PadKind kind) {
  std::vector<int64_t> r;
  auto outside = [&](int64_t k, bool front) -> int64_t {  // k-th element away from the edge
    if (kind == PadKind::constant) return -1;
    if (kind == PadKind::edge) return front ? 0 : n - 1;
    return front ? k : n - 1 - k;
  };
  for (int64_t k = std::max<int64_t>(b, 0); k >= 1; --k) r.push_back(outside(k, true));
  for (int64_t i = 0; i < n; ++i) r.push_back(i);
  for (int64_t k = 1; k <= e; ++k) r.push_back(outside(k, false));
  if (b < 0) r.erase(r.begin(), r.begin() + std::min<int64_t>(-b, r.size()));
  if (e < 0) r.resize(r.size() - std::min<int64_t>(-e, r.size()));
  return r;
}

TEST(Pad, AllModesWithCropping) {
  std::uniform_int_distribution<int64_t> pd(-2, 3);
  for (PadKind kind : {PadKind::constant, PadKind::reflect, PadKind::edge}) {
    for (int trial = 0; trial < 15; ++trial) {
      // (the last two: channels last, unpadded, as a conv's NHWC input is padded: whole runs of
      // rows copied at once, over planes split between threads in the larger one)
      const Shape in = trial >= 13 ? (trial == 13 ? Shape{2, 9, 7, 16} : Shape{1, 70, 66, 32})
                       : trial % 2 ? Shape{4, 5}
                                   : Shape{2, 4, 1, 3};
      std::vector<int64_t> pads;
      for (int64_t n : in)
        for (int k = 0; k < 2; ++k) {
          const int64_t p = kind == PadKind::reflect ? std::min(pd(rng()), n - 1) : pd(rng());
          pads.push_back(std::max(p, -(n / 2)));  // crop at most the whole dim
        }
      if (trial >= 13) pads[pads.size() - 1] = pads[pads.size() - 2] = 0;
      const DType t = kMoveTypes[trial % 9];
      Array x;
      Array y = run1(
          in, t, [&](const Tensor& v) { return pad(v, pads, kind, 1.5); }, &x);
      std::vector<std::vector<int64_t>> pos;
      Shape out;
      for (size_t d = 0; d < in.size(); ++d) {
        pos.push_back(pad_positions(in[d], pads[2 * d], pads[2 * d + 1], kind));
        out.push_back(static_cast<int64_t>(pos.back().size()));
      }
      const double fill = is_floating(t) ? 1.5 : 1;
      expect_equal(y, out,
                   ref_map(
                       x, out,
                       [&](const std::vector<int64_t>& o) {
                         std::vector<int64_t> s(o.size());
                         for (size_t d = 0; d < o.size(); ++d) {
                           s[d] = pos[d][o[d]];
                           if (s[d] < 0) return std::vector<int64_t>{-1};
                         }
                         return s;
                       },
                       fill));
    }
  }
}

TEST(Pad, EmptyAndScalar) {
  Array x;
  expect_equal(run1(
                   {0, 2}, f32,
                   [](const Tensor& v) {
                     return pad(v, {1, 1, 0, 1}, PadKind::constant, 7);
                   },
                   &x),
               {2, 3}, std::vector<double>(6, 7.0));
  Array y = run1(
      {}, i64, [](const Tensor& v) { return pad(v, std::vector<int64_t>{}); }, &x);
  expect_equal(y, {}, to_f64(x));
}

TEST(Pad, ErrorsNameOpAndShapes) {
  Graph g;
  auto x = g.placeholder({2, 3}, f32, "x");
  expect_error<ValueError>([&] { pad(x, {1, 1}); }, {"[pad]", "(2, 3)", "4"});
  expect_error<ValueError>(
      [&] {
        pad(x, {2, 0, 0, 0}, PadKind::reflect);
      },
      {"[pad]", "reflect", "(2, 3)"});
  expect_error<ShapeError>([&] { pad(x, {-2, -1, 0, 0}); }, {"[pad]", "(2, 3)"});
  expect_error<ValueError>(
      [&] {
        pad(g.placeholder({0}, f32, "e"), {1, 0}, PadKind::edge);
      },
      {"[pad]", "edge", "(0,)"});
}

TEST(Tile, MatchesNumpy) {
  struct Case {
    Shape in;
    std::vector<int64_t> reps;
    Shape out;
  };
  for (auto c :
       {Case{{2, 3}, {2, 3}, {4, 9}}, Case{{2, 3}, {2}, {2, 6}}, Case{{3}, {2, 1, 2}, {2, 1, 6}},
        Case{{1, 4}, {3, 0}, {3, 0}}, Case{{}, {4}, {4}}, Case{{2, 1, 3}, {1, 5, 1}, {2, 5, 3}}}) {
    for (DType t : {f32, u8, boolean, f16, i64}) {
      Array x;
      Array y = run1(
          c.in, t, [&](const Tensor& v) { return tile(v, c.reps); }, &x);
      expect_equal(y, c.out, ref_map(x, c.out, [&](const std::vector<int64_t>& o) {
                     std::vector<int64_t> s;
                     const size_t lead = o.size() - c.in.size();
                     for (size_t d = 0; d < c.in.size(); ++d) s.push_back(o[lead + d] % c.in[d]);
                     return s;
                   }));
    }
  }
  Graph g;
  expect_error<ValueError>([&] { tile(g.placeholder({2}, f32, "x"), {-1}); }, {"[tile]", "(2,)"});
}

TEST(BroadcastTo, MatchesNumpy) {
  struct Case {
    Shape in, want, out;
  };
  for (auto c : {Case{{3, 1}, {2, 3, 4}, {2, 3, 4}}, Case{{1}, {5}, {5}}, Case{{}, {2, 2}, {2, 2}},
                 Case{{4, 1, 3}, {-1, 2, -1}, {4, 2, 3}}, Case{{2, 1}, {2, 0}, {2, 0}},
                 Case{{1, 6}, {7, 6}, {7, 6}}}) {
    for (DType t : {f64, i32, boolean, bf16}) {
      Array x;
      Array y = run1(
          c.in, t, [&](const Tensor& v) { return broadcast_to(v, c.want); }, &x);
      expect_equal(y, c.out, ref_map(x, c.out, [&](const std::vector<int64_t>& o) {
                     std::vector<int64_t> s;
                     const size_t lead = o.size() - c.in.size();
                     for (size_t d = 0; d < c.in.size(); ++d)
                       s.push_back(c.in[d] == 1 ? 0 : o[lead + d]);
                     return s;
                   }));
    }
  }
  Graph g;
  auto x = g.placeholder({2, 3}, f32, "x");
  expect_error<ShapeError>(
      [&] {
        broadcast_to(x, {4, 3, 3});
      },
      {"[broadcast_to]", "(2, 3)", "(4, 3, 3)"});
  expect_error<ShapeError>([&] { broadcast_to(x, {3}); }, {"[broadcast_to]", "(2, 3)", "(3,)"});
}

TEST(Flip, AxesNegativeAndAll) {
  struct Case {
    Shape in;
    std::vector<int64_t> axes;
    std::vector<int> flipped;
  };
  for (auto c : {Case{{3, 4}, {0}, {1, 0}}, Case{{2, 3, 5}, {-1, 0}, {1, 0, 1}},
                 Case{{2, 3}, {}, {1, 1}}, Case{{1, 0, 2}, {1}, {0, 1, 0}}, Case{{}, {}, {}}}) {
    for (DType t : kMoveTypes) {
      Array x;
      Array y = run1(
          c.in, t, [&](const Tensor& v) { return flip(v, c.axes); }, &x);
      expect_equal(y, c.in, ref_map(x, c.in, [&](std::vector<int64_t> o) {
                     for (size_t d = 0; d < o.size(); ++d)
                       if (c.flipped[d]) o[d] = c.in[d] - 1 - o[d];
                     return o;
                   }));
    }
  }
  Graph g;
  expect_error<ValueError>(
      [&] {
        flip(g.placeholder({2, 3}, f32, "x"), {2});
      },
      {"[flip]", "axis 2", "(2, 3)"});
}

}  // namespace
}  // namespace kiln
