// CUDA kernels of the conv family through cuDNN's convolution API: Conv is
// cudnnConvolutionForward, ConvTranspose is the backward-data pass of the conv it transposes, and
// ConvGradWeight is the backward-filter pass. 1-D convolutions run as 2-D ones of height 1.
// With channels_last (2-D), all three take NHWC data and (O, kh, kw, C/G) weights (cuDNN's NHWC
// filter format), the layout of its bf16/f16/TF32 tensor-core kernels.
// cuDNN pads symmetrically and wants the output size that follows from the input size; other
// geometries (asymmetric pads, output_padding) go through a zero-padded or cropped copy made by
// window_copy. f32 and f64 use exactly summing algorithms only (no TF32, FFT or Winograd), so
// results match the CPU, except f32 problems with attr tf32 (CompileOptions::allow_tf32), whose
// math type lets cuDNN use TF32 tensor cores; f16/bf16 compute in f32 and may use any algorithm.
// Deterministic executables (KernelContext::deterministic) take cuDNN's heuristics' first
// deterministic algorithm (no timing, no package seeds, no graph-API plans), or throw.
#include <algorithm>
#include <array>
#include <climits>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <type_traits>
#include <vector>

#include "backends/cuda/conv_graph.h"
#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/handles.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/library_check.h"
#include "backends/cuda/tuning.h"
#include "runtime/log.h"

namespace kiln::cuda {

namespace {

constexpr size_t kMaxWorkspace = size_t{1} << 30;
// Added to an f32 problem's dtype in its key (and packages' tuning records) when TF32 is allowed.
constexpr int64_t kTf32Key = 256;
// Added to a problem's dtype in its key when the executable is deterministic: those plans are
// never timed, seeded or exported.
constexpr int64_t kDeterministicKey = 512;

// ---- small kernels ----

struct Dims3 {
  int64_t v[3] = {1, 1, 1};
};

// dst (rows, ds) = src (rows, ss) moved by `shift` per spatial dim (dst[p] = src[p - shift],
// zero outside src), plus bias[row % channels] when bias is given.
template <typename T>
__global__ void window_copy(const T* src, T* dst, int64_t total, Dims3 ss, Dims3 ds, Dims3 shift,
                            const T* bias, int64_t channels) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    int64_t r = i;
    const int64_t p2 = r % ds.v[2];
    r /= ds.v[2];
    const int64_t p1 = r % ds.v[1];
    r /= ds.v[1];
    const int64_t p0 = r % ds.v[0];
    const int64_t row = r / ds.v[0];
    const int64_t s0 = p0 - shift.v[0], s1 = p1 - shift.v[1], s2 = p2 - shift.v[2];
    acc_t<T> v = 0;
    if (s0 >= 0 && s0 < ss.v[0] && s1 >= 0 && s1 < ss.v[1] && s2 >= 0 && s2 < ss.v[2])
      v = to_acc(src[((row * ss.v[0] + s0) * ss.v[1] + s1) * ss.v[2] + s2]);
    if (bias) v += to_acc(bias[row % channels]);
    dst[i] = from_acc<T>(v);
  }
}

// y (N, O, S): y = bias[o] (+ y when accumulate); bias may be null (then y = 0 unless accumulate).
// V elements of one channel per thread (16-byte accesses when S allows), and 32-bit index math
// when the sizes fit (I): a bandwidth-bound pass.
template <typename T, int V> struct alignas(sizeof(T) * V) Pack {
  T v[V];
};
template <typename T, int V, typename I>
__global__ void channel_bias(T* y, const T* bias, I packs, I S_packs, I O, bool accumulate) {
  for (I i = blockIdx.x * I(blockDim.x) + threadIdx.x; i < packs; i += I(gridDim.x) * blockDim.x) {
    const acc_t<T> b = bias ? to_acc(bias[(i / S_packs) % O]) : acc_t<T>(0);
    auto* p = reinterpret_cast<Pack<T, V>*>(y) + i;
    Pack<T, V> out;
    if (accumulate) out = *p;
#pragma unroll
    for (int u = 0; u < V; ++u)
      out.v[u] = from_acc<T>(accumulate ? b + to_acc(out.v[u]) : b);
    *p = out;
  }
}

void launch_channel_bias(KernelContext& ctx, const TensorView& y, const void* bias,
                         bool accumulate) {
  const int64_t total = y.numel(), O = y.shape[1];
  if (total == 0) return;
  const int64_t S = total / (y.shape[0] * O);
  dispatch_float(y.dtype, ctx.op_name(), [&](auto v) {
    using T = decltype(v);
    constexpr int kV = 16 / sizeof(T) > 0 ? static_cast<int>(16 / sizeof(T)) : 1;
    const bool wide = S % kV == 0 && reinterpret_cast<uintptr_t>(y.data) % 16 == 0;
    auto run = [&](auto width, auto index) {
      constexpr int W = decltype(width)::value;
      using I = decltype(index);
      const int64_t packs = total / W;
      channel_bias<T, W, I><<<blocks_for(packs), kThreads, 0, stream_of(ctx)>>>(
          y.ptr<T>(), static_cast<const T*>(bias), static_cast<I>(packs), static_cast<I>(S / W),
          static_cast<I>(O), accumulate);
    };
    const bool small = total < (int64_t{1} << 31);
    using W1 = std::integral_constant<int, 1>;
    using WV = std::integral_constant<int, kV>;
    if (wide && small) run(WV{}, int32_t{});
    else if (wide) run(WV{}, int64_t{});
    else if (small) run(W1{}, int32_t{});
    else run(W1{}, int64_t{});
    check_launch(ctx.op_name());
  });
}

// An NHWC conv's epilogue in one pass: y (rows, O) = relu?(y + bias[o] + residual), bias and
// residual optional; V elements a thread (16-byte accesses when O allows), 32-bit indices.
template <typename T, int V>
__global__ void conv_epilogue_nhwc(T* y, const T* bias, const T* res, uint32_t packs, uint32_t O,
                                   bool relu) {
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < packs; i += gridDim.x * blockDim.x) {
    auto* p = reinterpret_cast<Pack<T, V>*>(y) + i;
    Pack<T, V> v = *p, r;
    if (res) r = reinterpret_cast<const Pack<T, V>*>(res)[i];
    const uint32_t o0 = (i * V) % O;
#pragma unroll
    for (int u = 0; u < V; ++u) {
      acc_t<T> a = to_acc(v.v[u]);
      if (bias) a += to_acc(bias[o0 + u]);
      if (res) a += to_acc(r.v[u]);
      if (relu && a < acc_t<T>(0)) a = acc_t<T>(0);
      v.v[u] = from_acc<T>(a);
    }
    *p = v;
  }
}

// ---- the cuDNN problem ----

enum class Pass { forward, backward_data, backward_filter };

// The convolution as cuDNN sees it: x (N, C, in), w (O, C/G, k), y (N, O, out), symmetric pads.
// 1-D problems get a leading spatial dim of 1, so nd is 2 or 3.
struct Problem {
  int nd = 2;
  bool nhwc = false;  // channels_last data (N, H, W, C) and weights (O, kh, kw, C/G); nd 2
  bool tf32 = false;  // f32 may run on TF32 tensor cores (attr tf32: CompileOptions::allow_tf32)
  bool deterministic = false;  // CompileOptions::deterministic: a deterministic algorithm only
  int64_t N = 0, C = 0, O = 0, G = 1;
  std::array<int64_t, 3> in{1, 1, 1}, k{1, 1, 1}, out{1, 1, 1}, pad{}, stride{1, 1, 1},
      dil{1, 1, 1};
  int64_t in_size() const { return in[0] * in[1] * in[2]; }
  int64_t out_size() const { return out[0] * out[1] * out[2]; }
  int64_t k_size() const { return k[0] * k[1] * k[2]; }
};

// kiln's spatial values (nd of them) right-aligned in three, others left at `fill`.
std::array<int64_t, 3> place(const int64_t* v, int nd, int64_t fill) {
  std::array<int64_t, 3> r{fill, fill, fill};
  for (int i = 0; i < nd; ++i) r[3 - nd + i] = v[i];
  return r;
}

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

struct Descriptors {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  Descriptors() = default;
  Descriptors(const Descriptors&) = delete;
  Descriptors& operator=(const Descriptors&) = delete;
  ~Descriptors() {
    if (x) cudnnDestroyTensorDescriptor(x);
    if (y) cudnnDestroyTensorDescriptor(y);
    if (w) cudnnDestroyFilterDescriptor(w);
    if (conv) cudnnDestroyConvolutionDescriptor(conv);
  }
};

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

// ---- algorithm choice, once per problem ----

struct Algo {
  int algo = 0;
  size_t workspace = 0;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
};

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
      return pick(pass, t, tf32, only_deterministic, perf, count, [&](cudnnConvolutionFwdAlgo_t a, cudnnMathType_t m) {
        return workspace_of(d, m, [&](size_t* b) {
          return cudnnGetConvolutionForwardWorkspaceSize(h, d.x, d.w, d.conv, d.y, a, b);
        });
      });
    }
    case Pass::backward_data: {
      cudnnConvolutionBwdDataAlgoPerf_t perf[kMax];
      KILN_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, d.w, d.y, d.conv, d.x, kMax,
                                                                   &count, perf));
      return pick(pass, t, tf32, only_deterministic, perf, count, [&](cudnnConvolutionBwdDataAlgo_t a, cudnnMathType_t m) {
        return workspace_of(d, m, [&](size_t* b) {
          return cudnnGetConvolutionBackwardDataWorkspaceSize(h, d.w, d.y, d.conv, d.x, a, b);
        });
      });
    }
    case Pass::backward_filter: {
      cudnnConvolutionBwdFilterAlgoPerf_t perf[kMax];
      KILN_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, d.x, d.y, d.conv, d.w, kMax,
                                                                     &count, perf));
      return pick(pass, t, tf32, only_deterministic, perf, count, [&](cudnnConvolutionBwdFilterAlgo_t a, cudnnMathType_t m) {
        return workspace_of(d, m, [&](size_t* b) {
          return cudnnGetConvolutionBackwardFilterWorkspaceSize(h, d.x, d.y, d.conv, d.w, a, b);
        });
      });
    }
  }
  return std::nullopt;
}

// Measured choice: cuDNN runs the candidate algorithms on the step's own buffers (writing its
// output, which the step then computes again) and reports them fastest first. The fastest usable
// one wins; a deterministic one is preferred when it is at most 15% slower.
template <typename Perf>
std::optional<Algo> pick_measured(Pass pass, DType t, bool tf32, const Perf* perf, int count,
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
      KILN_CUDNN_CHECK(cudnnFindConvolutionBackwardDataAlgorithmEx(
          h, d.w, b.w, d.y, b.y, d.conv, d.x, b.out, kMax, &count, perf, b.workspace,
          b.workspace_bytes));
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

std::vector<int64_t> problem_key(Pass pass, int device, DType t, const Problem& p) {
  // (NHWC problems count 8 more dims: the key, and packages' tuning records, keep their size)
  // (TF32 problems add kTf32Key to the dtype: the key keeps its size)
  const int64_t dtype = static_cast<int64_t>(t) + (p.tf32 && t == DType::f32 ? kTf32Key : 0) +
                        (p.deterministic ? kDeterministicKey : 0);
  std::vector<int64_t> key{static_cast<int64_t>(pass), device, dtype,
                           p.nd + (p.nhwc ? 8 : 0), p.N, p.C, p.O, p.G};
  for (const auto* a : {&p.in, &p.k, &p.out, &p.pad, &p.stride, &p.dil})
    key.insert(key.end(), a->begin(), a->end());
  return key;
}

// A problem's descriptors (with the chosen math type) and algorithm, made on its first run and
// then only read, so runs pay no descriptor set-up.
struct ConvPlan {
  Descriptors d;
  std::optional<Algo> algo;
};

// Every problem's plan in the process, keyed by problem_key, and the choices seeded from packages
// for problems not run yet.
// How an f16/bf16 channels_last forward problem runs: a plan of cuDNN's graph API, or (null) the
// legacy algorithm of its ConvPlan.
struct NhwcChoice {
  std::unique_ptr<GraphConvPlan> plan;
};

struct PlanCache {
  std::mutex mu;
  std::map<std::vector<int64_t>, std::unique_ptr<ConvPlan>> plans;
  std::map<std::vector<int64_t>, Algo> seeds;
  std::map<std::vector<int64_t>, std::unique_ptr<NhwcChoice>> nhwc;  // problem_key + epilogue
  std::map<std::vector<int64_t>, std::vector<int64_t>> nhwc_seeds;    // record values, same keys
  TuningStats stats;
};
PlanCache& plan_cache() {
  static PlanCache c;
  return c;
}

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
  ++(how == seeded ? cache.stats.seeded
    : how == measured ? cache.stats.measured
                      : cache.stats.heuristic);
  return *cache.plans.emplace(key, std::move(plan)).first->second;  // the first one made wins
}

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
      find = FindBuffers{static_cast<const char*>(x) + x_off, w,
                         static_cast<const char*>(y) + y_off,
                         pass == Pass::forward         ? static_cast<char*>(out) + y_off
                         : pass == Pass::backward_data ? static_cast<char*>(out) + x_off
                                                       : out,
                         nullptr, bytes};
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

// ---- geometry ----

// kiln's attributes and the sizes of the conv's input x, weight w and output y (for
// conv_transpose: of the conv it transposes, whose input is conv_transpose's output).
struct Geometry {
  int nd = 0;
  int64_t N = 0, C = 0, O = 0, G = 1;
  std::vector<int64_t> in, k, out, stride, dil, pb, pe;
};

Geometry geometry(const Attrs& attrs, const Shape& x, const Shape& w, const Shape& y) {
  Geometry g;
  g.nd = static_cast<int>(x.size()) - 2;
  g.N = x[0];
  g.C = x[1];
  g.O = y[1];
  g.G = attrs.i("groups");
  g.in.assign(x.begin() + 2, x.end());
  g.k.assign(w.begin() + 2, w.end());
  g.out.assign(y.begin() + 2, y.end());
  g.stride = attrs.ints("stride");
  g.dil = attrs.ints("dilation");
  const auto& p = attrs.ints("pads");
  g.pb.assign(p.begin(), p.begin() + g.nd);
  g.pe.assign(p.begin() + g.nd, p.end());
  return g;
}

int64_t extent(const Geometry& g, int i) { return (g.k[i] - 1) * g.dil[i] + 1; }

// Whether cuDNN, padding `pad` on both sides of `in`, gives `out` positions along dim i.
bool cudnn_fits(const Geometry& g, int i, int64_t in, int64_t pad, int64_t out) {
  const int64_t span = in + 2 * pad - extent(g, i);
  return span >= 0 && span / g.stride[i] + 1 == out;
}

// The cuDNN problem with input sizes `in` and symmetric pads `pad` (kiln order, nd values).
Problem problem(const Geometry& g, const std::vector<int64_t>& in,
                const std::vector<int64_t>& pad) {
  Problem p;
  p.nd = std::max(2, g.nd);
  p.N = g.N, p.C = g.C, p.O = g.O, p.G = g.G;
  p.in = place(in.data(), g.nd, 1);
  p.k = place(g.k.data(), g.nd, 1);
  p.out = place(g.out.data(), g.nd, 1);
  p.pad = place(pad.data(), g.nd, 0);
  p.stride = place(g.stride.data(), g.nd, 1);
  p.dil = place(g.dil.data(), g.nd, 1);
  return p;
}

Dims3 dims3(const std::vector<int64_t>& v, int64_t fill) {
  Dims3 d;
  const int nd = static_cast<int>(v.size());
  for (int i = 0; i < 3; ++i) d.v[i] = fill;
  for (int i = 0; i < nd; ++i) d.v[3 - nd + i] = v[i];
  return d;
}

// dst (rows, ds) from src (rows, ss) moved by shift, plus a per-channel bias (see window_copy).
void launch_window_copy(KernelContext& ctx, DType t, const void* src, void* dst, int64_t rows,
                        const std::vector<int64_t>& ss, const std::vector<int64_t>& ds,
                        const std::vector<int64_t>& shift, const void* bias, int64_t channels) {
  const Dims3 s3 = dims3(ss, 1), d3 = dims3(ds, 1), sh3 = dims3(shift, 0);
  const int64_t total = rows * d3.v[0] * d3.v[1] * d3.v[2];
  if (total == 0) return;
  dispatch_float(t, ctx.op_name(), [&](auto v) {
    using T = decltype(v);
    window_copy<T><<<blocks_for(total), kThreads, 0, stream_of(ctx)>>>(
        static_cast<const T*>(src), static_cast<T*>(dst), total, s3, d3, sh3,
        static_cast<const T*>(bias), channels);
    check_launch(ctx.op_name());
  });
}

int64_t prod(const std::vector<int64_t>& v) {
  int64_t r = 1;
  for (int64_t e : v) r *= e;
  return r;
}

const void* bias_of(const KernelContext& ctx) {
  return ctx.attrs().b("has_bias") ? ctx.in(2).data : nullptr;
}

// What a conv-family op runs: one cuDNN pass on problem p, either on the step's own buffers
// (direct) or through a copy of sizes `window` moved by `shift` (launch_window_copy): for conv
// the zero-padded input, for conv_transpose the uncropped output, for conv_grad_weight the input
// window the outputs read.
struct ConvCall {
  Pass pass = Pass::forward;
  Geometry g;
  bool direct = true;
  Problem p;
  std::vector<int64_t> window, shift;
};

// in0, in1, out0: the op's first two inputs and its output (x, w, y; for conv_grad_weight x, dy,
// dw). Shared by the kernels and by export_conv_tuning, so both name the same problems.
ConvCall conv_call(OpId op, const Attrs& attrs, const Shape& in0, const Shape& in1,
                   const Shape& out0) {
  ConvCall c;
  Geometry& g = c.g;
  switch (op) {
    case OpId::ConvTranspose:  // as the transposed conv: input y (N, O, ...), output x (N, C, ...)
      c.pass = Pass::backward_data;
      g = geometry(attrs, out0, in1, in0);
      break;
    case OpId::ConvGradWeight:
      c.pass = Pass::backward_filter;
      g = geometry(attrs, in0, out0, in1);
      break;
    default:
      c.pass = Pass::forward;
      g = geometry(attrs, in0, in1, out0);
  }
  for (int i = 0; i < g.nd; ++i)
    c.direct = c.direct && cudnn_fits(g, i, g.in[i], g.pb[i], g.out[i]);
  const bool tf32 = attrs.b("tf32", false);
  if (c.direct) {
    c.p = problem(g, g.in, g.pb);
    c.p.tf32 = tf32;
    return c;
  }
  std::vector<int64_t> pad(g.nd, 0);
  c.window.resize(g.nd);
  c.shift.resize(g.nd);
  for (int i = 0; i < g.nd; ++i) {
    if (c.pass == Pass::forward) {  // pad the input by what the symmetric pads lack
      pad[i] = std::min(g.pb[i], g.pe[i]);
      c.shift[i] = g.pb[i] - pad[i];
      c.window[i] = g.in[i] + g.pb[i] + g.pe[i] - 2 * pad[i];
    } else {  // the full extent the outputs touch, begin pads included, no pads left for cuDNN
      c.window[i] = (g.out[i] - 1) * g.stride[i] + extent(g, i);
      c.shift[i] = c.pass == Pass::backward_data ? -g.pb[i] : g.pb[i];
    }
  }
  c.p = problem(g, c.window, pad);
  c.p.tf32 = tf32;
  return c;
}

// ---- the kernels ----

// y (rows, O) = relu?(y + bias + residual) in one pass after an NHWC convolution (nothing to do
// without bias, residual and relu).
void launch_epilogue_nhwc(KernelContext& ctx, const TensorView& y, const void* bias,
                          const void* res, bool relu) {
  if (!bias && !res && !relu) return;
  dispatch_float(y.dtype, ctx.op_name(), [&](auto v) {
    using T = decltype(v);
    constexpr int kV = 16 / sizeof(T) > 0 ? static_cast<int>(16 / sizeof(T)) : 1;
    const uint32_t O = static_cast<uint32_t>(y.shape[3]);
    auto aligned = [](const void* q) { return reinterpret_cast<uintptr_t>(q) % 16 == 0; };
    const bool wide = O % kV == 0 && aligned(y.data) && (!res || aligned(res));
    const auto run = [&](auto width) {
      constexpr int W = decltype(width)::value;
      const uint32_t packs = static_cast<uint32_t>(y.numel() / W);
      conv_epilogue_nhwc<T, W><<<blocks_for(packs), kThreads, 0, stream_of(ctx)>>>(
          y.ptr<T>(), static_cast<const T*>(bias), static_cast<const T*>(res), packs, O, relu);
    };
    if (wide)
      run(std::integral_constant<int, kV>{});
    else
      run(std::integral_constant<int, 1>{});
    check_launch(ctx.op_name());
  });
}

bool aligned16(const GraphConvArgs& a) {
  for (const void* q : {a.x, a.w, a.bias, a.residual, static_cast<const void*>(a.y)})
    if (reinterpret_cast<uintptr_t>(q) % 16 != 0) return false;
  return true;
}

// Runs `plan` (and the epilogue it leaves out); false when cuDNN refused, and nothing ran.
bool run_graph_plan(KernelContext& ctx, const GraphConvPlan& plan, const GraphConvArgs& a,
                    const TensorView& y, bool relu) {
  const cudnnHandle_t h = cudnn_handle(ctx.device(), stream_of(ctx));
  void* ws = plan.workspace() ? ctx.scratch(plan.workspace()) : nullptr;
  if (!plan.execute(h, a, ws)) return false;
  if (!plan.fused()) launch_epilogue_nhwc(ctx, y, a.bias, a.residual, relu);
  return true;
}

// The graph-API problem of an NHWC forward problem and its epilogue.
GraphConvProblem graph_problem(const Problem& p, DType t, const GraphConvArgs& a, bool relu) {
  GraphConvProblem gp;
  gp.t = t;
  gp.N = p.N, gp.C = p.C, gp.O = p.O, gp.G = p.G;
  gp.H = p.in[1], gp.W = p.in[2], gp.kh = p.k[1], gp.kw = p.k[2], gp.oh = p.out[1],
  gp.ow = p.out[2];
  for (int i = 0; i < 2; ++i)
    gp.pad[i] = p.pad[1 + i], gp.stride[i] = p.stride[1 + i], gp.dil[i] = p.dil[1 + i];
  gp.bias = a.bias != nullptr, gp.residual = a.residual != nullptr, gp.relu = relu;
  return gp;
}

// Mean milliseconds of 3 runs of `f` on stream s after one warm-up run; waits for the stream.
// Infinite when a run of f fails.
float time_on_stream(cudaStream_t s, const std::function<bool()>& f) {
  constexpr int kReps = 3;
  cudaEvent_t start = nullptr, stop = nullptr;
  KILN_CUDA_CHECK(cudaEventCreate(&start));
  KILN_CUDA_CHECK(cudaEventCreate(&stop));
  bool ok = f();
  KILN_CUDA_CHECK(cudaEventRecord(start, s));
  for (int i = 0; i < kReps && ok; ++i) ok = f();
  KILN_CUDA_CHECK(cudaEventRecord(stop, s));
  float ms = 0;
  const cudaError_t e = cudaEventSynchronize(stop);
  if (e == cudaSuccess) KILN_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  KILN_CUDA_CHECK(e);
  return ok ? ms / kReps : std::numeric_limits<float>::infinity();
}

constexpr int kGraphPlansPerGraph = 4;

// The graph plan an f16/bf16 NHWC problem runs with, or null for the legacy algorithm. Chosen on
// the problem's first run: the plans the graph API's heuristics rank first, for the convolution
// with its epilogue and for the convolution alone (then kiln's epilogue kernel), are timed against
// `legacy` on the step's own buffers (which they all write), and the fastest wins. This waits for
// the stream once per problem, as measuring the legacy algorithm does; not while the stream is
// being recorded (then legacy, chosen again on the next run).
std::vector<int64_t> nhwc_key(int device, DType t, const Problem& p, bool bias, bool residual,
                              bool relu) {
  std::vector<int64_t> key = problem_key(Pass::forward, device, t, p);
  key.insert(key.end(), {bias, residual, relu});
  return key;
}

// A graph-API plan's record value: engine, fused, workspace, then each knob as type << 48 | value
// (48-bit two's complement); -1 and nothing else for the legacy algorithm.
constexpr int kKnobShift = 48;
std::vector<int64_t> nhwc_record_value(const GraphConvPlan* plan) {
  if (!plan) return {-1, 0, 0};
  std::vector<int64_t> v{plan->engine(), plan->fused(), static_cast<int64_t>(plan->workspace())};
  constexpr int64_t kMask = (int64_t{1} << kKnobShift) - 1;
  for (const GraphKnob& k : plan->knobs()) v.push_back(k.type << kKnobShift | (k.value & kMask));
  return v;
}
std::vector<GraphKnob> knobs_of_record(const std::vector<int64_t>& v) {
  std::vector<GraphKnob> knobs;
  for (size_t i = 3; i < v.size(); ++i) {
    const auto u = static_cast<uint64_t>(v[i]);
    int64_t value = static_cast<int64_t>(u << (64 - kKnobShift)) >> (64 - kKnobShift);
    knobs.push_back({static_cast<int64_t>(u >> kKnobShift), value});
  }
  return knobs;
}

GraphConvProblem graph_problem(const Problem& p, DType t, const GraphConvArgs& a, bool relu);

// Held while graph-API plans are made: cudnn_shared_handle's handle serves one thread at a time.
std::mutex& graph_build_mutex() {
  static std::mutex mu;
  return mu;
}

const GraphConvPlan* nhwc_plan(KernelContext& ctx, const Problem& p, DType t,
                               const GraphConvArgs& a, const TensorView& y, bool relu,
                               const std::function<void()>& legacy) {
  PlanCache& cache = plan_cache();
  std::vector<int64_t> key =
      nhwc_key(ctx.device(), t, p, a.bias != nullptr, a.residual != nullptr, relu);
  std::optional<std::vector<int64_t>> seed;
  {
    std::lock_guard<std::mutex> l(cache.mu);
    if (auto it = cache.nhwc.find(key); it != cache.nhwc.end()) return it->second->plan.get();
    if (auto it = cache.nhwc_seeds.find(key); it != cache.nhwc_seeds.end()) seed = it->second;
  }
  if (seed) {  // a package's choice: the legacy algorithm, or a plan made again without timing
    auto choice = std::make_unique<NhwcChoice>();
    if ((*seed)[0] >= 0) {
      std::lock_guard<std::mutex> l(graph_build_mutex());
      choice->plan =
          graph_conv_plan(cudnn_shared_handle(ctx.device()), graph_problem(p, t, a, relu),
                          (*seed)[1] != 0, (*seed)[0], knobs_of_record(*seed), size_t{256} << 20);
    }
    if ((*seed)[0] < 0 || choice->plan) {
      std::lock_guard<std::mutex> l(cache.mu);
      ++cache.stats.graph_seeded;
      return cache.nhwc.emplace(std::move(key), std::move(choice)).first->second->plan.get();
    }
    // cuDNN no longer takes the recorded plan: timed as if there were no record
  }
  const cudaStream_t s = stream_of(ctx);
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  KILN_CUDA_CHECK(cudaStreamIsCapturing(s, &capture));
  if (capture != cudaStreamCaptureStatusNone || !aligned16(a)) return nullptr;

  const GraphConvProblem gp = graph_problem(p, t, a, relu);
  std::vector<std::unique_ptr<GraphConvPlan>> plans;
  {
    std::lock_guard<std::mutex> l(graph_build_mutex());
    // (workspaces up to what measuring the legacy algorithms may take)
    plans = graph_conv_plans(cudnn_shared_handle(ctx.device()), gp, kGraphPlansPerGraph,
                             size_t{256} << 20);
  }
  auto choice = std::make_unique<NhwcChoice>();
  if (!plans.empty()) {
    const cudnnHandle_t h = cudnn_handle(ctx.device(), s);
    size_t ws_bytes = 0;
    for (const auto& plan : plans) ws_bytes = std::max(ws_bytes, plan->workspace());
    void* ws = ws_bytes ? ctx.scratch(ws_bytes) : nullptr;
    float best = time_on_stream(s, [&] {
      legacy();
      return true;
    });
    std::string timings = fmt::format("legacy {:.4f}", best);
    size_t best_plan = plans.size();
    for (size_t i = 0; i < plans.size(); ++i) {
      const GraphConvPlan& plan = *plans[i];
      const float ms = time_on_stream(s, [&] {
        if (!plan.execute(h, a, ws)) return false;
        if (!plan.fused()) launch_epilogue_nhwc(ctx, y, a.bias, a.residual, relu);
        return true;
      });
      timings += fmt::format(", {} {:.4f}", plan.name(), ms);
      if (ms < best) best = ms, best_plan = i;
    }
    if (best_plan < plans.size()) choice->plan = std::move(plans[best_plan]);
    log::info(
        "[conv] {} NHWC {}x{}x{}x{} -> {} k {}x{} stride {} groups {}{}{}{}: {} ms; runs with {}",
        name(t), p.N, p.in[1], p.in[2], p.C, p.O, p.k[1], p.k[2], p.stride[1], p.G,
        gp.bias ? " +bias" : "", gp.residual ? " +residual" : "", relu ? " +relu" : "", timings,
        choice->plan ? choice->plan->name() : "legacy");
  }
  std::lock_guard<std::mutex> l(cache.mu);
  if (!plans.empty()) ++cache.stats.graph_offered;
  if (choice->plan) ++cache.stats.graph_chosen;
  // the first choice made wins
  return cache.nhwc.emplace(std::move(key), std::move(choice)).first->second->plan.get();
}

// conv with channels_last (the channels_last pass's f16/bf16 inference convs, and f32 ones with
// TF32 allowed): cuDNN on NHWC
// data and (O, kh, kw, C/G) weights, tensor cores without layout conversions, with bias, the
// fused residual and relu: either one graph-API plan (with or without the epilogue inside) or the
// legacy algorithm and kiln's epilogue pass, whichever was faster on the problem's first run.
void conv_nhwc(KernelContext& ctx) {
  const TensorView &x = ctx.in(0), &w = ctx.in(1), &y = ctx.out(0);
  if (y.numel() == 0) return;
  auto nchw = [](const Shape& s) { return Shape{s[0], s[3], s[1], s[2]}; };
  const ConvCall c =
      conv_call(OpId::Conv, ctx.attrs(), nchw(x.shape), nchw(w.shape), nchw(y.shape));
  const void* bias = bias_of(ctx);
  if (!c.direct || x.numel() == 0 || w.numel() == 0 || y.numel() > UINT32_MAX)
    fail<UnsupportedError>(
        "[conv] channels_last takes symmetric pads and non-empty operands under 2^32 elements "
        "(x {}, w {}, pads {})",
        str(x.shape), str(w.shape), fmt::join(ctx.attrs().ints("pads"), ", "));
  Problem p = c.p;
  p.nhwc = true;
  const bool relu = ctx.attrs().b("relu", false);
  const void* res =
      ctx.attrs().b("has_residual", false) ? ctx.in(ctx.num_inputs() - 1).data : nullptr;
  const auto legacy = [&] {
    run_pass(ctx, Pass::forward, p, x.dtype, x.data, w.data, nullptr, y.data);
    launch_epilogue_nhwc(ctx, y, bias, res, relu);
  };
  const bool tensor_cores =
      x.dtype == DType::f16 || x.dtype == DType::bf16 || (x.dtype == DType::f32 && p.tf32);
  // (deterministic executables: the legacy algorithm, chosen without timing)
  if (tensor_cores && p.nd == 2 && ctx.choices().cudnn_graph && !ctx.deterministic()) {
    const GraphConvArgs args{x.data, w.data, bias, res, y.data};
    if (const GraphConvPlan* plan = nhwc_plan(ctx, p, x.dtype, args, y, relu, legacy))
      if (aligned16(args) && run_graph_plan(ctx, *plan, args, y, relu)) return;
  }
  legacy();
}

void conv(KernelContext& ctx) {
  if (ctx.attrs().b("channels_last", false)) return conv_nhwc(ctx);
  const TensorView &x = ctx.in(0), &w = ctx.in(1), &y = ctx.out(0);
  if (y.numel() == 0) return;
  const void* bias = bias_of(ctx);
  if (x.numel() == 0 || w.numel() == 0) return launch_channel_bias(ctx, y, bias, false);
  const ConvCall c = conv_call(OpId::Conv, ctx.attrs(), x.shape, w.shape, y.shape);
  const Geometry& g = c.g;
  if (c.direct) {
    run_pass(ctx, Pass::forward, c.p, x.dtype, x.data, w.data, nullptr, y.data);
  } else {
    void* xp = ctx.scratch(static_cast<size_t>(g.N * g.C * prod(c.window)) * size_of(x.dtype));
    launch_window_copy(ctx, x.dtype, x.data, xp, g.N * g.C, g.in, c.window, c.shift, nullptr, 1);
    run_pass(ctx, Pass::forward, c.p, x.dtype, xp, w.data, nullptr, y.data);
  }
  if (bias) launch_channel_bias(ctx, y, bias, true);
}

// The NHWC problem of a channels_last conv_transpose or conv_grad_weight (in0, in1, out0 as
// conv_call takes them, NHWC and (O, kh, kw, C/G)), which the channels_last pass gives training
// programs only where cuDNN runs it on the step's own buffers.
Problem nhwc_problem(KernelContext& ctx, const Shape& in0, const Shape& in1, const Shape& out0) {
  auto nchw = [](const Shape& s) { return Shape{s[0], s[3], s[1], s[2]}; };
  const ConvCall c = conv_call(ctx.op(), ctx.attrs(), nchw(in0), nchw(in1), nchw(out0));
  if (!c.direct)
    fail<UnsupportedError>(
        "[{}] channels_last takes symmetric pads and the output size cuDNN computes (inputs {} "
        "and {}, output {}, pads {})",
        ctx.op_name(), str(in0), str(in1), str(out0), fmt::join(ctx.attrs().ints("pads"), ", "));
  Problem p = c.p;
  p.nhwc = true;
  return p;
}

// conv_transpose with channels_last: x (N, h, w, C_in), w (C_in, kh, kw, C_out/G), y NHWC.
void conv_transpose_nhwc(KernelContext& ctx) {
  const TensorView &x = ctx.in(0), &w = ctx.in(1), &y = ctx.out(0);
  if (y.numel() == 0) return;
  const void* bias = bias_of(ctx);
  if (bias && y.numel() > UINT32_MAX)
    fail<UnsupportedError>("[conv_transpose] channels_last with a bias takes outputs under 2^32 "
                           "elements, got {}", str(y.shape));
  if (x.numel() == 0 || w.numel() == 0) {
    KILN_CUDA_CHECK(cudaMemsetAsync(y.data, 0, y.numel() * size_of(y.dtype), stream_of(ctx)));
  } else {
    const Problem p = nhwc_problem(ctx, x.shape, w.shape, y.shape);
    run_pass(ctx, Pass::backward_data, p, x.dtype, nullptr, w.data, x.data, y.data);
  }
  launch_epilogue_nhwc(ctx, y, bias, nullptr, false);
}

// conv_grad_weight with channels_last: x and dy NHWC, dW (O, kh, kw, C/G) (cuDNN's NHWC filter).
void conv_grad_weight_nhwc(KernelContext& ctx) {
  const TensorView &x = ctx.in(0), &dy = ctx.in(1), &dw = ctx.out(0);
  if (dw.numel() == 0) return;
  if (x.numel() == 0 || dy.numel() == 0) {
    KILN_CUDA_CHECK(cudaMemsetAsync(dw.data, 0, dw.numel() * size_of(dw.dtype), stream_of(ctx)));
    return;
  }
  const Problem p = nhwc_problem(ctx, x.shape, dy.shape, dw.shape);
  run_pass(ctx, Pass::backward_filter, p, x.dtype, x.data, nullptr, dy.data, dw.data);
}

// conv_transpose(x, w) is the backward-data pass of the conv from its output y to its input x.
void conv_transpose(KernelContext& ctx) {
  if (ctx.attrs().b("channels_last", false)) return conv_transpose_nhwc(ctx);
  const TensorView &x = ctx.in(0), &w = ctx.in(1), &y = ctx.out(0);
  if (y.numel() == 0) return;
  const void* bias = bias_of(ctx);
  if (x.numel() == 0 || w.numel() == 0) return launch_channel_bias(ctx, y, bias, false);
  const ConvCall c = conv_call(OpId::ConvTranspose, ctx.attrs(), x.shape, w.shape, y.shape);
  const Geometry& g = c.g;
  if (c.direct) {
    run_pass(ctx, Pass::backward_data, c.p, x.dtype, nullptr, w.data, x.data, y.data);
    if (bias) launch_channel_bias(ctx, y, bias, true);
    return;
  }
  // the unpadded ("full") result, cropped by the begin pads; output_padding beyond it is zero
  void* yf = ctx.scratch(static_cast<size_t>(g.N * g.C * prod(c.window)) * size_of(x.dtype));
  run_pass(ctx, Pass::backward_data, c.p, x.dtype, nullptr, w.data, x.data, yf);
  launch_window_copy(ctx, x.dtype, yf, y.data, g.N * g.C, c.window, g.in, c.shift, bias, g.C);
}

// dW of the conv from x (N, C, in) to dy (N, O, out): the backward-filter pass.
void conv_grad_weight(KernelContext& ctx) {
  if (ctx.attrs().b("channels_last", false)) return conv_grad_weight_nhwc(ctx);
  const TensorView &x = ctx.in(0), &dy = ctx.in(1), &dw = ctx.out(0);
  if (dw.numel() == 0) return;
  if (x.numel() == 0 || dy.numel() == 0) {
    KILN_CUDA_CHECK(cudaMemsetAsync(dw.data, 0, dw.numel() * size_of(dw.dtype), stream_of(ctx)));
    return;
  }
  const ConvCall c = conv_call(OpId::ConvGradWeight, ctx.attrs(), x.shape, dy.shape, dw.shape);
  const Geometry& g = c.g;
  if (c.direct) {
    run_pass(ctx, Pass::backward_filter, c.p, x.dtype, x.data, nullptr, dy.data, dw.data);
    return;
  }
  void* xp = ctx.scratch(static_cast<size_t>(g.N * g.C * prod(c.window)) * size_of(x.dtype));
  launch_window_copy(ctx, x.dtype, x.data, xp, g.N * g.C, g.in, c.window, c.shift, nullptr, 1);
  run_pass(ctx, Pass::backward_filter, c.p, x.dtype, xp, nullptr, dy.data, dw.data);
}

// ---- tuning records (tuning.h) ----

constexpr size_t kKeySize = 24, kValueSize = 3;
constexpr uint16_t kNhwcKind = 3;  // an f16/bf16 channels_last forward problem's way (tuning.h)
constexpr size_t kNhwcKeySize = kKeySize + 3;

int algo_count(Pass pass) {
  switch (pass) {
    case Pass::forward:
      return CUDNN_CONVOLUTION_FWD_ALGO_COUNT;
    case Pass::backward_data:
      return CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT;
    case Pass::backward_filter:
      return CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT;
  }
  return 0;
}

// Why a record of a conv pass is not one this backend could have chosen (empty: it could).
std::string check_record(const TuningRecord& r) {
  const auto pass = static_cast<Pass>(r.kind);
  if (r.key.size() != kKeySize || r.value.size() != kValueSize)
    return fmt::format("{} key and {} value entries; a convolution record has {} and {}",
                       r.key.size(), r.value.size(), kKeySize, kValueSize);
  const int64_t algo = r.value[0], math = r.value[1], ws = r.value[2];
  const bool tf32 = r.key[0] == static_cast<int64_t>(DType::f32) + kTf32Key;
  const int64_t t = tf32 ? static_cast<int64_t>(DType::f32) : r.key[0];
  if (t != static_cast<int64_t>(DType::f32) && t != static_cast<int64_t>(DType::f64) &&
      t != static_cast<int64_t>(DType::f16) && t != static_cast<int64_t>(DType::bf16))
    return fmt::format("dtype {} is not one cuDNN convolutions take", t);
  if (algo < 0 || algo >= algo_count(pass))
    return fmt::format("algorithm {} is not one of cuDNN's {}", algo, algo_count(pass));
  if (math != CUDNN_DEFAULT_MATH && math != CUDNN_TENSOR_OP_MATH &&
      math != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION && math != CUDNN_FMA_MATH)
    return fmt::format("unknown math type {}", math);
  if (t == static_cast<int64_t>(DType::f64) && !exact(pass, static_cast<int>(algo)))
    return fmt::format("algorithm {} does not sum exactly, as f64 needs", algo);
  if (t == static_cast<int64_t>(DType::f32) && !tf32 && math != CUDNN_FMA_MATH)
    return fmt::format("f32 with math type {} instead of FMA", math);
  if (ws < 0 || static_cast<uint64_t>(ws) > kMaxWorkspace)
    return fmt::format("a workspace of {} bytes", ws);
  return {};
}

// Why a kind-3 record (an NHWC problem's way) is not one this backend could have made.
std::string check_nhwc_record(const TuningRecord& r) {
  if (r.key.size() != kNhwcKeySize || r.value.size() < 3)
    return fmt::format("{} key and {} value entries; an NHWC record has {} and at least 3",
                       r.key.size(), r.value.size(), kNhwcKeySize);
  const int64_t t = r.key[0];
  if (t != static_cast<int64_t>(DType::f16) && t != static_cast<int64_t>(DType::bf16))
    return fmt::format("dtype {} is not f16 or bf16", t);
  if (r.key[1] != 2 + 8) return fmt::format("{} is not the NHWC 2-D marker 10", r.key[1]);
  for (size_t i = kKeySize; i < kNhwcKeySize; ++i)
    if (r.key[i] != 0 && r.key[i] != 1) return fmt::format("epilogue flag {}", r.key[i]);
  const int64_t engine = r.value[0], fused = r.value[1], ws = r.value[2];
  if (engine < -1) return fmt::format("engine {}", engine);
  if (engine == -1 && r.value.size() != 3) return "a legacy choice with knobs";
  if (fused != 0 && fused != 1) return fmt::format("fused flag {}", fused);
  if (ws < 0 || static_cast<uint64_t>(ws) > kMaxWorkspace)
    return fmt::format("a workspace of {} bytes", ws);
  for (size_t i = 3; i < r.value.size(); ++i)
    if (static_cast<uint64_t>(r.value[i]) >> kKnobShift >= CUDNN_KNOB_TYPE_COUNTS)
      return fmt::format("knob type {}", static_cast<uint64_t>(r.value[i]) >> kKnobShift);
  return {};
}

}  // namespace

TuningIdentity conv_tuning_identity(int device) {
  static std::mutex mu;
  static std::map<int, TuningIdentity> known;  // asked once per device: loads ask every time
  std::lock_guard<std::mutex> l(mu);
  if (auto it = known.find(device); it != known.end()) return it->second;
  cudaDeviceProp prop{};
  KILN_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  return known[device] = {prop.name, fmt::format("sm_{}{}", prop.major, prop.minor),
                          fmt::format("cudnn {}", cudnnGetVersion())};
}

std::vector<TuningRecord> export_conv_tuning(int device, const std::vector<KernelCall>& calls) {
  std::vector<std::vector<int64_t>> keys, nhwc_keys;
  for (const KernelCall& k : calls) {
    if (k.op != OpId::Conv && k.op != OpId::ConvTranspose && k.op != OpId::ConvGradWeight)
      continue;
    if (k.inputs.size() < 2 || k.outputs.empty() || !k.attrs) continue;
    const Shape &in0 = k.inputs[0].shape, &in1 = k.inputs[1].shape, &out0 = k.outputs[0].shape;
    if (numel(in0) == 0 || numel(in1) == 0 || numel(out0) == 0) continue;  // no cuDNN call
    const DType t = k.inputs[0].dtype;
    try {
      const bool cl = k.attrs->b("channels_last", false) && in0.size() == 4;
      auto nchw = [cl](const Shape& s) { return cl ? Shape{s[0], s[3], s[1], s[2]} : s; };
      const ConvCall c = conv_call(k.op, *k.attrs, nchw(in0), nchw(in1), nchw(out0));
      // (f32 NHWC problems, TF32 ones, are not recorded: they are timed again after loading)
      if (cl && k.op == OpId::Conv && (t == DType::f16 || t == DType::bf16) && c.direct) {
        Problem p = c.p;
        p.nhwc = true;
        nhwc_keys.push_back(nhwc_key(device, t, p, k.attrs->b("has_bias", false),
                                     k.attrs->b("has_residual", false),
                                     k.attrs->b("relu", false)));
      }
      const int64_t chunk = batch_chunk(c.p, op_name(k.op));
      // the batch's chunks: full ones and the rest (run_pass)
      for (const int64_t n : {chunk, c.p.N % chunk}) {
        if (n == 0) continue;
        Problem p = c.p;
        p.N = n;
        p.nhwc = cl;
        keys.push_back(problem_key(c.pass, device, t, p));
      }
    } catch (const Error&) {
      // a call the kernel rejects has no choice to export
    }
  }
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  std::vector<TuningRecord> out;
  PlanCache& cache = plan_cache();
  std::lock_guard<std::mutex> l(cache.mu);
  for (const auto& key : keys) {
    auto it = cache.plans.find(key);
    if (it == cache.plans.end() || !it->second->algo) continue;
    const Algo& a = *it->second->algo;
    TuningRecord r;
    r.kind = static_cast<uint16_t>(key[0]);
    r.key.assign(key.begin() + 2, key.end());  // without pass and device
    r.value = {a.algo, static_cast<int64_t>(a.math), static_cast<int64_t>(a.workspace)};
    out.push_back(std::move(r));
  }
  std::sort(nhwc_keys.begin(), nhwc_keys.end());
  nhwc_keys.erase(std::unique(nhwc_keys.begin(), nhwc_keys.end()), nhwc_keys.end());
  for (const auto& key : nhwc_keys) {
    auto it = cache.nhwc.find(key);
    if (it == cache.nhwc.end()) continue;
    TuningRecord r;
    r.kind = kNhwcKind;
    r.key.assign(key.begin() + 2, key.end());
    r.value = nhwc_record_value(it->second->plan.get());
    if (r.value.size() > kMaxTuningValue) continue;  // more knobs than a record holds
    out.push_back(std::move(r));
  }
  return out;
}

std::string import_conv_tuning(int device, const std::vector<TuningRecord>& records,
                               size_t* seeded) {
  if (seeded) *seeded = 0;
  constexpr uint16_t kConvKinds = 3;
  for (size_t i = 0; i < records.size(); ++i) {
    if (records[i].kind < kConvKinds)
      if (std::string why = check_record(records[i]); !why.empty())
        return fmt::format("record {} (convolution pass {}): {}", i, records[i].kind, why);
    if (records[i].kind == kNhwcKind)
      if (std::string why = check_nhwc_record(records[i]); !why.empty())
        return fmt::format("record {} (NHWC convolution): {}", i, why);
  }
  PlanCache& cache = plan_cache();
  std::lock_guard<std::mutex> l(cache.mu);
  for (const TuningRecord& r : records) {
    if (r.kind == kNhwcKind) {
      std::vector<int64_t> key{static_cast<int64_t>(Pass::forward), device};
      key.insert(key.end(), r.key.begin(), r.key.end());
      if (cache.nhwc.count(key)) continue;
      cache.nhwc_seeds[key] = r.value;
      if (seeded) ++*seeded;
      continue;
    }
    if (r.kind >= kConvKinds) continue;
    std::vector<int64_t> key{r.kind, device};
    key.insert(key.end(), r.key.begin(), r.key.end());
    if (cache.plans.count(key)) continue;  // chosen in this process already
    cache.seeds[key] = Algo{static_cast<int>(r.value[0]), static_cast<size_t>(r.value[2]),
                            static_cast<cudnnMathType_t>(r.value[1])};
    if (seeded) ++*seeded;
  }
  return {};
}

TuningStats conv_tuning_stats() {
  PlanCache& cache = plan_cache();
  std::lock_guard<std::mutex> l(cache.mu);
  return cache.stats;
}

void clear_conv_tuning() {
  PlanCache& cache = plan_cache();
  std::lock_guard<std::mutex> l(cache.mu);
  cache.plans.clear();
  cache.seeds.clear();
  cache.nhwc.clear();
  cache.nhwc_seeds.clear();
  cache.stats = {};
}

void register_conv_kernels() {
  constexpr DTypeSet kTypes{f32, f64, f16, bf16};
  register_kernel(OpId::Conv, Backend::cuda, {conv, kTypes, 0, false});
  register_kernel(OpId::ConvTranspose, Backend::cuda, {conv_transpose, kTypes, 0, false});
  register_kernel(OpId::ConvGradWeight, Backend::cuda, {conv_grad_weight, kTypes, 0, false});
}

}  // namespace kiln::cuda
