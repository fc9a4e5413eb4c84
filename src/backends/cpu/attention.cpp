// CPU kernels of scaled_dot_product_attention and its gradient. Forward: the keys are transposed
// once into blocks of kKeyBlock; blocks of queries run in parallel on the pool, each streaming
// over the key blocks with an online (max-subtracted) softmax, so no (Lq, Lk) matrix is formed;
// scores and weighted value sums run across keys (or value elements) in vector lanes, four queries
// at a time in registers (attention_lanes.inc, compiled per instruction set). f16 runs as f32
// (half_via_f32); bf16 natively through oneDNN's bf16 products where the CPU has them
// (attention_bf16.cpp), else on f32 copies. A query that sees no key gets zeros and passes no
// gradient.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "backends/cpu/attention_cpu.h"
#include "backends/cpu/cpu_common.h"
#include "backends/cpu/kernels.h"
#include "ops/attention_params.h"
#include "ops/attention_util.h"

namespace kiln::cpu {

namespace {

constexpr int64_t kQueryBlock = 64;  // the most queries that share a transposed key block
constexpr int64_t kKeyBlock = 64;
constexpr int64_t kLanes = 16;  // sums the inner loops keep in vector registers

// The forward pass's register tiles: kRows queries by one or more groups of kLanes keys (or
// value elements) at once, so each vector loaded serves kRows sums.
constexpr int64_t kRows = 4;

// The lane helpers, compiled for the baseline and (x86-64, GCC) for AVX2 with FMA and for AVX-512
// (F, DQ, BW, VL: without DQ, lane masks made from comparisons go through general registers); the
// CPU's best is picked on first use (cpu_isa; an FMA rounds once where the baseline rounds
// twice). Not target_clones: its ifunc resolvers run while the program is relocated, before a
// sanitizer's runtime has started. f64 uses the baseline's.
namespace baseline {
constexpr int64_t kVectorBytes = 16;  // SSE2
constexpr int kTileGroups = 1;
#include "backends/cpu/attention_lanes.inc"
}  // namespace baseline
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define KILN_ATTENTION_X86_VARIANTS 1
#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace avx2 {
constexpr int64_t kVectorBytes = 32;
constexpr int kTileGroups = 1;  // four queries by 16 floats: 8 of its 16 registers
#include "backends/cpu/attention_lanes.inc"
}  // namespace avx2
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx512f,avx512dq,avx512bw,avx512vl")
namespace avx512 {
constexpr int64_t kVectorBytes = 64;
constexpr int kTileGroups = 4;  // four queries by 64 floats: 16 of its 32 registers
#include "backends/cpu/attention_lanes.inc"
}  // namespace avx512
#pragma GCC pop_options
#endif

// The f32 lane helpers of one instruction set.
struct F32Lanes {
  void (*score_lanes)(const float*, const float*, int64_t, int64_t, float, float*);
  void (*weigh_lanes)(const float*, const int64_t*, const float*, int64_t, const float*, int64_t,
                      int64_t, float*);
  void (*score_tile)(const float*, const float*, int64_t, int64_t, float, float*);
  void (*weigh_tile)(const float*, const int64_t*, const float*, int64_t, const float*, int64_t,
                     int64_t, float*);
  float (*dot)(const float*, const float*, int64_t);
  float (*max)(const float*, int64_t, float);
  float (*exp_sum)(float*, int64_t, float);
  int64_t (*live_keys)(const float*, int64_t, int64_t, int64_t*);
};
#define KILN_F32_LANES(ns)                                                    \
  F32Lanes {                                                                  \
    &ns::score_lanes<float>, &ns::weigh_lanes<float>, &ns::score_tile<float>, \
        &ns::weigh_tile<float>, &ns::dot_lanes<float>, &ns::max_lanes<float>, \
        &ns::exp_sum_lanes<float>, &ns::live_keys<float>                      \
  }
const F32Lanes& f32_lanes() {
  static const F32Lanes best = [] {
#ifdef KILN_ATTENTION_X86_VARIANTS
    if (cpu_isa() == CpuIsa::avx512) return KILN_F32_LANES(avx512);
    if (cpu_isa() == CpuIsa::avx2) return KILN_F32_LANES(avx2);
#endif
    return KILN_F32_LANES(baseline);
  }();
  return best;
}
#undef KILN_F32_LANES

// The lane helpers of a dtype: f32's picked for the CPU, the baseline's otherwise.
template <typename T> T dot(const T* a, const T* b, int64_t n) {
  if constexpr (std::is_same_v<T, float>) return f32_lanes().dot(a, b, n);
  else return baseline::dot_lanes(a, b, n);
}
template <typename T> T max_of(const T* s, int64_t n, T init) {
  if constexpr (std::is_same_v<T, float>) return f32_lanes().max(s, n, init);
  else return baseline::max_lanes(s, n, init);
}
template <typename T> T exp_sum(T* s, int64_t n, T mx) {
  if constexpr (std::is_same_v<T, float>) return f32_lanes().exp_sum(s, n, mx);
  else return baseline::exp_sum_lanes(s, n, mx);
}
template <typename T>
void score_all_lanes(const T* qi, const T* kt, int64_t e, int64_t n, T scale, T* s) {
  if constexpr (std::is_same_v<T, float>) f32_lanes().score_lanes(qi, kt, e, n, scale, s);
  else baseline::score_lanes(qi, kt, e, n, scale, s);
}
template <typename T> void weigh_all_lanes(const T* v, const int64_t* keys, const T* w, int64_t n,
                                           const T* alpha, int64_t ev, int64_t evl, T* a) {
  if constexpr (std::is_same_v<T, float>) f32_lanes().weigh_lanes(v, keys, w, n, alpha, ev, evl, a);
  else baseline::weigh_lanes(v, keys, w, n, alpha, ev, evl, a);
}
template <typename T>
void score_all_tile(const T* q, const T* kt, int64_t e, int64_t n, T scale, T* s) {
  if constexpr (std::is_same_v<T, float>) f32_lanes().score_tile(q, kt, e, n, scale, s);
  else baseline::score_tile(q, kt, e, n, scale, s);
}
template <typename T> int64_t live(const T* w, int64_t g, int64_t n, int64_t* keys) {
  if constexpr (std::is_same_v<T, float>) return f32_lanes().live_keys(w, g, n, keys);
  else return baseline::live_keys(w, g, n, keys);
}
template <typename T> void weigh_all_tile(const T* v, const int64_t* keys, const T* w, int64_t n,
                                          const T* alpha, int64_t ev, int64_t evl, T* a) {
  if constexpr (std::is_same_v<T, float>) f32_lanes().weigh_tile(v, keys, w, n, alpha, ev, evl, a);
  else baseline::weigh_tile(v, keys, w, n, alpha, ev, evl, a);
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
    for (int d = 0; d < r - 2; ++d) batch *= tq.shape[d];
    q = tq.ptr<T>();
    k = tk.ptr<T>();
    v = tv.ptr<T>();
    const AttentionParams p = params_of<AttentionParams>(ctx);
    scale = static_cast<T>(p.scale_for(e));
    causal = p.causal;
    if (p.has_mask) {
      const TensorView& m = ctx.in(iq == 0 ? 3 : 5);  // the grad op: after dout, q, k, v, out
      if (m.dtype == DType::boolean) bmask = m.ptr<bool>();
      else amask = m.ptr<T>();
      attention::mask_layout(m.shape, Shape(tq.shape.begin(), tq.shape.end() - 2), lq, lk, ml);
    }
  }
  /// Keys [0, end) can be visible to query i.
  int64_t key_end(int64_t i) const { return causal ? std::min(lk, i + 1) : lk; }
  /// scale · q_i · k_j + mask, or -inf where masked (the gradient's; the forward
  /// pass uses dots and finish_scores).
  T score(int64_t b, int64_t i, int64_t j, int64_t moff) const {
    constexpr T kNegInf = -std::numeric_limits<T>::infinity();
    const int64_t mo = moff + i * ml.sq + j * ml.sk;
    if (bmask && !bmask[mo]) return kNegInf;
    T s = dot(q + (b * lq + i) * e, k + (b * lk + j) * e, e) * scale;
    if (amask) s += amask[mo];
    return s;
  }
  int64_t mask_offset(int64_t b) const { return (bmask || amask) ? ml.batch_offset(b) : 0; }
  /// Keys [j0, j0 + n) of batch b (n <= kKeyBlock) transposed into kt: e rows of kKeyBlock,
  /// zeros after the last key up to a whole number of kLanes (dots reads whole lanes).
  void transpose_keys(int64_t b, int64_t j0, int64_t n, T* kt) const {
    for (int64_t j = 0; j < n; ++j) {
      const T* kj = k + (b * lk + j0 + j) * e;
      for (int64_t d = 0; d < e; ++d) kt[d * kKeyBlock + j] = kj[d];
    }
    const int64_t padded = (n + kLanes - 1) / kLanes * kLanes;
    for (int64_t d = 0; d < e; ++d)
      std::fill(kt + d * kKeyBlock + n, kt + d * kKeyBlock + padded, T(0));
  }
  /// The scaled dot products (scale · (q_i · k_j)) of queries [i, i + g) (g is kRows or 1) with
  /// keys [j0, j0 + n) into rows of s kKeyBlock apart, from kt (transpose_keys of the block at
  /// j0): each sums over d in the order of score's, kLanes keys side by side in registers (and
  /// kRows queries, when g is kRows). The last lanes run whole over kt's zero padding: s past n
  /// holds zeros that nothing reads.
  void dots(int64_t b, int64_t i, int64_t g, int64_t n, const T* kt, T* __restrict s) const {
    const T* qi = q + (b * lq + i) * e;
    const int64_t nl = (n + kLanes - 1) / kLanes * kLanes;
    if (g == kRows) score_all_tile(qi, kt, e, nl, scale, s);
    else score_all_lanes(qi, kt, e, nl, scale, s);
  }
  /// Query i's scaled dot products with keys [j0, j0 + n) in s made score(b, i, j, moff) for keys
  /// before j1 (its visible end within the block) and -inf from there on.
  void finish_scores(int64_t i, int64_t j0, int64_t j1, int64_t n, int64_t moff,
                     T* __restrict s) const {
    constexpr T kNegInf = -std::numeric_limits<T>::infinity();
    const int64_t nv = std::max<int64_t>(0, j1 - j0);
    std::fill(s + nv, s + n, kNegInf);
    if (!bmask && !amask) return;
    for (int64_t j = 0; j < nv; ++j) {
      const int64_t mo = moff + i * ml.sq + (j0 + j) * ml.sk;
      if (bmask && !bmask[mo]) s[j] = kNegInf;
      else if (amask) s[j] += amask[mo];
    }
  }
  /// a_r = alpha[r] a_r + sum over keys [j0, j0 + n) of pr[r kKeyBlock + j - j0] v_j for the g
  /// queries of a tile (rows of a ev apart), keys that no query of the tile weighs skipped; in key
  /// order for every element, kLanes elements of a (of kRows queries, when g is kRows) held in
  /// registers across the keys.
  void weigh_values(int64_t b, int64_t j0, int64_t n, int64_t g, const T* pr, const T* alpha,
                    T* a) const {
    // the keys that count, first (no branch in the loops that vectorize): a weight counts unless
    // it is +-0, NaN included
    int64_t keys[kKeyBlock];
    const int64_t nk = live(pr, g, n, keys);
    const T* vb = v + (b * lk + j0) * ev;
    const int64_t evl = ev / kLanes * kLanes;
    if (g == kRows) weigh_all_tile(vb, keys, pr, nk, alpha, ev, evl, a);
    else weigh_all_lanes(vb, keys, pr, nk, alpha, ev, evl, a);
    // the elements after the last whole lane group (all of them where ev < kLanes): key by key,
    // along each value's contiguous elements
    for (int64_t r = 0; r < g; ++r) {
      T* __restrict ar = a + r * ev;
      for (int64_t d = evl; d < ev; ++d) ar[d] *= alpha[r];
      for (int64_t t = 0; t < nk; ++t) {
        const T wt = pr[r * kKeyBlock + keys[t]];
        const T* __restrict vt = vb + keys[t] * ev;
        for (int64_t d = evl; d < ev; ++d) ar[d] += wt * vt[d];
      }
    }
  }
};

template <typename T> void forward(KernelContext& ctx) {
  const Problem<T> p(ctx, 0);
  T* out = ctx.out(0).ptr<T>();
  // query blocks of kQueryBlock (each key block's transpose shared by more queries), halved down
  // to 16 while there would be fewer than four per thread
  int64_t qb = kQueryBlock;
  while (qb > 16 && p.batch * ((p.lq + qb - 1) / qb) < 4 * ctx.threads()) qb /= 2;
  const int64_t qblocks = (p.lq + qb - 1) / qb;
  // every block of kKeyBlock keys transposed once, first (e rows of kKeyBlock): K's size again
  const int64_t kblocks = (p.lk + kKeyBlock - 1) / kKeyBlock, kt_size = p.e * kKeyBlock;
  T* kts = static_cast<T*>(ctx.scratch(
      static_cast<size_t>(std::max<int64_t>(1, p.batch * kblocks * kt_size)) * sizeof(T)));
  auto transpose_blocks = [&](int64_t w0, int64_t w1) {  // key blocks w (batch w / kblocks)
    for (int64_t w = w0; w < w1; ++w) {
      const int64_t j0 = (w % kblocks) * kKeyBlock;
      p.transpose_keys(w / kblocks, j0, std::min(p.lk, j0 + kKeyBlock) - j0, kts + w * kt_size);
    }
  };
  // one query block a batch (short sequences): each task transposes its own batch's keys, in the
  // same parallel region (a second fork and join cost a small head more than its arithmetic)
  const bool own_keys = qblocks == 1;
  if (!own_keys) ctx.parallel_for(p.batch * kblocks, 1, transpose_blocks);
  ctx.parallel_for(p.batch * qblocks, 1, [&](int64_t w0, int64_t w1) {
    // (each thread's, kept from call to call)
    thread_local std::vector<T> acc, s;
    acc.resize(static_cast<size_t>(kQueryBlock * p.ev));
    s.resize(kRows * kKeyBlock);
    T m[kQueryBlock], l[kQueryBlock];
    for (int64_t w = w0; w < w1; ++w) {
      const int64_t b = w / qblocks, i0 = (w % qblocks) * qb;
      if (own_keys) transpose_blocks(b * kblocks, (b + 1) * kblocks);
      const int64_t i1 = std::min(p.lq, i0 + qb), moff = p.mask_offset(b);
      std::fill(acc.begin(), acc.end(), T(0));
      std::fill(m, m + kQueryBlock, -std::numeric_limits<T>::infinity());
      std::fill(l, l + kQueryBlock, T(0));
      const int64_t kend = p.key_end(i1 - 1);
      for (int64_t j0 = 0; j0 < kend; j0 += kKeyBlock) {
        const T* kt = kts + (b * kblocks + j0 / kKeyBlock) * kt_size;
        for (int64_t i = i0, g; i < i1; i += g) {
          g = i1 - i >= kRows ? kRows : 1;
          // the keys of the block that the tile's last query sees (under causality, the most)
          const int64_t n = std::min(p.key_end(i + g - 1), j0 + kKeyBlock) - j0;
          if (n <= 0) continue;
          p.dots(b, i, g, n, kt, s.data());
          T alpha[kRows];
          for (int64_t r = 0; r < g; ++r) {
            T* sr = s.data() + r * kKeyBlock;
            const int64_t ir = i + r - i0;
            p.finish_scores(i + r, j0, std::min(p.key_end(i + r), j0 + kKeyBlock), n, moff, sr);
            const T mx = max_of(sr, n, m[ir]);
            if (mx == -std::numeric_limits<T>::infinity()) {  // nothing visible yet
              alpha[r] = T(1);
              std::fill(sr, sr + n, T(0));
              continue;
            }
            alpha[r] = std::exp(m[ir] - mx);  // 0 when m was -inf
            l[ir] = l[ir] * alpha[r] + exp_sum(sr, n, mx);
            m[ir] = mx;
          }
          p.weigh_values(b, j0, n, g, s.data(), alpha, acc.data() + (i - i0) * p.ev);
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

void scaled_dot_product_attention_f(KernelContext& ctx) {
  dispatch_float(ctx.in(0).dtype, ctx.op_name(), [&](auto t) { forward<decltype(t)>(ctx); });
}

// bf16: natively through oneDNN's bf16 products where the CPU has them, else on f32 copies
void scaled_dot_product_attention(KernelContext& ctx) {
  if (ctx.in(0).dtype != DType::bf16) return scaled_dot_product_attention_f(ctx);
  if (!attention_bf16(ctx)) via_f32_copies(ctx, scaled_dot_product_attention_f);
}

// Gradient. Pass 1 (queries in parallel): the row's log-sum-exp (+inf when no key is visible,
// so every probability is 0), D_i = dO_i · O_i, and dq_i = scale Σ_j ds_ij k_j with
// ds_ij = p_ij (dO_i · v_j - D_i) (or ds itself as the mask's gradient). Pass 2 (keys in
// parallel): dk_j = scale Σ_i ds_ij q_i and dv_j = Σ_i p_ij dO_i.
template <typename T> void backward(KernelContext& ctx) {
  const Problem<T> p(ctx, 1);
  const T* dout = ctx.in(0).ptr<T>();
  const T* o = ctx.in(4).ptr<T>();
  const bool mask_grad = params_of<AttentionParams>(ctx).mask_grad;
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

float attention_max(const float* s, int64_t n, float init) { return f32_lanes().max(s, n, init); }
float attention_exp_sum(float* s, int64_t n, float mx) { return f32_lanes().exp_sum(s, n, mx); }

void register_attention_kernels() {
  const DTypeSet floats{f32, f64, f16, bf16};
  register_kernel(OpId::ScaledDotProductAttention, Backend::cpu,
                  {scaled_dot_product_attention, floats, 0, true, false, {bf16}});
  register_kernel(OpId::ScaledDotProductAttentionGrad, Backend::cpu,
                  {scaled_dot_product_attention_grad, floats, 1});
}

}  // namespace kiln::cpu
