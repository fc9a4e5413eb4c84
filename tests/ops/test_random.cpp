// Random ops: Philox4x32-10 known answers, TensorFlow goldens (scripts/make_tf_random_goldens.py),
// bits independent of the thread count and run, state chaining, statistics and bad arguments.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "kiln/kiln.h"
#include "kiln/ops/core.h"
#include "ops/philox.h"
#include "support/data.h"
#include "support/reference.h"

namespace kiln {
namespace {

using namespace kiln::test;
using philox::Block;
using philox::Key;

std::vector<uint32_t> bits_of(const Array& a) {
  const Array f = a.to(Device::cpu());
  std::vector<uint32_t> b(static_cast<size_t>(f.numel()));
  EXPECT_EQ(size_of(f.dtype()), 4u);
  std::memcpy(b.data(), f.data(), b.size() * 4);
  return b;
}

Array run_cpu(const Graph& g, const std::vector<Tensor>& outs, int threads, size_t i = 0) {
  CompileOptions o;
  o.num_threads = threads;
  o.optimize = false;  // run the kernels (constant folding would evaluate them at compile)
  Executable exe = g.compile(Device::cpu(), {}, outs, o);
  return exe.run(Feeds{})[i];
}

// ---- Philox4x32-10 known answers: Random123's tests/kat_vectors (DEShawResearch/random123),
// the three "philox4x32 10" lines: counter (4 words), key (2 words), expected output (4 words).
TEST(RandomPhiloxState, Philox4x32_10KnownAnswers) {
  struct Kat {
    Block ctr;
    Key key;
    Block want;
  };
  const Kat kats[] = {
      {{{0x00000000, 0x00000000, 0x00000000, 0x00000000}},
       {{0x00000000, 0x00000000}},
       {{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}}},
      {{{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}},
       {{0xffffffff, 0xffffffff}},
       {{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}}},
      {{{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}},
       {{0xa4093822, 0x299f31d0}},
       {{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}}},
  };
  for (const Kat& k : kats) {
    const Block out = philox::philox4x32_10(k.ctr, k.key);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(out.w[i], k.want.w[i]) << "word " << i;
  }
}

TEST(RandomPhiloxState, CounterSkipCarries) {
  Block c{{0xffffffffu, 0xffffffffu, 0xffffffffu, 7}};
  c = philox::skip(c, 1);
  EXPECT_EQ(c.w[0], 0u);
  EXPECT_EQ(c.w[1], 0u);
  EXPECT_EQ(c.w[2], 0u);
  EXPECT_EQ(c.w[3], 8u);
  c = philox::skip(Block{{5, 0, 0, 0}}, (uint64_t{3} << 32) + 2);
  EXPECT_EQ(c.w[0], 7u);
  EXPECT_EQ(c.w[1], 3u);
}

TEST(RandomPhiloxState, Layout) {
  Graph g;
  // MPSGraph's counter/key: counter words low first, then the key
  Tensor s = random_philox_state_from(g, 0x1111111122222222ull, 0x3333333344444444ull,
                                      0x5555555566666666ull);
  EXPECT_EQ(s.shape(), (Shape{6}));
  EXPECT_EQ(s.dtype(), i32);
  const auto w = bits_of(run_cpu(g, {s}, 1));
  const std::vector<uint32_t> want{0x22222222, 0x11111111, 0x44444444,
                                   0x33333333, 0x66666666, 0x55555555};
  EXPECT_EQ(w, want);
  // the seed pair goes through TensorFlow's scrambling: one Philox block under a fixed key
  Graph g2;
  const auto w2 = bits_of(run_cpu(g2, {random_philox_state(g2, 1, 2)}, 1));
  const Block mix = philox::philox4x32_10(Block{{1, 0, 2, 0}}, Key{{0x3ec8f720u, 0x02461e29u}});
  EXPECT_EQ(w2, (std::vector<uint32_t>{0, 0, mix.w[2], mix.w[3], mix.w[0], mix.w[1]}));
}

// ---- TensorFlow goldens

struct Golden {
  std::string op;
  std::array<int64_t, 2> seed;
  Shape shape;
  std::string file;
};

int64_t parse_num(const std::string& s) {
  return s[0] == 'm' ? -std::stoll(s.substr(1)) : std::stoll(s);
}

// Files are <op>_<seed0>_<seed1>_<dims>.npy, 'm' for a minus sign.
std::vector<Golden> goldens(const std::string& op) {
  std::vector<Golden> out;
  const std::filesystem::path dir =
      std::filesystem::path(kiln::test::test_data_dir(KILN_TEST_DATA_DIR)) / "random";
  for (auto& e : std::filesystem::directory_iterator(dir)) {
    std::string name = e.path().stem().string();
    if (name.rfind(op + "_", 0) != 0) continue;
    std::string rest = name.substr(op.size() + 1);
    if (!rest.empty() && !std::isdigit(rest[0]) && rest[0] != 'm') continue;  // another op
    std::vector<std::string> parts;
    size_t pos;
    while ((pos = rest.find('_')) != std::string::npos) {
      parts.push_back(rest.substr(0, pos));
      rest = rest.substr(pos + 1);
    }
    parts.push_back(rest);
    if (parts.size() != 3) continue;
    Golden gd{op, {parse_num(parts[0]), parse_num(parts[1])}, {}, e.path().string()};
    std::string dims = parts[2];
    while ((pos = dims.find('x')) != std::string::npos) {
      gd.shape.push_back(std::stoll(dims.substr(0, pos)));
      dims = dims.substr(pos + 1);
    }
    gd.shape.push_back(std::stoll(dims));
    out.push_back(gd);
  }
  std::sort(out.begin(), out.end(), [](auto& a, auto& b) { return a.file < b.file; });
  return out;
}

// Compares kiln's stateless op with every golden of `op`: bit for bit when `max_ulp` is 0, else
// each element within max_ulp units in the last place of the larger. Returns the count of
// elements whose bits differ.
int64_t compare_goldens(const std::string& op, int64_t* total, int max_ulp = 0) {
  const auto gs = goldens(op);
  EXPECT_GE(gs.size(), 6u) << "goldens of " << op << " missing";
  int64_t diff = 0;
  *total = 0;
  for (const Golden& gd : gs) {
    const Array want = Array::load_npy(gd.file);
    EXPECT_EQ(want.shape(), gd.shape) << gd.file;
    Graph g;
    Tensor t = op == "uniform"  ? stateless_uniform(g, gd.shape, gd.seed)
               : op == "normal" ? stateless_normal(g, gd.shape, gd.seed)
                                : stateless_truncated_normal(g, gd.shape, gd.seed);
    const auto got = bits_of(run_cpu(g, {t}, 2)), exp = bits_of(want);
    EXPECT_EQ(got.size(), exp.size());
    for (size_t i = 0; i < std::min(got.size(), exp.size()); ++i) {
      if (got[i] == exp[i]) continue;
      ++diff;
      float a, b;
      std::memcpy(&a, &got[i], 4);
      std::memcpy(&b, &exp[i], 4);
      const float m = std::max(std::fabs(a), std::fabs(b));
      if (!(std::fabs(a - b) <= static_cast<float>(max_ulp) * (std::nextafter(m, INFINITY) - m)))
        ADD_FAILURE() << gd.file << " element " << i << ": kiln " << a << " tf " << b;
    }
    *total += static_cast<int64_t>(exp.size());
  }
  return diff;
}

TEST(RandomUniform, MatchesTensorFlowBitForBit) {
  int64_t total = 0;
  EXPECT_EQ(compare_goldens("uniform", &total), 0) << "of " << total;
}
// Normals: TensorFlow calls libm's float logf and sincosf, which are not correctly rounded in
// about 1.5% of Box-Muller draws (glibc 2.36); kiln evaluates log, sin and cos itself
// (ops/philox.h) so that every device gives the same bits. The products then differ from
// TensorFlow's by a few ulp in those draws.
TEST(RandomNormal, MatchesTensorFlowWithinFourUlp) {
  int64_t total = 0;
  const int64_t diff = compare_goldens("normal", &total, 4);
  EXPECT_LT(diff, total / 25) << "of " << total;
  std::printf("RandomNormal: %lld of %lld elements differ from TensorFlow (<= 4 ulp)\n",
              static_cast<long long>(diff), static_cast<long long>(total));
}
TEST(RandomTruncatedNormal, MatchesTensorFlowWithinFourUlp) {
  int64_t total = 0;
  // (a rejection decision could flip only where a draw sits within an ulp of the bound)
  const int64_t diff = compare_goldens("truncated_normal", &total, 4);
  EXPECT_LT(diff, total / 25) << "of " << total;
}

// kiln's log, sin and cos (ops/philox.h) against long double libm: a few ulp of a double, and
// the floats Box-Muller rounds them to correctly rounded in 10^6 draws (the functions use only
// correctly rounded IEEE operations, so a GPU computes the same bits).
TEST(RandomNormal, LogSinCosAreAccurate) {
  std::mt19937_64 rng(test::seed());
  std::uniform_real_distribution<double> u(1e-7, 1), v(0, 2 * 3.14159265358979323846);
  const auto ulps = [](double got, long double want) {
    const double w = static_cast<double>(want);
    return std::fabs(static_cast<double>(got - want)) /
           (std::nextafter(std::fabs(w), INFINITY) - std::fabs(w));
  };
  double worst = 0;
  int64_t misrounded = 0;
  for (int i = 0; i < 1000000; ++i) {
    const double x = u(rng), y = v(rng);
    double s, c;
    philox::sincos_d(y, s, c);
    const long double lx = std::log(static_cast<long double>(x));
    const long double ls = std::sin(static_cast<long double>(y));
    const long double lc = std::cos(static_cast<long double>(y));
    worst = std::max({worst, ulps(philox::log_d(x), lx), ulps(s, ls), ulps(c, lc)});
    misrounded += static_cast<float>(philox::log_d(x)) != static_cast<float>(lx);
    misrounded += static_cast<float>(s) != static_cast<float>(ls);
    misrounded += static_cast<float>(c) != static_cast<float>(lc);
  }
  EXPECT_LE(worst, 4.0);
  EXPECT_LE(misrounded, 3);  // a result within ~2^-29 of a float rounding boundary
  std::printf("RandomNormal: log/sin/cos within %.2f ulp of a double, %lld floats misrounded\n",
              worst, static_cast<long long>(misrounded));
}

// ---- determinism: thread count, runs, chaining

// One graph with every random op (f32 or i32 values) of n elements from one seed.
std::vector<Tensor> all_ops(Graph& g, int64_t n) {
  Tensor s = random_philox_state(g, 77, 5);
  return {random_uniform(s, {n}, -3, 5).values,
          random_normal(s, {n}, 1, 2).values,
          random_truncated_normal(s, {n}, 0, 1, -1, 1.5).values,
          random_bernoulli(s, {n}, 0.3).values,
          random_dropout_mask(s, {n}, 0.8).values,
          random_integer(s, {n}, -7, 1000).values};
}

TEST(RandomUniform, SameBitsForAnyThreadCountAndRun) {
  const int64_t n = 200003;  // many groups and a partial last one
  Graph g;
  auto outs = all_ops(g, n);
  for (size_t k = 0; k < outs.size(); ++k) {
    const auto ref = bits_of(run_cpu(g, outs, 1, k));
    for (int threads : {2, 4, 4})
      EXPECT_EQ(bits_of(run_cpu(g, outs, threads, k)), ref)
          << "output " << k << ", " << threads << " threads";
  }
}

TEST(RandomNormal, StateChainingContinuesTheStream) {
  // n a multiple of the group size: draw(n) then draw(n) from the returned state == draw(2n)
  const int64_t n = 1000;
  using Fn = RandomResult (*)(const Tensor&, int64_t);
  const Fn fns[] = {
      [](const Tensor& s, int64_t m) { return random_uniform(s, {m}); },
      [](const Tensor& s, int64_t m) { return random_normal(s, {m}); },
      [](const Tensor& s, int64_t m) { return random_truncated_normal(s, {m}); },
      [](const Tensor& s, int64_t m) { return random_integer(s, {m}, 0, 1 << 20); },
      [](const Tensor& s, int64_t m) { return random_uniform(s, {m}, 0, 1, f64); },
  };
  for (const Fn& fn : fns) {
    Graph g;
    Tensor s = random_philox_state(g, 3, 9);
    RandomResult a = fn(s, n);
    RandomResult b = fn(a.state, n);
    RandomResult both = fn(s, 2 * n);
    CompileOptions o;
    o.optimize = false;
    auto r = g.compile(Device::cpu(), {}, {a.values, b.values, both.values}, o).run(Feeds{});
    const Array& va = r[0];
    const Array& vb = r[1];
    const Array& v2 = r[2];
    const size_t bytes = static_cast<size_t>(n) * size_of(va.dtype());
    EXPECT_NE(std::memcmp(va.data(), vb.data(), bytes), 0) << "two draws are equal";
    EXPECT_EQ(std::memcmp(va.data(), v2.data(), bytes), 0) << "first draw != first half";
    EXPECT_EQ(std::memcmp(vb.data(), static_cast<const char*>(v2.data()) + bytes, bytes), 0)
        << "second draw != second half";
  }
}

TEST(RandomPhiloxState, NextStateAdvancesTheCounter) {
  Graph g;
  Tensor s = random_philox_state_from(g, 0xfffffffffffffffeull, 5, 9);
  // 10 f32 uniforms: 3 blocks; 10 truncated normals: 3 groups of 256 blocks; 5 f64: 3 blocks
  Tensor n1 = random_uniform(s, {10}).state;
  Tensor n2 = random_truncated_normal(s, {10}).state;
  Tensor n3 = random_normal(s, {5}, 0, 1, f64).state;
  CompileOptions o;
  o.optimize = false;
  auto r = g.compile(Device::cpu(), {}, {n1, n2, n3}, o).run(Feeds{});
  auto expect_ctr = [&](const Array& a, uint64_t blocks) {
    const auto w = bits_of(a);
    const Block c = philox::skip(Block{{0xfffffffeu, 0xffffffffu, 5, 0}}, blocks);
    EXPECT_EQ(w, (std::vector<uint32_t>{c.w[0], c.w[1], c.w[2], c.w[3], 9, 0}));
  };
  expect_ctr(r[0], 3);
  expect_ctr(r[1], 3 * 256);
  expect_ctr(r[2], 3);
}

// ---- statistics on 1M samples; Kolmogorov-Smirnov at significance 0.001: the critical value
// of sqrt(n) * D is 1.9495 (asymptotic).

constexpr int64_t kN = 1 << 20;
constexpr double kKsCritical = 1.9495;

std::vector<double> sample(const std::function<Tensor(Graph&)>& make) {
  Graph g;
  Tensor t = make(g);
  return to_f64(run_cpu(g, {t}, 0));
}

double ks_statistic(std::vector<double> x, const std::function<double(double)>& cdf) {
  std::sort(x.begin(), x.end());
  const double n = static_cast<double>(x.size());
  double d = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double f = cdf(x[i]);
    d = std::max({d, (i + 1) / n - f, f - i / n});
  }
  return d * std::sqrt(n);
}

void expect_moments(const std::vector<double>& x, double mean, double var, const char* what) {
  double m = 0, v = 0;
  for (double e : x) m += e;
  m /= static_cast<double>(x.size());
  for (double e : x) v += (e - m) * (e - m);
  v /= static_cast<double>(x.size() - 1);
  // 5 standard errors of the mean and of the variance (4th moment bounded by 3 var^2)
  const double n = static_cast<double>(x.size());
  EXPECT_NEAR(m, mean, 5 * std::sqrt(var / n)) << what;
  EXPECT_NEAR(v, var, 5 * var * std::sqrt(2.0 / n)) << what;
}

double phi(double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)); }

TEST(RandomUniform, Statistics) {
  const auto x = sample(
      [](Graph& g) { return random_uniform(random_philox_state(g, 11, 0), {kN}, -2, 6).values; });
  for (double e : x) ASSERT_TRUE(e >= -2 && e < 6) << e;
  expect_moments(x, 2, 64.0 / 12, "uniform");
  EXPECT_LT(ks_statistic(x, [](double v) { return (v + 2) / 8; }), kKsCritical);
}

TEST(RandomNormal, Statistics) {
  const auto x = sample(
      [](Graph& g) { return random_normal(random_philox_state(g, 12, 0), {kN}, 0.5, 3).values; });
  expect_moments(x, 0.5, 9, "normal");
  EXPECT_LT(ks_statistic(x, [](double v) { return phi((v - 0.5) / 3); }), kKsCritical);
}

TEST(RandomTruncatedNormal, Statistics) {
  // mean 1, std 2 truncated to [0, 5]: standard bounds a = -0.5, b = 2
  const double a = -0.5, b = 2, z = phi(b) - phi(a);
  const auto x = sample([](Graph& g) {
    return random_truncated_normal(random_philox_state(g, 13, 0), {kN}, 1, 2, 0, 5).values;
  });
  for (double e : x) ASSERT_TRUE(e >= 0 && e <= 5) << e;
  auto pdf = [](double t) { return std::exp(-t * t / 2) / std::sqrt(2 * M_PI); };
  const double m = (pdf(a) - pdf(b)) / z;
  const double var = 1 + (a * pdf(a) - b * pdf(b)) / z - m * m;
  expect_moments(x, 1 + 2 * m, 4 * var, "truncated normal");
  EXPECT_LT(ks_statistic(x, [&](double v) { return (phi((v - 1) / 2) - phi(a)) / z; }),
            kKsCritical);
}

TEST(RandomBernoulli, Rate) {
  const auto x = sample(
      [](Graph& g) { return random_bernoulli(random_philox_state(g, 14, 0), {kN}, 0.3).values; });
  double ones = 0;
  for (double e : x) {
    ASSERT_TRUE(e == 0 || e == 1) << e;
    ones += e;
  }
  EXPECT_NEAR(ones / kN, 0.3, 5 * std::sqrt(0.3 * 0.7 / kN));
  // p = 0 and p = 1 are exact
  const auto none = sample([](Graph& g) {
    return random_bernoulli(random_philox_state(g, 1, 0), {999}, 0.0, i32).values;
  });
  const auto all = sample([](Graph& g) {
    return random_bernoulli(random_philox_state(g, 1, 0), {999}, 1.0, boolean).values;
  });
  for (double e : none) ASSERT_EQ(e, 0);
  for (double e : all) ASSERT_EQ(e, 1);
}

TEST(RandomBernoulli, MatchesPhiloxThreshold) {
  // element i is 1 exactly when word i % 4 of block i / 4 is below p * 2^32
  Graph g;
  Tensor s = random_philox_state_from(g, 123, 0, 456);
  const auto x = to_f64(run_cpu(g, {random_bernoulli(s, {37}, 0.6, u8).values}, 1));
  for (int i = 0; i < 37; ++i) {
    const Block blk =
        philox::philox4x32_10(Block{{static_cast<uint32_t>(123 + i / 4), 0, 0, 0}}, Key{{456, 0}});
    EXPECT_EQ(x[i], blk.w[i % 4] < std::llround(0.6 * 4294967296.0) ? 1 : 0) << i;
  }
}

TEST(RandomDropoutMask, ScaledMask) {
  const auto x = sample([](Graph& g) {
    return random_dropout_mask(random_philox_state(g, 15, 0), {kN}, 0.75).values;
  });
  const float scale = static_cast<float>(1 / 0.75);
  double kept = 0;
  for (double e : x) {
    ASSERT_TRUE(e == 0 || e == scale) << e;
    kept += e != 0;
  }
  EXPECT_NEAR(kept / kN, 0.75, 5 * std::sqrt(0.75 * 0.25 / kN));
  const auto b = sample([](Graph& g) {
    return random_dropout_mask(random_philox_state(g, 15, 0), {kN}, 0.75, boolean).values;
  });
  for (size_t i = 0; i < b.size(); ++i) ASSERT_EQ(b[i] != 0, x[i] != 0) << i;
}

TEST(RandomInteger, RangeAndTensorFlowRule) {
  Graph g;
  Tensor s = random_philox_state_from(g, 7, 0, 99);
  const auto x = to_f64(run_cpu(g, {random_integer(s, {4001}, -10, 7).values}, 2));
  std::vector<int> hits(17, 0);
  for (size_t i = 0; i < x.size(); ++i) {
    const Block blk =
        philox::philox4x32_10(Block{{static_cast<uint32_t>(7 + i / 4), 0, 0, 0}}, Key{{99, 0}});
    ASSERT_EQ(x[i], -10 + static_cast<double>(blk.w[i % 4] % 17)) << i;
    ++hits[static_cast<int>(x[i]) + 10];
  }
  for (int h : hits) EXPECT_GT(h, 150);
  // i64: two words per value, low first
  Graph g2;
  Tensor s2 = random_philox_state_from(g2, 7, 0, 99);
  const int64_t lo = -(int64_t{1} << 62), hi = int64_t{1} << 62;
  const Array v = run_cpu(g2, {random_integer(s2, {5}, lo, hi, i64).values}, 1);
  const int64_t* p = v.data<int64_t>();
  for (int i = 0; i < 5; ++i) {
    const Block blk =
        philox::philox4x32_10(Block{{static_cast<uint32_t>(7 + i / 2), 0, 0, 0}}, Key{{99, 0}});
    const uint64_t bits = blk.w[2 * (i % 2)] | (uint64_t{blk.w[2 * (i % 2) + 1]} << 32);
    EXPECT_EQ(p[i], static_cast<int64_t>(static_cast<uint64_t>(lo) + bits % (uint64_t{1} << 63)));
  }
  // u64 alike; u16 and u32 one word per value
  for (DType t : {u64, u32, u16}) {
    SCOPED_TRACE(name(t));
    Graph g3;
    Tensor s3 = random_philox_state_from(g3, 7, 0, 99);
    const int64_t top = t == u16 ? 60000 : t == u32 ? 4000000000 : int64_t{1} << 62;
    const auto u = run_cpu(g3, {random_integer(s3, {9}, 3, top, t).values}, 1).astype(u64);
    const uint64_t* q = u.data<uint64_t>();
    const int per = t == u64 ? 2 : 4;
    for (int i = 0; i < 9; ++i) {
      const Block blk =
          philox::philox4x32_10(Block{{static_cast<uint32_t>(7 + i / per), 0, 0, 0}}, Key{{99, 0}});
      const int k = i % per;
      const uint64_t range = static_cast<uint64_t>(top - 3);
      const uint64_t want =
          per == 2 ? 3 + (blk.w[2 * k] | (uint64_t{blk.w[2 * k + 1]} << 32)) % range
                   : uint64_t{static_cast<uint32_t>(3 + blk.w[k] % static_cast<uint32_t>(range))};
      EXPECT_EQ(q[i], want) << i;
    }
  }
}

TEST(RandomUniform, OtherFloatTypes) {
  for (DType t : {f64, f16, bf16}) {
    Graph g;
    Tensor s = random_philox_state(g, 21, 0);
    Tensor u = random_uniform(s, {4096}, 0, 1, t).values;
    Tensor n = random_normal(s, {4096}, 0, 1, t).values;
    EXPECT_EQ(u.dtype(), t);
    CompileOptions o;
    o.optimize = false;
    auto r = g.compile(Device::cpu(), {}, {u, n}, o).run(Feeds{});
    const auto xu = to_f64(r[0]), xn = to_f64(r[1]);
    double mu = 0, mn = 0;
    for (double e : xu) {
      ASSERT_TRUE(e >= 0 && e <= 1) << e;
      mu += e;
    }
    for (double e : xn) mn += e;
    EXPECT_NEAR(mu / 4096, 0.5, 0.03) << name(t);
    EXPECT_NEAR(mn / 4096, 0.0, 0.1) << name(t);
  }
}

// ---- bad arguments

TEST(RandomUniform, BadArguments) {
  Graph g;
  Tensor s = random_philox_state(g, 1, 2);
  expect_error<ValueError>([&] { random_uniform(s, {4}, 2, 1); }, {"[random_uniform]", "min"});
  expect_error<DTypeError>([&] { random_uniform(s, {4}, 0, 1, i32); }, {"[random_uniform]"});
  Tensor bad = g.placeholder({5}, i32, "s");
  expect_error<ValueError>([&] { random_uniform(bad, {4}); }, {"[random_uniform]", "state"});
  Tensor badt = g.placeholder({6}, f32, "t");
  expect_error<ValueError>([&] { random_normal(badt, {4}); }, {"[random_normal]", "state"});
  expect_error<ValueError>([&] { random_normal(s, {4}, 0, 0); }, {"[random_normal]", "std"});
  expect_error<ValueError>([&] { random_bernoulli(s, {4}, 1.5); }, {"[random_bernoulli]", "p"});
  expect_error<ValueError>([&] { random_bernoulli(s, {4}, -0.1); }, {"[random_bernoulli]"});
  expect_error<ValueError>([&] { random_dropout_mask(s, {4}, 0); }, {"[random_dropout_mask]"});
  expect_error<ValueError>([&] { random_integer(s, {4}, 5, 5); }, {"[random_integer]", "low"});
  expect_error<ValueError>([&] { random_integer(s, {4}, 0, 300, i8); }, {"[random_integer]"});
  expect_error<ValueError>([&] { random_truncated_normal(s, {4}, 0, 1, 2, 1); },
                           {"[random_truncated_normal]", "min"});
  expect_error<ValueError>([&] { random_truncated_normal(s, {4}, 0, 1, 6, 7); },
                           {"[random_truncated_normal]", "probability"});
  expect_error<ShapeError>([&] { random_uniform(s, {-1, 3}); }, {"shape"});
}

TEST(RandomTruncatedNormal, NotDifferentiable) {
  Graph g;
  Tensor x = g.placeholder({3}, f32, "x");
  Tensor s = random_philox_state(g, 1, 2);
  Tensor y = random_truncated_normal(s, {3}).values * x;
  // the random values are constants of x's gradient: d(sum(r * x))/dx = r
  auto grads = gradients(sum(y), {x});
  ASSERT_TRUE(grads[0].valid());
}

}  // namespace
}  // namespace kiln
