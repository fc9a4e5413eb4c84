// CPU kernels of the linalg family: f32, and bf16 where oneDNN runs it natively (AVX-512 BF16:
// bf16 operands, f32 accumulation, bf16 result), through oneDNN matmul (primitives cached per
// shape), except f32 matmuls of fewer than kSmallGemm multiply-adds, on the calling thread
// (small_gemm.h); bf16 elsewhere through f32 copies, other dtypes and degenerate shapes (K = 0)
// through plain loops. (f16 reaches them as f32: the registry converts it.)
#include <algorithm>

#include "backends/cpu/cpu_common.h"
#include "backends/cpu/dnnl_util.h"
#include "backends/cpu/kernels.h"
#include "backends/cpu/small_gemm.h"
#include "backends/geometry.h"
#include "ops/linalg_params.h"

namespace kiln::cpu {

namespace {
namespace du = dnnl_util;

// oneDNN matmul takes at most 12 dims.
constexpr int kMaxDnnlRank = 12;


// Rows [r0, r1) of C (M x N, row-major) = A · B, with A and B addressed through strides.
template <typename T>
void gemm_rows(const T* A, int64_t a_rs, int64_t a_cs, const T* B, int64_t b_rs, int64_t b_cs, T* C,
               int64_t r0, int64_t r1, int64_t N, int64_t K) {
  for (int64_t m = r0; m < r1; ++m) {
    T* c = C + m * N;
    const T* a = A + m * a_rs;
    if (b_cs == 1) {  // rows of B are contiguous: accumulate row by row
      std::fill(c, c + N, T(0));
      for (int64_t k = 0; k < K; ++k) {
        const T av = a[k * a_cs];
        const T* b = B + k * b_rs;
        for (int64_t n = 0; n < N; ++n) c[n] += av * b[n];
      }
    } else {  // B is transposed in memory: dot products
      for (int64_t n = 0; n < N; ++n) {
        T acc = 0;
        const T* b = B + n * b_cs;
        for (int64_t k = 0; k < K; ++k) acc += a[k * a_cs] * b[k * b_rs];
        c[n] = acc;
      }
    }
  }
}

// Element offsets of each batch of `in` (broadcast to `batch`), in units of whole matrices.
std::vector<int64_t> batch_offsets(const Shape& in, const Shape& batch) {
  const std::vector<int64_t> strides = broadcast_strides(in, batch);
  const int64_t count = numel(batch);
  std::vector<int64_t> off(count, 0);
  for (int64_t i = 0; i < count; ++i) {
    int64_t rem = i;
    for (int d = static_cast<int>(batch.size()) - 1; d >= 0; --d) {
      off[i] += (rem % batch[d]) * strides[d];
      rem /= batch[d];
    }
  }
  return off;
}

template <typename T>
void matmul_loops(KernelContext& ctx, const MatmulDims& d) {
  const T* A = ctx.in(0).ptr<T>();
  const T* B = ctx.in(1).ptr<T>();
  T* C = ctx.out(0).ptr<T>();
  const auto a_off = batch_offsets(d.batch_a, d.batch);
  const auto b_off = batch_offsets(d.batch_b, d.batch);
  const int64_t rows = numel(d.batch) * d.M;
  const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(d.N * d.K, 1));
  ctx.parallel_for(rows, grain, [&](int64_t r0, int64_t r1) {
    while (r0 < r1) {  // split the range at batch boundaries
      const int64_t bi = r0 / d.M, m0 = r0 % d.M;
      const int64_t m1 = std::min(d.M, m0 + (r1 - r0));
      gemm_rows(A + a_off[bi] * d.M * d.K, d.K, 1, B + b_off[bi] * d.K * d.N, d.N, 1,
                C + bi * d.M * d.N, m0, m1, d.N, d.K);
      r0 += m1 - m0;
    }
  });
}

using dnnl_dt = dnnl::memory::data_type;
using du::data_type;

// The weight's memory descriptor: `user` (kiln's layout), or any layout the primitive likes where
// the weight is a constant that packed_weight lays out once.
dnnl::memory::desc weight_md(const dnnl::memory::desc& user, bool packed) {
  return packed ? dnnl::memory::desc(user.dims(), user.data_type(), dnnl::memory::format_tag::any)
                : user;
}

// Runs a primitive of matmul_dnnl or linear_dnnl: a packed constant weight (argument 1) in the
// layout the primitive chose.
void run_linalg(KernelContext& ctx, const du::CachedPrimitive& p, std::vector<void*>& buffers,
                bool packed) {
  std::shared_ptr<const void> w;
  if (packed && p.args[1].reorder) {
    w = du::packed_weight(ctx.op_name(), p.args[1], buffers[1],
                          *params_of<LinalgParams>(ctx).state);
    buffers[1] = const_cast<void*>(w.get());
  }
  du::execute(ctx.op_name(), p, buffers, nullptr, w ? 1 : -1);
}

// Whether the node's weight (input 1) is a constant matrix whose layout the primitive may choose.
bool packs_weight(const KernelContext& ctx) {
  if ((ctx.op() != OpId::Matmul && ctx.op() != OpId::Linear) || !ctx.params()) return false;
  const auto& p = params_as<LinalgParams>(*ctx.params());
  return p.const_weight && p.state && ctx.in(1).rank() == 2;
}

void matmul_dnnl(KernelContext& ctx, const MatmulDims& d) {
  auto with = [](Shape s, int64_t x, int64_t y) {
    s.push_back(x);
    s.push_back(y);
    return s;
  };
  const DType t = ctx.in(0).dtype;
  const bool packed = packs_weight(ctx);
  // (this thread's key, its memory kept from call to call: no allocation per call)
  thread_local du::Dims key;
  key = {static_cast<int64_t>(ctx.op()), static_cast<int64_t>(t),
         static_cast<int64_t>(d.batch.size()) + 2, packed};
  key.insert(key.end(), d.batch_a.begin(), d.batch_a.end());
  key.insert(key.end(), {d.M, d.K});
  key.insert(key.end(), d.batch_b.begin(), d.batch_b.end());
  key.insert(key.end(), {d.K, d.N});
  key.insert(key.end(), d.batch.begin(), d.batch.end());
  key.insert(key.end(), {d.M, d.N});
  auto p = du::cached(ctx.op_name(), key, [&] {
    const Shape src = with(d.batch_a, d.M, d.K), wei = with(d.batch_b, d.K, d.N),
                dst = with(d.batch, d.M, d.N);
    auto s = du::plain_md(src, data_type(t)), w = du::plain_md(wei, data_type(t)),
         o = du::plain_md(dst, data_type(t));
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(s, weight_md(w, packed), o), du::attr(),
                                    du::engine());
    return du::CachedPrimitive{
        dnnl::matmul(pd),
        {du::make_arg(DNNL_ARG_SRC, s, s), du::make_arg(DNNL_ARG_WEIGHTS, w, pd.weights_desc()),
         du::make_arg(DNNL_ARG_DST, o, o, true)},
        pd.scratchpad_desc()};
  });
  std::vector<void*> buffers{ctx.in(0).data, ctx.in(1).data, ctx.out(0).data};
  run_linalg(ctx, *p, buffers, packed);
}

// f32 products with fewer multiply-adds than kSmallGemm in all, batch by batch on this thread.
bool matmul_small(KernelContext& ctx, const MatmulDims& d) {
  const int64_t batches = numel(d.batch);
  if (d.K <= 0 || batches * d.M * d.N * d.K > kSmallGemm) return false;
  const float* A = ctx.in(0).ptr<float>();
  const float* B = ctx.in(1).ptr<float>();
  float* C = ctx.out(0).ptr<float>();
  if (numel(d.batch_b) == 1 && d.batch_a == d.batch) {  // one matrix B: the batches as rows
    small_gemm_nn(batches * d.M, d.N, d.K, 1.f, A, d.K, B, d.N, 0.f, C, d.N);
    return true;
  }
  const bool plain = d.batch_a == d.batch && d.batch_b == d.batch;
  const auto a_off = plain ? std::vector<int64_t>{} : batch_offsets(d.batch_a, d.batch);
  const auto b_off = plain ? std::vector<int64_t>{} : batch_offsets(d.batch_b, d.batch);
  for (int64_t bi = 0; bi < batches; ++bi)
    small_gemm_nn(d.M, d.N, d.K, 1.f, A + (plain ? bi : a_off[bi]) * d.M * d.K, d.K,
                  B + (plain ? bi : b_off[bi]) * d.K * d.N, d.N, 0.f, C + bi * d.M * d.N, d.N);
  return true;
}

void matmul(KernelContext& ctx) {
  // (this thread's, its memory reused: no allocation per call; workers read it by reference)
  thread_local MatmulDims mine;
  MatmulDims& d = mine;
  matmul_dims(ctx.in(0), ctx.in(1), ctx.out(0), d);
  const DType t = ctx.in(0).dtype;
  if (t == f32 && matmul_small(ctx, d)) return;
  // one matrix B for every batch of A: A's batches are rows of one product (one 2-D GEMM, whose
  // kernels, and packed weights, oneDNN runs faster than a batched one's)
  if (!d.batch.empty() && numel(d.batch_b) == 1 && d.batch_a == d.batch) {
    d.M *= numel(d.batch);
    d.batch.clear();
    d.batch_a.clear();
    d.batch_b.clear();
  }
  const bool dnnl_fits = d.K > 0 && static_cast<int>(d.batch.size()) + 2 <= kMaxDnnlRank;
  if ((t == f32 || (t == bf16 && native_bf16())) && dnnl_fits) return matmul_dnnl(ctx, d);
  if (t == bf16) return via_f32_copies(ctx, matmul);
  dispatch(t, ctx.op_name(), [&](auto v) {
    using T = decltype(v);
    if constexpr (!std::is_same_v<T, bool>) matmul_loops<T>(ctx, d);
  });
}

template <typename T>
void linear_loops(KernelContext& ctx, int64_t M, int64_t K, int64_t N) {
  const T* X = ctx.in(0).ptr<T>();
  const T* W = ctx.in(1).ptr<T>();
  const T* bias = params_of<LinalgParams>(ctx).has_bias ? ctx.in(2).ptr<T>() : nullptr;
  T* Y = ctx.out(0).ptr<T>();
  const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(N * K, 1));
  ctx.parallel_for(M, grain, [&](int64_t r0, int64_t r1) {
    gemm_rows(X, K, 1, W, 1, K, Y, r0, r1, N, K);
    if (bias)
      for (int64_t m = r0; m < r1; ++m)
        for (int64_t n = 0; n < N; ++n) Y[m * N + n] += bias[n];
  });
}

// y (M, N) = x (M, K) · wᵀ (+ bias) through oneDNN, x, w and y of type t (f32, or bf16 with f32
// accumulation), the bias of type bias_t. w (N, K) is read as the K x N weights matrix through
// its strides: no transposed copy.
void linear_dnnl(KernelContext& ctx, const void* x, const void* w, const void* bias, void* y,
                 int64_t M, int64_t K, int64_t N, DType t, DType bias_t) {
  const bool has_bias = bias != nullptr;
  // (the weight is the node's own input 1 where x is its input 0: not for the callers that
  // hand in other buffers)
  const bool packed = w == ctx.in(1).data && packs_weight(ctx);
  thread_local du::Dims key;  // (no allocation per call)
  key = {static_cast<int64_t>(ctx.op()), M,     K, N, has_bias, static_cast<int64_t>(t),
         static_cast<int64_t>(bias_t),   packed};
  auto p = du::cached(ctx.op_name(), key, [&] {
    const dnnl_dt dt = data_type(t);
    auto s = du::plain_md({M, K}, dt), wm = du::strided_md({K, N}, {1, K}, dt),
         o = du::plain_md({M, N}, dt);
    auto b = has_bias ? du::plain_md({1, N}, data_type(bias_t)) : dnnl::memory::desc();
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(s, weight_md(wm, packed), b, o), du::attr(),
                                    du::engine());
    du::CachedPrimitive c{
        dnnl::matmul(pd),
        {du::make_arg(DNNL_ARG_SRC, s, s), du::make_arg(DNNL_ARG_WEIGHTS, wm, pd.weights_desc())},
        pd.scratchpad_desc()};
    if (has_bias) c.args.push_back(du::make_arg(DNNL_ARG_BIAS, b, b));
    c.args.push_back(du::make_arg(DNNL_ARG_DST, o, o, true));
    return c;
  });
  std::vector<void*> buffers{const_cast<void*>(x), const_cast<void*>(w)};
  if (has_bias) buffers.push_back(const_cast<void*>(bias));
  buffers.push_back(y);
  run_linalg(ctx, *p, buffers, packed);
}

}  // namespace

void linear_f32(KernelContext& ctx, const void* x, const void* w, const void* bias, void* y,
                int64_t M, int64_t K, int64_t N) {
  linear_dnnl(ctx, x, w, bias, y, M, K, N, f32, f32);
}

namespace {

void linear(KernelContext& ctx) {
  const int64_t K = ctx.in(0).shape.back(), N = ctx.in(1).shape[0];
  const int64_t rows = ctx.out(0).numel() / std::max<int64_t>(N, 1);
  const DType t = ctx.in(0).dtype;
  const bool has_bias = params_of<LinalgParams>(ctx).has_bias;
  if ((t == f32 || (t == bf16 && native_bf16())) && K > 0)
    return linear_dnnl(ctx, ctx.in(0).data, ctx.in(1).data, has_bias ? ctx.in(2).data : nullptr,
                       ctx.out(0).data, rows, K, N, t, has_bias ? ctx.in(2).dtype : f32);
  if (t == bf16) return via_f32_copies(ctx, linear);
  dispatch(ctx.in(0).dtype, ctx.op_name(), [&](auto v) {
    using T = decltype(v);
    if constexpr (!std::is_same_v<T, bool>) linear_loops<T>(ctx, rows, K, N);
  });
}
}  // namespace

void register_linalg_kernels() {
  // (bf16 reaches them as it is: native_bf16, or their own f32 copies)
  register_kernel(OpId::Matmul, Backend::cpu, {matmul, kNumericTypes, 0, true, false, {bf16}});
  register_kernel(OpId::Linear, Backend::cpu, {linear, kNumericTypes, 0, true, false, {bf16}});
}

}  // namespace kiln::cpu
