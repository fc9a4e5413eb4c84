// quantized_matmul through cuBLASLt's int8 product: i8 x i8 -> i32 (CUBLAS_COMPUTE_32I), then one
// epilogue kernel for the zero points, scales, bias, residual, relu or GELU and the requantization
// the exact kernel does (backends/quant_math.h), so results are the same bit for bit.
//
// cuBLASLt takes int8 operands in its "TN" form only: with row-major out (M, N) = a (M, K) w,
// computed as the column-major outᵀ = wᵀ aᵀ, the weights must be (N, K) row-major (linear's
// layout; matmul's (K, N) is transposed into scratch) and a (M, K) as it is. u8 data is shifted
// to i8 (v - 128, its zero point too), which leaves every (v - zp) unchanged. With the shifted a',
// w' and zero points za', zw':
//   sum (a' - za')(w' - zw') = sum a' w' - za' colsum(w') - zw' rowsum(a') + K za' zw'
// exact in i32. K and N must be multiples of 4 (cuBLASLt's int8 rule for leading dimensions);
// elsewhere, or when no algorithm is found, the caller runs the exact kernel.
#include <climits>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>

#include "backends/cuda/cublaslt_util.h"
#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/handles.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/library_check.h"
#include "backends/cuda/quant_gemm.h"
#include "backends/quant_dispatch.h"
#include "backends/quant_math.h"

namespace kiln::cuda {

namespace {

constexpr size_t kMaxWorkspace = size_t{32} << 20;

using lt::alignment_of;
using lt::Layout;
using lt::MatmulDesc;
using lt::Preference;

struct Key {
  int device = 0;
  int64_t m = 0, n = 0, k = 0;
  uint32_t align_a = 0, align_w = 0;
  auto tie() const { return std::tie(device, m, n, k, align_a, align_w); }
  bool operator<(const Key& o) const { return tie() < o.tie(); }
};

struct Plan {
  Layout w, a, d;
  cublasLtMatmulAlgo_t algo{};
  size_t workspace = 0;
  bool found = false;
};

void make_desc(MatmulDesc& desc) {
  KILN_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc.h, CUBLAS_COMPUTE_32I, CUDA_R_32I));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  KILN_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(desc.h, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  KILN_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(desc.h, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
}

std::shared_ptr<const Plan> build_plan(const Key& k) {
  auto plan = std::make_shared<Plan>();
  // column-major: w' is (K, N) with ld K, used transposed; a' is (K, M) with ld K; D is (N, M)
  KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->w.h, CUDA_R_8I, k.k, k.n, k.k));
  KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->a.h, CUDA_R_8I, k.k, k.m, k.k));
  KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->d.h, CUDA_R_32I, k.n, k.m, k.n));
  MatmulDesc desc;
  make_desc(desc);
  Preference pref;
  lt::make_preference(pref, kMaxWorkspace, k.align_w, k.align_a, 256);  // D is scratch
  plan->found = lt::first_algo(cublaslt_handle(k.device), desc, plan->w, plan->a, plan->d, pref,
                               kMaxWorkspace, plan->algo, plan->workspace);
  return plan;
}

std::shared_ptr<const Plan> plan_for(const Key& k) {
  return lt::build_once<Key, Plan>(k, build_plan);
}

// What shifts S's values into i8: 128 for u8.
template <typename S>
constexpr int32_t shift_of() {
  return std::is_same_v<S, uint8_t> ? 128 : 0;
}

// dst = src - shift as i8; with `transpose`, src (rows, cols) becomes dst (cols, rows).
template <typename S>
__global__ void to_i8(const S* __restrict__ src, int8_t* __restrict__ dst, int64_t rows,
                      int64_t cols, bool transpose, int32_t shift) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{blockDim.x} * gridDim.x) {
    const int64_t r = i / cols, c = i % cols;
    dst[transpose ? c * rows + r : i] = static_cast<int8_t>(int32_t{src[i]} - shift);
  }
}

// sums[r] = the sum of row r of v (rows, k).
__global__ void row_sums(const int8_t* __restrict__ v, int64_t rows, int64_t k,
                         int32_t* __restrict__ sums) {
  // a warp per row: the lanes read consecutive bytes, then add across the warp
  const int lane = threadIdx.x & 31;
  const int64_t warps = (int64_t{gridDim.x} * blockDim.x) >> 5;
  for (int64_t r = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) >> 5; r < rows; r += warps) {
    const int8_t* p = v + r * k;
    int32_t s = 0;
    for (int64_t i = lane; i < k; i += 32) s += p[i];
    for (int o = 16; o > 0; o >>= 1) s += __shfl_down_sync(0xffffffffu, s, o);
    if (lane == 0) sums[r] = s;
  }
}

struct EpilogueArgs {
  int64_t m, n, k;
  int32_t shift_a, shift_w;
  int act;  // quant_math::Activation
  bool per_channel;
};

template <typename A, typename W, typename Y>
__global__ void qmm_epilogue(const int32_t* __restrict__ raw, const int32_t* __restrict__ a_sums,
                             const int32_t* __restrict__ w_sums, const float* __restrict__ sa,
                             const A* __restrict__ za, const float* __restrict__ sw,
                             const W* __restrict__ zw, const float* __restrict__ sy,
                             const Y* __restrict__ zy, const float* __restrict__ bias,
                             const float* __restrict__ res, Y* __restrict__ out, EpilogueArgs g) {
  const int64_t total = g.m * g.n;
  const int32_t za_s = int32_t{za[0]} - g.shift_a;
  for (int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; t < total;
       t += int64_t{blockDim.x} * gridDim.x) {
    const int64_t r = t / g.n, j = t % g.n, c = g.per_channel ? j : 0;
    const int32_t zw_s = int32_t{zw[c]} - g.shift_w;
    // modulo 2^32 (the terms may overflow; the exact sum fits)
    const uint32_t u =
        static_cast<uint32_t>(raw[t]) -
        static_cast<uint32_t>(za_s) * static_cast<uint32_t>(w_sums[j]) -
        static_cast<uint32_t>(zw_s) * static_cast<uint32_t>(a_sums[r]) +
        static_cast<uint32_t>(g.k) * static_cast<uint32_t>(za_s) * static_cast<uint32_t>(zw_s);
    const int32_t acc = static_cast<int32_t>(u);
    out[t] = quant_math::requantize<Y>(acc, static_cast<double>(sa[0]) * static_cast<double>(sw[c]),
                                       bias ? bias[j] : 0.0, res ? res[t] : 0.0, g.act,
                                       static_cast<double>(sy[0]), zy[0]);
  }
}

}  // namespace

bool int8_gemm_available(int device, int64_t m, int64_t n, int64_t k, uint32_t align_a,
                         uint32_t align_w) {
  return plan_for(Key{device, m, n, k, align_a, align_w})->found;
}

void int8_gemm(KernelContext& ctx, const int8_t* a8, const int8_t* w8, int32_t* raw, int64_t m,
               int64_t n, int64_t k, uint32_t align_a, uint32_t align_w) {
  const auto plan = plan_for(Key{ctx.device(), m, n, k, align_a, align_w});
  if (!plan->found)
    fail<UnsupportedError>("[{}] cuBLASLt has no int8 algorithm for ({}, {}) x ({}, {})",
                           ctx.op_name(), m, k, k, n);
  void* ws = plan->workspace ? ctx.scratch(plan->workspace) : nullptr;
  MatmulDesc desc;
  make_desc(desc);
  const int32_t one = 1, zero = 0;
  KILN_CUBLAS_CHECK(cublasLtMatmul(cublaslt_handle(ctx.device()), desc.h, &one, w8, plan->w.h, a8,
                                   plan->a.h, &zero, raw, plan->d.h, raw, plan->d.h, &plan->algo,
                                   ws, plan->workspace, stream_of(ctx)));
}

void int8_row_sums(const int8_t* v, int64_t rows, int64_t k, int32_t* sums, cudaStream_t st) {
  if (rows > 0) row_sums<<<blocks_for(rows * 32), kThreads, 0, st>>>(v, rows, k, sums);
}

uint32_t pointer_alignment(const void* p) { return alignment_of(p); }

namespace {

template <typename A, typename W, typename Y>
bool run(KernelContext& ctx, int64_t m, int64_t n, int64_t k, bool tw) {
  const TensorView &ta = ctx.in(0), &tw_ = ctx.in(3);
  // operands used in place when they are i8 already (and w in (N, K)); else converted to scratch
  const bool a_direct = std::is_same_v<A, int8_t>;
  const bool w_direct = std::is_same_v<W, int8_t> && tw;
  const uint32_t align_a = a_direct ? alignment_of(ta.data) : 256u,
                 align_w = w_direct ? alignment_of(tw_.data) : 256u;
  if (!int8_gemm_available(ctx.device(), m, n, k, align_a, align_w)) return false;
  cudaStream_t st = stream_of(ctx);
  const int8_t* a8 = static_cast<const int8_t*>(ta.data);
  if (!a_direct) {
    auto* buf = static_cast<int8_t*>(ctx.scratch(static_cast<size_t>(m * k)));
    to_i8<A><<<blocks_for(m * k), kThreads, 0, st>>>(ta.ptr<A>(), buf, m, k, false, shift_of<A>());
    a8 = buf;
  }
  const int8_t* w8 = static_cast<const int8_t*>(tw_.data);
  if (!w_direct) {
    auto* buf = static_cast<int8_t*>(ctx.scratch(static_cast<size_t>(n * k)));
    // (N, K) from (N, K) or, transposed, from matmul's (K, N)
    to_i8<W><<<blocks_for(n * k), kThreads, 0, st>>>(tw_.ptr<W>(), buf, tw ? n : k, tw ? k : n, !tw,
                                                     shift_of<W>());
    w8 = buf;
  }
  auto* sums = static_cast<int32_t*>(ctx.scratch(static_cast<size_t>(m + n) * 4));
  int8_row_sums(a8, m, k, sums, st);
  int8_row_sums(w8, n, k, sums + m, st);
  check_launch(ctx.op_name());
  auto* raw = static_cast<int32_t*>(ctx.scratch(static_cast<size_t>(m * n) * 4));
  int8_gemm(ctx, a8, w8, raw, m, n, k, align_a, align_w);
  int next = 8;
  const QuantEpilogueParams ep = params_of<QuantEpilogueParams>(ctx);
  const float* bias = ep.has_bias ? ctx.in(next++).ptr<float>() : nullptr;
  const float* res = ep.has_residual ? ctx.in(next).ptr<float>() : nullptr;
  const EpilogueArgs g{m,
                       n,
                       k,
                       shift_of<A>(),
                       shift_of<W>(),
                       epilogue_activation(ep),
                       ctx.in(4).numel() != 1 || n == 1};
  qmm_epilogue<A, W, Y><<<blocks_for(m * n), kThreads, 0, st>>>(
      raw, sums, sums + m, ctx.in(1).ptr<float>(), ctx.in(2).ptr<A>(), ctx.in(4).ptr<float>(),
      ctx.in(5).ptr<W>(), ctx.in(6).ptr<float>(), ctx.in(7).ptr<Y>(), bias, res,
      ctx.out(0).ptr<Y>(), g);
  check_launch(ctx.op_name());
  return true;
}

}  // namespace

bool quantized_matmul_lt(KernelContext& ctx, int64_t m, int64_t n, int64_t k, bool transpose_w) {
  if (!int8_gemm_fits(m, n, k)) return false;
  bool done = false;
  auto q8 = [&](DType t, auto&& f) {
    if (t == DType::i8)
      f(int8_t{});
    else if (t == DType::u8)
      f(uint8_t{});
  };
  q8(ctx.in(0).dtype, [&](auto at) {
    q8(ctx.in(3).dtype, [&](auto wt) {
      q8(ctx.in(7).dtype, [&](auto yt) {
        done = run<decltype(at), decltype(wt), decltype(yt)>(ctx, m, n, k, transpose_w);
      });
    });
  });
  return done;
}

}  // namespace kiln::cuda
