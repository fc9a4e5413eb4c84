// Softmax, LogSoftmax, LayerNorm, RmsNorm, BatchNorm, InstanceNorm, GroupNorm, Dropout,
// BatchNormTrain and BatchNormTrainGrad against float64 reference loops.
#include <cmath>
#include <optional>

#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;

std::vector<double> ref_softmax(const Array& x, int axis, bool log) {
  const auto v = to_f64(x);
  const AxisView s = split_axis(x.shape(), axis);
  std::vector<double> r(v.size());
  for (int64_t o = 0; o < s.outer; ++o) {
    for (int64_t j = 0; j < s.inner; ++j) {
      auto at = [&](int64_t k) { return o * s.len * s.inner + k * s.inner + j; };
      double mx = -INFINITY, sum = 0;
      for (int64_t k = 0; k < s.len; ++k) mx = std::max(mx, v[at(k)]);
      for (int64_t k = 0; k < s.len; ++k) sum += std::exp(v[at(k)] - mx);
      for (int64_t k = 0; k < s.len; ++k)
        r[at(k)] = log ? v[at(k)] - mx - std::log(sum) : std::exp(v[at(k)] - mx) / sum;
    }
  }
  return r;
}

TEST(Softmax, MatchesReferenceOverEachAxis) {
  struct Case {
    Shape shape;
    int64_t axis;
  };
  for (auto c : {Case{{2, 3, 4}, -1}, Case{{2, 3, 4}, -2}, Case{{2, 3, 4}, 0}, Case{{5, 1, 7}, 1},
                 Case{{3, 5, 130}, 1}, Case{{7}, 0}, Case{{4, 1}, -1}}) {
    for (DType t : {f32, f64, bf16}) {
      Graph g;
      auto x = g.placeholder(c.shape, t, "x");
      Array v = random_array(c.shape, t, -4, 4);
      const int axis = normalize_axis(c.axis, static_cast<int>(c.shape.size()));
      expect_close(eval1(g, softmax(x, c.axis), {{x, v}}), c.shape, ref_softmax(v, axis, false),
                   tolerance(t), tolerance(t));
    }
  }
}

TEST(Softmax, ScalarEmptyAndLargeValues) {
  Graph g;
  auto s = g.placeholder({}, f32, "s");
  expect_close(eval1(g, softmax(s), {{s, Array::scalar(3.5f)}}), {}, {1.0});
  auto e = g.placeholder({0, 4}, f32, "e");
  expect_close(eval1(g, softmax(e, 0), {{e, Array::empty({0, 4}, f32)}}), {0, 4}, {});
  // a max shift keeps exp from overflowing
  auto x = g.placeholder({3, 6}, f32, "x");
  Array v = random_array({3, 6}, f32, 500, 1000);
  expect_close(eval1(g, softmax(x), {{x, v}}), {3, 6}, ref_softmax(v, 1, false), 1e-5, 1e-6);
}

TEST(Softmax, Errors) {
  Graph g;
  auto x = g.placeholder({2, 3}, f32, "x");
  expect_error<ValueError>([&] { softmax(x, 2); }, {"[softmax]", "axis 2", "(2, 3)"});
  expect_error<ValueError>([&] { softmax(x, -3); }, {"[softmax]", "axis -3", "(2, 3)"});
  auto i = g.placeholder({2, 3}, i32, "i");
  expect_error<DTypeError>([&] { softmax(i); }, {"[softmax]", "i32", "(2, 3)"});
}

TEST(LogSoftmax, MatchesReferenceOverEachAxis) {
  struct Case {
    Shape shape;
    int64_t axis;
  };
  for (auto c : {Case{{4, 9}, -1}, Case{{4, 9}, 0}, Case{{2, 1, 3, 5}, -3}, Case{{2, 70, 3}, 1}}) {
    for (DType t : {f32, f64, f16}) {
      Graph g;
      auto x = g.placeholder(c.shape, t, "x");
      Array v = random_array(c.shape, t, -3, 3);
      const int axis = normalize_axis(c.axis, static_cast<int>(c.shape.size()));
      expect_close(eval1(g, log_softmax(x, c.axis), {{x, v}}), c.shape, ref_softmax(v, axis, true),
                   tolerance(t), tolerance(t));
    }
  }
}

TEST(LogSoftmax, StableForLargeSpreads) {
  Graph g;
  auto x = g.placeholder({5, 8}, f64, "x");
  Array v = random_array({5, 8}, f64, -800, 800);  // exp would overflow and underflow
  Array out = eval1(g, log_softmax(x), {{x, v}});
  expect_close(out, {5, 8}, ref_softmax(v, 1, true), 1e-12, 1e-9);
  auto i = g.placeholder({3}, i64, "i");
  expect_error<DTypeError>([&] { log_softmax(i); }, {"[log_softmax]", "i64"});
  expect_error<ValueError>([&] { log_softmax(x, 5); }, {"[log_softmax]", "axis 5", "(5, 8)"});
}

// Layer/RMS norm over the trailing `n` elements of each row, with optional affine params.
std::vector<double> ref_row_norm(const std::vector<double>& x, int64_t n, double eps, bool rms,
                                 const std::vector<double>* w, const std::vector<double>* b) {
  std::vector<double> r(x.size());
  for (size_t row = 0; row * n < x.size(); ++row) {
    const double* p = x.data() + row * n;
    double mean = 0, var = 0;
    if (!rms) {
      for (int64_t i = 0; i < n; ++i) mean += p[i];
      mean /= n;
    }
    for (int64_t i = 0; i < n; ++i) var += (p[i] - mean) * (p[i] - mean);
    var /= n;
    for (int64_t i = 0; i < n; ++i)
      r[row * n + i] = (p[i] - mean) / std::sqrt(var + eps) * (w ? (*w)[i] : 1) + (b ? (*b)[i] : 0);
  }
  return r;
}

TEST(LayerNorm, WithAndWithoutWeightAndBias) {
  struct Case {
    Shape shape;
    int64_t begin;
    Shape params;
  };
  for (auto c : {Case{{4, 6, 8}, -1, {8}}, Case{{4, 6, 8}, 1, {6, 8}}, Case{{5, 1}, -1, {1}},
                 Case{{3, 17}, 0, {3, 17}}}) {
    for (DType t : {f32, f64, f16}) {
      for (int mask = 0; mask < 4; ++mask) {
        Graph g;
        auto x = g.placeholder(c.shape, t, "x");
        auto w = g.placeholder(c.params, t, "w");
        auto b = g.placeholder(c.params, t, "b");
        Array vx = random_array(c.shape, t, -2, 3), vw = random_array(c.params, t, 0.5, 1.5),
              vb = random_array(c.params, t);
        const bool hw = mask & 1, hb = mask & 2;
        auto y = layer_norm(x, hw ? std::optional(w) : std::nullopt,
                            hb ? std::optional(b) : std::nullopt, c.begin, 1e-5);
        Feeds feeds{{x, vx}};
        if (hw) feeds.push_back({w, vw});
        if (hb) feeds.push_back({b, vb});
        auto fw = to_f64(vw), fb = to_f64(vb);
        expect_close(eval1(g, y, feeds), c.shape,
                     ref_row_norm(to_f64(vx), numel(c.params), 1e-5, false, hw ? &fw : nullptr,
                                  hb ? &fb : nullptr),
                     tolerance(t), tolerance(t) * 4);
      }
    }
  }
}

TEST(LayerNorm, DynamicBatch) {
  Graph g;
  auto x = g.placeholder({-1, 8}, f64, "x");
  auto w = g.placeholder({8}, f64, "w");
  Array vx = random_array({5, 8}, f64), vw = random_array({8}, f64);
  auto fw = to_f64(vw);
  expect_close(eval1(g, layer_norm(x, w), {{x, vx}, {w, vw}}), {5, 8},
               ref_row_norm(to_f64(vx), 8, 1e-5, false, &fw, nullptr), 1e-10, 1e-10);
}

TEST(LayerNorm, LongRowsWithLargeMeanStayAccurate) {
  // float accumulation would lose the variance of 1000 + noise over 2^17 elements
  Graph g;
  const Shape shape{2, 1 << 17};
  auto x = g.placeholder(shape, f32, "x");
  Array v = random_array(shape, f32, 999, 1001);
  expect_close(eval1(g, layer_norm(x), {{x, v}}), shape,
               ref_row_norm(to_f64(v), shape[1], 1e-5, false, nullptr, nullptr), 1e-4, 1e-4);
}

TEST(LayerNorm, Errors) {
  Graph g;
  auto x = g.placeholder({2, 3, 4}, f32, "x");
  auto w3 = g.placeholder({3}, f32, "w");
  expect_error<ShapeError>([&] { layer_norm(x, w3); },
                           {"[layer_norm]", "weight", "(3,)", "(4,)", "(2, 3, 4)"});
  auto b = g.placeholder({4, 4}, f32, "b");
  expect_error<ShapeError>([&] { layer_norm(x, std::nullopt, b, -2); },
                           {"[layer_norm]", "bias", "(4, 4)", "(3, 4)"});
  expect_error<ValueError>([&] { layer_norm(x, std::nullopt, std::nullopt, 3); },
                           {"[layer_norm]", "axis 3", "(2, 3, 4)"});
  auto wi = g.placeholder({4}, i32, "wi");
  expect_error<DTypeError>([&] { layer_norm(x, wi); }, {"[layer_norm]", "weight", "i32"});
  expect_error<DTypeError>([&] { layer_norm(g.placeholder({2}, i64, "i")); },
                           {"[layer_norm]", "i64", "(2,)"});
}

TEST(RmsNorm, WithAndWithoutWeight) {
  struct Case {
    Shape shape;
    int64_t begin;
    Shape params;
  };
  for (auto c : {Case{{3, 5, 16}, -1, {16}}, Case{{3, 5, 16}, -2, {5, 16}}, Case{{6, 1}, 1, {1}}}) {
    for (DType t : {f32, f64, bf16}) {
      for (bool hw : {false, true}) {
        Graph g;
        auto x = g.placeholder(c.shape, t, "x");
        auto w = g.placeholder(c.params, t, "w");
        Array vx = random_array(c.shape, t, -2, 2), vw = random_array(c.params, t, -1.5, 1.5);
        auto y = rms_norm(x, hw ? std::optional(w) : std::nullopt, c.begin, 1e-6);
        Feeds feeds{{x, vx}};
        if (hw) feeds.push_back({w, vw});
        auto fw = to_f64(vw);
        expect_close(
            eval1(g, y, feeds), c.shape,
            ref_row_norm(to_f64(vx), numel(c.params), 1e-6, true, hw ? &fw : nullptr, nullptr),
            tolerance(t), tolerance(t) * 4);
      }
    }
  }
}

TEST(RmsNorm, Errors) {
  Graph g;
  auto x = g.placeholder({2, 5}, f32, "x");
  auto w = g.placeholder({2, 5}, f32, "w");
  expect_error<ShapeError>([&] { rms_norm(x, w); }, {"[rms_norm]", "weight", "(2, 5)", "(5,)"});
  expect_error<ValueError>([&] { rms_norm(x, std::nullopt, -3); },
                           {"[rms_norm]", "axis -3", "(2, 5)"});
}

// (N, C, spatial...) references: per-channel affine params of shape (C).
struct ChannelData {
  Array x, w, b;
  std::vector<double> fx, fw, fb;
};
ChannelData channel_data(const Shape& shape, DType t) {
  ChannelData d;
  d.x = random_array(shape, t, -2, 3);
  d.w = random_array({shape[1]}, t, 0.5, 1.5);
  d.b = random_array({shape[1]}, t);
  d.fx = to_f64(d.x), d.fw = to_f64(d.w), d.fb = to_f64(d.b);
  return d;
}

// Group norm over (N, C, S) data: groups of C/G channels; instance norm is G = C.
std::vector<double> ref_group_norm(const ChannelData& d, const Shape& shape, int64_t groups,
                                   bool hw, bool hb, double eps) {
  const int64_t n = shape[0], c = shape[1], s = numel(shape) / (n * c), cg = c / groups;
  std::vector<double> r(d.fx.size());
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t gi = 0; gi < groups; ++gi) {
      const int64_t base = (i * c + gi * cg) * s, len = cg * s;
      double mean = 0, var = 0;
      for (int64_t k = 0; k < len; ++k) mean += d.fx[base + k];
      mean /= len;
      for (int64_t k = 0; k < len; ++k) var += std::pow(d.fx[base + k] - mean, 2);
      var /= len;
      for (int64_t k = 0; k < len; ++k) {
        const int64_t ch = gi * cg + k / s;
        r[base + k] = (d.fx[base + k] - mean) / std::sqrt(var + eps) * (hw ? d.fw[ch] : 1) +
                      (hb ? d.fb[ch] : 0);
      }
    }
  }
  return r;
}

// Runs op(x, weight?, bias?) on channel data with the chosen params present.
template <typename F>
Array run_channel_op(const ChannelData& d, bool hw, bool hb, F op) {
  Graph g;
  auto x = g.placeholder(d.x.shape(), d.x.dtype(), "x");
  auto w = g.placeholder(d.w.shape(), d.w.dtype(), "w");
  auto b = g.placeholder(d.b.shape(), d.b.dtype(), "b");
  Feeds feeds{{x, d.x}};
  if (hw) feeds.push_back({w, d.w});
  if (hb) feeds.push_back({b, d.b});
  return eval1(g, op(x, hw ? std::optional(w) : std::nullopt, hb ? std::optional(b) : std::nullopt),
               feeds);
}

TEST(BatchNorm, Over2DAnd4DInputs) {
  for (Shape shape : {Shape{8, 3}, Shape{2, 3, 4, 5}, Shape{2, 1, 7}}) {
    for (DType t : {f32, f64, bf16}) {
      for (int mask = 0; mask < 4; ++mask) {
        const bool hw = mask & 1, hb = mask & 2;
        const ChannelData d = channel_data(shape, t);
        const Array mean = random_array({shape[1]}, t), var = random_array({shape[1]}, t, 0.1, 2);
        const auto fm = to_f64(mean), fv = to_f64(var);
        Graph g;
        auto x = g.placeholder(shape, t, "x");
        auto m = g.placeholder({shape[1]}, t, "m");
        auto v = g.placeholder({shape[1]}, t, "v");
        auto w = g.placeholder({shape[1]}, t, "w");
        auto b = g.placeholder({shape[1]}, t, "b");
        auto y = batch_norm(x, m, v, hw ? std::optional(w) : std::nullopt,
                            hb ? std::optional(b) : std::nullopt, 1e-3);
        Feeds feeds{{x, d.x}, {m, mean}, {v, var}};
        if (hw) feeds.push_back({w, d.w});
        if (hb) feeds.push_back({b, d.b});
        const int64_t s = numel(shape) / (shape[0] * shape[1]);
        std::vector<double> ref(d.fx.size());
        for (size_t i = 0; i < ref.size(); ++i) {
          const int64_t c = (static_cast<int64_t>(i) / s) % shape[1];
          ref[i] =
              (d.fx[i] - fm[c]) / std::sqrt(fv[c] + 1e-3) * (hw ? d.fw[c] : 1) + (hb ? d.fb[c] : 0);
        }
        expect_close(eval1(g, y, feeds), shape, ref, tolerance(t), tolerance(t) * 4);
      }
    }
  }
}

TEST(BatchNorm, Errors) {
  Graph g;
  auto x = g.placeholder({2, 3, 4}, f32, "x");
  auto c3 = g.placeholder({3}, f32, "c3");
  auto c4 = g.placeholder({4}, f32, "c4");
  expect_error<ShapeError>([&] { batch_norm(x, c4, c3); },
                           {"[batch_norm]", "mean", "(4,)", "(3,)", "(2, 3, 4)"});
  expect_error<ShapeError>([&] { batch_norm(x, c3, c3, c4); },
                           {"[batch_norm]", "weight", "(4,)", "(2, 3, 4)"});
  expect_error<ShapeError>([&] { batch_norm(g.placeholder({3}, f32, "r1"), c3, c3); },
                           {"[batch_norm]", "rank", "(3,)"});
}

TEST(InstanceNorm, PerSampleAndChannel) {
  for (Shape shape : {Shape{2, 3, 5}, Shape{2, 3, 4, 4}, Shape{3, 2, 1}}) {
    for (DType t : {f32, f64, f16}) {
      for (int mask = 0; mask < 4; ++mask) {
        const bool hw = mask & 1, hb = mask & 2;
        const ChannelData d = channel_data(shape, t);
        Array out = run_channel_op(
            d, hw, hb, [](auto x, auto w, auto b) { return instance_norm(x, w, b, 1e-5); });
        expect_close(out, shape, ref_group_norm(d, shape, shape[1], hw, hb, 1e-5), tolerance(t),
                     tolerance(t) * 4);
      }
    }
  }
}

TEST(InstanceNorm, Errors) {
  Graph g;
  auto x = g.placeholder({2, 3, 4}, f32, "x");
  auto w = g.placeholder({4}, f32, "w");
  expect_error<ShapeError>([&] { instance_norm(x, w); },
                           {"[instance_norm]", "weight", "(4,)", "(3,)", "(2, 3, 4)"});
  expect_error<ShapeError>(
      [&] {
        instance_norm(g.placeholder({2, 3}, f32, "r2"));
      },
      {"[instance_norm]", "rank", "(2, 3)"});
}

TEST(GroupNorm, SeveralGroups) {
  struct Case {
    Shape shape;
    int64_t groups;
  };
  for (auto c : {Case{{2, 6, 5}, 1}, Case{{2, 6, 5}, 2}, Case{{2, 6, 5}, 3}, Case{{2, 6, 5}, 6},
                 Case{{2, 4, 3, 3}, 2}, Case{{3, 4}, 2}}) {
    for (DType t : {f32, f64, bf16}) {
      for (int mask = 0; mask < 4; ++mask) {
        const bool hw = mask & 1, hb = mask & 2;
        const ChannelData d = channel_data(c.shape, t);
        Array out = run_channel_op(
            d, hw, hb, [&](auto x, auto w, auto b) { return group_norm(x, c.groups, w, b, 1e-5); });
        expect_close(out, c.shape, ref_group_norm(d, c.shape, c.groups, hw, hb, 1e-5), tolerance(t),
                     tolerance(t) * 4);
      }
    }
  }
}

TEST(GroupNorm, Errors) {
  Graph g;
  auto x = g.placeholder({2, 6, 5}, f32, "x");
  expect_error<ValueError>([&] { group_norm(x, 4); },
                           {"[group_norm]", "4 groups", "6 channels", "(2, 6, 5)"});
  expect_error<ValueError>([&] { group_norm(x, 0); }, {"[group_norm]", "0 groups", "(2, 6, 5)"});
  auto b = g.placeholder({3}, f32, "b");
  expect_error<ShapeError>([&] { group_norm(x, 2, std::nullopt, b); },
                           {"[group_norm]", "bias", "(3,)", "(6,)"});
}

TEST(GroupNorm, DynamicChannelsCheckedAtCompile) {
  Graph g;
  auto x = g.placeholder({-1, -1, 4}, f32, "x");
  auto y = group_norm(x, 2);  // channels unknown: accepted until compile
  const ChannelData d = channel_data({2, 6, 4}, f32);
  expect_close(eval1(g, y, {{x, d.x}}), {2, 6, 4},
               ref_group_norm(d, {2, 6, 4}, 2, false, false, 1e-5), tolerance(f32), tolerance(f32) * 4);
  expect_error<ValueError>(
      [&] {
        eval1(g, y, {{x, random_array({2, 5, 4}, f32)}});
      },
      {"[group_norm]", "2 groups", "5 channels", "(2, 5, 4)"});
}

TEST(Dropout, IdentityUnlessTrainingWithPositiveP) {
  Graph g;
  auto x = g.placeholder({4, 5}, f32, "x");
  EXPECT_EQ(dropout(x, 0.5), x);
  EXPECT_EQ(dropout(x, 0.0, true, 7), x);
  EXPECT_EQ(g.num_nodes(), 1u);
}

// Runs training dropout on v and returns the output.
Array run_dropout(const Array& v, double p, uint64_t seed, int threads = 0) {
  Graph g;
  auto x = g.placeholder(v.shape(), v.dtype(), "x");
  CompileOptions opts;
  opts.num_threads = threads;
  return eval(g, {dropout(x, p, true, seed)}, {{x, v}}, opts)[0];
}

TEST(Dropout, DropsAboutPAndScalesTheRestExactly) {
  const int64_t n = 100000;
  for (double p : {0.25, 0.5, 0.75}) {
    for (DType t : {f32, f64}) {
      Array v = random_nonzero({n}, t, 0.1, 3);
      Array out = run_dropout(v, p, 1234 + static_cast<uint64_t>(p * 100));
      ASSERT_EQ(out.shape(), Shape{n});
      const auto fx = to_f64(v), fy = to_f64(out);
      int64_t zeros = 0, bad = 0;
      for (int64_t i = 0; i < n; ++i) {
        // 1 - p is exact for these p, so x / (1 - p) rounds the same in the dtype and in f64
        const double kept = t == f32 ? static_cast<float>(fx[i] / (1 - p)) : fx[i] / (1 - p);
        if (fy[i] == 0)
          ++zeros;
        else if (fy[i] != kept)
          ++bad;
      }
      EXPECT_EQ(bad, 0);
      // six standard deviations of a binomial fraction: a false failure is ~1e-9 likely
      const double sigma = std::sqrt(p * (1 - p) / n);
      EXPECT_NEAR(static_cast<double>(zeros) / n, p, 6 * sigma) << "p=" << p;
    }
  }
}

TEST(Dropout, MaskDependsOnSeedOnly) {
  Array v = random_nonzero({4096}, f32, 0.5, 1);
  const auto a = to_f64(run_dropout(v, 0.5, 42, 1));
  const auto b = to_f64(run_dropout(v, 0.5, 42, 4));
  const auto c = to_f64(run_dropout(v, 0.5, 43));
  EXPECT_EQ(a, b);  // same seed, other thread count: the same mask
  int64_t differ = 0;
  for (size_t i = 0; i < a.size(); ++i) differ += (a[i] == 0) != (c[i] == 0);
  // two independent masks of p = 0.5 differ at about half the positions
  EXPECT_GT(differ, 1700);
}

TEST(Dropout, HalfTypesAndEmpty) {
  Array v = random_array({2000}, bf16, -2, 2);
  const auto fx = to_f64(v), fy = to_f64(run_dropout(v, 0.5, 9));
  for (size_t i = 0; i < fx.size(); ++i)
    if (fy[i] != 0) ASSERT_EQ(fy[i], 2 * fx[i]);
  EXPECT_EQ(run_dropout(Array::empty({0, 3}, f32), 0.5, 1).shape(), (Shape{0, 3}));
}

TEST(Dropout, Errors) {
  Graph g;
  auto x = g.placeholder({2, 3}, f32, "x");
  expect_error<ValueError>([&] { dropout(x, 1.0, true); }, {"[dropout]", "[0, 1)", "1", "(2, 3)"});
  expect_error<ValueError>([&] { dropout(x, -0.1); }, {"[dropout]", "-0.1", "(2, 3)"});
  expect_error<DTypeError>([&] { dropout(g.placeholder({2}, i32, "i"), 0.5, true); },
                           {"[dropout]", "i32", "(2,)"});
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {
using namespace kiln::test;

// Training batch norm against float64 loops: batch statistics and running-average updates.
TEST(BatchNorm, TrainingModeUsesBatchStatisticsAndUpdatesRunningAverages) {
  const int64_t n = 4, c = 3, h = 2, w = 5;
  Graph g;
  Array xv = random_array({n, c, h, w}, f64, -2, 3);
  Array rm0 = random_array({c}, f64), rv0 = random_array({c}, f64, 0.5, 2);
  Array wv = random_array({c}, f64), bv = random_array({c}, f64);
  auto x = g.placeholder({n, c, h, w}, f64, "x");
  auto rm = g.variable(rm0, "bn.running_mean"), rv = g.variable(rv0, "bn.running_var");
  auto bn = batch_norm_training(x, rm, rv, g.constant(wv), g.constant(bv), 0.1, 1e-5);
  auto exe = g.compile(Device::cpu(), {}, {bn.y}, bn.updates);
  auto y = exe.run({{x, xv}})[0];

  auto xs = to_f64(xv), ws = to_f64(wv), bs = to_f64(bv), m0 = to_f64(rm0), v0 = to_f64(rv0);
  std::vector<double> ref(xs.size()), want_m(c), want_v(c);
  const int64_t per = n * h * w;
  for (int64_t ch = 0; ch < c; ++ch) {
    double mean = 0, var = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k < h * w; ++k) mean += xs[(i * c + ch) * h * w + k] / per;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k < h * w; ++k) {
        double d = xs[(i * c + ch) * h * w + k] - mean;
        var += d * d / per;
      }
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k < h * w; ++k) {
        const int64_t at = (i * c + ch) * h * w + k;
        ref[at] = (xs[at] - mean) / std::sqrt(var + 1e-5) * ws[ch] + bs[ch];
      }
    want_m[ch] = 0.9 * m0[ch] + 0.1 * mean;
    want_v[ch] = 0.9 * v0[ch] + 0.1 * var * per / (per - 1);
  }
  expect_close(y, {n, c, h, w}, ref, 1e-10, 1e-10);
  expect_close(g.read_variable(rm), {c}, want_m, 1e-12, 1e-12);
  expect_close(g.read_variable(rv), {c}, want_v, 1e-12, 1e-12);
  expect_error<ShapeError>([&] { batch_norm_training(g.placeholder({1, 3}, f32), rm, rv); },
                           {"[batch_norm_training]", "(1, 3)"});
}

// ---- fused training batch norm ----

// Channel ch's element offsets of an (N, C, spatial...) shape.
std::vector<int64_t> channel_offsets(const Shape& shape, int64_t ch) {
  const int64_t n = shape[0], c = shape[1], s = numel(shape) / std::max<int64_t>(1, n * c);
  std::vector<int64_t> r;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t k = 0; k < s; ++k) r.push_back((i * c + ch) * s + k);
  return r;
}

// Absolute tolerance for outputs that are sums of many terms: dtype tolerance times their scale.
double sum_atol(DType t, const std::vector<double>& ref) {
  double m = 0;
  for (double v : ref) m += std::abs(v) / static_cast<double>(std::max<size_t>(1, ref.size()));
  return tolerance(t) * 4 * (1 + m);
}

const Shape kTrainShapes[] = {{8, 3},          {2, 3, 4, 5}, {2, 1, 7},
                              {3, 2, 2, 3, 2}, {5, 4, 1},    {2, 33, 3}};

TEST(BatchNormTrain, BatchStatisticsAndOutputMatchReference) {
  for (const Shape& shape : kTrainShapes) {
    for (DType t : {f32, f64, f16}) {
      for (int mask = 0; mask < 4; ++mask) {
        const bool hw = mask & 1, hb = mask & 2;
        const ChannelData d = channel_data(shape, t);
        const int64_t c = shape[1];
        Graph g;
        auto x = g.placeholder(shape, t, "x");
        auto w = g.placeholder({c}, t, "w");
        auto b = g.placeholder({c}, t, "b");
        auto r = batch_norm_train(x, hw ? std::optional(w) : std::nullopt,
                                  hb ? std::optional(b) : std::nullopt, 1e-3);
        Feeds feeds{{x, d.x}};
        if (hw) feeds.push_back({w, d.w});
        if (hb) feeds.push_back({b, d.b});
        std::vector<double> ry(d.fx.size()), rm(c), rv(c);
        for (int64_t ch = 0; ch < c; ++ch) {
          const auto at = channel_offsets(shape, ch);
          for (int64_t i : at) rm[ch] += d.fx[i] / static_cast<double>(at.size());
          for (int64_t i : at) rv[ch] += std::pow(d.fx[i] - rm[ch], 2) / at.size();
          for (int64_t i : at)
            ry[i] = (d.fx[i] - rm[ch]) / std::sqrt(rv[ch] + 1e-3) * (hw ? d.fw[ch] : 1) +
                    (hb ? d.fb[ch] : 0);
        }
        auto out = eval(g, {r.y, r.mean, r.var}, feeds);
        SCOPED_TRACE(to_string(shape) + " " + name(t) + (hw ? " weight" : "") +
                     (hb ? " bias" : ""));
        expect_close(out[0], shape, ry, tolerance(t), tolerance(t) * 4);
        expect_close(out[1], {c}, rm, tolerance(t), tolerance(t) * 4);
        expect_close(out[2], {c}, rv, tolerance(t), tolerance(t) * 4);
      }
    }
  }
}

TEST(BatchNormTrain, LargeMeanKeepsVarianceAccurate) {
  // values far from 0 with a small spread: a naive sum of squares would cancel
  Graph g;
  const Shape shape{16, 2, 9};
  auto x = g.placeholder(shape, f32, "x");
  Array v = random_array(shape, f32, 1000, 1001);
  auto r = batch_norm_train(x);
  auto out = eval(g, {r.y, r.var}, {{x, v}});
  const auto fx = to_f64(v);
  std::vector<double> rv(2);
  for (int64_t ch = 0; ch < 2; ++ch) {
    const auto at = channel_offsets(shape, ch);
    double m = 0;
    for (int64_t i : at) m += fx[i] / at.size();
    for (int64_t i : at) rv[ch] += std::pow(fx[i] - m, 2) / at.size();
  }
  expect_close(out[1], {2}, rv, 1e-3, 1e-5);
}

TEST(BatchNormTrain, Errors) {
  Graph g;
  auto x = g.placeholder({2, 3, 4}, f32, "x");
  auto c4 = g.placeholder({4}, f32, "c4");
  expect_error<ShapeError>([&] { batch_norm_train(x, c4); },
                           {"[batch_norm_train]", "weight", "(4,)", "(2, 3, 4)"});
  expect_error<ShapeError>([&] { batch_norm_train(g.placeholder({3}, f32, "r1")); },
                           {"[batch_norm_train]", "rank", "(3,)"});
  expect_error<ShapeError>(
      [&] {
        batch_norm_train(g.placeholder({0, 3}, f32, "e"));
      },
      {"[batch_norm_train]", "(0, 3)"});
  expect_error<DTypeError>(
      [&] {
        batch_norm_train(g.placeholder({2, 3}, i32, "i"));
      },
      {"[batch_norm_train]", "i32", "(2, 3)"});
}

// The backward of batch_norm_train for arbitrary mean and var (the formula is the op).
TEST(BatchNormTrainGrad, MatchesReference) {
  for (const Shape& shape : kTrainShapes) {
    for (DType t : {f32, f64, f16}) {
      for (bool hw : {false, true}) {
        const int64_t c = shape[1];
        const ChannelData d = channel_data(shape, t);
        const Array dyv = random_array(shape, t), mv = random_array({c}, t, 0, 1),
                    vv = random_array({c}, t, 0.5, 2);
        const auto fdy = to_f64(dyv), fm = to_f64(mv), fv = to_f64(vv);
        Graph g;
        auto dy = g.placeholder(shape, t, "dy");
        auto x = g.placeholder(shape, t, "x");
        auto m = g.placeholder({c}, t, "m");
        auto v = g.placeholder({c}, t, "v");
        auto w = g.placeholder({c}, t, "w");
        auto r = batch_norm_train_grad(dy, x, m, v, hw ? std::optional(w) : std::nullopt, 1e-3);
        Feeds feeds{{dy, dyv}, {x, d.x}, {m, mv}, {v, vv}};
        if (hw) feeds.push_back({w, d.w});
        std::vector<double> rdx(d.fx.size()), rdw(c), rdb(c);
        for (int64_t ch = 0; ch < c; ++ch) {
          const auto at = channel_offsets(shape, ch);
          const double mm = static_cast<double>(at.size()), rstd = 1 / std::sqrt(fv[ch] + 1e-3);
          for (int64_t i : at) {
            rdb[ch] += fdy[i];
            rdw[ch] += fdy[i] * (d.fx[i] - fm[ch]) * rstd;
          }
          for (int64_t i : at)
            rdx[i] = (hw ? d.fw[ch] : 1) * rstd / mm *
                     (mm * fdy[i] - rdb[ch] - (d.fx[i] - fm[ch]) * rstd * rdw[ch]);
        }
        auto out = eval(g, {r.dx, r.dweight, r.dbias}, feeds);
        SCOPED_TRACE(to_string(shape) + " " + name(t) + (hw ? " weight" : ""));
        expect_close(out[0], shape, rdx, tolerance(t), sum_atol(t, rdx));
        expect_close(out[1], {c}, rdw, tolerance(t), sum_atol(t, rdw));
        expect_close(out[2], {c}, rdb, tolerance(t), sum_atol(t, rdb));
      }
    }
  }
}

TEST(BatchNormTrainGrad, Errors) {
  Graph g;
  auto x = g.placeholder({2, 3, 4}, f32, "x");
  auto c3 = g.placeholder({3}, f32, "c3");
  auto c4 = g.placeholder({4}, f32, "c4");
  expect_error<ShapeError>(
      [&] {
        batch_norm_train_grad(g.placeholder({2, 3, 5}, f32, "dy"), x, c3, c3);
      },
      {"[batch_norm_train_grad]", "(2, 3, 5)", "(2, 3, 4)"});
  expect_error<ShapeError>([&] { batch_norm_train_grad(x, x, c4, c3); },
                           {"[batch_norm_train_grad]", "mean", "(4,)", "(2, 3, 4)"});
  expect_error<ShapeError>([&] { batch_norm_train_grad(x, x, c3, c3, c4); },
                           {"[batch_norm_train_grad]", "weight", "(4,)"});
}

}  // namespace
}  // namespace kiln
