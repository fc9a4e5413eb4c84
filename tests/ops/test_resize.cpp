// Resize (ONNX Resize, opset 19) against a float64 transcription of the ONNX reference
// implementation (1-D interpolation of the n nearest neighbours in the edge-padded input,
// recursively over the dims), and against values worked out by hand from the spec formulas.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;

const char* kCoordNames[] = {"half_pixel",    "half_pixel_symmetric", "pytorch_half_pixel",
                             "align_corners", "asymmetric",           "tf_crop_and_resize"};

struct Ref {
  ResizeOptions o;
  std::vector<double> scales;  // resolved per dim
};

std::vector<double> coeffs_for(const ResizeOptions& o, double ratio, double scale) {
  const double A = o.cubic_coeff_a;
  if (o.mode == ResizeMode::nearest) {
    if (ratio == 1) return {0, 1};
    switch (o.nearest_mode) {
      case NearestMode::round_prefer_floor: return {double(ratio <= 0.5), double(ratio > 0.5)};
      case NearestMode::round_prefer_ceil: return {double(ratio < 0.5), double(ratio >= 0.5)};
      case NearestMode::floor: return {1, 0};
      case NearestMode::ceil: return {0, 1};
    }
  }
  if (o.mode == ResizeMode::linear) {
    if (!o.antialias) return {1 - ratio, ratio};
    const double s = std::min(scale, 1.0);
    const int start = static_cast<int>(std::floor(-1 / s) + 1), n = 2 - 2 * start;
    std::vector<double> c;
    double sum = 0;
    for (int i = start; i < start + n; ++i) {
      c.push_back(std::clamp(1 - std::abs((i - ratio) * s), 0.0, 1.0));
      sum += c.back();
    }
    for (double& v : c) v /= sum;
    return c;
  }
  auto cubic = [A](double x) {
    x = std::abs(x);
    if (x <= 1) return (A + 2) * x * x * x - (A + 3) * x * x + 1;
    if (x < 2) return A * x * x * x - 5 * A * x * x + 8 * A * x - 4 * A;
    return 0.0;
  };
  if (!o.antialias) {
    const double r1 = ratio + 1, q = 1 - ratio, q1 = q + 1;
    return {((A * r1 - 5 * A) * r1 + 8 * A) * r1 - 4 * A,
            ((A + 2) * ratio - (A + 3)) * ratio * ratio + 1, ((A + 2) * q - (A + 3)) * q * q + 1,
            ((A * q1 - 5 * A) * q1 + 8 * A) * q1 - 4 * A};
  }
  const double s = std::min(scale, 1.0);
  const int i_start = static_cast<int>(std::floor(-2 / s) + 1), i_end = 2 - i_start;
  std::vector<double> c;
  double sum = 0;
  for (int i = i_start; i < i_end; ++i) {
    c.push_back(cubic(s * (i - ratio)));
    sum += c.back();
  }
  for (double& v : c) v /= sum;
  return c;
}

// ONNX _interpolate_1d_with_x, with the spec's integer output length where the spec uses it.
double interpolate_1d(const std::vector<double>& data, double scale, int64_t out_len, int64_t x,
                      double roi0, double roi1, const ResizeOptions& o) {
  const double in = static_cast<double>(data.size()), xd = static_cast<double>(x);
  double xo = 0;
  switch (o.coordinate_transformation_mode) {
    case ResizeCoordinates::half_pixel: xo = (xd + 0.5) / scale - 0.5; break;
    case ResizeCoordinates::half_pixel_symmetric: {
      const double adj = out_len / (scale * in);
      xo = in / 2 * (1 - adj) + (xd + 0.5) / scale - 0.5;
      break;
    }
    case ResizeCoordinates::pytorch_half_pixel:
      xo = out_len > 1 ? (xd + 0.5) / scale - 0.5 : 0;
      break;
    case ResizeCoordinates::align_corners:
      // the resized length is in * scale, not rounded (ONNX's reference)
      xo = out_len == 1 || in * scale <= 1 ? 0 : xd * (in - 1) / (in * scale - 1);
      break;
    case ResizeCoordinates::asymmetric: xo = xd / scale; break;
    case ResizeCoordinates::tf_crop_and_resize:
      xo = out_len == 1 ? (roi1 - roi0) * (in - 1) / 2
                        : xd * (roi1 - roi0) * (in - 1) / (out_len - 1);
      xo += roi0 * (in - 1);
      if (xo < 0 || xo > in - 1) return o.extrapolation_value;
      break;
  }
  const double ratio = xo == std::floor(xo) ? 1 : xo - std::floor(xo);
  std::vector<double> c = coeffs_for(o, ratio, scale);
  const int64_t n = static_cast<int64_t>(c.size()), pad = (n + 1) / 2;
  // distances in unpadded coordinates: the reference's x + pad can round (1 + 2^-52 + 1 == 2)
  // and pick a neighbour left of floor(x)
  std::vector<int64_t> idx(static_cast<size_t>(data.size() + 2 * pad));
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<int64_t>(i);
  std::stable_sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) {
    return std::abs(xo - static_cast<double>(a - pad)) <
           std::abs(xo - static_cast<double>(b - pad));
  });
  idx.resize(static_cast<size_t>(n));
  std::sort(idx.begin(), idx.end());
  if (o.exclude_outside && o.mode != ResizeMode::nearest) {
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t k = idx[i] - pad;
      if (k < 0 || k >= static_cast<int64_t>(data.size())) c[i] = 0;
      sum += c[i];
    }
    for (double& v : c) v /= sum;
  }
  double r = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t k = std::clamp<int64_t>(idx[i] - pad, 0, static_cast<int64_t>(data.size()) - 1);
    if (c[i] != 0) r += c[i] * data[k];
  }
  return r;
}

// ONNX _interpolate_nd_with_x: dim d interpolates the results of the dims after it.
double interpolate_nd(const std::vector<double>& x, const Shape& xs, const Shape& out,
                      const std::vector<double>& scales, const std::vector<int64_t>& at, size_t d,
                      int64_t base, const ResizeOptions& o) {
  if (d == xs.size()) return x[base];
  const int64_t stride = numel(Shape(xs.begin() + d + 1, xs.end()));
  std::vector<double> line;
  for (int64_t i = 0; i < xs[d]; ++i)
    line.push_back(interpolate_nd(x, xs, out, scales, at, d + 1, base + i * stride, o));
  const double r0 = o.roi.empty() ? 0 : o.roi[d], r1 = o.roi.empty() ? 1 : o.roi[d + xs.size()];
  return interpolate_1d(line, scales[d], out[d], at[d], r0, r1, o);
}

std::vector<double> ref_resize(const Array& x, const Shape& out, const ResizeOptions& o) {
  const Shape& xs = x.shape();
  std::vector<double> scales = o.scales;
  if (scales.empty())
    for (size_t d = 0; d < xs.size(); ++d) scales.push_back(double(out[d]) / double(xs[d]));
  const auto fx = to_f64(x);
  std::vector<double> r;
  for (int64_t i = 0; i < numel(out); ++i)
    r.push_back(interpolate_nd(fx, xs, out, scales, unravel(i, out), 0, 0, o));
  return r;
}

Array run_resize(const Array& vx, const Shape& sizes, const ResizeOptions& o) {
  Graph g;
  auto x = g.placeholder(vx.shape(), vx.dtype(), "x");
  return eval1(g, resize(x, sizes, o), {{x, vx}});
}

TEST(Resize, HandComputedFromSpec) {
  auto opts = [](ResizeMode m, ResizeCoordinates c) {
    ResizeOptions o;
    o.mode = m;
    o.coordinate_transformation_mode = c;
    return o;
  };
  const double d22[] = {1, 2, 3, 4};
  const Array x22 = Array::from_data(d22, {1, 1, 2, 2}, f64);
  // ONNX doc: upsample linear, half_pixel: x_ori = (x + 0.5) / 2 - 0.5 = -0.25, 0.25, 0.75, 1.25
  expect_close(
      run_resize(x22, {1, 1, 4, 4}, opts(ResizeMode::linear, ResizeCoordinates::half_pixel)),
      {1, 1, 4, 4},
      {1, 1.25, 1.75, 2, 1.5, 1.75, 2.25, 2.5, 2.5, 2.75, 3.25, 3.5, 3, 3.25, 3.75, 4}, 1e-12,
      1e-12);
  // align_corners: x_ori = x / 3
  const double t = 1.0 / 3;
  expect_close(
      run_resize(x22, {1, 1, 4, 4}, opts(ResizeMode::linear, ResizeCoordinates::align_corners)),
      {1, 1, 4, 4},
      {1, 1 + t, 1 + 2 * t, 2, 1 + 2 * t, 2, 2 + t, 2 + 2 * t, 2 + t, 2 + 2 * t, 3, 3 + t, 3, 3 + t,
       3 + 2 * t, 4},
      1e-12, 1e-12);
  // ONNX doc: downsample nearest with scales 0.6: x_ori = 1/3 and 2 -> elements 0 and 2
  const double d24[] = {1, 2, 3, 4, 5, 6, 7, 8};
  ResizeOptions near = opts(ResizeMode::nearest, ResizeCoordinates::half_pixel);
  near.scales = {1, 1, 0.6, 0.6};
  expect_equal(run_resize(Array::from_data(d24, {1, 1, 2, 4}, f64), {1, 1, 1, 2}, near),
               {1, 1, 1, 2}, {1, 3});
  // half_pixel_symmetric with scale 0.6 of 4 -> 2: offset 2 (1 - 2 / 2.4) = 1/3, x_ori = 2/3, 7/3
  const double d4[] = {1, 2, 3, 4};
  ResizeOptions sym = opts(ResizeMode::linear, ResizeCoordinates::half_pixel_symmetric);
  sym.scales = {0.6};
  expect_close(run_resize(Array::from_data(d4, {4}, f64), {2}, sym), {2}, {5.0 / 3, 10.0 / 3},
               1e-12, 1e-12);
  // cubic, asymmetric 4 -> 8: x = 1 has x_ori 0.5, taps -1 (edge: 10), 0, 1, 2 with weights
  // -0.09375, 0.59375, 0.59375, -0.09375 for A = -0.75
  const double c4[] = {10, 20, 40, 80};
  Array cub = run_resize(Array::from_data(c4, {4}, f64), {8},
                         opts(ResizeMode::cubic, ResizeCoordinates::asymmetric));
  EXPECT_NEAR(cub.data<double>()[1], 13.125, 1e-12);
  EXPECT_NEAR(cub.data<double>()[2], 20, 1e-12);  // x_ori = 1 exactly
  // tf_crop_and_resize, roi [0.4, 0.6] of 5 -> 3: x_ori = 1.6 + 0.4 x; roi [-0.5, 1.5]: -2, 2, 6
  const double d5[] = {1, 2, 3, 4, 5};
  ResizeOptions crop = opts(ResizeMode::linear, ResizeCoordinates::tf_crop_and_resize);
  crop.roi = {0.4, 0.6};
  expect_close(run_resize(Array::from_data(d5, {5}, f64), {3}, crop), {3}, {2.6, 3, 3.4}, 1e-12,
               1e-12);
  crop.roi = {-0.5, 1.5};
  crop.extrapolation_value = 7.5;
  expect_close(run_resize(Array::from_data(d5, {5}, f64), {3}, crop), {3}, {7.5, 3, 7.5}, 1e-12,
               1e-12);
  // pytorch_half_pixel to one element: x_ori = 0
  expect_close(run_resize(Array::from_data(c4, {4}, f64), {1},
                          opts(ResizeMode::cubic, ResizeCoordinates::pytorch_half_pixel)),
               {1}, {10}, 1e-12, 1e-12);
}

TEST(Resize, MatchesOnnxReferenceEveryMode) {
  struct Case {
    Shape x, out;
    std::vector<double> scales;
  };
  const Case cases[] = {{{2, 3, 4, 5}, {2, 3, 7, 3}, {}},
                        {{1, 2, 5, 4}, {1, 2, 3, 9}, {1, 1, 0.7, 2.3}},
                        {{3, 4, 6}, {5, 3, 6}, {}},
                        {{9}, {4}, {0.5}}};
  for (const Case& c : cases) {
    for (int mode = 0; mode < 3; ++mode) {
      for (int coord = 0; coord < 6; ++coord) {
        ResizeOptions o;
        o.mode = static_cast<ResizeMode>(mode);
        o.coordinate_transformation_mode = static_cast<ResizeCoordinates>(coord);
        o.nearest_mode = static_cast<NearestMode>((coord + mode) % 4);
        o.scales = c.scales;
        o.exclude_outside = coord % 2 == 1;
        o.cubic_coeff_a = coord == 3 ? -0.5 : -0.75;
        if (o.coordinate_transformation_mode == ResizeCoordinates::tf_crop_and_resize) {
          for (size_t d = 0; d < c.x.size(); ++d) o.roi.push_back(-0.1 * double(d));
          for (size_t d = 0; d < c.x.size(); ++d) o.roi.push_back(1 + 0.2 * double(d % 2));
          o.extrapolation_value = -3.5;
        }
        const Array vx = random_array(c.x, f64, -2, 2);
        SCOPED_TRACE(fmt::format("x {} -> {} mode {} coord {}", to_string(c.x), to_string(c.out),
                                 mode, kCoordNames[coord]));
        expect_close(run_resize(vx, c.out, o), c.out, ref_resize(vx, c.out, o), 1e-10, 1e-10);
      }
    }
  }
}

TEST(Resize, NearestModesAndDtypes) {
  for (int nm = 0; nm < 4; ++nm) {
    for (DType t : {f32, i64, u8, boolean, f16, bf16}) {
      ResizeOptions o;
      o.nearest_mode = static_cast<NearestMode>(nm);
      o.coordinate_transformation_mode =
          nm % 2 ? ResizeCoordinates::asymmetric : ResizeCoordinates::half_pixel;
      const Shape xs{2, 5, 6}, out{3, 8, 4};
      const Array vx = random_array(xs, t, 0, 100);
      expect_equal(run_resize(vx, out, o), out, ref_resize(vx, out, o));
    }
  }
}

TEST(Resize, FloatDtypesAndAntialias) {
  for (DType t : {f32, f16, bf16, f64}) {
    for (int mode = 1; mode < 3; ++mode) {
      for (bool aa : {false, true}) {
        ResizeOptions o;
        o.mode = static_cast<ResizeMode>(mode);
        o.antialias = aa;
        const Shape xs{2, 17, 12}, out{2, 5, 20};
        const Array vx = random_array(xs, t, -1, 1);
        expect_close(run_resize(vx, out, o), out, ref_resize(vx, out, o), tolerance(t) * 4,
                     tolerance(t) * 4);
      }
    }
  }
}

TEST(Resize, ErrorsNameOpAndShapes) {
  Graph g;
  auto x = g.placeholder({2, 3}, f32, "x");
  expect_error<ShapeError>([&] { resize(x, {4}); }, {"[resize]", "(4,)", "(2, 3)"});
  ResizeOptions o;
  o.scales = {1};
  expect_error<ShapeError>([&] { resize(x, {4, 6}, o); }, {"[resize]", "1 scales", "(2, 3)"});
  o.scales = {1, -2};
  expect_error<ValueError>([&] { resize(x, {4, 6}, o); }, {"[resize]", "positive"});
  ResizeOptions lin;
  lin.mode = ResizeMode::linear;
  expect_error<DTypeError>([&] { resize(g.placeholder({2, 3}, i32, "i"), {4, 6}, lin); },
                           {"[resize]", "linear", "i32"});
}

}  // namespace
}  // namespace kiln
