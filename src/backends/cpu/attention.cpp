// CPU kernels of scaled_dot_product_attention and its gradient: blocks of queries in parallel on
// the pool, each streaming over blocks of keys with an online (max-subtracted) softmax, so no
// (Lq, Lk) matrix is formed; a key block is transposed once for the query block, whose scores
// then run across keys in vector lanes. f16/bf16 run as f32 (half_via_f32). A query that sees no
// key gets zeros and passes no gradient.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backends/cpu/cpu_common.h"
#include "backends/cpu/kernels.h"
#include "ops/attention_util.h"

namespace kiln::cpu {

namespace {

constexpr int64_t kQueryBlock = 16;
constexpr int64_t kKeyBlock = 64;
constexpr int64_t kLanes = 16;  // sums the inner loops keep in vector registers

// The kernel's inner loops, kLanes values at a time in one vector variable (GCC and Clang vector
// extensions: the sums stay in registers whatever the vectorizer makes of a loop); in the scores
// and value sums each lane adds in the order of the scalar code.
// (vectors move through memcpy and references, never by value across a call: no ABI question)
template <typename T> struct Lanes {
  typedef T V __attribute__((vector_size(kLanes * sizeof(T))));
  /// v += s * p[0, kLanes)
  static void add_scaled(V& v, T s, const T* p) {
    V x;
    std::memcpy(&x, p, sizeof(V));
    v += s * x;
  }
};

// s[j] = sum over d of qi[d] kt[d kKeyBlock + j] for j < n (a multiple of kLanes).
template <typename T> inline void score_lanes(const T* qi, const T* kt, int64_t e, int64_t n,
                                              T* s) {
  using L = Lanes<T>;
  for (int64_t j = 0; j < n; j += kLanes) {
    typename L::V sum = {};
    for (int64_t d = 0; d < e; ++d) L::add_scaled(sum, qi[d], kt + d * kKeyBlock + j);
    std::memcpy(s + j, &sum, sizeof(sum));
  }
}

// a[d] = alpha a[d] + sum over j of w[j] rows[j][d] for d < ev (a multiple of kLanes).
template <typename T> inline void weigh_lanes(const T* const* rows, const T* w, int64_t n,
                                              T alpha, int64_t ev, T* a) {
  using L = Lanes<T>;
  for (int64_t d = 0; d < ev; d += kLanes) {
    typename L::V sum;
    std::memcpy(&sum, a + d, sizeof(sum));
    sum *= alpha;
    for (int64_t j = 0; j < n; ++j) L::add_scaled(sum, w[j], rows[j] + d);
    std::memcpy(a + d, &sum, sizeof(sum));
  }
}

// sum over d < n of a[d] b[d]: kLanes partial sums side by side, added up at the end, then the
// tail (the gradient's dot products)
template <typename T> inline T dot_lanes(const T* a, const T* b, int64_t n) {
  using V = typename Lanes<T>::V;
  int64_t d = 0;
  T s = 0;
  if (n >= kLanes) {
    V acc = {};
    for (; d + kLanes <= n; d += kLanes) {
      V x, y;
      std::memcpy(&x, a + d, sizeof(V));
      std::memcpy(&y, b + d, sizeof(V));
      acc += x * y;
    }
    for (int u = 0; u < kLanes; ++u) s += acc[u];
  }
  for (; d < n; ++d) s += a[d] * b[d];
  return s;
}

// s[j] = e^(s[j] - mx) for j < n, returning their sum. f32: kLanes at a time with Cephes' expf
// (x = s[j] - mx rounded to k = round(x log2 e), r = x - k ln 2 in two parts, a degree-5
// polynomial, times 2^k; within 1.01 ulp of e^x at every float in [-87.3, 0], with or without
// FMA), 0 below -87.3 (where e^x is no longer a normal float; -inf included), NaN kept; the tail
// and f64 through std::exp. The lanes' sums are added at the end.
template <typename T> inline T exp_sum_lanes(T* s, int64_t n, T mx) {
  T sum = 0;
  int64_t j = 0;
  if constexpr (std::is_same_v<T, float>) {
    using V = Lanes<float>::V;
    using I = Lanes<int32_t>::V;
    auto select = [](const I& m, const V& a, const V& b, V& out) {  // m ? a : b, lane by lane
      I ai, bi;
      std::memcpy(&ai, &a, sizeof(I));
      std::memcpy(&bi, &b, sizeof(I));
      const I r = (ai & m) | (bi & ~m);
      std::memcpy(&out, &r, sizeof(V));
    };
    const V zero = {};
    V acc = {};
    for (; j + kLanes <= n; j += kLanes) {
      V x;
      std::memcpy(&x, s + j, sizeof(V));
      x -= mx;
      const I nan = x != x, tiny = x < -87.33f;
      V xc;
      select(nan | tiny, zero, x, xc);  // (in range for the conversion below)
      const V k = (xc * 1.44269504f + 12582912.f) - 12582912.f;
      V r = xc - k * 0.693359375f;
      r = r - k * -2.12194440e-4f;
      V y = ((((1.9875691500e-4f * r + 1.3981999507e-3f) * r + 8.3334519073e-3f) * r +
              4.1665795894e-2f) * r + 1.6666665459e-1f) * r + 5.0000001201e-1f;
      y = y * (r * r) + r + 1.0f;
      const I bits = (__builtin_convertvector(k, I) + 127) << 23;
      V scale;
      std::memcpy(&scale, &bits, sizeof(V));
      y *= scale;
      select(tiny, zero, y, y);
      select(nan, x, y, y);
      std::memcpy(s + j, &y, sizeof(V));
      acc += y;
    }
    for (int u = 0; u < kLanes; ++u) sum += acc[u];
  }
  for (; j < n; ++j) sum += s[j] = std::exp(s[j] - mx);
  return sum;
}

// The f32 loops (f16/bf16 run as f32) are also compiled for AVX2 with FMA and for AVX-512; the
// CPU's best is picked on first use (__builtin_cpu_supports; an FMA rounds once where the
// baseline rounds twice). Not target_clones: its ifunc resolvers run while the program is
// relocated, before a sanitizer's runtime has started.
#if defined(__x86_64__) && defined(__GNUC__)
#define KILN_F32_VARIANTS(R, name, params, args)                                             \
  R name##_f32 params { return name args; }                                                 \
  __attribute__((target("avx2,fma"))) R name##_f32_avx2 params { return name args; }        \
  __attribute__((target("avx512f"))) R name##_f32_avx512 params { return name args; }       \
  auto pick_##name() {                                                                      \
    __builtin_cpu_init();                                                                   \
    if (__builtin_cpu_supports("avx512f")) return &name##_f32_avx512;                        \
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))                     \
      return &name##_f32_avx2;                                                              \
    return &name##_f32;                                                                     \
  }
#else
#define KILN_F32_VARIANTS(R, name, params, args) \
  R name##_f32 params { return name args; }      \
  auto pick_##name() { return &name##_f32; }
#endif
KILN_F32_VARIANTS(void, score_lanes,
                  (const float* qi, const float* kt, int64_t e, int64_t n, float* s),
                  (qi, kt, e, n, s))
KILN_F32_VARIANTS(void, weigh_lanes,
                  (const float* const* rows, const float* w, int64_t n, float alpha, int64_t ev,
                   float* a),
                  (rows, w, n, alpha, ev, a))
KILN_F32_VARIANTS(float, dot_lanes, (const float* a, const float* b, int64_t n), (a, b, n))
KILN_F32_VARIANTS(float, exp_sum_lanes, (float* s, int64_t n, float mx), (s, n, mx))
#undef KILN_F32_VARIANTS

template <typename T> T dot(const T* a, const T* b, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    static const auto f = pick_dot_lanes();
    return f(a, b, n);
  } else {
    return dot_lanes(a, b, n);
  }
}
template <typename T> T exp_sum(T* s, int64_t n, T mx) {
  if constexpr (std::is_same_v<T, float>) {
    static const auto f = pick_exp_sum_lanes();
    return f(s, n, mx);
  } else {
    return exp_sum_lanes(s, n, mx);
  }
}
template <typename T> void score_all_lanes(const T* qi, const T* kt, int64_t e, int64_t n,
                                           T* s) {
  if constexpr (std::is_same_v<T, float>) {
    static const auto f = pick_score_lanes();
    f(qi, kt, e, n, s);
  } else {
    score_lanes(qi, kt, e, n, s);
  }
}
template <typename T> void weigh_all_lanes(const T* const* rows, const T* w, int64_t n, T alpha,
                                           int64_t ev, T* a) {
  if constexpr (std::is_same_v<T, float>) {
    static const auto f = pick_weigh_lanes();
    f(rows, w, n, alpha, ev, a);
  } else {
    weigh_lanes(rows, w, n, alpha, ev, a);
  }
}

// The problem of one node: dims, scale, causality and the mask's layout.
template <typename T> struct Problem {
  const T *q, *k, *v;
  int64_t batch = 1, lq = 0, lk = 0, e = 0, ev = 0;
  T scale{};
  bool causal = false;
  const bool* bmask = nullptr;  // keep-mask
  const T* amask = nullptr;     // additive
  attention::MaskLayout ml;

  Problem(const KernelContext& ctx, int iq) {
    const TensorView &tq = ctx.in(iq), &tk = ctx.in(iq + 1), &tv = ctx.in(iq + 2);
    const int r = tq.rank();
    lq = tq.shape[r - 2];
    e = tq.shape[r - 1];
    lk = tk.shape[r - 2];
    ev = tv.shape[r - 1];
    batch = numel(Shape(tq.shape.begin(), tq.shape.end() - 2));
    q = tq.ptr<T>();
    k = tk.ptr<T>();
    v = tv.ptr<T>();
    scale = static_cast<T>(attention::scale_of(ctx.attrs(), e));
    causal = ctx.attrs().b("causal");
    if (ctx.attrs().b("has_mask")) {
      const TensorView& m = ctx.in(iq == 0 ? 3 : 5);  // the grad op: after dout, q, k, v, out
      if (m.dtype == DType::boolean) bmask = m.ptr<bool>();
      else amask = m.ptr<T>();
      attention::mask_layout(m.shape, Shape(tq.shape.begin(), tq.shape.end() - 2), lq, lk, ml);
    }
  }
  /// Keys [0, end) can be visible to query i.
  int64_t key_end(int64_t i) const { return causal ? std::min(lk, i + 1) : lk; }
  /// scale · q_i · k_j + mask, or -inf where masked (the gradient's; the forward pass uses scores).
  T score(int64_t b, int64_t i, int64_t j, int64_t moff) const {
    constexpr T kNegInf = -std::numeric_limits<T>::infinity();
    const int64_t mo = moff + i * ml.sq + j * ml.sk;
    if (bmask && !bmask[mo]) return kNegInf;
    T s = dot(q + (b * lq + i) * e, k + (b * lk + j) * e, e) * scale;
    if (amask) s += amask[mo];
    return s;
  }
  int64_t mask_offset(int64_t b) const { return (bmask || amask) ? ml.batch_offset(b) : 0; }
  /// Keys [j0, j0 + n) of batch b (n <= kKeyBlock) transposed into kt: e rows of kKeyBlock.
  void transpose_keys(int64_t b, int64_t j0, int64_t n, T* kt) const {
    for (int64_t j = 0; j < n; ++j) {
      const T* kj = k + (b * lk + j0 + j) * e;
      for (int64_t d = 0; d < e; ++d) kt[d * kKeyBlock + j] = kj[d];
    }
  }
  /// score(b, i, j, moff) of keys [j0, j1) into s, from kt (transpose_keys of the block at j0):
  /// each dot product sums over d in the same order as score's, kLanes keys side by side in
  /// registers rather than one latency-bound sum at a time.
  void scores(int64_t b, int64_t i, int64_t j0, int64_t j1, int64_t moff, const T* kt,
              T* __restrict s) const {
    constexpr T kNegInf = -std::numeric_limits<T>::infinity();
    const int64_t n = j1 - j0;
    const T* qi = q + (b * lq + i) * e;
    int64_t j = n / kLanes * kLanes;
    score_all_lanes(qi, kt, e, j, s);
    for (; j < n; ++j) {
      T sum = 0;
      for (int64_t d = 0; d < e; ++d) sum += qi[d] * kt[d * kKeyBlock + j];
      s[j] = sum;
    }
    if (!bmask && !amask) {
      for (int64_t j = 0; j < n; ++j) s[j] *= scale;
      return;
    }
    for (int64_t j = 0; j < n; ++j) {
      const int64_t mo = moff + i * ml.sq + (j0 + j) * ml.sk;
      if (bmask && !bmask[mo]) {
        s[j] = kNegInf;
        continue;
      }
      s[j] *= scale;
      if (amask) s[j] += amask[mo];
    }
  }
  /// a = alpha a + sum over keys [j0, j1) of pr[j - j0] v_j (keys whose weight is 0 skipped), in
  /// key order for every element, kLanes elements of a held in registers across the keys.
  void weigh_values(int64_t b, int64_t j0, int64_t j1, const T* pr, T alpha, T* a) const {
    // the keys that count, first (no branch in the loops that vectorize)
    T w[kKeyBlock];
    const T* rows[kKeyBlock];
    int64_t n = 0;
    for (int64_t j = 0; j < j1 - j0; ++j)
      if (pr[j] != T(0)) w[n] = pr[j], rows[n++] = v + (b * lk + j0 + j) * ev;
    int64_t d = ev / kLanes * kLanes;
    weigh_all_lanes(rows, w, n, alpha, d, a);
    for (; d < ev; ++d) {
      T sum = a[d] * alpha;
      for (int64_t j = 0; j < n; ++j) sum += w[j] * rows[j][d];
      a[d] = sum;
    }
  }
};

template <typename T> void forward(KernelContext& ctx) {
  const Problem<T> p(ctx, 0);
  T* out = ctx.out(0).ptr<T>();
  const int64_t qblocks = (p.lq + kQueryBlock - 1) / kQueryBlock;
  ctx.parallel_for(p.batch * qblocks, 1, [&](int64_t w0, int64_t w1) {
    std::vector<T> acc(static_cast<size_t>(kQueryBlock * p.ev)), s(kKeyBlock),
        kt(static_cast<size_t>(p.e * kKeyBlock));
    T m[kQueryBlock], l[kQueryBlock];
    for (int64_t w = w0; w < w1; ++w) {
      const int64_t b = w / qblocks, i0 = (w % qblocks) * kQueryBlock;
      const int64_t i1 = std::min(p.lq, i0 + kQueryBlock), moff = p.mask_offset(b);
      std::fill(acc.begin(), acc.end(), T(0));
      std::fill(m, m + kQueryBlock, -std::numeric_limits<T>::infinity());
      std::fill(l, l + kQueryBlock, T(0));
      const int64_t kend = p.key_end(i1 - 1);
      for (int64_t j0 = 0; j0 < kend; j0 += kKeyBlock) {
        p.transpose_keys(b, j0, std::min(kend, j0 + kKeyBlock) - j0, kt.data());
        for (int64_t i = i0; i < i1; ++i) {
          const int64_t j1 = std::min(p.key_end(i), j0 + kKeyBlock);
          if (j1 <= j0) continue;
          p.scores(b, i, j0, j1, moff, kt.data(), s.data());
          T mx = m[i - i0];
          for (int64_t j = j0; j < j1; ++j) mx = std::max(mx, s[j - j0]);
          if (mx == -std::numeric_limits<T>::infinity()) continue;  // nothing visible yet
          const T alpha = std::exp(m[i - i0] - mx);  // 0 when m was -inf
          const T sum = exp_sum(s.data(), j1 - j0, mx);
          p.weigh_values(b, j0, j1, s.data(), alpha, acc.data() + (i - i0) * p.ev);
          l[i - i0] = l[i - i0] * alpha + sum;
          m[i - i0] = mx;
        }
      }
      for (int64_t i = i0; i < i1; ++i) {
        const T inv = l[i - i0] > 0 ? T(1) / l[i - i0] : T(0);
        const T* a = acc.data() + (i - i0) * p.ev;
        T* o = out + (b * p.lq + i) * p.ev;
        for (int64_t d = 0; d < p.ev; ++d) o[d] = a[d] * inv;
      }
    }
  });
}

void scaled_dot_product_attention(KernelContext& ctx) {
  dispatch_float(ctx.in(0).dtype, ctx.op_name(), [&](auto t) { forward<decltype(t)>(ctx); });
}

// Gradient. Pass 1 (queries in parallel): the row's log-sum-exp (+inf when no key is visible,
// so every probability is 0), D_i = dO_i · O_i, and dq_i = scale Σ_j ds_ij k_j with
// ds_ij = p_ij (dO_i · v_j - D_i) (or ds itself as the mask's gradient). Pass 2 (keys in
// parallel): dk_j = scale Σ_i ds_ij q_i and dv_j = Σ_i p_ij dO_i.
template <typename T> void backward(KernelContext& ctx) {
  const Problem<T> p(ctx, 1);
  const T* dout = ctx.in(0).ptr<T>();
  const T* o = ctx.in(4).ptr<T>();
  const bool mask_grad = ctx.attrs().b("mask_grad", false);
  const int64_t rows = p.batch * p.lq;
  std::vector<T> lse(static_cast<size_t>(rows)), dd(static_cast<size_t>(rows));
  T* dq = mask_grad ? nullptr : ctx.out(0).ptr<T>();
  T* dmask = mask_grad ? ctx.out(0).ptr<T>() : nullptr;
  constexpr T kInf = std::numeric_limits<T>::infinity();
  ctx.parallel_for(rows, std::max<int64_t>(1, 4096 / std::max<int64_t>(1, p.lk)),
                   [&](int64_t r0, int64_t r1) {
    std::vector<T> s(static_cast<size_t>(p.lk));
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t b = r / p.lq, i = r % p.lq, moff = p.mask_offset(b), kend = p.key_end(i);
      T mx = -kInf;
      for (int64_t j = 0; j < kend; ++j) mx = std::max(mx, s[j] = p.score(b, i, j, moff));
      T sum = 0;
      if (mx != -kInf)
        for (int64_t j = 0; j < kend; ++j) sum += std::exp(s[j] - mx);
      const T ls = mx == -kInf ? kInf : mx + std::log(sum);
      const T* doi = dout + r * p.ev;
      const T di = dot(doi, o + r * p.ev, p.ev);
      lse[r] = ls;
      dd[r] = di;
      T* dqi = dq ? dq + r * p.e : nullptr;
      if (dqi) std::fill(dqi, dqi + p.e, T(0));
      T* dmi = dmask ? dmask + r * p.lk : nullptr;
      if (dmi) std::fill(dmi, dmi + p.lk, T(0));
      for (int64_t j = 0; j < kend; ++j) {
        const T pj = std::exp(s[j] - ls);
        if (pj == T(0)) continue;
        const T ds = pj * (dot(doi, p.v + (b * p.lk + j) * p.ev, p.ev) - di);
        if (dmi) dmi[j] = ds;
        if (dqi) {
          const T* kj = p.k + (b * p.lk + j) * p.e;
          for (int64_t d = 0; d < p.e; ++d) dqi[d] += p.scale * ds * kj[d];
        }
      }
    }
  });
  if (mask_grad) return;
  T *dk = ctx.out(1).ptr<T>(), *dv = ctx.out(2).ptr<T>();
  ctx.parallel_for(p.batch * p.lk, std::max<int64_t>(1, 4096 / std::max<int64_t>(1, p.lq)),
                   [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t b = r / p.lk, j = r % p.lk, moff = p.mask_offset(b);
      T* dkj = dk + r * p.e;
      T* dvj = dv + r * p.ev;
      std::fill(dkj, dkj + p.e, T(0));
      std::fill(dvj, dvj + p.ev, T(0));
      const T* vj = p.v + r * p.ev;
      for (int64_t i = p.causal ? std::min(j, p.lq) : 0; i < p.lq; ++i) {
        const int64_t qi = b * p.lq + i;
        const T pij = std::exp(p.score(b, i, j, moff) - lse[qi]);
        if (pij == T(0)) continue;
        const T* doi = dout + qi * p.ev;
        const T ds = pij * (dot(doi, vj, p.ev) - dd[qi]);
        const T* q = p.q + qi * p.e;
        for (int64_t d = 0; d < p.ev; ++d) dvj[d] += pij * doi[d];
        for (int64_t d = 0; d < p.e; ++d) dkj[d] += p.scale * ds * q[d];
      }
    }
  });
}

void scaled_dot_product_attention_grad(KernelContext& ctx) {
  dispatch_float(ctx.in(1).dtype, ctx.op_name(), [&](auto t) { backward<decltype(t)>(ctx); });
}

}  // namespace

void register_attention_kernels() {
  const DTypeSet floats{f32, f64, f16, bf16};
  register_kernel(OpId::ScaledDotProductAttention, Backend::cpu,
                  {scaled_dot_product_attention, floats});
  register_kernel(OpId::ScaledDotProductAttentionGrad, Backend::cpu,
                  {scaled_dot_product_attention_grad, floats, 1});
}

}  // namespace kiln::cpu
