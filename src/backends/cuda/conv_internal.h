// Declarations shared by the CUDA conv family's files: the cuDNN problem and the plan cache of its
// algorithms (conv_algo.cu), the geometry of a call (conv.cu) and the channels_last path
// (conv_nhwc.cu). Included by .cu files only.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "backends/cuda/conv_graph.h"
#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/tuning.h"
#include "ops/conv_params.h"

namespace kiln::cuda::conv_detail {

constexpr size_t kMaxWorkspace = size_t{1} << 30;
// Added to an f32 problem's dtype in its key (and packages' tuning records) when TF32 is allowed.
constexpr int64_t kTf32Key = 256;
// Added to a problem's dtype in its key when the executable is deterministic: those plans are
// never timed, seeded or exported.
constexpr int64_t kDeterministicKey = 512;

// V elements of T as one access (16 bytes at most).
template <typename T, int V> struct alignas(sizeof(T) * V) Pack { T v[V]; };

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

// ---- algorithm choice, once per problem ----

struct Algo {
  int algo = 0;
  size_t workspace = 0;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
};

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
  std::map<std::vector<int64_t>, std::vector<int64_t>> nhwc_seeds;   // record values, same keys
  TuningStats stats;
};
PlanCache& plan_cache();

// ---- geometry ----

// kiln's attributes and the sizes of the conv's input x, weight w and output y (for
// conv_transpose: of the conv it transposes, whose input is conv_transpose's output).
struct Geometry {
  int nd = 0;
  int64_t N = 0, C = 0, O = 0, G = 1;
  std::vector<int64_t> in, k, out, stride, dil, pb, pe;
};

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

// conv_algo.cu
bool exact(Pass pass, int algo);
std::vector<int64_t> problem_key(Pass pass, int device, DType t, const Problem& p);
int64_t batch_chunk(const Problem& full, const char* op);
void run_pass(KernelContext& ctx, Pass pass, const Problem& full, DType t, const void* x,
              const void* w, const void* y, void* out);

// conv.cu
/// Throws UnsupportedError for a conv node only the CPU runs (a package compiled for the CPU:
/// nchw_x, or a fused_conv activation other than relu).
void refuse_cpu_only(const KernelContext& ctx, const ConvParams& a);
const void* bias_of(const KernelContext& ctx, const ConvParams& a);
ConvCall conv_call(OpId op, const ConvParams& a, const Shape& in0, const Shape& in1,
                   const Shape& out0);

// conv_nhwc.cu
std::vector<int64_t> nhwc_key(int device, DType t, const Problem& p, bool bias, bool residual,
                              bool relu);
// A graph-API plan's record value: engine, fused, workspace, then each knob as type << 48 | value
// (48-bit two's complement); -1 and nothing else for the legacy algorithm.
constexpr int kKnobShift = 48;
std::vector<int64_t> nhwc_record_value(const GraphConvPlan* plan);
void conv_nhwc(KernelContext& ctx);
/// y = relu?(y + residual) in one pass, in place, over an output of any layout (residual: null
/// or of y's shape and dtype).
void add_residual_relu(KernelContext& ctx, const TensorView& y, const void* residual, bool relu);
void conv_transpose_nhwc(KernelContext& ctx);
void conv_grad_weight_nhwc(KernelContext& ctx);

}  // namespace kiln::cuda::conv_detail
