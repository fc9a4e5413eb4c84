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
#include "runtime/kernel_views.h"

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
  if ((ctx.op() != OpId::Matmul && ctx.op() != OpId::Linear && ctx.op() != OpId::FusedMatmul) ||
      !ctx.params())
    return false;
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
// ---- fused_matmul: y = the epilogue's steps over x · b, as post-ops of oneDNN's primitive (the
// product's tiles get them while still in registers and cache), or, for f32 products of fewer than
// kSmallGemm multiply-adds with b (K, N), small_gemm's product and the steps in a loop after it.

// Whether an operand is the whole (M, N) output (else a row of it: N values or one).
bool whole_output(const TensorView& o, int64_t M, int64_t N) {
  return o.numel() == M * N && o.rank() > 0 && o.shape.back() == N && (o.rank() > 1 || M == 1);
}
// An operand's oneDNN dims, (M, N), (1, N) or (1, 1), into `d` (its memory reused).
void operand_dims(const TensorView& o, int64_t M, int64_t N, du::Dims& d) {
  const bool row_of_n = o.rank() > 0 && o.shape.back() == N;
  d.assign({whole_output(o, M, N) ? M : 1, row_of_n ? N : 1});
}

// The steps from `first` on as oneDNN post-ops (operands' dims from operand `k` on).
dnnl::post_ops epilogue_post_ops(const std::vector<MatmulStep>& steps, size_t first,
                                 const std::vector<du::Dims>& operands, size_t k, dnnl_dt t) {
  using alg = dnnl::algorithm;
  dnnl::post_ops ops;
  for (size_t i = first; i < steps.size(); ++i) switch (steps[i]) {
      case MatmulStep::add:
      case MatmulStep::mul:
        ops.append_binary(steps[i] == MatmulStep::add ? alg::binary_add : alg::binary_mul,
                          du::plain_md(operands[k++], t));
        break;
      case MatmulStep::relu:
        ops.append_eltwise(1.f, alg::eltwise_relu, 0.f, 0.f);
        break;
      case MatmulStep::gelu:
        ops.append_eltwise(1.f, alg::eltwise_gelu_erf, 0.f, 0.f);
        break;
      case MatmulStep::gelu_tanh:
        ops.append_eltwise(1.f, alg::eltwise_gelu_tanh, 0.f, 0.f);
        break;
      case MatmulStep::sigmoid:
        ops.append_eltwise(1.f, alg::eltwise_logistic, 0.f, 0.f);
        break;
      case MatmulStep::silu:
        ops.append_eltwise(1.f, alg::eltwise_swish, 1.f, 0.f);
        break;
      case MatmulStep::tanh:
        ops.append_eltwise(1.f, alg::eltwise_tanh, 0.f, 0.f);
        break;
    }
  return ops;
}

// With `post_ops`, the steps run as the primitive's post-ops, a first step that adds a row of N
// as its bias (cheaper than a binary post-op); without, the primitive computes the product alone.
void fused_matmul_dnnl(KernelContext& ctx, const LinalgParams& lp, int64_t M, int64_t K, int64_t N,
                       bool post_ops) {
  const DType t = ctx.in(0).dtype;
  const bool packed = lp.const_weight && lp.state;
  const int operands = ctx.num_inputs() - 2;
  thread_local std::vector<du::Dims> dims;  // (no allocation per call)
  dims.resize(static_cast<size_t>(operands));
  thread_local du::Dims key;
  key = {static_cast<int64_t>(OpId::FusedMatmul),
         static_cast<int64_t>(t),
         M,
         K,
         N,
         lp.transpose_b,
         packed,
         post_ops};
  if (post_ops) {
    for (MatmulStep s : lp.epilogue) key.push_back(static_cast<int64_t>(s));
    for (int i = 0; i < operands; ++i) {
      operand_dims(ctx.in(2 + i), M, N, dims[i]);
      key.insert(key.end(), dims[i].begin(), dims[i].end());
    }
  }
  const bool bias =
      post_ops && lp.epilogue[0] == MatmulStep::add && dims[0][0] == 1 && dims[0][1] == N;
  const size_t steps = post_ops ? lp.epilogue.size() : 0;
  auto p = du::cached(ctx.op_name(), key, [&] {
    const dnnl_dt dt = data_type(t);
    auto s = du::plain_md({M, K}, dt), o = du::plain_md({M, N}, dt);
    auto w = lp.transpose_b ? du::strided_md({K, N}, {1, K}, dt) : du::plain_md({K, N}, dt);
    const auto b = bias ? du::plain_md({1, N}, dt) : dnnl::memory::desc();
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    if (post_ops) attr.set_post_ops(epilogue_post_ops(lp.epilogue, bias, dims, bias, dt));
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(s, weight_md(w, packed), b, o), attr,
                                    du::engine());
    du::CachedPrimitive c{
        dnnl::matmul(pd),
        {du::make_arg(DNNL_ARG_SRC, s, s), du::make_arg(DNNL_ARG_WEIGHTS, w, pd.weights_desc())},
        pd.scratchpad_desc()};
    if (bias) c.args.push_back(du::make_arg(DNNL_ARG_BIAS, b, b));
    size_t k = bias;
    for (size_t i = bias; i < steps; ++i)
      if (takes_operand(lp.epilogue[i])) {
        const auto md = du::plain_md(dims[k++], dt);
        const int post_op = static_cast<int>(i - bias);
        c.args.push_back(
            du::make_arg(DNNL_ARG_ATTR_MULTIPLE_POST_OP(post_op) | DNNL_ARG_SRC_1, md, md));
      }
    c.args.push_back(du::make_arg(DNNL_ARG_DST, o, o, true));
    return c;
  });
  std::vector<void*> buffers{ctx.in(0).data, ctx.in(1).data};
  if (post_ops)
    for (int i = 0; i < operands; ++i) buffers.push_back(ctx.in(2 + i).data);
  buffers.push_back(ctx.out(0).data);
  run_linalg(ctx, *p, buffers, packed);
}

// An activation step's op and attributes.
std::pair<OpId, const Attrs*> activation_op(MatmulStep s) {
  static const Attrs none, erf{{"approximate", std::string("none")}},
      tanh{{"approximate", std::string("tanh")}};
  switch (s) {
    case MatmulStep::relu:
      return {OpId::Relu, &none};
    case MatmulStep::gelu:
      return {OpId::Gelu, &erf};
    case MatmulStep::gelu_tanh:
      return {OpId::Gelu, &tanh};
    case MatmulStep::sigmoid:
      return {OpId::Sigmoid, &none};
    case MatmulStep::silu:
      return {OpId::Silu, &none};
    default:
      return {OpId::Tanh, &none};
  }
}

// The steps over y (M, N) in place, in parallel over blocks of rows (of 16384 elements or more;
// one block where the output is smaller), every step over a block before the next block: adds and
// multiplies row by row, activations through their ops' own kernels (the vectorized functions,
// each element by itself: any split gives the same bits).
void apply_epilogue(KernelContext& ctx, const LinalgParams& lp, float* y, int64_t M, int64_t N) {
  const KernelEntry* kernels[kMaxMatmulSteps] = {};
  for (size_t i = 0; i < lp.epilogue.size(); ++i)
    if (!takes_operand(lp.epilogue[i]))
      kernels[i] = find_kernel(activation_op(lp.epilogue[i]).first, Backend::cpu);
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(N, 1));
  ctx.parallel_for(M, grain, [&](int64_t m0, int64_t m1) {
    int k = 2;
    for (size_t i = 0; i < lp.epilogue.size(); ++i) {
      const MatmulStep s = lp.epilogue[i];
      if (!takes_operand(s)) {
        // (this thread's views, lent to the kernel: no allocation per call)
        thread_local std::vector<TensorView> in(1), out(1);
        in.resize(1), out.resize(1);
        for (auto* v : {&in, &out}) {
          (*v)[0].data = y + m0 * N;
          (*v)[0].shape.assign(1, (m1 - m0) * N);
          (*v)[0].dtype = f32;
        }
        KernelContextViews lent(activation_op(s).first, *activation_op(s).second, in, out, nullptr,
                                nullptr, nullptr);
        kernels[i]->fn(lent.ctx);
        continue;
      }
      const TensorView& o = ctx.in(k++);
      const float* od = o.ptr<float>();
      const bool full = whole_output(o, M, N) && M > 1;
      const bool add = s == MatmulStep::add;
      for (int64_t m = m0; m < m1; ++m) {
        float* __restrict r = y + m * N;
        if (o.numel() == 1) {  // (a one-element row)
          const float v = od[0];
          if (add)
            for (int64_t n = 0; n < N; ++n) r[n] += v;
          else
            for (int64_t n = 0; n < N; ++n) r[n] *= v;
          continue;
        }
        const float* __restrict on = od + (full ? m * N : 0);
        if (add)
          for (int64_t n = 0; n < N; ++n) r[n] += on[n];
        else
          for (int64_t n = 0; n < N; ++n) r[n] *= on[n];
      }
    }
  });
}

// Products of up to this many multiply-adds apply their epilogue after the product
// (apply_epilogue): oneDNN's post-ops cost more than that on products this small.
constexpr int64_t kEpilogueAfter = int64_t{1} << 22;

void fused_matmul(KernelContext& ctx) {
  const LinalgParams& lp = params_of<LinalgParams>(ctx);
  const TensorView &x = ctx.in(0), &b = ctx.in(1);
  const int64_t K = x.shape.back(), N = b.shape[lp.transpose_b ? 0 : 1];
  const int64_t M = ctx.out(0).numel() / std::max<int64_t>(N, 1);
  if (ctx.out(0).numel() == 0) return;
  const int64_t macs = M * N * K;
  if (K > 0 && macs > kEpilogueAfter) return fused_matmul_dnnl(ctx, lp, M, K, N, true);
  float* Y = ctx.out(0).ptr<float>();
  if (K > 0 && (macs > kSmallGemm || lp.transpose_b)) fused_matmul_dnnl(ctx, lp, M, K, N, false);
  else if (K > 0) small_gemm_nn(M, N, K, 1.f, x.ptr<float>(), K, b.ptr<float>(), N, 0.f, Y, N);
  else std::fill(Y, Y + M * N, 0.f);
  apply_epilogue(ctx, lp, Y, M, N);
}

}  // namespace

void register_linalg_kernels() {
  // (bf16 reaches them as it is: native_bf16, or their own f32 copies)
  register_kernel(OpId::Matmul, Backend::cpu, {matmul, kNumericTypes, 0, true, false, {bf16}});
  register_kernel(OpId::Linear, Backend::cpu, {linear, kNumericTypes, 0, true, false, {bf16}});
  register_kernel(OpId::FusedMatmul, Backend::cpu, {fused_matmul, DTypeSet{f32}});
}

}  // namespace kiln::cpu
