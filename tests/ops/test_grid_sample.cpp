// GridSample (ONNX GridSample, opset 20) against a float64 transcription of the ONNX reference
// implementation, and against values worked out by hand.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;

struct RefSampler {
  GridSampleOptions o;
  int spatial;

  double denormalize(double n, int64_t len) const {
    return o.align_corners ? (n + 1) / 2.0 * (len - 1) : ((n + 1) * len - 1) / 2.0;
  }
  static double reflect(double x, double lo, double hi) {
    const double rng = hi - lo;
    if (x < lo) {
      const double dx = lo - x;
      const int64_t n = static_cast<int64_t>(dx / rng);
      const double r = dx - n * rng;
      return n % 2 == 0 ? lo + r : hi - r;
    }
    if (x > hi) {
      const double dx = x - hi;
      const int64_t n = static_cast<int64_t>(dx / rng);
      const double r = dx - n * rng;
      return n % 2 == 0 ? hi - r : lo + r;
    }
    return x;
  }
  double lo(int64_t) const { return o.align_corners ? 0.0 : -0.5; }
  double hi(int64_t len) const { return o.align_corners ? len - 1.0 : len - 0.5; }
  // _pixel_at_array: the value at integer i of a line, under the padding mode
  double pixel(const std::vector<double>& line, int64_t i) const {
    const int64_t d = static_cast<int64_t>(line.size());
    switch (o.padding_mode) {
      case GridSamplePadding::zeros: return i >= 0 && i < d ? line[i] : 0.0;
      case GridSamplePadding::border: return line[std::clamp<int64_t>(i, 0, d - 1)];
      case GridSamplePadding::reflection:
        return line[static_cast<int64_t>(reflect(static_cast<double>(i), lo(d), hi(d)))];
    }
    return 0;
  }
  static double cubic(double t) {
    const double a = -0.75;
    t = std::abs(t);
    if (t <= 1) return ((a + 2) * t - (a + 3)) * t * t + 1;
    if (t < 2) return ((a * t - 5 * a) * t + 8 * a) * t - 4 * a;
    return 0;
  }
  double interp_1d(const std::vector<double>& line, double x) const {
    const int64_t x0 = static_cast<int64_t>(std::floor(x));
    const double f = x - x0;
    if (o.mode == GridSampleMode::linear)
      return (1 - f) * pixel(line, x0) + f * pixel(line, x0 + 1);
    double r = 0;
    for (int k = 0; k < 4; ++k) r += cubic(f - (k - 1)) * pixel(line, x0 - 1 + k);
    return r;
  }
  // recursive over dims: dim d interpolates the results of the dims after it
  double interp_nd(const std::vector<double>& x, const Shape& dims, const std::vector<double>& at,
                   size_t d, int64_t base) const {
    const int64_t stride = numel(Shape(dims.begin() + d + 1, dims.end()));
    std::vector<double> line;
    for (int64_t i = 0; i < dims[d]; ++i)
      line.push_back(d + 1 == dims.size() ? x[base + i]
                                          : interp_nd(x, dims, at, d + 1, base + i * stride));
    return interp_1d(line, at[d]);
  }
  double nearest_nd(const std::vector<double>& x, const Shape& dims,
                    const std::vector<double>& at) const {
    int64_t off = 0;
    for (size_t d = 0; d < dims.size(); ++d) {
      const int64_t i = static_cast<int64_t>(at[d]), len = dims[d];
      int64_t j = i;
      if (o.padding_mode == GridSamplePadding::zeros && (i < 0 || i >= len)) return 0;
      if (o.padding_mode == GridSamplePadding::border) j = std::clamp<int64_t>(i, 0, len - 1);
      if (o.padding_mode == GridSamplePadding::reflection && (i < 0 || i >= len))
        j = static_cast<int64_t>(reflect(static_cast<double>(i), lo(len), hi(len)));
      off = off * len + j;
    }
    return x[off];
  }
};

std::vector<double> ref_grid_sample(const Array& x, const Array& grid, const GridSampleOptions& o) {
  const Shape &xs = x.shape(), &gs = grid.shape();
  const int k = static_cast<int>(xs.size()) - 2;
  const Shape dims(xs.begin() + 2, xs.end());
  const int64_t plane = numel(dims), points = numel(gs) / gs[0] / k;
  const auto fx = to_f64(x), fg = to_f64(grid);
  RefSampler s{o, k};
  std::vector<double> r;
  for (int64_t n = 0; n < xs[0]; ++n)
    for (int64_t c = 0; c < xs[1]; ++c) {
      const std::vector<double> data(fx.begin() + (n * xs[1] + c) * plane,
                                     fx.begin() + (n * xs[1] + c + 1) * plane);
      for (int64_t p = 0; p < points; ++p) {
        std::vector<double> at(k);
        for (int d = 0; d < k; ++d) {
          double v = s.denormalize(fg[(n * points + p) * k + (k - 1 - d)], dims[d]);
          if (o.mode == GridSampleMode::nearest) v = k == 3 ? std::round(v) : std::nearbyint(v);
          if (v < s.lo(dims[d]) || v > s.hi(dims[d])) {
            if (o.padding_mode == GridSamplePadding::border) v = std::clamp(v, 0.0, dims[d] - 1.0);
            else if (o.padding_mode == GridSamplePadding::reflection)
              v = RefSampler::reflect(v, s.lo(dims[d]), s.hi(dims[d]));
          }
          at[d] = v;
        }
        r.push_back(o.mode == GridSampleMode::nearest ? s.nearest_nd(data, dims, at)
                                                      : s.interp_nd(data, dims, at, 0, 0));
      }
    }
  return r;
}

Array run_grid_sample(const Array& vx, const Array& vg, const GridSampleOptions& o) {
  Graph g;
  auto x = g.placeholder(vx.shape(), vx.dtype(), "x");
  auto grid = g.placeholder(vg.shape(), vg.dtype(), "grid");
  return eval1(g, grid_sample(x, grid, o), {{x, vx}, {grid, vg}});
}

TEST(GridSample, HandComputed) {
  const double d[] = {1, 2, 3, 4};
  const Array x = Array::from_data(d, {1, 1, 2, 2}, f64);
  // (0, 0) is the centre: x = ((0 + 1) 2 - 1) / 2 = 0.5 on both dims; (-1, -1) is x = -0.5,
  // half outside: zeros reads 0 there, border and reflection read element 0; (0.5, -1) with
  // align_corners is column 0.75 of row 0
  const double g[] = {0, 0, -1, -1};
  const Array grid = Array::from_data(g, {1, 1, 2, 2}, f64);
  GridSampleOptions o;
  expect_close(run_grid_sample(x, grid, o), {1, 1, 1, 2}, {2.5, 0.25}, 1e-12, 1e-12);
  o.padding_mode = GridSamplePadding::border;
  expect_close(run_grid_sample(x, grid, o), {1, 1, 1, 2}, {2.5, 1}, 1e-12, 1e-12);
  o.padding_mode = GridSamplePadding::reflection;
  expect_close(run_grid_sample(x, grid, o), {1, 1, 1, 2}, {2.5, 1}, 1e-12, 1e-12);
  const double g2[] = {0.5, -1};
  GridSampleOptions ac;
  ac.align_corners = true;
  expect_close(run_grid_sample(x, Array::from_data(g2, {1, 1, 1, 2}, f64), ac), {1, 1, 1, 1},
               {1.75}, 1e-12, 1e-12);
}

TEST(GridSample, MatchesOnnxReference) {
  struct Case {
    Shape x, grid;
  };
  for (auto c : {Case{{2, 3, 5, 6}, {2, 4, 7, 2}}, Case{{1, 2, 7}, {1, 9, 1}},
                 Case{{2, 2, 3, 4, 5}, {2, 2, 3, 4, 3}}}) {
    for (int mode = 0; mode < 3; ++mode)
      for (int pad = 0; pad < 3; ++pad)
        for (bool align : {false, true}) {
          GridSampleOptions o{static_cast<GridSampleMode>(mode),
                              static_cast<GridSamplePadding>(pad), align};
          // beyond [-1, 1] too, so every padding mode is exercised
          const Array vx = random_array(c.x, f64, -2, 2), vg = random_array(c.grid, f64, -1.6, 1.6);
          SCOPED_TRACE(
              fmt::format("x {} mode {} padding {} align {}", to_string(c.x), mode, pad, align));
          Shape out{c.x[0], c.x[1]};
          out.insert(out.end(), c.grid.begin() + 1, c.grid.end() - 1);
          expect_close(run_grid_sample(vx, vg, o), out, ref_grid_sample(vx, vg, o), 1e-10, 1e-10);
        }
  }
}

TEST(GridSample, HalfTypes) {
  for (DType t : {f32, f16, bf16}) {
    const Array vx = random_array({2, 3, 6, 5}, t, -1, 1),
                vg = random_array({2, 4, 3, 2}, t, -1.2, 1.2);
    GridSampleOptions o;
    o.mode = GridSampleMode::cubic;
    o.padding_mode = GridSamplePadding::reflection;
    expect_close(run_grid_sample(vx, vg, o), {2, 3, 4, 3}, ref_grid_sample(vx, vg, o),
                 tolerance(t) * 8, tolerance(t) * 8);
  }
}

TEST(GridSample, ErrorsNameOpAndShapes) {
  Graph g;
  auto x = g.placeholder({2, 3, 4, 5}, f32, "x");
  expect_error<ShapeError>([&] { grid_sample(x, g.placeholder({2, 4, 4, 3}, f32, "g")); },
                           {"[grid_sample]", "(2, 3, 4, 5)", "(2, 4, 4, 3)"});
  expect_error<ShapeError>([&] { grid_sample(x, g.placeholder({1, 4, 4, 2}, f32, "g")); },
                           {"[grid_sample]", "(1, 4, 4, 2)"});
  expect_error<DTypeError>(
      [&] {
        grid_sample(g.placeholder({1, 1, 2, 2}, i32, "i"), g.placeholder({1, 1, 1, 2}, f32, "g"));
      },
      {"[grid_sample]", "i32"});
}

}  // namespace
}  // namespace kiln
