// The conv family's channels_last kernels (cuDNN on NHWC data and (O, kh, kw, C/G) weights): the
// forward conv through a graph-API plan or the legacy algorithm, whichever was faster on the
// problem's first run, and kiln's epilogue pass; conv_transpose and conv_grad_weight.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "backends/cuda/conv_internal.h"
#include "backends/cuda/handles.h"
#include "runtime/log.h"

namespace kiln::cuda {

namespace {

using namespace conv_detail;

// An NHWC conv's epilogue in one pass: y (rows, O) = relu?(y + bias[o] + residual), bias and
// residual optional; V elements a thread (16-byte accesses when O allows), 32-bit indices.
template <typename T, int V> __global__ void conv_epilogue_nhwc(T* y, const T* bias, const T* res,
                                                                uint32_t packs, uint32_t O,
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

// y (rows, O) = relu?(y + bias + residual) in one pass after an NHWC convolution (nothing to do
// without bias, residual and relu). Without a bias, y may have any layout (O: its last dim).
void launch_epilogue_nhwc(KernelContext& ctx, const TensorView& y, const void* bias,
                          const void* res, bool relu) {
  if (!bias && !res && !relu) return;
  dispatch_float(y.dtype, ctx.op_name(), [&](auto v) {
    using T = decltype(v);
    constexpr int kV = 16 / sizeof(T) > 0 ? static_cast<int>(16 / sizeof(T)) : 1;
    const uint32_t O = static_cast<uint32_t>(y.shape.back());
    auto aligned = [](const void* q) { return reinterpret_cast<uintptr_t>(q) % 16 == 0; };
    const bool wide = O % kV == 0 && aligned(y.data) && (!res || aligned(res));
    const auto run = [&](auto width) {
      constexpr int W = decltype(width)::value;
      const uint32_t packs = static_cast<uint32_t>(y.numel() / W);
      conv_epilogue_nhwc<T, W><<<blocks_for(packs), kThreads, 0, stream_of(ctx)>>>(
          y.ptr<T>(), static_cast<const T*>(bias), static_cast<const T*>(res), packs, O, relu);
    };
    if (wide) run(std::integral_constant<int, kV>{});
    else run(std::integral_constant<int, 1>{});
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

}  // namespace

namespace conv_detail {

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

std::vector<int64_t> nhwc_record_value(const GraphConvPlan* plan) {
  if (!plan) return {-1, 0, 0};
  std::vector<int64_t> v{plan->engine(), plan->fused(), static_cast<int64_t>(plan->workspace())};
  constexpr int64_t kMask = (int64_t{1} << kKnobShift) - 1;
  for (const GraphKnob& k : plan->knobs()) v.push_back(k.type << kKnobShift | (k.value & kMask));
  return v;
}

}  // namespace conv_detail

namespace {

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

}  // namespace

namespace conv_detail {

void add_residual_relu(KernelContext& ctx, const TensorView& y, const void* residual, bool relu) {
  if (y.numel() > UINT32_MAX)
    fail<UnsupportedError>(
        "[{}] the fused residual and relu take outputs under 2^32 elements, "
        "got {}",
        ctx.op_name(), str(y.shape));
  launch_epilogue_nhwc(ctx, y, nullptr, residual, relu);
}

// conv and fused_conv with channels_last (the channels_last pass's f16/bf16 inference convs, and
// f32 ones with TF32 allowed): cuDNN on NHWC
// data and (O, kh, kw, C/G) weights, tensor cores without layout conversions, with bias, the
// fused residual and relu: either one graph-API plan (with or without the epilogue inside) or the
// legacy algorithm and kiln's epilogue pass, whichever was faster on the problem's first run.
void conv_nhwc(KernelContext& ctx) {
  const TensorView &x = ctx.in(0), &w = ctx.in(1), &y = ctx.out(0);
  if (y.numel() == 0) return;
  auto nchw = [](const Shape& s) { return Shape{s[0], s[3], s[1], s[2]}; };
  ConvParams spare;
  const ConvParams& a = params_of(ctx, spare);
  refuse_cpu_only(ctx, a);
  const ConvCall c = conv_call(OpId::Conv, a, nchw(x.shape), nchw(w.shape), nchw(y.shape));
  const void* bias = bias_of(ctx, a);
  if (!c.direct || x.numel() == 0 || w.numel() == 0 || y.numel() > UINT32_MAX)
    fail<UnsupportedError>(
        "[conv] channels_last takes symmetric pads and non-empty operands under 2^32 elements "
        "(x {}, w {}, pads {})",
        str(x.shape), str(w.shape), fmt::join(a.pads, ", "));
  Problem p = c.p;
  p.nhwc = true;
  const bool relu = a.relu;
  const void* res = a.has_residual ? ctx.in(ctx.num_inputs() - 1).data : nullptr;
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

}  // namespace conv_detail

namespace {

// The NHWC problem of a channels_last conv_transpose or conv_grad_weight (in0, in1, out0 as
// conv_call takes them, NHWC and (O, kh, kw, C/G)), which the channels_last pass gives training
// programs only where cuDNN runs it on the step's own buffers.
Problem nhwc_problem(KernelContext& ctx, const ConvParams& a, const Shape& in0, const Shape& in1,
                     const Shape& out0) {
  auto nchw = [](const Shape& s) { return Shape{s[0], s[3], s[1], s[2]}; };
  const ConvCall c = conv_call(ctx.op(), a, nchw(in0), nchw(in1), nchw(out0));
  if (!c.direct)
    fail<UnsupportedError>(
        "[{}] channels_last takes symmetric pads and the output size cuDNN computes (inputs {} "
        "and {}, output {}, pads {})",
        ctx.op_name(), str(in0), str(in1), str(out0), fmt::join(a.pads, ", "));
  Problem p = c.p;
  p.nhwc = true;
  return p;
}

}  // namespace

namespace conv_detail {

// conv_transpose with channels_last: x (N, h, w, C_in), w (C_in, kh, kw, C_out/G), y NHWC.
void conv_transpose_nhwc(KernelContext& ctx) {
  const TensorView &x = ctx.in(0), &w = ctx.in(1), &y = ctx.out(0);
  if (y.numel() == 0) return;
  ConvParams spare;
  const ConvParams& a = params_of(ctx, spare);
  const void* bias = bias_of(ctx, a);
  if (bias && y.numel() > UINT32_MAX)
    fail<UnsupportedError>(
        "[conv_transpose] channels_last with a bias takes outputs under 2^32 "
        "elements, got {}",
        str(y.shape));
  if (x.numel() == 0 || w.numel() == 0) {
    KILN_CUDA_CHECK(cudaMemsetAsync(y.data, 0, y.numel() * size_of(y.dtype), stream_of(ctx)));
  } else {
    const Problem p = nhwc_problem(ctx, a, x.shape, w.shape, y.shape);
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
  ConvParams spare;
  const Problem p = nhwc_problem(ctx, params_of(ctx, spare), x.shape, dy.shape, dw.shape);
  run_pass(ctx, Pass::backward_filter, p, x.dtype, x.data, nullptr, dy.data, dw.data);
}

}  // namespace conv_detail

}  // namespace kiln::cuda
