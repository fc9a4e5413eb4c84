// scaled_dot_product_attention in bf16 on CPUs whose oneDNN runs bf16 products natively (AVX-512
// BF16, AMX): both products through oneDNN's batched bf16 matmul with f32 accumulation, the
// softmax between them in f32. Tiles of batch-heads (or, where one head's scores would not fit,
// of one head's queries) bound the f32 scores held at once; causal tiles of 128 queries stop
// their products at the last key their last query sees. The weights are rounded to bf16
// unnormalized (each at most 1, the row's maximum exactly 1) and the f32 sums divided by the
// row's total before the output is rounded, as flash attention does on GPUs.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "backends/cpu/attention_cpu.h"
#include "backends/cpu/cpu_common.h"
#include "backends/cpu/dnnl_util.h"
#include "ops/attention_params.h"
#include "ops/attention_util.h"

namespace kiln::cpu {

namespace du = dnnl_util;

namespace {

float bf16_bits_to_f32(uint16_t b) {
  float f;
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

using dnnl_dt = dnnl::memory::data_type;

// the most f32 scores (and bf16 weights beside them) a tile holds: 4 Mi scores, 24 MiB in all
constexpr int64_t kTileScores = int64_t{1} << 22;
constexpr int64_t kCausalQueries = 128;

struct Dims {
  int64_t batch = 1, lq = 0, lk = 0, e = 0, ev = 0;
};

// a (nb, m, k) by (nb, k, n) batched bf16 product into f32 (nb, m, n), a and b read through
// their strides, cached by shape and strides
std::shared_ptr<const du::CachedPrimitive> batched_product(const char* op, const du::Dims& a_dims,
                                                           const du::Dims& a_strides,
                                                           const du::Dims& b_dims,
                                                           const du::Dims& b_strides) {
  thread_local du::Dims key;
  key.assign({static_cast<int64_t>(OpId::ScaledDotProductAttention), 1});
  key.insert(key.end(), a_dims.begin(), a_dims.end());
  key.insert(key.end(), a_strides.begin(), a_strides.end());
  key.insert(key.end(), b_dims.begin(), b_dims.end());
  key.insert(key.end(), b_strides.begin(), b_strides.end());
  return du::cached(op, key, [&] {
    const auto a = du::strided_md(a_dims, a_strides, dnnl_dt::bf16);
    const auto b = du::strided_md(b_dims, b_strides, dnnl_dt::bf16);
    const auto c = du::plain_md({a_dims[0], a_dims[1], b_dims[2]});
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), du::attr(), du::engine());
    return du::CachedPrimitive{
        dnnl::matmul(pd),
        {du::make_arg(DNNL_ARG_SRC, a, a), du::make_arg(DNNL_ARG_WEIGHTS, b, b),
         du::make_arg(DNNL_ARG_DST, c, c, true)},
        pd.scratchpad_desc()};
  });
}

}  // namespace

bool attention_bf16(KernelContext& ctx) {
  const TensorView &tq = ctx.in(0), &tk = ctx.in(1), &tv = ctx.in(2);
  if (tq.dtype != DType::bf16 || tk.dtype != DType::bf16 || tv.dtype != DType::bf16 ||
      !native_bf16())
    return false;
  const int r = tq.rank();
  Dims d;
  d.lq = tq.shape[r - 2];
  d.e = tq.shape[r - 1];
  d.lk = tk.shape[r - 2];
  d.ev = tv.shape[r - 1];
  for (int i = 0; i < r - 2; ++i) d.batch *= tq.shape[i];
  // (the op gives k and v q's batch dims: anything else is left to the general kernel)
  if (tk.numel() != d.batch * d.lk * d.e || tv.numel() != d.batch * d.lk * d.ev) return false;
  if (d.batch * d.lq * d.ev == 0) return true;  // nothing to write
  if (d.lk == 0 || d.e == 0) return false;      // the general kernel's zeros
  const AttentionParams p = params_of<AttentionParams>(ctx);
  const float scale = static_cast<float>(p.scale_for(d.e));
  attention::MaskLayout ml;
  const bool* bmask = nullptr;
  const uint16_t* amask = nullptr;  // additive, bf16 like the operands
  if (p.has_mask) {
    const TensorView& m = ctx.in(3);
    if (m.dtype == DType::boolean) bmask = m.ptr<bool>();
    else if (m.dtype == DType::bf16) amask = static_cast<const uint16_t*>(m.data);
    else return false;
    if (!attention::mask_layout(m.shape, Shape(tq.shape.begin(), tq.shape.end() - 2), d.lq, d.lk,
                                ml))
      return false;
  }

  // a tile: nb batch-heads of all their queries, or (nb = 1) mq queries of one
  // (causal: tiles of kCausalQueries queries, each product stopping at its last query's key)
  const int64_t mq = std::min(d.lq, p.causal ? kCausalQueries : kTileScores / d.lk);
  const int64_t nb = std::clamp<int64_t>(kTileScores / (mq * d.lk), 1, d.batch);
  auto* s = static_cast<float*>(ctx.scratch(sizeof(float) * nb * mq * d.lk));
  auto* w = static_cast<uint16_t*>(ctx.scratch(sizeof(uint16_t) * nb * mq * d.lk));
  auto* o = static_cast<float*>(ctx.scratch(sizeof(float) * nb * mq * d.ev));
  auto* sums = static_cast<float*>(ctx.scratch(sizeof(float) * nb * mq));
  const auto* q = static_cast<const uint16_t*>(tq.data);
  const auto* k = static_cast<const uint16_t*>(tk.data);
  const auto* v = static_cast<const uint16_t*>(tv.data);
  auto* out = static_cast<uint16_t*>(ctx.out(0).data);

  for (int64_t b0 = 0; b0 < d.batch; b0 += nb) {
    const int64_t bn = std::min(nb, d.batch - b0);
    for (int64_t i0 = 0; i0 < d.lq; i0 += mq) {
      const int64_t m = std::min(mq, d.lq - i0);
      const int64_t n = p.causal ? std::min(d.lk, i0 + m) : d.lk;  // keys any of them sees
      // scores: q (bn, m, e) · kᵀ (bn, e, n), kᵀ read through k's strides
      auto qk = batched_product(ctx.op_name(), {bn, m, d.e}, {d.lq * d.e, d.e, 1}, {bn, d.e, n},
                                {d.lk * d.e, 1, d.e});
      du::execute(ctx.op_name(), *qk,
                  {const_cast<uint16_t*>(q + (b0 * d.lq + i0) * d.e),
                   const_cast<uint16_t*>(k + b0 * d.lk * d.e), s});
      // the softmax's numerators, row by row: masked keys and keys after a causal query's own
      // are -inf; a row that sees no key weighs nothing
      ctx.parallel_for(bn * m, std::max<int64_t>(1, 16384 / n), [&](int64_t r0, int64_t r1) {
        constexpr float kNegInf = -std::numeric_limits<float>::infinity();
        for (int64_t row = r0; row < r1; ++row) {
          const int64_t bb = b0 + row / m, i = i0 + row % m;
          float* sr = s + row * n;
          const int64_t end = p.causal ? std::min(n, i + 1) : n;
          for (int64_t j = 0; j < end; ++j) sr[j] *= scale;
          std::fill(sr + end, sr + n, kNegInf);
          if (bmask || amask) {
            const int64_t moff = ml.batch_offset(bb) + i * ml.sq;
            for (int64_t j = 0; j < end; ++j) {
              const int64_t at = moff + j * ml.sk;
              if (bmask && !bmask[at]) sr[j] = kNegInf;
              else if (amask) sr[j] += bf16_bits_to_f32(amask[at]);
            }
          }
          const float mx = attention_max(sr, n, kNegInf);
          if (mx == kNegInf) {  // sees no key
            std::fill(sr, sr + n, 0.f);
            sums[row] = 0;
          } else {
            sums[row] = attention_exp_sum(sr, n, mx);
          }
          convert(sr, DType::f32, w + row * n, DType::bf16, n);
        }
      });
      // the weighted sums: w (bn, m, n) · v (bn, n, ev)
      auto wv = batched_product(ctx.op_name(), {bn, m, n}, {m * n, n, 1}, {bn, n, d.ev},
                                {d.lk * d.ev, d.ev, 1});
      du::execute(ctx.op_name(), *wv, {w, const_cast<uint16_t*>(v + b0 * d.lk * d.ev), o});
      ctx.parallel_for(bn * m, std::max<int64_t>(1, 16384 / d.ev), [&](int64_t r0, int64_t r1) {
        for (int64_t row = r0; row < r1; ++row) {
          const int64_t bb = b0 + row / m, i = i0 + row % m;
          const float inv = sums[row] > 0 ? 1.f / sums[row] : 0.f;
          float* orow = o + row * d.ev;
          for (int64_t c = 0; c < d.ev; ++c) orow[c] *= inv;
          convert(orow, DType::f32, out + (bb * d.lq + i) * d.ev, DType::bf16, d.ev);
        }
      });
    }
  }
  return true;
}

}  // namespace kiln::cpu
