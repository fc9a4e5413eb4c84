#include "support/reference.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace kiln::test {

namespace {
uint64_t make_seed() {
  if (const char* s = std::getenv("KILN_TEST_SEED")) return std::strtoull(s, nullptr, 10);
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}
struct SeedPrinter : ::testing::Environment {
  void SetUp() override { std::printf("[kiln] KILN_TEST_SEED=%llu\n", (unsigned long long)seed()); }
};
const auto* kEnv = ::testing::AddGlobalTestEnvironment(new SeedPrinter);
}  // namespace

uint64_t seed() {
  static const uint64_t s = make_seed();
  return s;
}

std::mt19937_64& rng() {
  static std::mt19937_64 g(seed());
  return g;
}

Array random_array(const Shape& shape, DType dtype, double lo, double hi) {
  const int64_t n = numel(shape);
  std::vector<double> v(static_cast<size_t>(n));
  if (is_floating(dtype)) {
    std::uniform_real_distribution<double> d(lo, hi);
    for (auto& x : v) x = d(rng());
  } else if (dtype == boolean) {
    std::bernoulli_distribution d(0.5);
    for (auto& x : v) x = d(rng());
  } else {
    std::uniform_int_distribution<int64_t> d(static_cast<int64_t>(lo), static_cast<int64_t>(hi));
    for (auto& x : v) x = static_cast<double>(d(rng()));
  }
  return Array::from_vector(v, shape).astype(dtype);
}

Array random_nonzero(const Shape& shape, DType dtype, double min_abs, double max_abs) {
  const int64_t n = numel(shape);
  std::vector<double> v(static_cast<size_t>(n));
  std::uniform_real_distribution<double> d(min_abs, max_abs);
  std::bernoulli_distribution s(0.5);
  for (auto& x : v) {
    x = d(rng()) * (s(rng()) ? 1 : -1);
    if (!is_floating(dtype)) x = std::trunc(x) == 0 ? (x < 0 ? -1 : 1) : std::trunc(x);
  }
  return Array::from_vector(v, shape).astype(dtype);
}

Array random_ints(const Shape& shape, int64_t lo, int64_t hi, DType dtype) {
  return random_array(shape, dtype, static_cast<double>(lo), static_cast<double>(hi));
}

std::vector<double> tanh_recurrence(std::vector<double> h, const std::vector<double>& w,
                                    const std::vector<double>& xs, int64_t B, int64_t H,
                                    int64_t steps) {
  for (int64_t t = 0; t < steps; ++t) {
    std::vector<double> next(static_cast<size_t>(B * H));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t j = 0; j < H; ++j) {
        double s = xs[(t * B + b) * H + j];
        for (int64_t k = 0; k < H; ++k) s += h[b * H + k] * w[k * H + j];
        next[b * H + j] = std::tanh(s);
      }
    h = std::move(next);
  }
  return h;
}

std::vector<double> to_f64(const Array& a) { return a.to_vector<double>(); }

void expect_close(const Array& actual, const Shape& shape, const std::vector<double>& expected,
                  double rtol, double atol) {
  ASSERT_EQ(to_string(actual.shape()), to_string(shape));
  ASSERT_EQ(static_cast<size_t>(actual.numel()), expected.size());
  auto got = to_f64(actual);
  int bad = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    const double e = expected[i], g = got[i];
    bool ok;
    if (std::isnan(e)) ok = std::isnan(g);
    else if (std::isinf(e)) ok = g == e;
    else ok = std::fabs(g - e) <= atol + rtol * std::fabs(e);
    if (!ok && bad++ < 5)
      ADD_FAILURE() << "element " << i << ": got " << g << ", expected " << e << " (rtol " << rtol
                    << ", atol " << atol << ", seed " << seed() << ")";
  }
  EXPECT_EQ(bad, 0) << bad << " of " << expected.size() << " elements differ";
}

void expect_close_to_magnitude(const Array& actual, const std::vector<double>& expected,
                               const std::vector<double>& magnitude, double rtol, double atol) {
  ASSERT_EQ(actual.dtype(), DType::f32);
  ASSERT_EQ(static_cast<size_t>(actual.numel()), expected.size());
  ASSERT_EQ(magnitude.size(), expected.size());
  const auto got = to_f64(actual);
  int bad = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    const double tol = atol + rtol * magnitude[i];
    if (!(std::fabs(got[i] - expected[i]) <= tol) && bad++ < 5)
      ADD_FAILURE() << "element " << i << ": got " << got[i] << ", expected " << expected[i]
                    << " (tolerance " << tol << ", seed " << seed() << ")";
  }
  EXPECT_EQ(bad, 0) << bad << " of " << expected.size() << " elements differ";
}

double tolerance(DType t) {
  switch (t) {
    case DType::f64: return 1e-10;
    case DType::f32: return 2e-5;
    case DType::f16: return 2e-3;
    default: return 1.6e-2;  // bf16
  }
}

void expect_equal(const Array& actual, const Shape& shape, const std::vector<double>& expected) {
  expect_close(actual, shape, expected, 0.0, 0.0);
}

std::vector<Array> eval(const Graph& g, const std::vector<Tensor>& outs, const Feeds& feeds,
                        const CompileOptions& opts) {
  FeedShapes shapes;
  for (auto& [t, a] : feeds) shapes.emplace_back(t, a.shape());
  // KILN_DEVICE picks the device (make test-gpu runs the suite on CUDA); results come back to
  // the host
  Executable exe = g.compile(default_device(), shapes, outs, opts);
  std::vector<Array> r = exe.run(feeds);
  for (auto& a : r) a = a.to(Device::cpu());
  return r;
}

Array eval1(const Graph& g, const Tensor& out, const Feeds& feeds) {
  return eval(g, {out}, feeds)[0];
}

AxisView split_axis(const Shape& s, int axis) {
  AxisView r;
  for (int d = 0; d < static_cast<int>(s.size()); ++d) {
    if (d < axis) r.outer *= s[d];
    else if (d == axis) r.len = s[d];
    else r.inner *= s[d];
  }
  return r;
}

std::vector<int64_t> unravel(int64_t i, const Shape& shape) {
  std::vector<int64_t> idx(shape.size());
  for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
    idx[d] = shape[d] ? i % shape[d] : 0;
    i = shape[d] ? i / shape[d] : 0;
  }
  return idx;
}

int64_t ravel(const std::vector<int64_t>& idx, const Shape& shape) {
  int64_t r = 0;
  for (size_t d = 0; d < shape.size(); ++d) r = r * shape[d] + idx[d];
  return r;
}

int64_t broadcast_offset(const std::vector<int64_t>& idx, const Shape& in, const Shape& out) {
  int64_t r = 0;
  const size_t off = out.size() - in.size();
  for (size_t d = 0; d < in.size(); ++d) r = r * in[d] + (in[d] == 1 ? 0 : idx[off + d]);
  return r;
}

double requantized(double v, bool relu, int gelu, double y_scale, double y_zero_point, DType yt) {
  if (relu) v = std::max(v, 0.0);
  if (gelu == 1) v = 0.5 * v * std::erfc(-v / std::sqrt(2.0));
  if (gelu == 2) v = 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
  const double lo = yt == DType::u8 ? 0 : -128, hi = yt == DType::u8 ? 255 : 127;
  return std::clamp(std::nearbyint(v / y_scale) + y_zero_point, lo, hi);
}

}  // namespace kiln::test
