// Pooling against float64 loops that visit every tap of every window (N, C, spatial...).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/graph_impl.h"
#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;

struct Case {
  Shape x;
  PoolOptions o;
};

// Options with defaults resolved, as the reference needs them.
struct Resolved {
  std::vector<int64_t> k, s, pb, pe, dil;
};
Resolved resolve(const PoolOptions& o) {
  const size_t nd = o.kernel.size();
  Resolved r{o.kernel, o.stride.empty() ? o.kernel : o.stride, {}, {}, o.dilation};
  if (r.dil.empty()) r.dil.assign(nd, 1);
  for (size_t d = 0; d < nd; ++d) {
    r.pb.push_back(o.padding.empty() ? 0 : o.padding[d]);
    r.pe.push_back(o.padding.empty() ? 0 : o.padding[o.padding.size() == nd ? d : nd + d]);
  }
  return r;
}

Shape ref_out_shape(const Shape& x, const PoolOptions& o) {
  Resolved r = resolve(o);
  Shape out{x[0], x[1]};
  for (size_t d = 0; d < r.k.size(); ++d) {
    const double span = static_cast<double>(x[2 + d] + r.pb[d] + r.pe[d] - r.dil[d] * (r.k[d] - 1) -
                                            1) / static_cast<double>(r.s[d]);
    int64_t n = static_cast<int64_t>(o.ceil_mode ? std::ceil(span) : std::floor(span)) + 1;
    if (o.ceil_mode && (n - 1) * r.s[d] >= x[2 + d] + r.pb[d]) --n;  // window starts in the end pad
    out.push_back(n);
  }
  return out;
}

// Calls f(plane, out_index, taps) for every output, where taps lists the window's positions as
// (in-plane flat index or -1 for padding, inside the padded input).
struct Tap {
  int64_t index;
  bool in_padded;
};
template <typename F> void for_windows(const Shape& x, const PoolOptions& o, F f) {
  Resolved r = resolve(o);
  const Shape out = ref_out_shape(x, o);
  const Shape in_sp(x.begin() + 2, x.end()), out_sp(out.begin() + 2, out.end());
  const int64_t planes = x[0] * x[1];
  for (int64_t p = 0; p < planes; ++p) {
    for (int64_t oi = 0; oi < numel(out_sp); ++oi) {
      auto oidx = unravel(oi, out_sp);
      std::vector<Tap> taps;
      for (int64_t t = 0; t < numel(r.k); ++t) {
        auto tidx = unravel(t, r.k);
        std::vector<int64_t> pos;
        bool inside = true, in_padded = true;
        for (size_t d = 0; d < r.k.size(); ++d) {
          pos.push_back(oidx[d] * r.s[d] - r.pb[d] + tidx[d] * r.dil[d]);
          inside = inside && pos[d] >= 0 && pos[d] < in_sp[d];
          in_padded = in_padded && pos[d] < in_sp[d] + r.pe[d];
        }
        taps.push_back({inside ? ravel(pos, in_sp) : -1, in_padded});
      }
      f(p, p * numel(out_sp) + oi, taps);
    }
  }
}

std::pair<std::vector<double>, std::vector<double>> ref_max_pool(const Array& x,
                                                                 const PoolOptions& o) {
  auto v = to_f64(x);
  const int64_t plane = numel(Shape(x.shape().begin() + 2, x.shape().end()));
  std::vector<double> values, indices;
  for_windows(x.shape(), o, [&](int64_t p, int64_t, const std::vector<Tap>& taps) {
    int64_t best = -1;
    for (const Tap& t : taps) {
      if (t.index < 0) continue;
      const double e = v[p * plane + t.index];
      if (best < 0 || e > v[p * plane + best] || std::isnan(e)) best = t.index;  // NaN wins
    }
    values.push_back(v[p * plane + best]);
    indices.push_back(static_cast<double>(best));
  });
  return {values, indices};
}

std::vector<double> ref_avg_pool(const Array& x, const PoolOptions& o) {
  auto v = to_f64(x);
  const int64_t plane = numel(Shape(x.shape().begin() + 2, x.shape().end()));
  std::vector<double> out;
  for_windows(x.shape(), o, [&](int64_t p, int64_t, const std::vector<Tap>& taps) {
    double sum = 0;
    int64_t real = 0, padded = 0;
    for (const Tap& t : taps) {
      if (t.index >= 0) sum += v[p * plane + t.index], ++real;
      if (t.in_padded) ++padded;
    }
    out.push_back(sum / static_cast<double>(o.count_include_pad ? padded : real));
  });
  return out;
}

// Distinct values in random order, so that every window has one maximum.
Array distinct_array(const Shape& shape, DType t) {
  std::vector<double> v(static_cast<size_t>(numel(shape)));
  // (from 0 for the unsigned types, 0 to 255 then repeating for u8)
  std::iota(v.begin(), v.end(), is_signed(t) ? -static_cast<double>(v.size() / 2) : 0.0);
  if (t == u8)
    for (double& e : v) e = std::fmod(e, 256.0);
  std::shuffle(v.begin(), v.end(), rng());
  if (is_floating(t))
    for (double& e : v) e = e / static_cast<double>(v.size()) + 1e-3 * (e > 0);
  return Array::from_vector(v, shape).astype(t);
}

std::string describe(const Case& c) {
  return fmt::format("x {} kernel ({}) stride ({}) padding ({}) dilation ({}) ceil {} incl {}",
                     to_string(c.x), fmt::join(c.o.kernel, ","), fmt::join(c.o.stride, ","),
                     fmt::join(c.o.padding, ","), fmt::join(c.o.dilation, ","), c.o.ceil_mode,
                     c.o.count_include_pad);
}

// Window geometries in 1, 2 and 3 spatial dims (each also run with ceil_mode).
std::vector<Case> window_cases(bool dilated) {
  std::vector<int64_t> none;
  auto dil = [&](std::vector<int64_t> d) { return dilated ? d : none; };
  std::vector<Case> cases = {
      {{2, 3, 11}, {{3}, {2}, {1}, dil({2})}},
      {{1, 2, 2}, {{3}, {3}, {1}}},  // ceil_mode drops a window starting in the end padding
      {{2, 3, 9, 10}, {{3, 2}, {2, 1}, {1, 0}, dil({1, 2})}},
      {{1, 2, 7, 7}, {{3, 3}, {2, 2}, {1, 1}}},
      {{2, 2, 8, 9}, {{2, 3}, {}, {0, 1, 1, 0}}},  // stride = kernel, asymmetric padding
      {{1, 2, 5, 6, 7}, {{2, 3, 2}, {2, 2, 1}, {1, 1, 0}, dil({2, 1, 1})}},
      {{2, 1, 4, 4, 4}, {{2, 2, 2}, {}, {}}},
  };
  const size_t n = cases.size();
  for (size_t i = 0; i < n; ++i) {
    cases.push_back(cases[i]);
    cases.back().o.ceil_mode = true;
  }
  return cases;
}

// ---- MaxPool ----

TEST(MaxPool, ValuesAndIndicesMatchReference) {
  for (const Case& c : window_cases(true)) {
    for (DType t : {f32, f64, i32, f16}) {
      SCOPED_TRACE(describe(c) + " " + name(t));
      Graph g;
      auto x = g.placeholder(c.x, t, "x");
      auto [y, idx] = max_pool_with_indices(x, c.o);
      Array v = distinct_array(c.x, t);
      auto outs = eval(g, {y, idx}, {{x, v}});
      auto [values, indices] = ref_max_pool(v, c.o);
      const Shape out = ref_out_shape(c.x, c.o);
      EXPECT_EQ(outs[0].dtype(), t);
      EXPECT_EQ(outs[1].dtype(), i64);
      expect_equal(outs[0], out, values);
      expect_equal(outs[1], out, indices);
    }
  }
}

// The node of `nchw` (a pool of x) again with channels_last, on x transposed to NHWC; its outputs
// NHWC.
std::vector<Tensor> channels_last_twin(const Tensor& nchw, const Tensor& x) {
  // (copies: adding the transpose may move the graph's nodes)
  const OpId op = nchw.graph_impl()->nodes[nchw.node_id()].op;
  Attrs attrs = nchw.graph_impl()->nodes[nchw.node_id()].attrs;
  attrs.set("channels_last", true);
  const Tensor x_nhwc = transpose(x, {0, 2, 3, 1});
  return detail::make_node(op, {x_nhwc}, attrs);
}

// channels_last max pooling (which the channels_last pass gives pools between NHWC convolutions
// on CUDA): the NHWC node against the reference on NCHW data, values and in-plane indices, with
// channel counts that take the CUDA kernel's 16-byte path and ones that do not.
TEST(MaxPool, ChannelsLastMatchesReference) {
  std::vector<Case> cases;
  for (const Case& c : window_cases(true))
    if (c.x.size() == 4) cases.push_back(c);
  cases.push_back({{2, 16, 9, 10}, {{3, 3}, {2, 2}, {1, 1}}});
  cases.push_back({{1, 32, 5, 6}, {{2, 2}, {1, 1}, {}, {2, 1}}});
  for (const Case& c : cases)
    for (DType t : {f32, bf16, f16, u8, i8, u16, u32, u64}) {
      SCOPED_TRACE(describe(c) + " " + name(t));
      Graph g;
      auto x = g.placeholder(c.x, t, "x");
      const auto nhwc = channels_last_twin(max_pool(x, c.o), x);
      const Array v = distinct_array(c.x, t);
      const auto outs = eval(g, {transpose(nhwc[0], {0, 3, 1, 2}), transpose(nhwc[1], {0, 3, 1, 2})},
                             {{x, v}});
      const auto [values, indices] = ref_max_pool(v, c.o);
      const Shape out = ref_out_shape(c.x, c.o);
      expect_equal(outs[0], out, values);
      expect_equal(outs[1], out, indices);
    }
  Graph g;
  auto x = g.placeholder({2, 3, 4}, f32, "x");
  Attrs attrs;
  attrs.set("kernel", std::vector<int64_t>{2});
  attrs.set("stride", std::vector<int64_t>{1});
  attrs.set("pads", std::vector<int64_t>{0, 0});
  attrs.set("dilation", std::vector<int64_t>{1});
  attrs.set("ceil_mode", false);
  attrs.set("channels_last", true);
  expect_error<ShapeError>([&] { detail::make_node(OpId::MaxPool, {x}, attrs); },
                           {"[max_pool]", "channels_last", "(2, 3, 4)"});
}

TEST(MaxPool, LargeInputRunsInParallel) {
  // the benchmark's shape class: 3x3 stride 2 pad 1, with right-border windows
  const Shape shape{2, 8, 57, 57};
  PoolOptions o{{3, 3}, {2, 2}, {1, 1}};
  Graph g;
  auto x = g.placeholder(shape, f32, "x");
  auto [y, idx] = max_pool_with_indices(x, o);
  Array v = random_array(shape, f32);
  auto outs = eval(g, {y, idx}, {{x, v}});
  auto [values, indices] = ref_max_pool(v, o);
  expect_equal(outs[0], {2, 8, 29, 29}, values);
  expect_equal(outs[1], {2, 8, 29, 29}, indices);
}

TEST(MaxPool, PaddingNeverWinsAndNanPropagates) {
  // all-negative input: a padded zero would win if padding took part; rows wide enough for the
  // vectorized path, with stride 1 and 2
  const Shape shape{1, 2, 6, 37};
  for (int64_t stride : {1, 2}) {
    Array v = random_array(shape, f32, -2, -1);
    for (int64_t i : {0, 40, 41, 100, 250, 251, 443}) v.data<float>()[i] = NAN;
    Graph g;
    auto x = g.placeholder(shape, f32, "x");
    PoolOptions o{{3, 3}, {stride, stride}, {1, 1}};
    auto [y, idx] = max_pool_with_indices(x, o);
    auto outs = eval(g, {y, idx}, {{x, v}});
    auto [values, indices] = ref_max_pool(v, o);
    expect_close(outs[0], ref_out_shape(shape, o), values);
    expect_equal(outs[1], ref_out_shape(shape, o), indices);
  }
}

TEST(MaxPool, ShapesDynamicAndEmpty) {
  Graph g;
  auto x = g.placeholder({-1, 3, -1, 8}, f32, "x");
  EXPECT_EQ(max_pool(x, {{2, 2}}).shape(), (Shape{-1, 3, -1, 4}));
  auto big = g.placeholder({1, 1, 112, 112}, f32, "big");
  EXPECT_EQ(max_pool(big, {{3, 3}, {2, 2}, {1, 1}}).shape(), (Shape{1, 1, 56, 56}));
  auto five = g.placeholder({1, 1, 5}, f32, "five");
  EXPECT_EQ(max_pool(five, {{2}}).shape(), (Shape{1, 1, 2}));
  EXPECT_EQ(max_pool(five, {.kernel = {2}, .ceil_mode = true}).shape(), (Shape{1, 1, 3}));
  auto empty = g.placeholder({0, 3, 4, 4}, f32, "e");
  auto [y, idx] = max_pool_with_indices(empty, {{2, 2}});
  auto outs = eval(g, {y, idx}, {{empty, random_array({0, 3, 4, 4}, f32)}});
  expect_equal(outs[0], {0, 3, 2, 2}, {});
  expect_equal(outs[1], {0, 3, 2, 2}, {});
}

TEST(MaxPool, ErrorsNameOpAndShapes) {
  Graph g;
  auto x = g.placeholder({1, 1, 3, 3}, f32, "x");
  expect_error<ShapeError>([&] { max_pool(x, {{5, 5}}); },
                           {"[max_pool]", "(5, 5)", "(1, 1, 3, 3)", "larger"});
  expect_error<ShapeError>([&] { max_pool(g.placeholder({3, 4}, f32, "r"), {{2, 2}}); },
                           {"[max_pool]", "(3, 4)", "rank 4"});
  expect_error<ValueError>([&] { max_pool(x, {{2, 2}, {}, {1, 1, 1}}); },
                           {"[max_pool]", "padding has 3 entries"});
  expect_error<ValueError>([&] { max_pool(x, {{2, 2}, {}, {2, 2}}); },
                           {"[max_pool]", "padding", "(1, 1, 3, 3)"});
  expect_error<ValueError>([&] { max_pool(x, {{1, 1, 1, 1}}); }, {"[max_pool]", "(1, 1, 1, 1)"});
  expect_error<ValueError>([&] { max_pool(x, {{2, 2}, {0, 1}}); },
                           {"[max_pool]", "stride", "(1, 1, 3, 3)"});
  expect_error<DTypeError>([&] { max_pool(g.placeholder({1, 1, 2, 2}, boolean, "b"), {{2, 2}}); },
                           {"[max_pool]", "bool"});
}

// ---- AvgPool ----

TEST(AvgPool, MatchesReference) {
  for (const Case& base : window_cases(false)) {
    for (bool include_pad : {false, true}) {
      Case c = base;
      c.o.count_include_pad = include_pad;
      for (DType t : {f32, f64, bf16}) {
        SCOPED_TRACE(describe(c) + " " + name(t));
        Graph g;
        auto x = g.placeholder(c.x, t, "x");
        Array v = random_array(c.x, t);
        Array out = eval1(g, avg_pool(x, c.o), {{x, v}});
        EXPECT_EQ(out.dtype(), t);
        const double tol = t == bf16 ? 8e-3 : 1e-6;
        expect_close(out, ref_out_shape(c.x, c.o), ref_avg_pool(v, c.o), tol, tol);
      }
    }
  }
}

TEST(AvgPool, ErrorsNameOpAndShapes) {
  Graph g;
  auto x = g.placeholder({1, 1, 4, 4}, i32, "x");
  expect_error<DTypeError>([&] { avg_pool(x, {{2, 2}}); }, {"[avg_pool]", "i32", "(1, 1, 4, 4)"});
  auto f = g.placeholder({1, 1, 4, 4}, f32, "f");
  expect_error<ValueError>([&] { avg_pool(f, {.kernel = {2, 2}, .dilation = {2, 2}}); },
                           {"[avg_pool]", "dilation"});
  expect_error<ShapeError>([&] { avg_pool(f, {{2, 6}}); }, {"[avg_pool]", "(1, 1, 4, 4)"});
  expect_error<ShapeError>([&] { avg_pool(g.placeholder({1, 4, 4}, f32, "r"), {{2, 2}}); },
                           {"[avg_pool]", "(1, 4, 4)"});
}

// ---- AdaptiveAvgPool ----

std::vector<double> ref_adaptive(const Array& x, const Shape& out_sp) {
  auto v = to_f64(x);
  const Shape in_sp(x.shape().begin() + 2, x.shape().end());
  const int64_t planes = x.shape()[0] * x.shape()[1];
  std::vector<double> out;
  for (int64_t p = 0; p < planes; ++p) {
    for (int64_t oi = 0; oi < numel(out_sp); ++oi) {
      auto o = unravel(oi, out_sp);
      double sum = 0;
      int64_t count = 0;
      for (int64_t i = 0; i < numel(in_sp); ++i) {
        auto idx = unravel(i, in_sp);
        bool inside = true;
        for (size_t d = 0; d < in_sp.size(); ++d) {
          const double a = static_cast<double>(in_sp[d]) / static_cast<double>(out_sp[d]);
          inside = inside && idx[d] >= std::floor(o[d] * a) && idx[d] < std::ceil((o[d] + 1) * a);
        }
        if (inside) sum += v[p * numel(in_sp) + i], ++count;
      }
      out.push_back(sum / static_cast<double>(count));
    }
  }
  return out;
}

TEST(AdaptiveAvgPool, NonDivisibleSizes) {
  struct AdaptiveCase { Shape x, out; };
  for (const AdaptiveCase& c : {AdaptiveCase{{2, 3, 7, 10}, {3, 4}}, AdaptiveCase{{2, 5, 13}, {5}},
                                AdaptiveCase{{1, 2, 5, 7, 3}, {2, 3, 2}},
                                AdaptiveCase{{1, 1, 3, 4}, {5, 7}},
                                AdaptiveCase{{2, 2, 6, 6}, {3, 2}}}) {
    for (DType t : {f32, f64, f16}) {
      SCOPED_TRACE(to_string(c.x) + " -> " + to_string(c.out) + " " + name(t));
      Graph g;
      auto x = g.placeholder(c.x, t, "x");
      Array v = random_array(c.x, t);
      Shape out{c.x[0], c.x[1]};
      out.insert(out.end(), c.out.begin(), c.out.end());
      const double tol = t == f16 ? 1e-3 : 1e-6;
      expect_close(eval1(g, adaptive_avg_pool(x, c.out), {{x, v}}), out, ref_adaptive(v, c.out),
                   tol, tol);
    }
  }
}

// channels_last adaptive average pooling (NHWC in and out) against the NCHW reference.
TEST(AdaptiveAvgPool, ChannelsLastMatchesReference) {
  struct AdaptiveCase { Shape x, out; };
  for (const AdaptiveCase& c :
       {AdaptiveCase{{2, 16, 7, 7}, {1, 1}}, AdaptiveCase{{2, 3, 7, 10}, {3, 4}},
        AdaptiveCase{{1, 8, 6, 6}, {3, 2}}, AdaptiveCase{{2, 24, 5, 5}, {5, 5}}}) {
    for (DType t : {f32, bf16, f16}) {
      SCOPED_TRACE(to_string(c.x) + " -> " + to_string(c.out) + " " + name(t));
      Graph g;
      auto x = g.placeholder(c.x, t, "x");
      const Tensor nchw = adaptive_avg_pool(x, c.out);
      const Tensor nhwc = channels_last_twin(nchw, x)[0];
      const Array v = random_array(c.x, t);
      const double tol = t == f32 ? 1e-6 : tolerance(t);
      expect_close(eval1(g, transpose(nhwc, {0, 3, 1, 2}), {{x, v}}), nchw.shape(),
                   ref_adaptive(v, c.out), tol, tol);
    }
  }
}

TEST(AdaptiveAvgPool, GlobalAvgPool) {
  for (Shape shape : {Shape{2, 3, 6, 5}, Shape{3, 4, 100}, Shape{1, 2, 3, 4, 5}}) {
    Graph g;
    auto x = g.placeholder(shape, f32, "x");
    Array v = random_array(shape, f32);
    Shape out(shape.size(), 1);
    out[0] = shape[0];
    out[1] = shape[1];
    expect_close(eval1(g, global_avg_pool(x), {{x, v}}), out,
                 ref_adaptive(v, Shape(shape.size() - 2, 1)));
  }
  Graph g;
  expect_error<ShapeError>([&] { global_avg_pool(g.placeholder({3, 4}, f32, "x")); },
                           {"[global_avg_pool]", "(3, 4)"});
}

TEST(AdaptiveAvgPool, ErrorsNameOpAndShapes) {
  Graph g;
  auto x = g.placeholder({2, 3, 4}, f32, "x");
  expect_error<ShapeError>([&] { adaptive_avg_pool(x, {2, 2}); },
                           {"[adaptive_avg_pool]", "(2, 3, 4)", "rank 4"});
  expect_error<ValueError>([&] { adaptive_avg_pool(x, {0}); }, {"[adaptive_avg_pool]", "(0,)"});
  expect_error<DTypeError>([&] { adaptive_avg_pool(g.placeholder({1, 1, 4}, i64, "i"), {2}); },
                           {"[adaptive_avg_pool]", "i64"});
  expect_error<ShapeError>([&] { adaptive_avg_pool(g.placeholder({1, 1, 0}, f32, "e"), {2}); },
                           {"[adaptive_avg_pool]", "(1, 1, 0)"});
}

// ---- gradient ops ----

// dx of a pooling whose output o spreads dy[o] * weight(taps) over its window's taps.
std::vector<double> ref_spread(const Shape& x, const PoolOptions& o, const std::vector<double>& dy,
                               bool include_pad) {
  const int64_t plane = numel(Shape(x.begin() + 2, x.end()));
  std::vector<double> dx(static_cast<size_t>(numel(x)), 0.0);
  for_windows(x, o, [&](int64_t p, int64_t out, const std::vector<Tap>& taps) {
    int64_t real = 0, padded = 0;
    for (const Tap& t : taps) real += t.index >= 0, padded += t.in_padded;
    const double v = dy[out] / static_cast<double>(include_pad ? padded : real);
    for (const Tap& t : taps)
      if (t.index >= 0) dx[p * plane + t.index] += v;
  });
  return dx;
}

// dy[o] added at plane position indices[o].
std::vector<double> ref_scatter(const Shape& x, const Shape& y, const std::vector<double>& dy,
                                const std::vector<double>& indices) {
  const int64_t in_plane = numel(Shape(x.begin() + 2, x.end()));
  const int64_t out_plane = numel(Shape(y.begin() + 2, y.end()));
  std::vector<double> dx(static_cast<size_t>(numel(x)), 0.0);
  for (size_t o = 0; o < dy.size(); ++o)
    dx[o / out_plane * in_plane + static_cast<int64_t>(indices[o])] += dy[o];
  return dx;
}

TEST(MaxPoolGrad, ScattersAtForwardIndices) {
  for (const Case& c : window_cases(true)) {
    for (DType t : {f32, f64, f16}) {
      SCOPED_TRACE(describe(c) + " " + name(t));
      Graph g;
      auto x = g.placeholder(c.x, t, "x");
      const Shape out = ref_out_shape(c.x, c.o);
      auto dy = g.placeholder(out, t, "dy");
      auto dx = max_pool_grad(dy, max_pool_with_indices(x, c.o).second, c.x);
      Array vx = distinct_array(c.x, t), vdy = random_array(out, t);
      Array got = eval1(g, dx, {{x, vx}, {dy, vdy}});
      EXPECT_EQ(got.dtype(), t);
      const double tol = t == f16 ? 2e-3 : 1e-6;
      expect_close(got, c.x, ref_scatter(c.x, out, to_f64(vdy), ref_max_pool(vx, c.o).second),
                   tol, tol);
    }
  }
}

TEST(MaxPoolGrad, RepeatedIndicesAddUpInParallel) {
  // i32 indices drawn at random (many repeats), on enough planes to split across threads
  const Shape x{4, 16, 9, 11}, y{4, 16, 5, 5};
  Graph g;
  auto dy = g.placeholder(y, f64, "dy");
  auto idx = g.placeholder(y, i32, "idx");
  Array vdy = random_array(y, f64), vidx = random_ints(y, 0, 98, i32);
  Array got = eval1(g, max_pool_grad(dy, idx, x), {{dy, vdy}, {idx, vidx}});
  expect_close(got, x, ref_scatter(x, y, to_f64(vdy), to_f64(vidx)), 1e-12, 1e-12);
}

TEST(MaxPoolGrad, ErrorsNameOpAndShapes) {
  Graph g;
  auto dy = g.placeholder({1, 2, 2, 2}, f32, "dy");
  auto idx = g.placeholder({1, 2, 2, 2}, i64, "idx");
  expect_error<ShapeError>([&] { max_pool_grad(dy, idx, {1, 2, -1, 4}); },
                           {"[max_pool_grad]", "(1, 2, ?, 4)", "static"});
  expect_error<ShapeError>([&] { max_pool_grad(dy, idx, {1, 3, 4, 4}); },
                           {"[max_pool_grad]", "(1, 3, 4, 4)", "(1, 2, 2, 2)"});
  expect_error<ShapeError>(
      [&] { max_pool_grad(dy, g.placeholder({1, 2, 2}, i64, "i3"), {1, 2, 4, 4}); },
      {"[max_pool_grad]", "(1, 2, 2)", "(1, 2, 2, 2)"});
  expect_error<DTypeError>(
      [&] { max_pool_grad(dy, g.placeholder({1, 2, 2, 2}, f32, "fi"), {1, 2, 4, 4}); },
      {"[max_pool_grad]", "f32"});
  Array bad = random_ints({1, 2, 2, 2}, 0, 15);
  bad.data<int64_t>()[5] = 16;
  expect_error<ValueError>(
      [&] {
        eval1(g, max_pool_grad(dy, idx, {1, 2, 4, 4}),
              {{dy, random_array({1, 2, 2, 2}, f32)}, {idx, bad}});
      },
      {"[max_pool_grad]", "index 16", "16 elements"});
}

TEST(AvgPoolGrad, MatchesReference) {
  for (const Case& base : window_cases(false)) {
    for (bool include_pad : {false, true}) {
      Case c = base;
      c.o.count_include_pad = include_pad;
      for (DType t : {f32, f64}) {
        SCOPED_TRACE(describe(c) + " " + name(t));
        const Shape out = ref_out_shape(c.x, c.o);
        Graph g;
        auto dy = g.placeholder(out, t, "dy");
        Array vdy = random_array(out, t);
        Array got = eval1(g, avg_pool_grad(dy, c.x, c.o), {{dy, vdy}});
        EXPECT_EQ(got.dtype(), t);
        expect_close(got, c.x, ref_spread(c.x, c.o, to_f64(vdy), include_pad), 1e-6, 1e-6);
      }
    }
  }
}

TEST(AvgPoolGrad, ErrorsNameOpAndShapes) {
  Graph g;
  auto dy = g.placeholder({1, 1, 2, 2}, f32, "dy");
  expect_error<ShapeError>([&] { avg_pool_grad(dy, {1, 1, 6, 6}, {{2, 2}}); },
                           {"[avg_pool_grad]", "(1, 1, 2, 2)", "(1, 1, 3, 3)", "(1, 1, 6, 6)"});
  expect_error<ValueError>(
      [&] { avg_pool_grad(dy, {1, 1, 4, 4}, {.kernel = {2, 2}, .dilation = {2, 2}}); },
      {"[avg_pool_grad]", "dilation"});
  expect_error<DTypeError>(
      [&] { avg_pool_grad(g.placeholder({1, 1, 2, 2}, i32, "i"), {1, 1, 4, 4}, {{2, 2}}); },
      {"[avg_pool_grad]", "i32"});
}

std::vector<double> ref_adaptive_grad(const Shape& x, const Shape& out_sp,
                                      const std::vector<double>& dy) {
  const Shape in_sp(x.begin() + 2, x.end());
  std::vector<double> dx(static_cast<size_t>(numel(x)), 0.0);
  for (int64_t p = 0; p < x[0] * x[1]; ++p)
    for (int64_t oi = 0; oi < numel(out_sp); ++oi) {
      auto o = unravel(oi, out_sp);
      std::vector<int64_t> members;
      for (int64_t i = 0; i < numel(in_sp); ++i) {
        auto idx = unravel(i, in_sp);
        bool inside = true;
        for (size_t d = 0; d < in_sp.size(); ++d) {
          const double a = static_cast<double>(in_sp[d]) / static_cast<double>(out_sp[d]);
          inside = inside && idx[d] >= std::floor(o[d] * a) && idx[d] < std::ceil((o[d] + 1) * a);
        }
        if (inside) members.push_back(i);
      }
      const double v = dy[p * numel(out_sp) + oi] / static_cast<double>(members.size());
      for (int64_t i : members) dx[p * numel(in_sp) + i] += v;
    }
  return dx;
}

TEST(AdaptiveAvgPoolGrad, NonDivisibleSizes) {
  struct AdaptiveCase { Shape x, out; };
  for (const AdaptiveCase& c : {AdaptiveCase{{2, 3, 7, 10}, {3, 4}}, AdaptiveCase{{2, 5, 13}, {5}},
                                AdaptiveCase{{1, 2, 5, 7, 3}, {2, 3, 2}},
                                AdaptiveCase{{1, 1, 3, 4}, {5, 7}}}) {
    for (DType t : {f32, f64}) {
      SCOPED_TRACE(to_string(c.x) + " -> " + to_string(c.out) + " " + name(t));
      Shape out{c.x[0], c.x[1]};
      out.insert(out.end(), c.out.begin(), c.out.end());
      Graph g;
      auto dy = g.placeholder(out, t, "dy");
      Array vdy = random_array(out, t);
      expect_close(eval1(g, adaptive_avg_pool_grad(dy, c.x), {{dy, vdy}}), c.x,
                   ref_adaptive_grad(c.x, c.out, to_f64(vdy)), 1e-6, 1e-6);
    }
  }
}

TEST(AdaptiveAvgPoolGrad, ErrorsNameOpAndShapes) {
  Graph g;
  auto dy = g.placeholder({2, 3, 4}, f32, "dy");
  expect_error<ShapeError>([&] { adaptive_avg_pool_grad(dy, {2, 3, 4, 4}); },
                           {"[adaptive_avg_pool_grad]", "(2, 3, 4, 4)", "(2, 3, 4)"});
  expect_error<ShapeError>([&] { adaptive_avg_pool_grad(dy, {2, 3, -1}); },
                           {"[adaptive_avg_pool_grad]", "static"});
}

}  // namespace
}  // namespace kiln
