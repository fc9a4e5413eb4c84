// Layout, lookup and selection ops: DepthToSpace, SpaceToDepth, PixelShuffle, PixelUnshuffle,
// Embedding, EmbeddingGrad, MaskedFill, Roll, NonMaxSuppression, against plain loops over their
// definitions (ONNX, PyTorch, numpy) on fresh random data.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;

// ---- depth_to_space / space_to_depth

// The depth tensor (n, c*b*b, h, w) and space tensor (n, c, h*b, w*b) in the layout asked for.
Shape depth_shape(int64_t n, int64_t c, int64_t h, int64_t w, int64_t b, bool nhwc) {
  return nhwc ? Shape{n, h, w, c * b * b} : Shape{n, c * b * b, h, w};
}
Shape space_shape(int64_t n, int64_t c, int64_t h, int64_t w, int64_t b, bool nhwc) {
  return nhwc ? Shape{n, h * b, w * b, c} : Shape{n, c, h * b, w * b};
}

// ONNX DepthToSpace as a walk over the input: depth channel k at (y, x) holds space channel ch
// at (y*b + bh, x*b + bw), with k = (bh*b + bw)*C + ch (DCR) or ch*b*b + bh*b + bw (CRD).
std::vector<double> ref_depth_to_space(const Array& x, int64_t b, bool crd, bool nhwc) {
  const Shape& s = x.shape();
  const int64_t n = s[0], dc = nhwc ? s[3] : s[1], h = nhwc ? s[1] : s[2], w = nhwc ? s[2] : s[3];
  const int64_t c = dc / (b * b);
  const Shape os = space_shape(n, c, h, w, b, nhwc);
  const auto v = to_f64(x);
  std::vector<double> out(v.size());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t k = 0; k < dc; ++k)
      for (int64_t y = 0; y < h; ++y)
        for (int64_t xx = 0; xx < w; ++xx) {
          int64_t ch, bh, bw;
          if (crd) {
            ch = k / (b * b), bh = (k % (b * b)) / b, bw = k % b;
          } else {
            ch = k % c, bh = (k / c) / b, bw = (k / c) % b;
          }
          const int64_t src = nhwc ? ravel({i, y, xx, k}, s) : ravel({i, k, y, xx}, s);
          const int64_t oy = y * b + bh, ox = xx * b + bw;
          const int64_t dst = nhwc ? ravel({i, oy, ox, ch}, os) : ravel({i, ch, oy, ox}, os);
          out[dst] = v[src];
        }
  return out;
}

struct SdCase {
  int64_t n, c, h, w, b;
};
const SdCase kSdCases[] = {{2, 3, 4, 5, 2}, {1, 2, 3, 2, 3}, {3, 1, 1, 7, 1}, {1, 5, 2, 2, 4}};

TEST(DepthToSpace, MatchesOnnxDefinition) {
  for (const SdCase& k : kSdCases)
    for (bool crd : {false, true})
      for (bool nhwc : {false, true})
        for (DType t : {f32, f64, i32, i8, boolean, f16, bf16, i64}) {
          Graph g;
          const Shape in = depth_shape(k.n, k.c, k.h, k.w, k.b, nhwc);
          auto x = g.placeholder(in, t, "x");
          Array vx = random_array(in, t, -100, 100);
          const SpaceDepthMode mode = crd ? SpaceDepthMode::crd : SpaceDepthMode::dcr;
          Array y = eval1(g, depth_to_space(x, k.b, {mode, nhwc}), {{x, vx}});
          expect_equal(y, space_shape(k.n, k.c, k.h, k.w, k.b, nhwc),
                       ref_depth_to_space(vx, k.b, crd, nhwc));
        }
}

TEST(DepthToSpace, DcrAndCrdOrders) {
  // x = arange(8) as (1, 8, 1, 1), blocksize 2: DCR takes channels (bh*2 + bw)*2 + c, CRD
  // c*4 + bh*2 + bw
  Graph g;
  std::vector<float> v(8);
  std::iota(v.begin(), v.end(), 0.0f);
  auto x = g.constant(Array::from_vector(v, {1, 8, 1, 1}));
  expect_equal(eval1(g, depth_to_space(x, 2)), {1, 2, 2, 2}, {0, 2, 4, 6, 1, 3, 5, 7});
  expect_equal(eval1(g, depth_to_space(x, 2, {SpaceDepthMode::crd})), {1, 2, 2, 2},
               {0, 1, 2, 3, 4, 5, 6, 7});
  // NHWC: x (1, 1, 1, 8)
  auto xl = g.constant(Array::from_vector(v, {1, 1, 1, 8}));
  expect_equal(eval1(g, depth_to_space(xl, 2, {SpaceDepthMode::dcr, true})), {1, 2, 2, 2},
               {0, 1, 2, 3, 4, 5, 6, 7});
  expect_equal(eval1(g, depth_to_space(xl, 2, {SpaceDepthMode::crd, true})), {1, 2, 2, 2},
               {0, 4, 1, 5, 2, 6, 3, 7});
}

TEST(DepthToSpace, DynamicDims) {
  // unknown batch and height until compile; the channel dim is checked once known
  Graph g;
  auto x = g.placeholder({-1, 8, -1, 3}, f32, "x");
  auto y = depth_to_space(x, 2, {SpaceDepthMode::crd});
  EXPECT_EQ(y.shape(), (Shape{-1, 2, -1, 6}));
  auto z = space_to_depth(y, 2, {SpaceDepthMode::crd});
  EXPECT_EQ(z.shape(), (Shape{-1, 8, -1, 3}));
  Array vx = random_array({3, 8, 5, 3}, f32);
  expect_equal(eval1(g, y, {{x, vx}}), {3, 2, 10, 6}, ref_depth_to_space(vx, 2, true, false));
  expect_equal(eval1(g, z, {{x, vx}}), {3, 8, 5, 3}, to_f64(vx));
}

TEST(DepthToSpace, ErrorsNameOpAndShapes) {
  Graph g;
  auto x = g.placeholder({2, 6, 3, 3}, f32, "x");
  expect_error<ShapeError>([&] { depth_to_space(x, 2); },
                           {"[depth_to_space]", "(2, 6, 3, 3)", "block_size^2 = 4"});
  expect_error<ShapeError>(
      [&] {
        depth_to_space(x, 2, {SpaceDepthMode::dcr, true});
      },
      {"[depth_to_space]", "NHWC"});
  expect_error<ValueError>([&] { depth_to_space(x, 0); }, {"[depth_to_space]", "block_size 0"});
  expect_error<ShapeError>(
      [&] {
        depth_to_space(g.placeholder({4, 3, 3}, f32, "r3"), 2);
      },
      {"[depth_to_space]", "(4, 3, 3)"});
}

TEST(SpaceToDepth, InvertsDepthToSpace) {
  for (const SdCase& k : kSdCases)
    for (bool crd : {false, true})
      for (bool nhwc : {false, true})
        for (DType t : {f32, u8, f16, i16}) {
          Graph g;
          const Shape depth = depth_shape(k.n, k.c, k.h, k.w, k.b, nhwc);
          const Shape space = space_shape(k.n, k.c, k.h, k.w, k.b, nhwc);
          auto x = g.placeholder(space, t, "x");
          // space_to_depth(x) is the depth tensor d with depth_to_space(d) == x: check through
          // the reference of depth_to_space applied to the result
          Array vx = random_array(space, t, 0, 100);
          const SpaceDepthMode mode = crd ? SpaceDepthMode::crd : SpaceDepthMode::dcr;
          Array d = eval1(g, space_to_depth(x, k.b, {mode, nhwc}), {{x, vx}});
          ASSERT_EQ(d.shape(), depth);
          expect_equal(vx, space, ref_depth_to_space(d, k.b, crd, nhwc));
        }
}

TEST(SpaceToDepth, OnnxDcrOrder) {
  // ONNX SpaceToDepth: reshape (N, C, H/b, b, W/b, b), transpose (0, 3, 5, 1, 2, 4)
  const Shape s{2, 3, 4, 6};
  const int64_t b = 2;
  Array vx = random_array(s, f64);
  const auto v = to_f64(vx);
  std::vector<double> want;
  for (int64_t n = 0; n < 2; ++n)
    for (int64_t bh = 0; bh < b; ++bh)
      for (int64_t bw = 0; bw < b; ++bw)
        for (int64_t c = 0; c < 3; ++c)
          for (int64_t h = 0; h < 2; ++h)
            for (int64_t w = 0; w < 3; ++w)
              want.push_back(v[ravel({n, c, h * b + bh, w * b + bw}, s)]);
  Graph g;
  auto x = g.placeholder(s, f64, "x");
  expect_equal(eval1(g, space_to_depth(x, b), {{x, vx}}), {2, 12, 2, 3}, want);
}

TEST(SpaceToDepth, ErrorsNameOpAndShapes) {
  Graph g;
  auto x = g.placeholder({1, 2, 4, 5}, f32, "x");
  expect_error<ShapeError>([&] { space_to_depth(x, 2); },
                           {"[space_to_depth]", "(1, 2, 4, 5)", "block_size 2"});
  expect_error<ValueError>([&] { space_to_depth(x, -1); }, {"[space_to_depth]", "block_size -1"});
  expect_error<ShapeError>(
      [&] {
        space_to_depth(g.placeholder({4, 4}, f32, "r2"), 2);
      },
      {"[space_to_depth]", "(4, 4)"});
}

// PyTorch pixel_shuffle: out[..., c, h*r + i, w*r + j] = x[..., c*r*r + i*r + j, h, w]
std::vector<double> ref_pixel_shuffle(const Array& x, int64_t r, Shape& out) {
  const Shape& s = x.shape();
  const size_t k = s.size();
  out = s;
  out[k - 3] = s[k - 3] / (r * r);
  out[k - 2] = s[k - 2] * r;
  out[k - 1] = s[k - 1] * r;
  const auto v = to_f64(x);
  std::vector<double> res(v.size());
  for (int64_t o = 0; o < numel(out); ++o) {
    auto idx = unravel(o, out);
    const int64_t c = idx[k - 3], y = idx[k - 2], xx = idx[k - 1];
    idx[k - 3] = c * r * r + (y % r) * r + xx % r;
    idx[k - 2] = y / r;
    idx[k - 1] = xx / r;
    res[o] = v[ravel(idx, s)];
  }
  return res;
}

TEST(PixelShuffle, MatchesPyTorchDefinition) {
  for (const Shape& s :
       {Shape{2, 8, 3, 4}, Shape{9, 2, 5}, Shape{2, 3, 4, 2, 3}, Shape{1, 18, 1, 1}})
    for (int64_t r : {2, 3}) {
      if (s[s.size() - 3] % (r * r)) continue;
      Graph g;
      auto x = g.placeholder(s, f32, "x");
      Array vx = random_array(s, f32);
      Shape out;
      const auto want = ref_pixel_shuffle(vx, r, out);
      expect_equal(eval1(g, pixel_shuffle(x, r), {{x, vx}}), out, want);
    }
}

TEST(PixelShuffle, ErrorsNameOpAndShapes) {
  Graph g;
  expect_error<ShapeError>(
      [&] {
        pixel_shuffle(g.placeholder({4, 4}, f32, "x"), 2);
      },
      {"[pixel_shuffle]", "(4, 4)"});
  expect_error<ShapeError>(
      [&] {
        pixel_shuffle(g.placeholder({1, 6, 2, 2}, f32, "x"), 2);
      },
      {"[depth_to_space]", "(1, 6, 2, 2)"});
}

TEST(PixelUnshuffle, InvertsPixelShuffle) {
  for (const Shape& s : {Shape{2, 3, 6, 4}, Shape{2, 4, 6}, Shape{2, 2, 1, 4, 2}}) {
    Graph g;
    auto x = g.placeholder(s, f64, "x");
    Array vx = random_array(s, f64);
    Array d = eval1(g, pixel_unshuffle(x, 2), {{x, vx}});
    Shape back;
    const auto want = ref_pixel_shuffle(d, 2, back);
    EXPECT_EQ(back, s);
    expect_equal(vx, s, want);
  }
  Graph g;
  expect_error<ShapeError>(
      [&] {
        pixel_unshuffle(g.placeholder({1, 2, 3, 4}, f32, "x"), 2);
      },
      {"[space_to_depth]", "(1, 2, 3, 4)"});
}

// ---- embedding

TEST(Embedding, GathersRows) {
  struct Case {
    Shape w, idx;
  };
  for (auto c :
       {Case{{10, 4}, {3, 5}}, Case{{7, 2, 3}, {6}}, Case{{5, 1}, {}}, Case{{3, 9}, {2, 0}}})
    for (DType t : {f32, f64, f16, i32, boolean, u8})
      for (DType it : {i64, i32, i16, u8}) {
        Graph g;
        auto w = g.placeholder(c.w, t, "w");
        auto idx = g.placeholder(c.idx, it, "idx");
        Array vw = random_array(c.w, t, -9, 9), vi = random_ints(c.idx, 0, c.w[0] - 1, it);
        Array y = eval1(g, embedding(w, idx, c.w[0] - 1), {{w, vw}, {idx, vi}});
        const int64_t d = numel(c.w) / c.w[0];
        const auto fw = to_f64(vw), fi = to_f64(vi);
        std::vector<double> want;
        for (double k : fi)
          for (int64_t j = 0; j < d; ++j) want.push_back(fw[static_cast<int64_t>(k) * d + j]);
        Shape out = c.idx;
        out.insert(out.end(), c.w.begin() + 1, c.w.end());
        expect_equal(y, out, want);
      }
}

TEST(Embedding, ErrorsNameOpAndShapes) {
  Graph g;
  auto w = g.placeholder({5, 3}, f32, "w");
  auto idx = g.placeholder({4}, i32, "idx");
  const int32_t bad[] = {1, 4, 5, 0};
  expect_error<ValueError>(
      [&] {
        eval1(g, embedding(w, idx),
              {{w, random_array({5, 3}, f32)}, {idx, Array::from_data(bad, {4}, i32)}});
      },
      {"[embedding]", "index 5", "position 2", "axis 0 of size 5"});
  const int32_t neg[] = {1, -1, 0, 0};
  expect_error<ValueError>(
      [&] {
        eval1(g, embedding(w, idx),
              {{w, random_array({5, 3}, f32)}, {idx, Array::from_data(neg, {4}, i32)}});
      },
      {"[embedding]", "index -1"});
  expect_error<DTypeError>([&] { embedding(w, g.placeholder({4}, f32, "f")); },
                           {"[embedding]", "f32"});
  expect_error<ValueError>([&] { embedding(w, idx, 5); }, {"[embedding]", "padding_idx 5"});
  expect_error<ValueError>([&] { embedding(w, idx, -6); }, {"[embedding]", "padding_idx -6"});
  expect_error<ShapeError>([&] { embedding(g.placeholder({}, f32, "s"), idx); },
                           {"[embedding]", "rank >= 1"});
}

// embedding_grad: row v of the result sums the grad rows whose index is v (none for padding).
std::vector<double> ref_embedding_grad(const Array& idx, const Array& grad, int64_t rows, int64_t d,
                                       int64_t pad) {
  const auto fi = to_f64(idx), fg = to_f64(grad);
  const int64_t m = static_cast<int64_t>(fi.size());
  std::vector<double> out(static_cast<size_t>(rows * d), 0.0);
  for (int64_t r = 0; r < m; ++r) {
    const int64_t v = static_cast<int64_t>(fi[r]);
    if (v == pad) continue;
    for (int64_t j = 0; j < d; ++j) out[v * d + j] += fg[r * d + j];
  }
  return out;
}

TEST(EmbeddingGrad, ScatterAddsRowsSkippingPadding) {
  struct Case {
    Shape idx, row;
    int64_t rows, pad;
  };
  for (auto c : {Case{{40}, {3}, 6, 2}, Case{{5, 7}, {2, 2}, 4, -1}, Case{{9}, {}, 3, 0},
                 Case{{0}, {4}, 3, -1}, Case{{300}, {17}, 11, 10}})
    for (DType t : {f32, f64, f16}) {
      Graph g;
      Shape gs = c.idx;
      gs.insert(gs.end(), c.row.begin(), c.row.end());
      auto idx = g.placeholder(c.idx, i64, "idx");
      auto gr = g.placeholder(gs, t, "g");
      Array vi = random_ints(c.idx, 0, c.rows - 1), vg = random_array(gs, t);
      Array y = eval1(g, embedding_grad(idx, gr, c.rows, c.pad), {{idx, vi}, {gr, vg}});
      Shape out{c.rows};
      out.insert(out.end(), c.row.begin(), c.row.end());
      // many repeats per row: the sums grow like sqrt(count)
      expect_close(y, out, ref_embedding_grad(vi, vg, c.rows, numel(c.row), c.pad),
                   4 * tolerance(t), 8 * tolerance(t));
    }
}

TEST(EmbeddingGrad, IsDeterministic) {
  Graph g;
  auto idx = g.placeholder({4000}, i32, "idx");
  auto gr = g.placeholder({4000, 33}, f32, "g");
  Array vi = random_ints({4000}, 0, 4, i32), vg = random_array({4000, 33}, f32, -1e3, 1e3);
  auto out = embedding_grad(idx, gr, 5);
  const auto a = eval1(g, out, {{idx, vi}, {gr, vg}}).to_vector<float>();
  const auto b = eval1(g, out, {{idx, vi}, {gr, vg}}).to_vector<float>();
  EXPECT_EQ(a, b);
}

TEST(EmbeddingGrad, ErrorsNameOpAndShapes) {
  Graph g;
  auto idx = g.placeholder({4}, i64, "idx");
  expect_error<ShapeError>(
      [&] {
        embedding_grad(idx, g.placeholder({5, 3}, f32, "g"), 6);
      },
      {"[embedding_grad]", "(5, 3)", "(4,)"});
  expect_error<DTypeError>(
      [&] {
        embedding_grad(idx, g.placeholder({4, 3}, i32, "g"), 6);
      },
      {"[embedding_grad]", "i32"});
  expect_error<ValueError>(
      [&] {
        embedding_grad(idx, g.placeholder({4, 3}, f32, "g"), 6, 6);
      },
      {"[embedding_grad]", "padding_idx 6"});
  auto gr = g.placeholder({4, 2}, f32, "g2");
  const int64_t bad[] = {0, 1, 7, 2};
  expect_error<ValueError>(
      [&] {
        eval1(g, embedding_grad(idx, gr, 6),
              {{idx, Array::from_data(bad, {4}, i64)}, {gr, random_array({4, 2}, f32)}});
      },
      {"[embedding_grad]", "index 7", "axis 0 of size 6"});
}

// ---- masked_fill

TEST(MaskedFill, BroadcastsMaskAndCastsValue) {
  struct Case {
    Shape x, mask;
  };
  for (auto c : {Case{{3, 4, 5}, {3, 4, 5}}, Case{{3, 4, 5}, {4, 1}}, Case{{2, 7}, {}},
                 Case{{6, 1, 3}, {1, 1, 3}}, Case{{0, 3}, {3}}})
    for (DType t : {f32, f64, f16, bf16, i32, i8, u8, boolean, i64}) {
      const double value = t == boolean ? 1 : is_floating(t) ? -2.5 : 7;
      Graph g;
      auto x = g.placeholder(c.x, t, "x");
      auto m = g.placeholder(c.mask, boolean, "m");
      Array vx = random_array(c.x, t, -50, 50), vm = random_array(c.mask, boolean);
      Array y = eval1(g, masked_fill(x, m, value), {{x, vx}, {m, vm}});
      const auto fx = to_f64(vx), fm = to_f64(vm);
      std::vector<double> want(fx.size());
      for (size_t i = 0; i < fx.size(); ++i) {
        const auto at = unravel(static_cast<int64_t>(i), c.x);
        want[i] = fm[broadcast_offset(at, c.mask, c.x)] != 0 ? value : fx[i];
      }
      expect_equal(y, c.x, want);
    }
}

TEST(MaskedFill, ErrorsNameOpAndShapes) {
  Graph g;
  auto x = g.placeholder({3, 4}, f32, "x");
  expect_error<DTypeError>(
      [&] {
        masked_fill(x, g.placeholder({3, 4}, i32, "m"), 0);
      },
      {"[masked_fill]", "i32"});
  expect_error<ShapeError>(
      [&] {
        masked_fill(x, g.placeholder({3, 1, 4}, boolean, "m"), 0);
      },
      {"[masked_fill]", "(3, 1, 4)", "(3, 4)"});
  expect_error<ShapeError>(
      [&] {
        masked_fill(x, g.placeholder({2, 4}, boolean, "m"), 0);
      },
      {"[masked_fill]", "(2, 4)", "(3, 4)"});
  expect_error<ShapeError>(
      [&] {
        masked_fill(g.placeholder({1, 4}, f32, "y"), g.placeholder({3, 4}, boolean, "m"), 0);
      },
      {"[masked_fill]", "(3, 4)", "(1, 4)"});
}

// ---- roll

// numpy.roll: out[(i + shift) mod n] = x[i] along each rolled axis (axes empty: flattened).
std::vector<double> ref_roll(const Array& x, const std::vector<int64_t>& shifts,
                             const std::vector<int64_t>& axes) {
  const auto v = to_f64(x);
  std::vector<double> out(v.size());
  const Shape& s = x.shape();
  const int64_t total = numel(s);
  for (int64_t i = 0; i < total; ++i) {
    if (axes.empty()) {
      out[static_cast<size_t>((((i + shifts[0]) % total) + total) % total)] = v[i];
      continue;
    }
    auto idx = unravel(i, s);
    for (size_t k = 0; k < axes.size(); ++k) {
      const int64_t a = axes[k] < 0 ? axes[k] + static_cast<int64_t>(s.size()) : axes[k];
      idx[a] = (((idx[a] + shifts[k]) % s[a]) + s[a]) % s[a];
    }
    out[ravel(idx, s)] = v[i];
  }
  return out;
}

TEST(Roll, MatchesNumpy) {
  struct Case {
    Shape x;
    std::vector<int64_t> shifts, axes;
  };
  for (auto c :
       {Case{{5, 7}, {2}, {1}}, Case{{5, 7}, {-3, 9}, {0, 1}}, Case{{4, 3, 6}, {13}, {}},
        Case{{4, 3, 6}, {1, -2}, {-1, 0}}, Case{{2, 3, 4}, {1, 2}, {2, 2}}, Case{{6}, {0}, {0}},
        Case{{3, 0, 2}, {1}, {0}}, Case{{2, 5, 3, 2}, {4, 1, 1}, {1, 2, 3}}})
    for (DType t : {f32, f64, i64, boolean, f16, i8}) {
      Graph g;
      auto x = g.placeholder(c.x, t, "x");
      Array vx = random_array(c.x, t, -100, 100);
      expect_equal(eval1(g, roll(x, c.shifts, c.axes), {{x, vx}}), c.x,
                   ref_roll(vx, c.shifts, c.axes));
    }
}

TEST(Roll, ErrorsNameOpAndShapes) {
  Graph g;
  auto x = g.placeholder({3, 4}, f32, "x");
  expect_error<ValueError>(
      [&] {
        roll(x, {1, 2}, {0});
      },
      {"[roll]", "2 shifts for 1 axes", "(3, 4)"});
  expect_error<ValueError>([&] { roll(x, {1, 2}); }, {"[roll]", "2 shifts for 0 axes"});
  expect_error<ValueError>([&] { roll(x, {1}, {2}); }, {"[roll]", "axis 2", "(3, 4)"});
}

// ---- non_max_suppression

struct Box {
  double y0, x0, y1, x1;
};

Box extent(const double* p, bool center) {
  if (center) return {p[1] - p[3] / 2, p[0] - p[2] / 2, p[1] + p[3] / 2, p[0] + p[2] / 2};
  return {std::min(p[0], p[2]), std::min(p[1], p[3]), std::max(p[0], p[2]), std::max(p[1], p[3])};
}

double iou(const Box& a, const Box& b) {
  const double ih = std::min(a.y1, b.y1) - std::max(a.y0, b.y0);
  const double iw = std::min(a.x1, b.x1) - std::max(a.x0, b.x0);
  if (ih <= 0 || iw <= 0) return 0;
  const double inter = ih * iw;
  const double aa = (a.y1 - a.y0) * (a.x1 - a.x0), ab = (b.y1 - b.y0) * (b.x1 - b.x0);
  if (aa <= 0 || ab <= 0) return 0;
  return inter / (aa + ab - inter);
}

// Greedy NMS per batch and class: the selected (batch, class, box) triples in ONNX order.
std::vector<double> ref_nms(const Array& boxes, const Array& scores, int64_t max_out,
                            const NonMaxSuppressionOptions& o) {
  const auto fb = to_f64(boxes), fs = to_f64(scores);
  const int64_t nb = scores.shape()[0], nc = scores.shape()[1], n = scores.shape()[2];
  std::vector<double> out;
  for (int64_t b = 0; b < nb; ++b)
    for (int64_t c = 0; c < nc; ++c) {
      const double* s = fs.data() + (b * nc + c) * n;
      std::vector<int64_t> order;
      for (int64_t i = 0; i < n; ++i)
        if (!std::isnan(s[i]) && (!o.score_threshold || s[i] > *o.score_threshold))
          order.push_back(i);
      std::sort(order.begin(), order.end(),
                [&](int64_t p, int64_t q) { return s[p] > s[q] || (s[p] == s[q] && p < q); });
      std::vector<int64_t> kept;
      for (int64_t i : order) {
        if (static_cast<int64_t>(kept.size()) >= max_out) break;
        bool ok = true;
        for (int64_t j : kept)
          if (iou(extent(&fb[(b * n + i) * 4], o.center_point_box),
                  extent(&fb[(b * n + j) * 4], o.center_point_box)) > o.iou_threshold)
            ok = false;
        if (ok) kept.push_back(i);
      }
      for (int64_t i : kept) out.insert(out.end(), {double(b), double(c), double(i)});
    }
  return out;
}

// Runs the op; checks the padding and returns the first `count` rows.
std::vector<double> run_nms(const Array& boxes, const Array& scores, int64_t max_out,
                            const NonMaxSuppressionOptions& o) {
  Graph g;
  auto b = g.placeholder(boxes.shape(), boxes.dtype(), "boxes");
  auto s = g.placeholder(scores.shape(), scores.dtype(), "scores");
  auto [sel, count] = non_max_suppression(b, s, max_out, o);
  const auto r = eval(g, {sel, count}, {{b, boxes}, {s, scores}});
  const Shape& ss = scores.shape();
  EXPECT_EQ(r[0].shape(), (Shape{ss[0] * ss[1] * std::min(max_out, ss[2]), 3}));
  EXPECT_EQ(r[1].shape(), Shape{});
  const int64_t k = r[1].to_vector<int64_t>().at(0);
  auto rows = to_f64(r[0]);
  for (size_t i = static_cast<size_t>(3 * k); i < rows.size(); ++i) EXPECT_EQ(rows[i], -1) << i;
  rows.resize(static_cast<size_t>(3 * k));
  return rows;
}

TEST(NonMaxSuppression, OnnxSuppressByIou) {
  // ONNX's nonmaxsuppression_suppress_by_IOU and _center_point_box_format examples
  const float corners[] = {0, 0,  1, 1,  0, 0.1f,  1, 1.1f,  0, -0.1f, 1, 0.9f,
                           0, 10, 1, 11, 0, 10.1f, 1, 11.1f, 0, 100,   1, 101};
  const float centers[] = {0.5f, 0.5f,  1, 1, 0.5f, 0.6f,  1, 1, 0.5f, 0.4f,   1, 1,
                           0.5f, 10.5f, 1, 1, 0.5f, 10.6f, 1, 1, 0.5f, 100.5f, 1, 1};
  const float sc[] = {0.9f, 0.75f, 0.6f, 0.95f, 0.5f, 0.3f};
  const Array scores = Array::from_data(sc, {1, 1, 6}, f32);
  NonMaxSuppressionOptions o;
  o.iou_threshold = 0.5;
  o.score_threshold = 0.0;
  EXPECT_EQ(run_nms(Array::from_data(corners, {1, 6, 4}, f32), scores, 3, o),
            (std::vector<double>{0, 0, 3, 0, 0, 0, 0, 0, 5}));
  o.center_point_box = true;
  EXPECT_EQ(run_nms(Array::from_data(centers, {1, 6, 4}, f32), scores, 3, o),
            (std::vector<double>{0, 0, 3, 0, 0, 0, 0, 0, 5}));
  // score threshold 0.4 drops box 5; max 2 stops after two
  o.center_point_box = false;
  o.score_threshold = 0.4;
  EXPECT_EQ(run_nms(Array::from_data(corners, {1, 6, 4}, f32), scores, 10, o),
            (std::vector<double>{0, 0, 3, 0, 0, 0}));
  EXPECT_EQ(run_nms(Array::from_data(corners, {1, 6, 4}, f32), scores, 1, o),
            (std::vector<double>{0, 0, 3}));
  EXPECT_EQ(run_nms(Array::from_data(corners, {1, 6, 4}, f32), scores, 0, o),
            std::vector<double>{});
}

// Random boxes in a 10 x 10 field (corners in either order), so that many overlap.
Array random_boxes(int64_t b, int64_t n, DType t, bool center) {
  std::uniform_real_distribution<double> pos(0, 10), size(0.5, 4);
  std::vector<double> v;
  for (int64_t i = 0; i < b * n; ++i) {
    const double y = pos(rng()), x = pos(rng()), h = size(rng()), w = size(rng());
    if (center) v.insert(v.end(), {x, y, w, h});
    else if (i % 3 == 1) v.insert(v.end(), {y + h, x + w, y, x});
    else v.insert(v.end(), {y, x, y + h, x + w});
  }
  return Array::from_vector(v, {b, n, 4}).astype(t);
}

TEST(NonMaxSuppression, MatchesGreedyReference) {
  struct Case {
    int64_t b, c, n, max_out;
    double iou;
    std::optional<double> score;
    bool center;
  };
  for (auto k : {Case{1, 1, 30, 10, 0.5, std::nullopt, false}, Case{2, 3, 50, 100, 0.3, 0.2, false},
                 Case{3, 2, 40, 5, 0.0, std::nullopt, true}, Case{1, 4, 200, 20, 0.7, 0.5, true},
                 Case{2, 1, 1, 3, 0.5, std::nullopt, false}, Case{2, 2, 0, 3, 0.5, 0.1, false},
                 Case{1, 2, 64, 64, 1.0, std::nullopt, false}})
    for (DType t : {f32, f64}) {
      NonMaxSuppressionOptions o;
      o.iou_threshold = k.iou;
      o.score_threshold = k.score;
      o.center_point_box = k.center;
      const Array boxes = random_boxes(k.b, k.n, t, k.center);
      Array scores = random_array({k.b, k.c, k.n}, t, 0, 1);
      EXPECT_EQ(run_nms(boxes, scores, k.max_out, o), ref_nms(boxes, scores, k.max_out, o))
          << "case b " << k.b << " c " << k.c << " n " << k.n << " dtype " << name(t);
    }
}

TEST(NonMaxSuppression, TiesNanAndHalfScores) {
  // equal scores keep box order; NaN scores are never selected; f16 runs via f32
  const Array boxes = random_boxes(1, 12, f32, false);
  std::vector<float> s(12, 0.5f);
  s[3] = std::nanf("");
  s[7] = 0.9f;
  const Array scores = Array::from_vector(s, {1, 1, 12});
  NonMaxSuppressionOptions o;
  o.iou_threshold = 1.0;  // nothing is suppressed
  std::vector<double> want{0, 0, 7};
  for (int64_t i = 0; i < 12; ++i)
    if (i != 3 && i != 7) want.insert(want.end(), {0, 0, double(i)});
  EXPECT_EQ(run_nms(boxes, scores, 12, o), want);
  EXPECT_EQ(run_nms(boxes.astype(f16), scores.astype(f16), 12, o), want);
}

TEST(NonMaxSuppression, DynamicBoxCount) {
  // the result's row count is known once N is
  Graph g;
  auto b = g.placeholder({2, -1, 4}, f32, "b");
  auto s = g.placeholder({2, 3, -1}, f32, "s");
  auto [sel, count] = non_max_suppression(b, s, 4);
  EXPECT_EQ(sel.shape(), (Shape{-1, 3}));
  const Array boxes = random_boxes(2, 7, f32, false), scores = random_array({2, 3, 7}, f32, 0, 1);
  const auto r = eval(g, {sel, count}, {{b, boxes}, {s, scores}});
  EXPECT_EQ(r[0].shape(), (Shape{24, 3}));
  const int64_t k = r[1].to_vector<int64_t>().at(0);
  auto rows = to_f64(r[0]);
  rows.resize(static_cast<size_t>(3 * k));
  EXPECT_EQ(rows, ref_nms(boxes, scores, 4, {}));
}

TEST(NonMaxSuppression, ErrorsNameOpAndShapes) {
  Graph g;
  auto b = g.placeholder({2, 5, 4}, f32, "b");
  auto s = g.placeholder({2, 3, 5}, f32, "s");
  expect_error<ShapeError>(
      [&] {
        non_max_suppression(g.placeholder({2, 5, 3}, f32, "b3"), s, 2);
      },
      {"[non_max_suppression]", "(2, 5, 3)", "(2, 3, 5)"});
  expect_error<ShapeError>(
      [&] {
        non_max_suppression(b, g.placeholder({2, 3, 4}, f32, "s4"), 2);
      },
      {"[non_max_suppression]", "(2, 5, 4)", "(2, 3, 4)"});
  expect_error<DTypeError>(
      [&] {
        non_max_suppression(g.placeholder({2, 5, 4}, i32, "bi"), s, 2);
      },
      {"[non_max_suppression]", "i32"});
  expect_error<ValueError>([&] { non_max_suppression(b, s, -1); },
                           {"[non_max_suppression]", "max_output_boxes_per_class -1"});
  NonMaxSuppressionOptions o;
  o.iou_threshold = 1.5;
  expect_error<ValueError>([&] { non_max_suppression(b, s, 2, o); },
                           {"[non_max_suppression]", "iou_threshold 1.5"});
}

}  // namespace
}  // namespace kiln
