// scaled_dot_product_attention and its gradient op against float64 loops that form the scores
// explicitly (q kᵀ, softmax, · v), on fresh random data.
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

#include "support/gradcheck.h"
#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;
using Ts = std::vector<Tensor>;

enum class MaskKind { none, keep, additive };

struct Config {
  Shape batch;
  int64_t lq, lk, e, ev;
  bool causal = false;
  MaskKind mask = MaskKind::none;
  Shape mask_shape;  // broadcasting to (batch..., lq, lk)
  std::optional<double> scale;
};

Shape with(Shape b, std::initializer_list<int64_t> tail) {
  b.insert(b.end(), tail);
  return b;
}

// Scores, probabilities and output of one problem in float64; a query that sees no key has
// zero probabilities.
struct Ref {
  std::vector<double> p, out;  // (B, lq, lk), (B, lq, ev)
};
Ref ref_attention(const Config& c, const Array& q, const Array& k, const Array& v,
                  const Array* mask) {
  const auto vq = to_f64(q), vk = to_f64(k), vv = to_f64(v);
  const std::vector<double> vm = mask ? to_f64(*mask) : std::vector<double>{};
  const Shape full = with(c.batch, {c.lq, c.lk});
  const int64_t nb = numel(c.batch);
  const double scale = c.scale ? *c.scale : 1 / std::sqrt(static_cast<double>(c.e));
  const double inf = std::numeric_limits<double>::infinity();
  Ref r;
  r.p.assign(static_cast<size_t>(nb * c.lq * c.lk), 0.0);
  r.out.assign(static_cast<size_t>(nb * c.lq * c.ev), 0.0);
  for (int64_t b = 0; b < nb; ++b)
    for (int64_t i = 0; i < c.lq; ++i) {
      std::vector<double> s(static_cast<size_t>(c.lk));
      double mx = -inf;
      for (int64_t j = 0; j < c.lk; ++j) {
        double x = 0;
        for (int64_t d = 0; d < c.e; ++d)
          x += vq[(b * c.lq + i) * c.e + d] * vk[(b * c.lk + j) * c.e + d];
        x *= scale;
        if (mask) {
          auto idx = unravel(b, c.batch);
          idx.push_back(i);
          idx.push_back(j);
          const double m = vm[broadcast_offset(idx, mask->shape(), full)];
          if (c.mask == MaskKind::keep && m == 0) x = -inf;
          if (c.mask == MaskKind::additive) x += m;
        }
        if (c.causal && j > i) x = -inf;
        s[j] = x;
        mx = std::max(mx, x);
      }
      if (mx == -inf) continue;
      double sum = 0;
      for (int64_t j = 0; j < c.lk; ++j) sum += std::exp(s[j] - mx);
      for (int64_t j = 0; j < c.lk; ++j) {
        const double p = std::exp(s[j] - mx) / sum;
        r.p[(b * c.lq + i) * c.lk + j] = p;
        for (int64_t d = 0; d < c.ev; ++d)
          r.out[(b * c.lq + i) * c.ev + d] += p * vv[(b * c.lk + j) * c.ev + d];
      }
    }
  return r;
}

Array make_mask(const Config& c, DType t) {
  if (c.mask == MaskKind::keep) {
    // mostly kept (about one in four removed)
    Array m = random_array(c.mask_shape, f32, 0, 1);
    std::vector<double> v = to_f64(m);
    Array out = Array::zeros(c.mask_shape, DType::boolean);
    for (size_t i = 0; i < v.size(); ++i) out.data<bool>()[i] = v[i] > 0.25;
    return out;
  }
  Array m = random_array(c.mask_shape, f64, -2, 2);
  auto* p = m.data<double>();
  for (int64_t i = 0; i < m.numel(); ++i)
    if (p[i] < -1.6) p[i] = -std::numeric_limits<double>::infinity();
  return m.astype(t);
}

AttentionOptions options(const Config& c) {
  AttentionOptions o;
  o.causal = c.causal;
  o.scale = c.scale;
  return o;
}

// Runs `c`'s forward in dtype t on fresh data and hands its output, the f64 reference of the same
// (rounded) inputs and v to `check`.
void run_forward(const Config& c, DType t,
                 const std::function<void(const Array&, const Ref&, const Array&)>& check) {
  SCOPED_TRACE(::testing::Message() << name(t) << " batch " << to_string(c.batch) << " lq "
                                    << c.lq << " lk " << c.lk << " e " << c.e << " ev " << c.ev
                                    << " causal " << c.causal << " mask "
                                    << static_cast<int>(c.mask) << " "
                                    << to_string(c.mask_shape));
  Graph g;
  const Array q = random_array(with(c.batch, {c.lq, c.e}), t, -2, 2);
  const Array k = random_array(with(c.batch, {c.lk, c.e}), t, -2, 2);
  const Array v = random_array(with(c.batch, {c.lk, c.ev}), t);
  auto pq = g.placeholder(q.shape(), t, "q"), pk = g.placeholder(k.shape(), t, "k"),
       pv = g.placeholder(v.shape(), t, "v");
  Feeds feeds{{pq, q}, {pk, k}, {pv, v}};
  std::optional<Array> m;
  std::optional<Tensor> pm;
  if (c.mask != MaskKind::none) {
    m = make_mask(c, t);
    pm = g.placeholder(m->shape(), m->dtype(), "mask");
    feeds.push_back({*pm, *m});
  }
  const Ref r = ref_attention(c, q, k, v, m ? &*m : nullptr);
  const Array y = eval1(g, scaled_dot_product_attention(pq, pk, pv, pm, options(c)), feeds);
  ASSERT_EQ(y.shape(), with(c.batch, {c.lq, c.ev}));
  check(y, r, v);
}

void check_forward(const Config& c, DType t, double tol) {
  run_forward(c, t, [&](const Array& y, const Ref& r, const Array&) {
    expect_close(y, with(c.batch, {c.lq, c.ev}), r.out, tol, tol);
  });
}

const std::vector<Config> kConfigs = {
    {{}, 5, 7, 4, 3},
    {{2, 3}, 17, 33, 16, 8},
    {{2}, 40, 40, 8, 8, true},
    {{3}, 9, 70, 5, 6, true},                                // Lq < Lk, causal (top-left)
    {{2}, 70, 9, 5, 6, true},                                // Lq > Lk, causal
    {{2, 2}, 19, 23, 8, 5, false, MaskKind::keep, {19, 23}},
    {{2, 2}, 19, 23, 8, 5, false, MaskKind::keep, {2, 1, 19, 23}},
    {{2, 2}, 19, 23, 8, 5, true, MaskKind::additive, {23}},
    {{2, 3}, 6, 65, 12, 7, false, MaskKind::additive, {2, 3, 6, 65}},
    {{1}, 3, 4, 2, 2, false, MaskKind::additive, {1, 3, 1}, 0.7},
    {{2}, 1, 1, 3, 3},
    {{2}, 4, 0, 3, 3},                                      // no keys: zeros
    // heads wide enough for the CPU kernel's 16-lane sums over keys and value elements, with
    // partial key blocks and tails of both
    {{2}, 33, 150, 64, 40},
    {{1, 2}, 70, 70, 24, 32, true, MaskKind::additive, {70, 70}},
    // enough query blocks for the CPU kernel's widest (64 queries), the last one partial
    {{4}, 130, 75, 24, 20, true, MaskKind::additive, {4, 130, 75}},
    // scores far apart (e^x of most differences below the smallest normal float: 0)
    {{2}, 9, 40, 16, 16, false, MaskKind::none, {}, 30.0},
};

// f32's tolerance: 1e-5, or more where the scores are large enough for rounding to matter. A
// score's rounding error is about |scale| e |q||k| u (|q|, |k| <= 2, u = 2^-24 without FMA, two
// per product-sum), and the softmax turns a score's error into the same relative error of its
// weight: four times that bound covers the two scores a difference takes, with room.
double f32_tolerance(const Config& c) {
  const double scale = c.scale ? *c.scale : 1 / std::sqrt(static_cast<double>(c.e));
  return std::max(1e-5, 4 * std::abs(scale) * static_cast<double>(c.e) * 4 * 0x1p-24);
}

TEST(ScaledDotProductAttention, MatchesReferenceF32F64) {
  for (const Config& c : kConfigs) {
    check_forward(c, f32, f32_tolerance(c));
    check_forward(c, f64, 1e-10);
  }
}

TEST(ScaledDotProductAttention, HalfTypesComputeInF32) {
  for (const Config& c : kConfigs) {
    check_forward(c, f16, 4e-3);
    check_forward(c, bf16, 3e-2);
  }
}

// bf16 on a CPU with native bf16 products runs through oneDNN's products in tiles of at most
// 2^22 scores: several heads a tile (the last tile partial), and one head's queries over two
// tiles. Its weights are rounded to bf16 for the second product (as flash attention does on GPUs),
// so each output is within half a bf16 unit (2^-8 relative at worst) of the f64 result of the
// bf16 inputs, plus half a unit of each weight times |v| over the row: 2^-8 (|out| + sum p |v|),
// and f32's error. (On f32 copies, CPUs without native bf16, the second part is f32's.)
TEST(ScaledDotProductAttention, Bf16WithinItsRoundings) {
  std::vector<Config> configs = kConfigs;
  configs.push_back({{11}, 700, 650, 8, 8, false, MaskKind::additive, {11, 1, 650}});
  configs.push_back({{1}, 2100, 2050, 8, 4, true});
  configs.push_back({{2, 3}, 200, 300, 64, 64, true, MaskKind::keep, {200, 300}});
  for (const Config& c : configs)
    run_forward(c, bf16, [&](const Array& y, const Ref& r, const Array& v) {
      const std::vector<double> vv = to_f64(v);
      std::vector<double> magnitude(r.out.size());
      const int64_t rows = static_cast<int64_t>(r.out.size()) / std::max<int64_t>(1, c.ev);
      for (int64_t row = 0; row < rows; ++row) {
        const int64_t b = row / c.lq;
        for (int64_t d = 0; d < c.ev; ++d) {
          double m = std::abs(r.out[row * c.ev + d]);
          for (int64_t j = 0; j < c.lk; ++j)
            m += r.p[row * c.lk + j] * std::abs(vv[(b * c.lk + j) * c.ev + d]);
          magnitude[row * c.ev + d] = m;
        }
      }
      expect_close_to_magnitude(y.astype(f32), r.out, magnitude, 0x1p-8, 2e-5);
    });
}

TEST(ScaledDotProductAttention, FullyMaskedRowsGiveZeros) {
  Graph g;
  const Config c{{2}, 3, 5, 4, 2, false, MaskKind::keep, {3, 5}};
  Array m = Array::zeros({3, 5}, DType::boolean);
  for (int j = 0; j < 5; ++j) m.data<bool>()[2 * 5 + j] = true;  // rows 0, 1 see nothing
  const Array q = random_array({2, 3, 4}, f32), k = random_array({2, 5, 4}, f32),
              v = random_array({2, 5, 2}, f32);
  auto pq = g.placeholder(q.shape(), f32, "q"), pk = g.placeholder(k.shape(), f32, "k"),
       pv = g.placeholder(v.shape(), f32, "v"), pm = g.placeholder({3, 5}, DType::boolean, "m");
  auto y = scaled_dot_product_attention(pq, pk, pv, pm);
  auto grads = gradients(sum(y * y), {pq, pk, pv});
  Feeds feeds{{pq, q}, {pk, k}, {pv, v}, {pm, m}};
  auto outs = eval(g, {y, grads[0], grads[1], grads[2]}, feeds);
  const Ref r = ref_attention(c, q, k, v, &m);
  expect_close(outs[0], {2, 3, 2}, r.out, 1e-5, 1e-6);
  for (double x : to_f64(outs[0])) EXPECT_FALSE(std::isnan(x));
  const auto dq = to_f64(outs[1]);
  for (int b = 0; b < 2; ++b)
    for (int i = 0; i < 2; ++i)
      for (int d = 0; d < 4; ++d) EXPECT_EQ(dq[(b * 3 + i) * 4 + d], 0.0);
  for (const auto& a : outs)
    for (double x : to_f64(a)) EXPECT_TRUE(std::isfinite(x));
}

TEST(ScaledDotProductAttention, BroadcastsBatchDimsOfQKV) {
  // one k/v head shared by 3 query heads
  Graph g;
  const Array q = random_array({2, 3, 6, 4}, f64), k = random_array({2, 1, 5, 4}, f64),
              v = random_array({1, 1, 5, 3}, f64);
  auto pq = g.placeholder(q.shape(), f64, "q"), pk = g.placeholder(k.shape(), f64, "k"),
       pv = g.placeholder(v.shape(), f64, "v");
  const Array y = eval1(g, scaled_dot_product_attention(pq, pk, pv), {{pq, q}, {pk, k}, {pv, v}});
  // reference on explicitly repeated k, v
  Graph g2;
  auto k2 = broadcast_to(constant(g2, k), {2, 3, 5, 4});
  auto v2 = broadcast_to(constant(g2, v), {2, 3, 5, 3});
  const auto outs = eval(g2, {k2, v2});
  const Ref r = ref_attention({{2, 3}, 6, 5, 4, 3}, q, outs[0], outs[1], nullptr);
  expect_close(y, {2, 3, 6, 3}, r.out, 1e-10, 1e-12);
  check_gradients(
      [](const Ts& x) { return scaled_dot_product_attention(x[0], x[1], x[2]); },
      {random_array({2, 3, 4, 3}, f64), random_array({2, 1, 5, 3}, f64),
       random_array({1, 1, 5, 2}, f64)});
}

TEST(ScaledDotProductAttention, PromotesAndRejectsBadInputs) {
  Graph g;
  auto q = g.placeholder({2, 4, 8}, f32, "q"), k = g.placeholder({2, 5, 8}, f32, "k"),
       v = g.placeholder({2, 5, 3}, f32, "v");
  EXPECT_EQ(scaled_dot_product_attention(q, k, g.placeholder({2, 5, 3}, f64, "v64")).dtype(),
            f64);
  expect_error<ShapeError>(
      [&] { scaled_dot_product_attention(q, g.placeholder({2, 5, 7}, f32, "k7"), v); },
      {"[scaled_dot_product_attention]", "(2, 5, 7)"});
  expect_error<ShapeError>(
      [&] { scaled_dot_product_attention(q, k, g.placeholder({2, 6, 3}, f32, "v6")); },
      {"[scaled_dot_product_attention]", "(2, 6, 3)"});
  expect_error<ShapeError>(
      [&] { scaled_dot_product_attention(q, k, v, g.placeholder({3, 5}, DType::boolean, "m")); },
      {"[scaled_dot_product_attention]", "mask shape (3, 5)"});
  expect_error<DTypeError>(
      [&] { scaled_dot_product_attention(q, k, v, g.placeholder({4, 5}, i32, "mi")); },
      {"[scaled_dot_product_attention]", "i32"});
  expect_error<DTypeError>(
      [&] {
        auto qi = g.placeholder({4, 8}, i32, "qi");
        scaled_dot_product_attention(qi, qi, qi);
      },
      {"[scaled_dot_product_attention]", "float"});
  expect_error<ShapeError>(
      [&] {
        auto x = g.placeholder({8}, f32, "x");
        scaled_dot_product_attention(x, x, x);
      },
      {"[scaled_dot_product_attention]", "rank"});
}

// The grad op against dq = scale dS k, dk = scale dSᵀ q, dv = Pᵀ dO with
// dS = P ∘ (dO vᵀ - rowsum(dO ∘ O)), and dS itself as the mask's gradient.
TEST(ScaledDotProductAttentionGrad, MatchesReference) {
  for (DType t : {f32, f64}) {
    for (const Config& c :
         {Config{{2}, 7, 9, 4, 3, true, MaskKind::additive, {7, 9}},
          Config{{2, 2}, 20, 13, 5, 6, false, MaskKind::keep, {2, 2, 20, 13}},
          Config{{3}, 33, 65, 8, 8},
          // head dims past the 16-lane dot products, with tails
          Config{{2}, 19, 40, 37, 20, true}}) {
      SCOPED_TRACE(::testing::Message() << name(t) << " lq " << c.lq << " lk " << c.lk);
      Graph g;
      const Array q = random_array(with(c.batch, {c.lq, c.e}), t, -2, 2);
      const Array k = random_array(with(c.batch, {c.lk, c.e}), t, -2, 2);
      const Array v = random_array(with(c.batch, {c.lk, c.ev}), t);
      const Array dout = random_array(with(c.batch, {c.lq, c.ev}), t);
      std::optional<Array> m;
      if (c.mask != MaskKind::none) m = make_mask(c, t);
      const Ref r = ref_attention(c, q, k, v, m ? &*m : nullptr);
      const int64_t nb = numel(c.batch);
      const double scale = 1 / std::sqrt(static_cast<double>(c.e));
      const auto vq = to_f64(q), vk = to_f64(k), vv = to_f64(v), vdo = to_f64(dout);
      std::vector<double> dq(vq.size()), dk(vk.size()), dv(vv.size()),
          ds(static_cast<size_t>(nb * c.lq * c.lk));
      for (int64_t b = 0; b < nb; ++b)
        for (int64_t i = 0; i < c.lq; ++i) {
          double di = 0;
          for (int64_t d = 0; d < c.ev; ++d)
            di += vdo[(b * c.lq + i) * c.ev + d] * r.out[(b * c.lq + i) * c.ev + d];
          for (int64_t j = 0; j < c.lk; ++j) {
            const double p = r.p[(b * c.lq + i) * c.lk + j];
            double dp = 0;
            for (int64_t d = 0; d < c.ev; ++d)
              dp += vdo[(b * c.lq + i) * c.ev + d] * vv[(b * c.lk + j) * c.ev + d];
            const double s = p * (dp - di);
            ds[(b * c.lq + i) * c.lk + j] = s;
            for (int64_t d = 0; d < c.e; ++d) {
              dq[(b * c.lq + i) * c.e + d] += scale * s * vk[(b * c.lk + j) * c.e + d];
              dk[(b * c.lk + j) * c.e + d] += scale * s * vq[(b * c.lq + i) * c.e + d];
            }
            for (int64_t d = 0; d < c.ev; ++d)
              dv[(b * c.lk + j) * c.ev + d] += p * vdo[(b * c.lq + i) * c.ev + d];
          }
        }
      Graph g2;
      auto pq = g2.placeholder(q.shape(), t, "q"), pk = g2.placeholder(k.shape(), t, "k"),
           pv = g2.placeholder(v.shape(), t, "v"), pd = g2.placeholder(dout.shape(), t, "dout");
      Feeds feeds{{pq, q}, {pk, k}, {pv, v}, {pd, dout}};
      std::optional<Tensor> pm;
      if (m) {
        pm = g2.placeholder(m->shape(), m->dtype(), "m");
        feeds.push_back({*pm, *m});
      }
      auto out = scaled_dot_product_attention(pq, pk, pv, pm, options(c));
      auto d = scaled_dot_product_attention_grad(pd, pq, pk, pv, out, pm, options(c));
      auto outs = eval(g2, {d[0], d[1], d[2]}, feeds);
      const double tol = t == f32 ? 2e-5 : 1e-10;
      expect_close(outs[0], q.shape(), dq, tol, tol);
      expect_close(outs[1], k.shape(), dk, tol, tol);
      expect_close(outs[2], v.shape(), dv, tol, tol);
      if (c.mask == MaskKind::additive) {
        // the mask's gradient: dS summed over the batch it broadcast over
        std::vector<double> dm(static_cast<size_t>(c.lq * c.lk), 0.0);
        for (int64_t b = 0; b < nb; ++b)
          for (int64_t x = 0; x < c.lq * c.lk; ++x) dm[x] += ds[b * c.lq * c.lk + x];
        Graph g3;
        auto q3 = g3.placeholder(q.shape(), t, "q"), k3 = g3.placeholder(k.shape(), t, "k"),
             v3 = g3.placeholder(v.shape(), t, "v"), m3 = g3.placeholder(m->shape(), t, "m");
        auto y3 = scaled_dot_product_attention(q3, k3, v3, m3, options(c));
        auto gm = gradients(y3, {m3}, constant(g3, dout))[0];
        expect_close(eval1(g3, gm, {{q3, q}, {k3, k}, {v3, v}, {m3, *m}}), m->shape(), dm, tol,
                     tol);
      }
    }
  }
}

}  // namespace
}  // namespace kiln
