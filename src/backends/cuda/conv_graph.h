// cuDNN's graph (backend) API for the channels_last forward convolutions of f16/bf16 programs.
// The legacy algorithm API (conv_algo.cu) reaches only the engines behind its algorithm enum; the
// graph API's heuristics also offer the engines written for newer GPUs, and engines that run the
// convolution's epilogue (bias, residual add, relu) inside the convolution kernel. conv_nhwc.cu
// asks for both graphs of a problem (with and without the epilogue), times their plans against its
// legacy algorithm on the problem's first run, and keeps the fastest (KILN_CUDNN_GRAPH=0: legacy
// only).
#pragma once

#include <cudnn.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kiln/dtype.h"

namespace kiln::cuda {

/// A 2-D forward convolution on NHWC data with KRSC weights (O, kh, kw, C/G), symmetric pads.
struct GraphConvProblem {
  DType t = DType::bf16;  // x, w, bias, residual and y (f16, bf16, or f32 with TF32 allowed);
                          // sums in f32
  int64_t N = 0, C = 0, H = 0, W = 0, O = 0, G = 1, kh = 1, kw = 1, oh = 0, ow = 0;
  int64_t pad[2] = {0, 0}, stride[2] = {1, 1}, dil[2] = {1, 1};
  bool bias = false, residual = false, relu = false;  // the epilogue: y = relu?(conv + b + r)
};

/// A run's buffers; bias and residual are read when the problem has them.
struct GraphConvArgs {
  const void* x = nullptr;
  const void* w = nullptr;
  const void* bias = nullptr;
  const void* residual = nullptr;
  void* y = nullptr;
};

/// One knob of an engine configuration (cudnnBackendKnobType_t and its value).
struct GraphKnob {
  int64_t type = 0;
  int64_t value = 0;
};

/// One finalized execution plan of an operation graph.
class GraphConvPlan {
 public:
  struct Impl;
  explicit GraphConvPlan(std::unique_ptr<Impl> impl);
  ~GraphConvPlan();
  GraphConvPlan(const GraphConvPlan&) = delete;
  GraphConvPlan& operator=(const GraphConvPlan&) = delete;

  /// Workspace bytes each execution needs.
  size_t workspace() const;
  /// Whether the plan computes the epilogue too (else only the convolution, into y).
  bool fused() const;
  /// cuDNN's global index of the plan's engine, and its knob choices: with the problem and
  /// fused(), what graph_conv_plan needs to make the same plan again (packages store them).
  int64_t engine() const;
  const std::vector<GraphKnob>& knobs() const;
  /// "engine N (fused)" or "engine N", for logs and reports.
  std::string name() const;
  /// Enqueues the plan on the stream `h` is bound to; false when cuDNN refuses (nothing ran).
  /// Every pointer must be aligned to 16 bytes.
  bool execute(cudnnHandle_t h, const GraphConvArgs& args, void* workspace) const;

 private:
  std::unique_ptr<Impl> impl_;
};

/// The plans cuDNN's heuristics offer for `p`, best first by its ranking: up to `per_graph` for
/// the graph with the epilogue (when `p` has one) and up to `per_graph` for the convolution alone.
/// Engines that compile kernels at run time (unless KILN_CUDNN_RUNTIME_FUSION=1, and then two per
/// graph at most), reduce in f16 or bf16, or need more than `max_workspace` bytes are left out. Empty when cuDNN takes neither
/// graph; never throws for a problem cuDNN refuses.
std::vector<std::unique_ptr<GraphConvPlan>> graph_conv_plans(cudnnHandle_t h,
                                                             const GraphConvProblem& p,
                                                             int per_graph, size_t max_workspace);

/// The plan of engine `engine` with `knobs` for `p` (with the epilogue when `fused`), as an
/// earlier graph_conv_plans offered it; null when cuDNN no longer takes it (another version or
/// GPU) or it needs more than `max_workspace` bytes.
std::unique_ptr<GraphConvPlan> graph_conv_plan(cudnnHandle_t h, const GraphConvProblem& p,
                                               bool fused, int64_t engine,
                                               const std::vector<GraphKnob>& knobs,
                                               size_t max_workspace);

}  // namespace kiln::cuda
