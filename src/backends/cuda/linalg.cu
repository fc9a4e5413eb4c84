// CUDA kernels of the linalg family. Float types go through cuBLASLt (f32 in true f32, no TF32,
// unless the node has attr tf32 from CompileOptions::allow_tf32; f16/bf16 with f32 accumulation;
// f64 in f64); Linear adds its bias in cuBLASLt's epilogue where an algorithm takes it. Integer
// types use a tiled kernel that wraps like the CPU loops. Row-major C = A·B is computed as the
// column-major product Cᵀ = Bᵀ·Aᵀ, so no copies are made.
#include <algorithm>
#include <array>
#include <atomic>
#include <climits>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <tuple>
#include <vector>

#include "backends/cuda/cublaslt_util.h"
#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/handles.h"
#include "backends/cuda/kernels.h"
#include "backends/geometry.h"
#include "ops/linalg_params.h"
#include "runtime/env.h"
#include "runtime/profiler.h"

namespace kiln::cuda {

namespace {

constexpr size_t kMaxWorkspace = size_t{32} << 20;


// ---- cuBLASLt ----

using lt::alignment_of;
using lt::Layout;
using lt::MatmulDesc;
using lt::Preference;

// One column-major product D (m x n) = op(A) (m x k) · B (k x n), batched with element strides
// (0: the operand is shared by every batch). Everything a heuristic result depends on.
struct GemmKey {
  int device = 0;
  DType dtype = f32;
  bool trans_a = false;
  int64_t m = 0, n = 0, k = 0, batch = 1;
  int64_t lda = 0, ldb = 0, ldd = 0, stride_a = 0, stride_b = 0, stride_d = 0;
  bool bias = false;
  bool tf32 = false;  // f32 on TF32 tensor cores (attr tf32: CompileOptions::allow_tf32)
  uint32_t align_a = 0, align_b = 0, align_d = 0, align_bias = 0;
  auto tie() const {
    return std::tie(device, dtype, trans_a, m, n, k, batch, lda, ldb, ldd, stride_a, stride_b,
                    stride_d, bias, tf32, align_a, align_b, align_d, align_bias);
  }
  bool operator<(const GemmKey& o) const { return tie() < o.tie(); }
};

// The layouts of A, B and D and the chosen algorithm; immutable once built, shared by threads.
struct GemmPlan {
  Layout a, b, d;
  cublasLtMatmulAlgo_t algo{};
  size_t workspace = 0;
  bool found = false;
  mutable std::atomic<bool> launched{false};  // (the profiler shows a plan's first launch)
  // the bucket plan whose algorithm this one takes (plan_near), marked launched with it
  const GemmPlan* source = nullptr;
};

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::f32:
      return CUDA_R_32F;
    case DType::f16:
      return CUDA_R_16F;
    case DType::bf16:
      return CUDA_R_16BF;
    case DType::f64:
      return CUDA_R_64F;
    default:
      fail<UnsupportedError>("[matmul] cuBLASLt kernel got dtype {}", name(t));
  }
}

// A matmul descriptor is made per call: the bias pointer lives in it.
void make_desc(MatmulDesc& desc, const GemmKey& k, const void* bias) {
  const bool f64 = k.dtype == DType::f64;
  const cublasComputeType_t compute = f64 ? CUBLAS_COMPUTE_64F
                                      : k.tf32 && k.dtype == DType::f32
                                          ? CUBLAS_COMPUTE_32F_FAST_TF32
                                          : CUBLAS_COMPUTE_32F;
  KILN_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc.h, compute, f64 ? CUDA_R_64F : CUDA_R_32F));
  const cublasOperation_t ta = k.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = CUBLAS_OP_N;
  KILN_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(desc.h, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  KILN_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(desc.h, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  if (k.bias) {
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    KILN_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(desc.h, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.h, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                     &bias, sizeof(bias)));
  }
}

void make_layout(Layout& l, cudaDataType_t t, int64_t rows, int64_t cols, int64_t ld, int64_t batch,
                 int64_t stride) {
  KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l.h, t, static_cast<uint64_t>(rows),
                                               static_cast<uint64_t>(cols), ld));
  if (batch > 1) {
    const int32_t count = static_cast<int32_t>(batch);
    KILN_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l.h, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                       &count, sizeof(count)));
    KILN_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(
        l.h, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
  }
}

// The layouts of k's operands (into plan) and the descriptor a query for k takes; the heuristic
// needs a bias pointer, aligned as a real one is (a misaligned one makes it refuse f64 with
// INVALID_VALUE), which is never read.
void describe(const GemmKey& k, GemmPlan& plan, MatmulDesc& desc) {
  const cudaDataType_t t = cuda_type(k.dtype);
  make_layout(plan.a, t, k.trans_a ? k.k : k.m, k.trans_a ? k.m : k.k, k.lda, k.batch, k.stride_a);
  make_layout(plan.b, t, k.k, k.n, k.ldb, k.batch, k.stride_b);
  make_layout(plan.d, t, k.m, k.n, k.ldd, k.batch, k.stride_d);
  alignas(256) static const char kBiasStandIn[256] = {};
  make_desc(desc, k, k.bias ? kBiasStandIn : nullptr);
}

// The preference of a heuristic query for k: the workspace bound, the operands' alignments, and
// split-K partial sums in f32 for f16/bf16 (no reduction in, or in place of, the half output).
void prefer(const GemmKey& k, Preference& pref) {
  lt::make_preference(pref, kMaxWorkspace, k.align_a, k.align_b, k.align_d);
  if (k.dtype == DType::f16 || k.dtype == DType::bf16) {
    const uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    KILN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref.h, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes, sizeof(schemes)));
  }
}

std::shared_ptr<const GemmPlan> build_plan(const GemmKey& k) {
  auto plan = std::make_shared<GemmPlan>();
  MatmulDesc desc;
  describe(k, *plan, desc);
  Preference pref;
  prefer(k, pref);
  prof::HostScope span(SpanKind::compile, "cuBLASLt heuristic");
  plan->found = lt::first_algo(cublaslt_handle(k.device), desc, plan->a, plan->b, plan->d, pref,
                               kMaxWorkspace, plan->algo, plan->workspace);
  return plan;
}

std::shared_ptr<const GemmPlan> plan_for(const GemmKey& k) {
  return lt::build_once<GemmKey, GemmPlan>(k, build_plan);
}

// Sizes in buckets, two per octave: v rounded up to the next 2^j or 3 * 2^(j-1).
int64_t bucket_up(int64_t v) {
  int64_t p = 1;
  while (p < v) p <<= 1;
  const int64_t three_quarters = p / 2 + p / 4;
  return v > 2 && v <= three_quarters ? three_quarters : p;
}

// `k` with its sizes rounded up to their buckets, leading dims and batch strides grown to fit
// them (a packed operand stays packed; a broadcast one stays broadcast).
GemmKey bucketed(const GemmKey& k) {
  GemmKey b = k;
  b.m = bucket_up(k.m);
  b.n = bucket_up(k.n);
  b.k = bucket_up(k.k);
  b.batch = bucket_up(k.batch);
  auto ld = [](int64_t ld, int64_t rows, int64_t new_rows) {
    return ld == rows ? new_rows : std::max(ld, new_rows);
  };
  b.lda = ld(k.lda, k.trans_a ? k.k : k.m, k.trans_a ? b.k : b.m);
  b.ldb = ld(k.ldb, k.k, b.k);
  b.ldd = ld(k.ldd, k.m, b.m);
  auto stride = [&](int64_t stride, int64_t ld, int64_t cols, int64_t new_ld, int64_t new_cols) {
    if (b.batch == 1 || stride == 0) return stride;
    return stride == ld * cols ? new_ld * new_cols : std::max(stride, new_ld * new_cols);
  };
  b.stride_a = stride(k.stride_a, k.lda, k.trans_a ? k.m : k.k, b.lda, k.trans_a ? b.m : b.k);
  b.stride_b = stride(k.stride_b, k.ldb, k.n, b.ldb, b.n);
  b.stride_d = stride(k.stride_d, k.ldd, k.n, b.ldd, b.n);
  return b;
}

// Bucket plans by product: one product of a layer at different token counts differs only in its
// columns n (and the batch strides of B and D that follow from them), so those are left out of
// the family key. A new bucket may borrow a launched neighbour's algorithm (its kernel loaded).
GemmKey family_of(GemmKey k) {
  k.n = 0;
  k.stride_b = k.stride_d = 0;
  return k;
}
struct BucketPlans {
  std::mutex mu;
  std::map<GemmKey, std::map<int64_t, std::shared_ptr<const GemmPlan>>> by_family;
};
BucketPlans& bucket_plans() {
  static BucketPlans* p = new BucketPlans;  // (never destroyed: plans outlive static teardown)
  return *p;
}
std::shared_ptr<const GemmPlan> bucket_plan(const GemmKey& b) {
  auto plan = plan_for(b);
  BucketPlans& bp = bucket_plans();
  std::lock_guard<std::mutex> l(bp.mu);
  bp.by_family[family_of(b)].emplace(b.n, plan);
  return plan;
}
// A plan of b's family whose bucket is within a factor of two of b's columns and whose kernel
// has run: the nearest one (in octaves), or none.
std::shared_ptr<const GemmPlan> launched_neighbour(const GemmKey& b) {
  BucketPlans& bp = bucket_plans();
  std::lock_guard<std::mutex> l(bp.mu);
  const auto f = bp.by_family.find(family_of(b));
  if (f == bp.by_family.end()) return nullptr;
  std::shared_ptr<const GemmPlan> best;
  double best_distance = 1.0 + 1e-9;  // octaves
  for (const auto& [n, plan] : f->second) {
    if (!plan->found || !plan->launched.load(std::memory_order_relaxed)) continue;
    const double d = std::abs(std::log2(static_cast<double>(n) / static_cast<double>(b.n)));
    if (d < best_distance) best = plan, best_distance = d;
  }
  return best;
}

// Kernels the process has launched (their modules loaded), by what selects a kernel: the
// product's types, transposes and epilogue, and the algorithm's configuration.
struct KernelId {
  DType dtype = f32;
  bool tf32 = false, trans_a = false, bias = false;
  std::array<uint64_t, 8> algo{};
  KernelId(const GemmKey& k, const cublasLtMatmulAlgo_t& a)
      : dtype(k.dtype), tf32(k.tf32), trans_a(k.trans_a), bias(k.bias) {
    static_assert(sizeof(a.data) == sizeof(algo));
    std::memcpy(algo.data(), a.data, sizeof(algo));
  }
  auto tie() const { return std::tie(dtype, tf32, trans_a, bias, algo); }
  bool operator<(const KernelId& o) const { return tie() < o.tie(); }
};
struct LoadedKernels {
  std::mutex mu;
  std::set<KernelId> ids;
};
LoadedKernels& loaded_kernels() {
  static LoadedKernels* l = new LoadedKernels;  // (never destroyed, as bucket_plans)
  return *l;
}
// Records plan's kernel as launched; whether it had not been.
bool mark_loaded(const GemmKey& k, const GemmPlan& plan) {
  LoadedKernels& l = loaded_kernels();
  std::lock_guard<std::mutex> g(l.mu);
  return l.ids.insert(KernelId(k, plan.algo)).second;
}

// The plan of bucket b when no neighbouring bucket has run: of cuBLASLt's first kPreferLoaded
// heuristic choices, the first whose kernel the process has launched (a first launch of a kernel
// costs up to about 5 ms, a product of these sizes microseconds), else the first; registered as
// the bucket's plan.
constexpr int kPreferLoaded = 8;
std::shared_ptr<const GemmPlan> bucket_plan_preferring_loaded(const GemmKey& b) {
  auto plan = std::make_shared<GemmPlan>();
  MatmulDesc desc;
  describe(b, *plan, desc);
  Preference pref;
  prefer(b, pref);
  cublasLtMatmulHeuristicResult_t results[kPreferLoaded] = {};
  int count = 0;
  {
    prof::HostScope span(SpanKind::compile, "cuBLASLt heuristic");
    const cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(
        cublaslt_handle(b.device), desc.h, plan->a.h, plan->b.h, plan->d.h, plan->d.h, pref.h,
        kPreferLoaded, results, &count);
    if (s != CUBLAS_STATUS_SUCCESS && s != CUBLAS_STATUS_NOT_SUPPORTED)
      throw_cublas_error(s, "cublasLtMatmulAlgoGetHeuristic", __FILE__, __LINE__);
  }
  const cublasLtMatmulHeuristicResult_t* chosen = nullptr;
  {
    LoadedKernels& l = loaded_kernels();
    std::lock_guard<std::mutex> g(l.mu);
    for (int i = 0; i < count; ++i) {
      const auto& r = results[i];
      if (r.state != CUBLAS_STATUS_SUCCESS || r.workspaceSize > kMaxWorkspace) continue;
      if (!chosen) chosen = &r;  // (the heuristic's first usable choice)
      if (l.ids.count(KernelId(b, r.algo))) {
        chosen = &r;
        break;
      }
    }
  }
  if (chosen) {
    plan->algo = chosen->algo;
    plan->workspace = chosen->workspaceSize;
    plan->found = true;
  }
  std::shared_ptr<const GemmPlan> shared = plan;
  BucketPlans& bp = bucket_plans();
  std::lock_guard<std::mutex> g(bp.mu);
  return bp.by_family[family_of(b)].emplace(b.n, shared).first->second;
}

// source's algorithm for `key` when cuBLASLt confirms that it runs key within the workspace
// bound; else null. (Plans of plan_for live as long as the process: `source` may point at one.)
std::shared_ptr<const GemmPlan> checked_plan(const GemmKey& key, const GemmPlan& source) {
  const cublasLtMatmulAlgo_t& algo = source.algo;
  auto plan = std::make_shared<GemmPlan>();
  MatmulDesc desc;
  describe(key, *plan, desc);
  cublasLtMatmulHeuristicResult_t r{};
  prof::HostScope span(SpanKind::compile, "cuBLASLt check");
  const cublasStatus_t s = cublasLtMatmulAlgoCheck(cublaslt_handle(key.device), desc.h, plan->a.h,
                                                   plan->b.h, plan->d.h, plan->d.h, &algo, &r);
  if (s != CUBLAS_STATUS_SUCCESS || r.state != CUBLAS_STATUS_SUCCESS ||
      r.workspaceSize > kMaxWorkspace)
    return nullptr;
  plan->algo = algo;
  plan->workspace = r.workspaceSize;
  plan->found = true;
  plan->source = &source;
  return plan;
}

// For executables of many shapes (KernelContext::many_shapes): the heuristic's algorithm for
// `k`'s bucket (bucketed), when cuBLASLt confirms that it runs `k` within the workspace bound;
// else `k`'s own. A heuristic query costs about a millisecond on the H200; a check, microseconds;
// the first launch of a kernel the process has not run, up to about 5 ms (its module loads). So
// a bucket not planned yet first borrows the algorithm of a launched neighbouring bucket (within
// a factor of two of its columns), and without one takes a heuristic choice whose kernel has run
// (bucket_plan_preferring_loaded); KILN_GEMM_BORROW=0 turns both off.
std::shared_ptr<const GemmPlan> plan_near(const GemmKey& k) {
  if (k.m <= 0 || k.n <= 0 || k.k <= 0) return plan_for(k);
  const GemmKey b = bucketed(k);
  if (!(b < k) && !(k < b)) return bucket_plan(k);
  return lt::build_once<GemmKey, GemmPlan>(k, [&b](const GemmKey& key) {
    std::shared_ptr<const GemmPlan> near;
    {
      BucketPlans& bp = bucket_plans();
      std::lock_guard<std::mutex> l(bp.mu);
      const auto f = bp.by_family.find(family_of(b));
      if (f != bp.by_family.end() && f->second.count(b.n)) near = f->second.at(b.n);
    }
    if (!near && env::gemm_borrow()) {
      if (const auto borrowed = launched_neighbour(b))
        if (auto plan = checked_plan(key, *borrowed)) return plan;
      near = bucket_plan_preferring_loaded(b);
    }
    if (!near) near = bucket_plan(b);
    if (!near->found) return plan_for(key);
    if (auto plan = checked_plan(key, *near)) return plan;
    return plan_for(key);
  });
}

struct GemmArgs {
  const void* a = nullptr;
  const void* b = nullptr;
  void* d = nullptr;
  const void* bias = nullptr;
};

GemmKey with_alignments(GemmKey k, const GemmArgs& g) {
  k.align_a = alignment_of(g.a);
  k.align_b = alignment_of(g.b);
  k.align_d = alignment_of(g.d);
  k.align_bias = g.bias ? alignment_of(g.bias) : 0;
  return k;
}

// Runs the product when an algorithm exists; false otherwise (nothing was enqueued).
bool try_gemm(KernelContext& ctx, GemmKey key, const GemmArgs& g) {
  key = with_alignments(key, g);
  const auto plan = ctx.many_shapes() ? plan_near(key) : plan_for(key);
  if (!plan->found) return false;
  MatmulDesc desc;
  make_desc(desc, key, g.bias);
  void* ws = plan->workspace ? ctx.scratch(plan->workspace) : nullptr;
  const float one = 1.f, zero = 0.f;
  const double one_d = 1.0, zero_d = 0.0;
  const bool f64 = key.dtype == DType::f64;
  std::optional<prof::HostScope> first;
  const bool new_plan = !plan->launched.exchange(true, std::memory_order_relaxed);
  if (new_plan && plan->source) plan->source->launched.store(true, std::memory_order_relaxed);
  // (a kernel's first launch in the process loads it: up to about 5 ms)
  const bool new_kernel = new_plan && mark_loaded(key, *plan);
  if (new_plan && prof::on())
    first.emplace(SpanKind::compile,
                  new_kernel ? "cuBLASLt first launch of a kernel" : "cuBLASLt first launch");
  KILN_CUBLAS_CHECK(cublasLtMatmul(
      cublaslt_handle(ctx.device()), desc.h, f64 ? static_cast<const void*>(&one_d) : &one, g.a,
      plan->a.h, g.b, plan->b.h, f64 ? static_cast<const void*>(&zero_d) : &zero, g.d, plan->d.h,
      g.d, plan->d.h, &plan->algo, ws, plan->workspace, stream_of(ctx)));
  return true;
}

void require_int_batch(const char* op, int64_t batch) {
  if (batch > INT_MAX)
    fail<UnsupportedError>("[{}] cuBLASLt takes at most {} batches, got {}", op, INT_MAX, batch);
}

// ---- small kernels ----

// Whole matrices of `size` elements: matrix i of dst is matrix bi.offset(i) of src.
template <typename T>
__global__ void gather_matrices(const T* src, T* dst, BroadcastIndex bi, int64_t count,
                                int64_t size) {
  const int64_t n = count * size;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t mat = i / size;
    dst[i] = src[bi.offset(mat) * size + (i - mat * size)];
  }
}

// out (rows, n) += bias (n)
template <typename T>
__global__ void add_bias_rows(T* out, const T* bias, int64_t total, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x)
    out[i] = from_acc<T>(to_acc(out[i]) + to_acc(bias[i % n]));
}

// Integer products wrap like the CPU loops: accumulate modulo 2^64, then truncate to T.
// C[z] (M x N) = A[z] (M x K, row stride a_rs, col stride a_cs) · B[z] (K x N, b_rs, b_cs)
// + bias; a_bi/b_bi map a batch to its matrix, a_mat/b_mat are the matrix sizes.
constexpr int kTile = 16;
template <typename T>
__device__ uint64_t widen(T v) {
  return static_cast<uint64_t>(static_cast<int64_t>(v));
}
template <typename T>
__global__ void int_gemm(const T* A, int64_t a_rs, int64_t a_cs, BroadcastIndex a_bi, int64_t a_mat,
                         const T* B, int64_t b_rs, int64_t b_cs, BroadcastIndex b_bi, int64_t b_mat,
                         const T* bias, T* C, int64_t batch, int64_t M, int64_t N, int64_t K) {
  __shared__ uint64_t as[kTile][kTile + 1];
  __shared__ uint64_t bs[kTile][kTile + 1];
  const int tx = threadIdx.x, ty = threadIdx.y;
  for (int64_t z = blockIdx.z; z < batch; z += gridDim.z) {
    const T* a = A + a_bi.offset(z) * a_mat;
    const T* b = B + b_bi.offset(z) * b_mat;
    for (int64_t m0 = int64_t(blockIdx.y) * kTile; m0 < M; m0 += int64_t(gridDim.y) * kTile)
      for (int64_t n0 = int64_t(blockIdx.x) * kTile; n0 < N; n0 += int64_t(gridDim.x) * kTile) {
        const int64_t m = m0 + ty, n = n0 + tx;
        uint64_t acc = 0;
        for (int64_t k0 = 0; k0 < K; k0 += kTile) {
          const int64_t ka = k0 + tx, kb = k0 + ty;
          as[ty][tx] = (m < M && ka < K) ? widen(a[m * a_rs + ka * a_cs]) : 0;
          bs[ty][tx] = (kb < K && n < N) ? widen(b[kb * b_rs + n * b_cs]) : 0;
          __syncthreads();
#pragma unroll
          for (int j = 0; j < kTile; ++j) acc += as[ty][j] * bs[j][tx];
          __syncthreads();
        }
        if (m < M && n < N) {
          if (bias) acc += widen(bias[n]);
          C[(z * M + m) * N + n] = static_cast<T>(static_cast<int64_t>(acc));
        }
      }
  }
}

template <typename T>
void launch_int_gemm(const char* op, cudaStream_t stream, const T* A, int64_t a_rs, int64_t a_cs,
                     const BroadcastIndex& a_bi, int64_t a_mat, const T* B, int64_t b_rs,
                     int64_t b_cs, const BroadcastIndex& b_bi, int64_t b_mat, const T* bias, T* C,
                     int64_t batch, int64_t M, int64_t N, int64_t K) {
  const auto tiles = [](int64_t n) {
    return static_cast<unsigned>(
        std::min<int64_t>(std::max<int64_t>((n + kTile - 1) / kTile, 1), 65535));
  };
  const dim3 grid(tiles(N), tiles(M), static_cast<unsigned>(std::min<int64_t>(batch, 65535)));
  int_gemm<T><<<grid, dim3(kTile, kTile), 0, stream>>>(A, a_rs, a_cs, a_bi, a_mat, B, b_rs, b_cs,
                                                       b_bi, b_mat, bias, C, batch, M, N, K);
  check_launch(op);
}

bool is_float(DType t) {
  return t == DType::f32 || t == DType::f16 || t == DType::bf16 || t == DType::f64;
}

// ---- matmul ----

// An operand's batch stride: whole when its batch is the output's, 0 when it has one matrix;
// otherwise (mixed broadcasting) -1: the operand is gathered to the full batch first.
int64_t batch_stride(const Shape& in, const Shape& out, int64_t matrix) {
  if (in == out) return matrix;
  if (numel(in) == 1) return 0;
  return -1;
}

void matmul_float(KernelContext& ctx, const MatmulDims& d) {
  const TensorView &a = ctx.in(0), &b = ctx.in(1), &out = ctx.out(0);
  const DType t = a.dtype;
  const int64_t batch = numel(d.batch);
  const size_t esize = size_of(t);
  const void* pa = a.data;
  const void* pb = b.data;
  int64_t sa = batch_stride(d.batch_a, d.batch, d.M * d.K);
  int64_t sb = batch_stride(d.batch_b, d.batch, d.K * d.N);

  // Gathers an operand to the full batch (mixed broadcasting, or stride 0 without an algorithm).
  auto gather = [&](const TensorView& v, const Shape& vb, int64_t size) -> const void* {
    void* dst = ctx.scratch(static_cast<size_t>(batch * size) * esize);
    const BroadcastIndex bi = make_broadcast_index(vb, d.batch, ctx.op_name());
    dispatch_float(t, ctx.op_name(), [&](auto x) {
      using T = decltype(x);
      gather_matrices<T><<<blocks_for(batch * size), kThreads, 0, stream_of(ctx)>>>(
          static_cast<const T*>(v.data), static_cast<T*>(dst), bi, batch, size);
      check_launch(ctx.op_name());
    });
    return dst;
  };
  if (sa < 0) pa = gather(a, d.batch_a, d.M * d.K), sa = d.M * d.K;
  if (sb < 0) pb = gather(b, d.batch_b, d.K * d.N), sb = d.K * d.N;

  GemmKey key;
  key.device = ctx.device();
  key.dtype = t;
  key.tf32 = params_of<LinalgParams>(ctx).tf32;
  key.ldb = d.K;
  if (sb == 0 && sa != 0) {
    // one b for every batch: fold the batch into the rows of a (Cᵀ = Bᵀ · [A_0ᵀ A_1ᵀ ...])
    key.m = d.N, key.n = batch * d.M, key.k = d.K, key.batch = 1;
  } else {
    require_int_batch(ctx.op_name(), batch);
    key.m = d.N, key.n = d.M, key.k = d.K, key.batch = batch;
    key.stride_a = sb, key.stride_b = sa, key.stride_d = d.M * d.N;
  }
  key.lda = d.N, key.ldd = d.N;
  if (try_gemm(ctx, key, {pb, pa, out.data, nullptr})) return;
  // no algorithm for a shared (stride 0) operand: gather it and retry
  if (key.batch > 1 && (sa == 0 || sb == 0)) {
    if (sa == 0) pa = gather(a, d.batch_a, d.M * d.K), key.stride_b = d.M * d.K;
    if (sb == 0) pb = gather(b, d.batch_b, d.K * d.N), key.stride_a = d.K * d.N;
    if (try_gemm(ctx, key, {pb, pa, out.data, nullptr})) return;
  }
  fail<UnsupportedError>("[matmul] cuBLASLt has no algorithm for {} x {} in {}", str(a.shape),
                         str(b.shape), name(t));
}

void matmul(KernelContext& ctx) {
  const TensorView &a = ctx.in(0), &b = ctx.in(1), &out = ctx.out(0);
  if (out.numel() == 0) return;
  const MatmulDims d = matmul_dims(a, b, out);
  if (d.K == 0) {
    KILN_CUDA_CHECK(cudaMemsetAsync(out.data, 0, out.numel() * size_of(out.dtype), stream_of(ctx)));
    return;
  }
  if (is_float(a.dtype)) return matmul_float(ctx, d);
  const BroadcastIndex a_bi = make_broadcast_index(d.batch_a, d.batch, ctx.op_name());
  const BroadcastIndex b_bi = make_broadcast_index(d.batch_b, d.batch, ctx.op_name());
  dispatch(a.dtype, ctx.op_name(), [&](auto x) {
    using T = decltype(x);
    if constexpr (!std::is_same_v<T, bool> && std::is_integral_v<T>)
      launch_int_gemm<T>(ctx.op_name(), stream_of(ctx), a.ptr<T>(), d.K, 1, a_bi, d.M * d.K,
                         b.ptr<T>(), d.N, 1, b_bi, d.K * d.N, nullptr, out.ptr<T>(), numel(d.batch),
                         d.M, d.N, d.K);
  });
}

}  // namespace

// ---- linear: y (rows, N) = x (rows, K) · wᵀ + bias, i.e. yᵀ = w · xᵀ in column-major ----

void linear_float(KernelContext& ctx, const void* x, const void* w, const void* bias, void* out,
                  int64_t rows, int64_t N, int64_t K, DType t, bool tf32) {
  const cudaStream_t stream = stream_of(ctx);
  auto add_bias = [&] {
    if (!bias) return;
    dispatch(t, ctx.op_name(), [&](auto v) {
      using T = decltype(v);
      if constexpr (!std::is_same_v<T, bool>) {
        add_bias_rows<T><<<blocks_for(rows * N), kThreads, 0, stream>>>(
            static_cast<T*>(out), static_cast<const T*>(bias), rows * N, N);
        check_launch(ctx.op_name());
      }
    });
  };
  if (K == 0) {
    KILN_CUDA_CHECK(cudaMemsetAsync(out, 0, static_cast<size_t>(rows * N) * size_of(t), stream));
    return add_bias();
  }
  GemmKey key;
  key.device = ctx.device();
  key.dtype = t;
  key.tf32 = tf32;
  key.trans_a = true;
  key.m = N, key.n = rows, key.k = K;
  key.lda = K, key.ldb = K, key.ldd = N;
  // the bias epilogue where an algorithm takes it (and the bias is aligned for its vector
  // loads); otherwise the bias is added afterwards
  if (bias && alignment_of(bias) >= 16) {
    key.bias = true;
    if (try_gemm(ctx, key, {w, x, out, bias})) return;
    key.bias = false;
  }
  if (try_gemm(ctx, key, {w, x, out, nullptr})) return add_bias();
  fail<UnsupportedError>("[{}] cuBLASLt has no algorithm for {} rows, K {} and N {} in {}",
                         ctx.op_name(), rows, K, N, name(t));
}

namespace {

void linear(KernelContext& ctx) {
  const TensorView &x = ctx.in(0), &w = ctx.in(1), &out = ctx.out(0);
  const LinalgParams p = params_of<LinalgParams>(ctx);
  const void* bias = p.has_bias ? ctx.in(2).data : nullptr;
  const int64_t K = x.shape.back(), N = w.shape[0];
  if (out.numel() == 0) return;
  const int64_t rows = out.numel() / N;
  const DType t = x.dtype;
  if (K > 0 && !is_float(t)) {
    const BroadcastIndex none = make_broadcast_index({}, {}, ctx.op_name());
    dispatch(t, ctx.op_name(), [&](auto v) {
      using T = decltype(v);
      if constexpr (!std::is_same_v<T, bool> && std::is_integral_v<T>)
        launch_int_gemm<T>(ctx.op_name(), stream_of(ctx), x.ptr<T>(), K, 1, none, 0, w.ptr<T>(), 1,
                           K, none, 0, static_cast<const T*>(bias), out.ptr<T>(), 1, rows, N, K);
    });
    return;
  }
  linear_float(ctx, x.data, w.data, bias, out.data, rows, N, K, t, p.tf32);
}

}  // namespace

void register_linalg_kernels() {
  register_kernel(OpId::Matmul, Backend::cuda, {matmul, kNumericTypes, 0, false});
  register_kernel(OpId::Linear, Backend::cuda, {linear, kNumericTypes, 0, false});
}

}  // namespace kiln::cuda
