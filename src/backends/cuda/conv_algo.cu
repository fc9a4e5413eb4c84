// cuDNN's legacy convolution API for the conv family: the descriptors of a problem, its
// algorithm (seeded, measured or from the heuristics) kept in the plan cache, and the passes.
#include <algorithm>
#include <array>
#include <climits>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "backends/cuda/conv_internal.h"
#include "backends/cuda/handles.h"
#include "backends/cuda/library_check.h"

namespace kiln::cuda {

namespace {

using namespace conv_detail;

int checked_int(int64_t v, const char* op) {
  if (v > INT_MAX)
    fail<UnsupportedError>("[{}] cuDNN takes sizes up to {}, got {}", op, INT_MAX, v);
  return static_cast<int>(v);
}

cudnnDataType_t cudnn_type(DType t, const char* op) {
  switch (t) {
    case DType::f32:
      return CUDNN_DATA_FLOAT;
    case DType::f16:
      return CUDNN_DATA_HALF;
    case DType::bf16:
      return CUDNN_DATA_BFLOAT16;
    case DType::f64:
      return CUDNN_DATA_DOUBLE;
    default:
      fail<UnsupportedError>("[{}] cuDNN kernel got dtype {}", op, name(t));
  }
}

// f32 runs on FMA kernels only (CUDNN_DEFAULT_MATH would let Ampere and later GPUs use TF32),
// unless TF32 is allowed.
bool fma_only(DType t, bool tf32) { return t == DType::f32 && !tf32; }

cudnnMathType_t requested_math(DType t, bool tf32) {
  switch (t) {
    case DType::f32:
      return tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
    case DType::f64:
      return CUDNN_DEFAULT_MATH;
    default:
      return CUDNN_TENSOR_OP_MATH;
  }
}

void set_tensor(cudnnTensorDescriptor_t d, cudnnDataType_t t, int64_t n, int64_t c,
                const std::array<int64_t, 3>& sp, int nd, bool nhwc, const char* op) {
  std::array<int64_t, 5> dims{n, c};
  for (int i = 0; i < nd; ++i) dims[2 + i] = sp[3 - nd + i];
  const int rank = nd + 2;
  int idims[5], istrides[5];
  // the memory order of the dims: n, c, spatial... or n, spatial..., c
  std::array<int, 5> order{0, 1, 2, 3, 4};
  if (nhwc) {
    for (int i = 1; i < rank - 1; ++i) order[i] = i + 1;
    order[rank - 1] = 1;
  }
  int64_t stride = 1;
  for (int i = rank - 1; i >= 0; --i) {
    const int dim = order[i];
    idims[dim] = checked_int(dims[dim], op);
    istrides[dim] = checked_int(stride, op);
    stride *= dims[dim];
  }
  checked_int(stride, op);
  KILN_CUDNN_CHECK(cudnnSetTensorNdDescriptor(d, t, rank, idims, istrides));
}

void make_descriptors(Descriptors& d, const Problem& p, DType t, cudnnMathType_t math,
                      const char* op) {
  const cudnnDataType_t dt = cudnn_type(t, op);
  KILN_CUDNN_CHECK(cudnnCreateTensorDescriptor(&d.x));
  KILN_CUDNN_CHECK(cudnnCreateTensorDescriptor(&d.y));
  KILN_CUDNN_CHECK(cudnnCreateFilterDescriptor(&d.w));
  KILN_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&d.conv));
  set_tensor(d.x, dt, p.N, p.C, p.in, p.nd, p.nhwc, op);
  set_tensor(d.y, dt, p.N, p.O, p.out, p.nd, p.nhwc, op);
  int wdims[5] = {checked_int(p.O, op), checked_int(p.C / p.G, op)};
  int pad[3], stride[3], dil[3];
  for (int i = 0; i < p.nd; ++i) {
    const int j = 3 - p.nd + i;
    wdims[2 + i] = checked_int(p.k[j], op);
    pad[i] = checked_int(p.pad[j], op);
    stride[i] = checked_int(p.stride[j], op);
    dil[i] = checked_int(p.dil[j], op);
  }
  checked_int(p.O * (p.C / p.G) * p.k_size(), op);
  KILN_CUDNN_CHECK(cudnnSetFilterNdDescriptor(
      d.w, dt, p.nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW, p.nd + 2, wdims));
  KILN_CUDNN_CHECK(
      cudnnSetConvolutionNdDescriptor(d.conv, p.nd, pad, stride, dil, CUDNN_CROSS_CORRELATION,
                                      t == DType::f64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT));
  KILN_CUDNN_CHECK(cudnnSetConvolutionGroupCount(d.conv, checked_int(p.G, op)));
  KILN_CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv, math));
}

}  // namespace

namespace conv_detail {

// FFT and Winograd algorithms round differently from a direct sum.
bool exact(Pass pass, int algo) {
  switch (pass) {
    case Pass::forward:
      return algo != CUDNN_CONVOLUTION_FWD_ALGO_FFT &&
             algo != CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING &&
             algo != CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD &&
             algo != CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED;
    case Pass::backward_data:
      return algo != CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT &&
             algo != CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING &&
             algo != CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD &&
             algo != CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED;
    case Pass::backward_filter:
      return algo != CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT &&
             algo != CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING &&
             algo != CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED;
  }
  return false;
}

}  // namespace conv_detail

namespace {

// The heuristics' first usable result, preferring deterministic ones (only those when
// `only_deterministic`); `workspace` asks cuDNN for an algorithm's workspace (nullopt: not
// supported here).
template <typename Perf, typename Workspace>
std::optional<Algo> pick(Pass pass, DType t, bool tf32, bool only_deterministic, const Perf* perf,
                         int count, Workspace&& workspace) {
  const bool precise = t == DType::f32 || t == DType::f64;
  for (const bool need_determinism : {true, false}) {
    if (!need_determinism && only_deterministic) break;
    for (int i = 0; i < count; ++i) {
      const Perf& r = perf[i];
      if (r.status != CUDNN_STATUS_SUCCESS) continue;
      if (precise && !exact(pass, static_cast<int>(r.algo))) continue;
      if (fma_only(t, tf32) && r.mathType != CUDNN_FMA_MATH && r.mathType != CUDNN_DEFAULT_MATH)
        continue;
      if (need_determinism && r.determinism != CUDNN_DETERMINISTIC) continue;
      // f32 keeps FMA math whatever the heuristic reports
      const cudnnMathType_t math = fma_only(t, tf32) ? CUDNN_FMA_MATH : r.mathType;
      const std::optional<size_t> ws = workspace(r.algo, math);
      if (!ws || *ws > kMaxWorkspace) continue;
      return Algo{static_cast<int>(r.algo), *ws, math};
    }
  }
  return std::nullopt;
}

// The bytes a workspace query wrote, when it succeeded.
template <typename Query>
std::optional<size_t> workspace_of(const Descriptors& d, cudnnMathType_t math, Query&& query) {
  size_t bytes = 0;
  KILN_CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv, math));
  if (query(&bytes) != CUDNN_STATUS_SUCCESS) return std::nullopt;
  return bytes;
}

std::optional<Algo> find_algo(cudnnHandle_t h, Pass pass, DType t, bool tf32,
                              bool only_deterministic, const Descriptors& d) {
  constexpr int kMax = 16;
  int count = 0;
  switch (pass) {
    case Pass::forward: {
      cudnnConvolutionFwdAlgoPerf_t perf[kMax];
      KILN_CUDNN_CHECK(
          cudnnGetConvolutionForwardAlgorithm_v7(h, d.x, d.w, d.conv, d.y, kMax, &count, perf));
      return pick(pass, t, tf32, only_deterministic, perf, count,
                  [&](cudnnConvolutionFwdAlgo_t a, cudnnMathType_t m) {
                    return workspace_of(d, m, [&](size_t* b) {
                      return cudnnGetConvolutionForwardWorkspaceSize(h, d.x, d.w, d.conv, d.y, a,
                                                                     b);
                    });
                  });
    }
    case Pass::backward_data: {
      cudnnConvolutionBwdDataAlgoPerf_t perf[kMax];
      KILN_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, d.w, d.y, d.conv, d.x, kMax,
                                                                   &count, perf));
      return pick(pass, t, tf32, only_deterministic, perf, count,
                  [&](cudnnConvolutionBwdDataAlgo_t a, cudnnMathType_t m) {
                    return workspace_of(d, m, [&](size_t* b) {
                      return cudnnGetConvolutionBackwardDataWorkspaceSize(h, d.w, d.y, d.conv, d.x,
                                                                          a, b);
                    });
                  });
    }
    case Pass::backward_filter: {
      cudnnConvolutionBwdFilterAlgoPerf_t perf[kMax];
      KILN_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, d.x, d.y, d.conv, d.w, kMax,
                                                                     &count, perf));
      return pick(pass, t, tf32, only_deterministic, perf, count,
                  [&](cudnnConvolutionBwdFilterAlgo_t a, cudnnMathType_t m) {
                    return workspace_of(d, m, [&](size_t* b) {
                      return cudnnGetConvolutionBackwardFilterWorkspaceSize(h, d.x, d.y, d.conv,
                                                                            d.w, a, b);
                    });
                  });
    }
  }
  return std::nullopt;
}

// Measured choice: cuDNN runs the candidate algorithms on the step's own buffers (writing its
// output, which the step then computes again) and reports them fastest first. The fastest usable
// one wins; a deterministic one is preferred when it is at most 15% slower.
template <typename Perf> std::optional<Algo> pick_measured(Pass pass, DType t, bool tf32,
                                                           const Perf* perf, int count,
                                                           size_t workspace_limit) {
  // measured choice: f32 may take Winograd and FFT when they are fastest (their error stays within
  // f32 tolerance, and PyTorch takes them too); f64 keeps the exact algorithms
  const bool precise = t == DType::f64;
  std::optional<Algo> fastest, deterministic;
  float fastest_ms = 0;
  for (int i = 0; i < count; ++i) {
    const Perf& r = perf[i];
    if (r.status != CUDNN_STATUS_SUCCESS || r.memory > workspace_limit) continue;
    if (precise && !exact(pass, static_cast<int>(r.algo))) continue;
    // measured under the FMA descriptor; some report the default math type for the same kernels
    if (fma_only(t, tf32) && r.mathType != CUDNN_FMA_MATH && r.mathType != CUDNN_DEFAULT_MATH)
      continue;
    const Algo a{static_cast<int>(r.algo), r.memory,
                 fma_only(t, tf32) ? CUDNN_FMA_MATH : r.mathType};
    if (!fastest) {
      fastest = a;
      fastest_ms = r.time;
    }
    if (r.determinism == CUDNN_DETERMINISTIC) {
      if (r.time <= 1.15f * fastest_ms) deterministic = a;
      break;
    }
  }
  return deterministic ? deterministic : fastest;
}

// Buffers of a step for a measured choice.
struct FindBuffers {
  const void* x;
  const void* w;
  const void* y;
  void* out;
  void* workspace;
  size_t workspace_bytes;
};

std::optional<Algo> measure_algo(cudnnHandle_t h, Pass pass, DType t, bool tf32,
                                 const Descriptors& d, const FindBuffers& b) {
  constexpr int kMax = 16;
  int count = 0;
  switch (pass) {
    case Pass::forward: {
      cudnnConvolutionFwdAlgoPerf_t perf[kMax];
      KILN_CUDNN_CHECK(cudnnFindConvolutionForwardAlgorithmEx(h, d.x, b.x, d.w, b.w, d.conv, d.y,
                                                              b.out, kMax, &count, perf,
                                                              b.workspace, b.workspace_bytes));
      return pick_measured(pass, t, tf32, perf, count, b.workspace_bytes);
    }
    case Pass::backward_data: {
      cudnnConvolutionBwdDataAlgoPerf_t perf[kMax];
      KILN_CUDNN_CHECK(cudnnFindConvolutionBackwardDataAlgorithmEx(h, d.w, b.w, d.y, b.y, d.conv,
                                                                   d.x, b.out, kMax, &count, perf,
                                                                   b.workspace, b.workspace_bytes));
      return pick_measured(pass, t, tf32, perf, count, b.workspace_bytes);
    }
    case Pass::backward_filter: {
      cudnnConvolutionBwdFilterAlgoPerf_t perf[kMax];
      KILN_CUDNN_CHECK(cudnnFindConvolutionBackwardFilterAlgorithmEx(
          h, d.x, b.x, d.y, b.y, d.conv, d.w, b.out, kMax, &count, perf, b.workspace,
          b.workspace_bytes));
      return pick_measured(pass, t, tf32, perf, count, b.workspace_bytes);
    }
  }
  return std::nullopt;
}

}  // namespace

namespace conv_detail {

std::vector<int64_t> problem_key(Pass pass, int device, DType t, const Problem& p) {
  // (NHWC problems count 8 more dims: the key, and packages' tuning records, keep their size)
  // (TF32 problems add kTf32Key to the dtype: the key keeps its size)
  const int64_t dtype = static_cast<int64_t>(t) + (p.tf32 && t == DType::f32 ? kTf32Key : 0) +
                        (p.deterministic ? kDeterministicKey : 0);
  std::vector<int64_t> key{
      static_cast<int64_t>(pass), device, dtype, p.nd + (p.nhwc ? 8 : 0), p.N, p.C, p.O, p.G};
  for (const auto* a : {&p.in, &p.k, &p.out, &p.pad, &p.stride, &p.dil})
    key.insert(key.end(), a->begin(), a->end());
  return key;
}

PlanCache& plan_cache() {
  static PlanCache c;
  return c;
}

}  // namespace conv_detail

namespace {

// The workspace `algo` needs with `math` on problem `d` (nullopt: cuDNN refuses it).
std::optional<size_t> workspace_for(cudnnHandle_t h, Pass pass, const Descriptors& d, int algo,
                                    cudnnMathType_t math) {
  return workspace_of(d, math, [&](size_t* b) {
    switch (pass) {
      case Pass::forward:
        return cudnnGetConvolutionForwardWorkspaceSize(
            h, d.x, d.w, d.conv, d.y, static_cast<cudnnConvolutionFwdAlgo_t>(algo), b);
      case Pass::backward_data:
        return cudnnGetConvolutionBackwardDataWorkspaceSize(
            h, d.w, d.y, d.conv, d.x, static_cast<cudnnConvolutionBwdDataAlgo_t>(algo), b);
      case Pass::backward_filter:
        return cudnnGetConvolutionBackwardFilterWorkspaceSize(
            h, d.x, d.y, d.conv, d.w, static_cast<cudnnConvolutionBwdFilterAlgo_t>(algo), b);
    }
    return CUDNN_STATUS_BAD_PARAM;
  });
}

// The algorithm of a problem, chosen on its first run: a seed from a package when cuDNN takes it,
// else measured on the step's buffers when `find` is given (this waits for the stream once per
// problem), else by cuDNN's heuristics. Deterministic problems: the heuristics' first
// deterministic algorithm, always.
const ConvPlan& plan_for(cudnnHandle_t h, Pass pass, int device, DType t, const Problem& p,
                         const FindBuffers* find, KernelContext& ctx) {
  PlanCache& cache = plan_cache();
  const auto key = problem_key(pass, device, t, p);
  std::optional<Algo> seed;
  {
    std::lock_guard<std::mutex> l(cache.mu);
    auto it = cache.plans.find(key);
    if (it != cache.plans.end()) return *it->second;
    if (auto s = cache.seeds.find(key); s != cache.seeds.end()) seed = s->second;
  }
  if (p.deterministic) find = nullptr;  // (and no seed: their keys never match one)
  auto plan = std::make_unique<ConvPlan>();
  const Descriptors& d = plan->d;
  make_descriptors(plan->d, p, t, requested_math(t, p.tf32), ctx.op_name());
  std::optional<Algo> a;
  enum { heuristic, seeded, measured } how = heuristic;
  if (seed) {
    // the workspace is asked of cuDNN again: the file says only which algorithm
    if (auto ws = workspace_for(h, pass, d, seed->algo, seed->math); ws && *ws <= kMaxWorkspace) {
      a = Algo{seed->algo, *ws, seed->math};
      how = seeded;
    }
    KILN_CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv, requested_math(t, p.tf32)));
  }
  if (!a && find) {
    FindBuffers b = *find;
    b.workspace = ctx.scratch(b.workspace_bytes);  // only on the first run of a problem
    a = measure_algo(h, pass, t, p.tf32, d, b);
    how = measured;
    // the candidates ran with other math types: the step's own setting again
    KILN_CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv, requested_math(t, p.tf32)));
  }
  if (!a) a = find_algo(h, pass, t, p.tf32, p.deterministic, d);
  if (a) KILN_CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv, a->math));
  plan->algo = a;
  std::lock_guard<std::mutex> l(cache.mu);
  ++(how == seeded     ? cache.stats.seeded
     : how == measured ? cache.stats.measured
                       : cache.stats.heuristic);
  return *cache.plans.emplace(key, std::move(plan)).first->second;  // the first one made wins
}

}  // namespace

namespace conv_detail {

// Samples per cuDNN call: the batch is split where a tensor passes cuDNN's int sizes.
int64_t batch_chunk(const Problem& full, const char* op) {
  const int64_t per_sample = std::max(full.C * full.in_size(), full.O * full.out_size());
  const int64_t chunk = std::min<int64_t>(full.N, INT_MAX / std::max<int64_t>(per_sample, 1));
  if (chunk < 1)
    fail<UnsupportedError>("[{}] cuDNN takes at most {} elements per sample, got {}", op, INT_MAX,
                           per_sample);
  return chunk;
}

// Runs one pass on dense buffers: forward y = conv(x, w); backward_data x = convᵀ(y, w);
// backward_filter w = dW(x, y). The batch is split where a tensor passes cuDNN's int sizes
// (weight gradients of later chunks accumulate).
void run_pass(KernelContext& ctx, Pass pass, const Problem& full, DType t, const void* x,
              const void* w, const void* y, void* out) {
  const char* op = ctx.op_name();
  const int64_t chunk = batch_chunk(full, op);
  const size_t es = size_of(t);
  const cudnnHandle_t h = cudnn_handle(ctx.device(), stream_of(ctx));
  const float one = 1.f, zero = 0.f;
  const double one_d = 1.0, zero_d = 0.0;
  const bool f64 = t == DType::f64;
  const void* alpha = f64 ? static_cast<const void*>(&one_d) : &one;
  for (int64_t n0 = 0; n0 < full.N; n0 += chunk) {
    Problem p = full;
    p.N = std::min(chunk, full.N - n0);
    p.deterministic = ctx.deterministic();
    const void* beta = (pass == Pass::backward_filter && n0 > 0)
                           ? alpha
                           : (f64 ? static_cast<const void*>(&zero_d) : &zero);
    const size_t x_off = n0 * full.C * full.in_size() * es;
    const size_t y_off = n0 * full.O * full.out_size() * es;
    // the first chunk may be measured: later ones accumulate into the weight gradient
    std::optional<FindBuffers> find;
    if (n0 == 0) {
      const size_t bytes = size_t{256} << 20;
      find = FindBuffers{static_cast<const char*>(x) + x_off,
                         w,
                         static_cast<const char*>(y) + y_off,
                         pass == Pass::forward         ? static_cast<char*>(out) + y_off
                         : pass == Pass::backward_data ? static_cast<char*>(out) + x_off
                                                       : out,
                         nullptr,
                         bytes};
    }
    const ConvPlan& plan = plan_for(h, pass, ctx.device(), t, p, find ? &*find : nullptr, ctx);
    const Descriptors& d = plan.d;
    const std::optional<Algo>& a = plan.algo;
    if (!a)
      fail<UnsupportedError>(
          "[{}] cuDNN has no {}algorithm for input {}x{}x({}), weight {}x{}x({}), groups {} in {}",
          op, p.deterministic ? "deterministic " : "", p.N, p.C, fmt::join(p.in, ", "), p.O,
          p.C / p.G, fmt::join(p.k, ", "), p.G, name(t));
    void* ws = a->workspace ? ctx.scratch(a->workspace) : nullptr;
    switch (pass) {
      case Pass::forward:
        KILN_CUDNN_CHECK(
            cudnnConvolutionForward(h, alpha, d.x, static_cast<const char*>(x) + x_off, d.w, w,
                                    d.conv, static_cast<cudnnConvolutionFwdAlgo_t>(a->algo), ws,
                                    a->workspace, beta, d.y, static_cast<char*>(out) + y_off));
        break;
      case Pass::backward_data:
        KILN_CUDNN_CHECK(cudnnConvolutionBackwardData(
            h, alpha, d.w, w, d.y, static_cast<const char*>(y) + y_off, d.conv,
            static_cast<cudnnConvolutionBwdDataAlgo_t>(a->algo), ws, a->workspace, beta, d.x,
            static_cast<char*>(out) + x_off));
        break;
      case Pass::backward_filter:
        KILN_CUDNN_CHECK(
            cudnnConvolutionBackwardFilter(h, alpha, d.x, static_cast<const char*>(x) + x_off, d.y,
                                           static_cast<const char*>(y) + y_off, d.conv,
                                           static_cast<cudnnConvolutionBwdFilterAlgo_t>(a->algo),
                                           ws, a->workspace, beta, d.w, out));
        break;
    }
  }
}

}  // namespace conv_detail

}  // namespace kiln::cuda
