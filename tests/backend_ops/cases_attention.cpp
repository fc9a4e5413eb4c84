// Cases of attention (scaled_dot_product_attention and its gradient op) and of the linalg ops
// cholesky and triangular_solve. Attention sizes straddle the CUDA kernels' tiles (8 query rows
// per block, 32 keys per tile, 32 output dims per lane chunk, 256 dims per launch; for 16-bit
// head dims of 32/64/128, 64 query rows and 64 keys per tile on tensor cores; for f32 ones, 64
// query rows and 64 keys per tile in register tiles).
#include <fmt/format.h>

#include <random>

#include "backend_ops/harness.h"

namespace kiln::harness {
namespace {

struct AttentionCase {
  Shape batch;
  int64_t lq, lk, e, ev;
  bool causal;
  int mask;  // 0 none, 1 bool keep, 2 additive, 3 bool keep of the first 2/5 of the keys
  Shape mask_shape;
};

const AttentionCase kAttention[] = {
    {{2, 3}, 17, 33, 16, 16, false, 0, {}},
    {{1}, 8, 32, 32, 32, false, 0, {}},
    {{2}, 9, 31, 64, 64, true, 0, {}},
    {{2}, 33, 7, 20, 12, true, 0, {}},  // Lq > Lk
    {{2, 2}, 40, 65, 24, 40, false, 1, {40, 65}},
    {{2, 2}, 13, 70, 8, 8, true, 2, {2, 1, 13, 70}},
    {{3}, 5, 129, 128, 128, false, 2, {129}},
    {{1}, 3, 40, 257, 300, false, 0, {}},  // head dims past one launch's slice
    {{2}, 11, 45, 16, 96, true, 0, {}},    // 65-128 output dims: four lane chunks
    {{}, 1, 1, 1, 1, false, 0, {}},
    {{2}, 6, 0, 4, 4, false, 0, {}},  // no keys: zeros
    // head dims 32/64/128 take the tensor-core kernel (16-bit) or the register-tile one (f32):
    // 64 query rows, 64 keys per tile
    {{2, 3}, 130, 190, 64, 64, true, 1, {130, 190}},
    {{2}, 64, 64, 128, 128, false, 0, {}},
    {{3}, 65, 127, 32, 32, false, 2, {3, 1, 127}},
    {{1, 2}, 200, 150, 64, 64, true, 0, {}},               // Lq > Lk, causal
    {{4, 2}, 128, 128, 64, 64, false, 2, {4, 1, 1, 128}},  // a BERT-style padding mask
    {{2, 2}, 70, 20, 32, 32, false, 1, {2, 1, 70, 1}},     // whole rows hidden: zeros
    // few query rows over many keys (a decode step over its cache): split over the keys on
    // tensor cores; mask 3 keeps only the first 2/5 of the keys (the splits past them skipped)
    {{1, 4}, 8, 1000, 64, 64, false, 3, {1, 1, 8, 1000}},
    {{2, 2}, 4, 700, 128, 128, false, 1, {2, 1, 4, 700}},
    {{3}, 16, 600, 32, 32, false, 0, {}},
    {{1}, 70, 600, 64, 64, false, 0, {}},  // two row blocks
    {{1}, 70, 300, 64, 64, true, 0, {}},   // causal: the later splits see no key
    {{2}, 2, 513, 128, 128, false, 3, {2, 1, 513}},
};
constexpr int kNumAttention = static_cast<int>(std::size(kAttention));

Shape with(Shape b, std::initializer_list<int64_t> tail) {
  b.insert(b.end(), tail);
  return b;
}

std::optional<Tensor> mask_of(Case& c, const AttentionCase& k, DType t) {
  if (k.mask == 1) return c.rand(k.mask_shape, DType::boolean);
  if (k.mask == 3)
    return c.input(k.mask_shape, DType::boolean, [](const Shape& s) {
      std::bernoulli_distribution keep(0.8);
      std::vector<double> m(static_cast<size_t>(numel(s)));
      for (size_t e = 0; e < m.size(); ++e)
        m[e] = static_cast<int64_t>(e) % s.back() < s.back() * 2 / 5 && keep(test::rng());
      return from_f64(m, s, DType::boolean);
    });
  if (k.mask == 2) return c.rand(k.mask_shape, t, -2, 2);
  return std::nullopt;
}

std::string note_of(const AttentionCase& k) {
  return fmt::format("batch {} lq {} lk {} e {} ev {}{}{}", to_string(k.batch), k.lq, k.lk, k.e,
                     k.ev, k.causal ? " causal" : "",
                     k.mask == 0   ? ""
                     : k.mask == 1 ? " bool mask " + to_string(k.mask_shape)
                     : k.mask == 3 ? " bool mask over the first keys " + to_string(k.mask_shape)
                                   : " additive mask " + to_string(k.mask_shape));
}

const bool kSdpa = register_cases(
    {OpId::ScaledDotProductAttention, kNumAttention, [](Case& c, DType t, int i) {
       const AttentionCase& k = kAttention[i];
       Tensor q = c.rand(with(k.batch, {k.lq, k.e}), t, -2, 2);
       Tensor kk = c.rand(with(k.batch, {k.lk, k.e}), t, -2, 2);
       Tensor v = c.rand(with(k.batch, {k.lk, k.ev}), t, -1, 1,
                         i == 1 ? Layout::transposed : Layout::dense);
       AttentionOptions o;
       o.causal = k.causal;
       c.outs = {scaled_dot_product_attention(q, kk, v, mask_of(c, k, t), o)};
       c.tol_scale = 4;
       c.note(note_of(k));
       return true;
     }, {f32, f16, bf16, f64}});

const bool kSdpaGrad = register_cases(
    {OpId::ScaledDotProductAttentionGrad, 2 * kNumAttention, [](Case& c, DType t, int i) {
       const AttentionCase& k = kAttention[i % kNumAttention];
       const bool mask_grad = i >= kNumAttention;
       if (mask_grad && k.mask != 2) return false;
       Tensor q = c.rand(with(k.batch, {k.lq, k.e}), t, -2, 2);
       Tensor kk = c.rand(with(k.batch, {k.lk, k.e}), t, -2, 2);
       Tensor v = c.rand(with(k.batch, {k.lk, k.ev}), t);
       Tensor dout = c.rand(with(k.batch, {k.lq, k.ev}), t);
       const std::optional<Tensor> m = mask_of(c, k, t);
       AttentionOptions o;
       o.causal = k.causal;
       if (mask_grad) {
         // the mask's gradient node, as the gradient rule builds it
         Tensor out = scaled_dot_product_attention(q, kk, v, m, o);
         c.outs = {gradients(out, {*m}, dout)[0]};
       } else {
         // For 16-bit dtypes the forward's output is computed in f64 and rounded once, so that
         // both backends feed the gradient the same `out`: dK amplifies a difference between
         // two forwards' roundings, which the forward's own cases check, not this op's.
         const bool wide = t == f16 || t == bf16;
         const auto f64_of = [&](const Tensor& x) { return wide ? cast(x, f64) : x; };
         std::optional<Tensor> m64 = m;
         if (m && m->dtype() != DType::boolean) m64 = f64_of(*m);
         Tensor out = scaled_dot_product_attention(f64_of(q), f64_of(kk), f64_of(v), m64, o);
         if (wide) out = cast(out, t);
         c.outs = scaled_dot_product_attention_grad(dout, q, kk, v, out, m, o);
       }
       c.grad = false;
       // The mask's gradient dS = P (dP - D) takes each backend's own forward (the rule's node):
       // D = rowsum(dout * out) carries the two roundings of a 16-bit `out`, up to 2^-8
       // sum |dout| |out| (about the mean |dS| here), times P, whatever dS's own size: twice the
       // scale for those.
       c.tol_scale = mask_grad && (t == f16 || t == bf16) ? 16 : 8;
       c.note(note_of(k) + (mask_grad ? " (mask gradient)" : ""));
       return true;
     }, {f32, f16, bf16, f64}});

// Symmetric positive-definite x xᵀ + n I, with junk above the diagonal (never read).
Gen spd(DType t) {
  return [t](const Shape& s) {
    const int64_t n = s.back(), batch = numel(s) / std::max<int64_t>(1, n * n);
    std::uniform_real_distribution<double> u(-1, 1);
    std::vector<double> x(static_cast<size_t>(numel(s))), a(x.size());
    for (auto& v : x) v = u(test::rng());
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < n; ++j) {
          double v = i == j ? static_cast<double>(n) : 0.0;
          for (int64_t k = 0; k < n; ++k) v += x[(b * n + i) * n + k] * x[(b * n + j) * n + k];
          a[(b * n + i) * n + j] = v;
        }
    return from_f64(a, s, t);
  };
}

// Diagonal of magnitude [1, 2], small off-diagonal entries.
Gen triangular(DType t) {
  return [t](const Shape& s) {
    const int64_t n = s.back();
    std::uniform_real_distribution<double> u(-0.4, 0.4);
    std::vector<double> a(static_cast<size_t>(numel(s)));
    for (size_t e = 0; e < a.size(); ++e) {
      const int64_t ij = static_cast<int64_t>(e) % (n * n);
      const double v = u(test::rng());
      a[e] = ij / n == ij % n ? (v < 0 ? -1 : 1) * (1 + std::abs(v) * 2.5) : v;
    }
    return from_f64(a, s, t);
  };
}

const bool kCholesky = register_cases(
    {OpId::Cholesky, 6, [](Case& c, DType t, int i) {
       const Shape s[] = {{1, 1}, {5, 5}, {3, 17, 17}, {2, 2, 33, 33}, {130, 130}, {0, 4, 4}};
       const Shape& sh = s[i % 6];
       const bool upper = i % 2 == 1;
       c.outs = {cholesky(c.input(sh, t, spd(t)), upper)};
       c.tol_scale = 4;
       c.note(fmt::format("a {}{}", to_string(sh), upper ? " upper" : ""));
       return true;
     }, {f32, f64}});

const bool kTriangularSolve = register_cases(
    {OpId::TriangularSolve, 16, [](Case& c, DType t, int i) {
       TriangularSolveOptions o{(i & 1) != 0, (i & 2) != 0, (i & 4) != 0, (i & 8) != 0};
       struct S {
         Shape a, b;
       };
       const S s[] = {{{4, 4}, {4, 3}}, {{2, 1, 9, 9}, {3, 9, 5}}, {{3, 33, 33}, {33, 2}},
                      {{65, 65}, {65, 40}}};
       const S& k = s[i % 4];
       Shape bs = k.b;
       if (!o.left) std::swap(bs[bs.size() - 1], bs[bs.size() - 2]);
       c.outs = {triangular_solve(c.input(k.a, t, triangular(t)), c.rand(bs, t), o)};
       c.tol_scale = 8;
       c.note(fmt::format("a {} b {} upper {} left {} transpose {} unit {}", to_string(k.a),
                          to_string(bs), o.upper, o.left, o.transpose, o.unit_diagonal));
       return true;
     }, {f32, f64}});

}  // namespace
}  // namespace kiln::harness
