#include "backends/cuda/conv_graph.h"

#include <fmt/format.h>

#include <array>
#include <deque>
#include <memory>
#include <utility>
#include <vector>

#include "runtime/env.h"

namespace kiln::cuda {

namespace {

using Handle = cudnnBackendDescriptor_t;

// An owned backend descriptor (null when cuDNN could not create it).
class Desc {
 public:
  Desc() = default;
  explicit Desc(cudnnBackendDescriptorType_t type) {
    if (cudnnBackendCreateDescriptor(type, &d_) != CUDNN_STATUS_SUCCESS) d_ = nullptr;
  }
  ~Desc() {
    if (d_) cudnnBackendDestroyDescriptor(d_);
  }
  Desc(Desc&& o) noexcept : d_(std::exchange(o.d_, nullptr)) {}
  Desc& operator=(Desc&& o) noexcept {
    if (this != &o) {
      if (d_) cudnnBackendDestroyDescriptor(d_);
      d_ = std::exchange(o.d_, nullptr);
    }
    return *this;
  }
  Handle get() const { return d_; }

 private:
  Handle d_ = nullptr;
};

// Sets up descriptors; the first call cuDNN refuses turns `ok` off, and later calls do nothing.
struct Builder {
  bool ok = true;
  Desc make(cudnnBackendDescriptorType_t type) {
    Desc d(type);
    if (!d.get()) ok = false;
    return d;
  }
  void set(const Desc& d, cudnnBackendAttributeName_t a, cudnnBackendAttributeType_t t, int64_t n,
           const void* v) {
    if (ok && cudnnBackendSetAttribute(d.get(), a, t, n, v) != CUDNN_STATUS_SUCCESS) ok = false;
  }
  void set(const Desc& d, cudnnBackendAttributeName_t a, const Desc& v) {
    Handle h = v.get();
    set(d, a, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &h);
  }
  void finalize(const Desc& d) {
    if (ok && cudnnBackendFinalize(d.get()) != CUDNN_STATUS_SUCCESS) ok = false;
  }
};

// The unique ids of the tensors; virtual ones (f32 intermediates of the epilogue) from kStage on.
enum : int64_t { kX = 1, kW, kB, kR, kY, kStage = 16 };

// A tensor of logical dims (n, c, h, w) stored n, h, w, c (NHWC data; KRSC weights; a bias is
// (1, O, 1, 1)).
Desc tensor(Builder& b, int64_t uid, cudnnDataType_t t, const std::array<int64_t, 4>& dims,
            bool is_virtual) {
  const std::array<int64_t, 4> strides{dims[1] * dims[2] * dims[3], 1, dims[3] * dims[1], dims[1]};
  const int64_t alignment = 16;
  const bool v = is_virtual;
  Desc d = b.make(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  b.set(d, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &t);
  b.set(d, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data());
  b.set(d, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data());
  b.set(d, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
  b.set(d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment);
  b.set(d, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &v);
  b.finalize(d);
  return d;
}

// y = mode(x, operand); the pointwise descriptor goes to `parts`, which keeps it alive.
Desc pointwise_op(Builder& b, std::deque<Desc>& parts, cudnnPointwiseMode_t mode, const Desc& x,
                  const Desc* operand, const Desc& y) {
  const cudnnDataType_t precision = CUDNN_DATA_FLOAT;
  Desc& pw = parts.emplace_back(b.make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR));
  b.set(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
  b.set(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &precision);
  b.finalize(pw);
  Desc op = b.make(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
  b.set(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw);
  b.set(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x);
  if (operand) b.set(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, *operand);
  b.set(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y);
  b.finalize(op);
  return op;
}

}  // namespace

// An operation graph with every descriptor it refers to, shared by its plans.
struct OpGraph {
  std::deque<Desc> parts;  // tensors and operations (a deque: references stay valid)
  Desc graph;
  bool fused = false;
  std::vector<int64_t> uids;  // of the buffers an execution binds
};

struct GraphConvPlan::Impl {
  std::shared_ptr<const OpGraph> graph;
  std::vector<Desc> parts;  // the engine configuration the plan was made from, and its parts
  Desc plan;
  size_t workspace = 0;
  int64_t engine = -1;
  std::vector<GraphKnob> knobs;
};

GraphConvPlan::GraphConvPlan(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GraphConvPlan::~GraphConvPlan() = default;
size_t GraphConvPlan::workspace() const { return impl_->workspace; }
bool GraphConvPlan::fused() const { return impl_->graph->fused; }
int64_t GraphConvPlan::engine() const { return impl_->engine; }
const std::vector<GraphKnob>& GraphConvPlan::knobs() const { return impl_->knobs; }
std::string GraphConvPlan::name() const {
  return fmt::format("engine {}{}", impl_->engine, fused() ? " (fused)" : "");
}

bool GraphConvPlan::execute(cudnnHandle_t h, const GraphConvArgs& a, void* workspace) const {
  const OpGraph& g = *impl_->graph;
  std::vector<void*> pointers;
  for (int64_t uid : g.uids)
    pointers.push_back(uid == kX   ? const_cast<void*>(a.x)
                       : uid == kW ? const_cast<void*>(a.w)
                       : uid == kB ? const_cast<void*>(a.bias)
                       : uid == kR ? const_cast<void*>(a.residual)
                                   : a.y);
  Builder b;
  Desc pack = b.make(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  const auto n = static_cast<int64_t>(g.uids.size());
  b.set(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, g.uids.data());
  b.set(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, pointers.data());
  b.set(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
  b.finalize(pack);
  return b.ok && cudnnBackendExecute(h, impl_->plan.get(), pack.get()) == CUDNN_STATUS_SUCCESS;
}

namespace {

// f16 and bf16, and f32 where TF32 is allowed (the caller's business: every f32 engine may run)
bool graph_dtype(DType t) { return t == DType::f16 || t == DType::bf16 || t == DType::f32; }

// The convolution of p, with the epilogue when `fused`; null when cuDNN refuses the graph.
std::shared_ptr<const OpGraph> build_graph(cudnnHandle_t h, const GraphConvProblem& p, bool fused) {
  Builder b;
  auto g = std::make_shared<OpGraph>();
  g->fused = fused;
  const cudnnDataType_t dt = p.t == DType::f16    ? CUDNN_DATA_HALF
                            : p.t == DType::bf16 ? CUDNN_DATA_BFLOAT16
                                                 : CUDNN_DATA_FLOAT;
  auto keep = [&](Desc d) -> const Desc& { return g->parts.emplace_back(std::move(d)); };
  const std::array<int64_t, 4> ydims{p.N, p.O, p.oh, p.ow};
  const Desc& x = keep(tensor(b, kX, dt, {p.N, p.C, p.H, p.W}, false));
  const Desc& w = keep(tensor(b, kW, dt, {p.O, p.C / p.G, p.kh, p.kw}, false));
  const Desc& y = keep(tensor(b, kY, dt, ydims, false));
  g->uids = {kX, kW};

  const cudnnDataType_t sums = CUDNN_DATA_FLOAT;
  const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  const int64_t spatial = 2;
  const Desc& conv = keep(b.make(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR));
  b.set(conv, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &sums);
  b.set(conv, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode);
  b.set(conv, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &spatial);
  b.set(conv, CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, p.dil);
  b.set(conv, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, p.stride);
  b.set(conv, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, p.pad);
  b.set(conv, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, p.pad);
  b.finalize(conv);

  // the stages after the convolution: (mode, operand uid or 0)
  std::vector<std::pair<cudnnPointwiseMode_t, int64_t>> stages;
  if (fused) {
    if (p.bias) stages.emplace_back(CUDNN_POINTWISE_ADD, kB);
    if (p.residual) stages.emplace_back(CUDNN_POINTWISE_ADD, kR);
    if (p.relu) stages.emplace_back(CUDNN_POINTWISE_RELU_FWD, 0);
  }
  int64_t next_virtual = kStage;
  auto intermediate = [&]() -> const Desc& {
    return keep(tensor(b, next_virtual++, CUDNN_DATA_FLOAT, ydims, true));
  };
  const Desc* out = stages.empty() ? &y : &intermediate();
  const float alpha = 1.f, beta = 0.f;
  const Desc& conv_op = keep(b.make(CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR));
  b.set(conv_op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, x);
  b.set(conv_op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, w);
  b.set(conv_op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, *out);
  b.set(conv_op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, conv);
  b.set(conv_op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_TYPE_FLOAT, 1, &alpha);
  b.set(conv_op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA, CUDNN_TYPE_FLOAT, 1, &beta);
  b.finalize(conv_op);
  std::vector<Handle> ops{conv_op.get()};

  for (size_t i = 0; i < stages.size(); ++i) {
    const auto [pw_mode, uid] = stages[i];
    const Desc* operand = nullptr;
    if (uid == kB) operand = &keep(tensor(b, kB, dt, {1, p.O, 1, 1}, false));
    if (uid == kR) operand = &keep(tensor(b, kR, dt, ydims, false));
    if (uid) g->uids.push_back(uid);
    const Desc* stage_out = i + 1 == stages.size() ? &y : &intermediate();
    ops.push_back(keep(pointwise_op(b, g->parts, pw_mode, *out, operand, *stage_out)).get());
    out = stage_out;
  }
  g->uids.push_back(kY);

  g->graph = b.make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  b.set(g->graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
  b.set(g->graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
        static_cast<int64_t>(ops.size()), ops.data());
  b.finalize(g->graph);
  if (!b.ok) return nullptr;
  return g;
}

constexpr int kMaxCompiledPlans = 2;

// Whether the engine of `cfg` may run here; its global index goes to `index`, and whether it
// compiles kernels at run time to `compiles`.
bool usable_engine(Handle cfg, bool runtime_compilation, int64_t* index, bool* compiles) {
  Desc engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  Handle e = engine.get();
  int64_t n = 0;
  if (!e ||
      cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                               &n, &e) != CUDNN_STATUS_SUCCESS)
    return false;
  cudnnBackendBehaviorNote_t behavior[CUDNN_BEHAVIOR_NOTE_TYPE_COUNT];
  if (cudnnBackendGetAttribute(e, CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE, CUDNN_TYPE_BEHAVIOR_NOTE,
                               CUDNN_BEHAVIOR_NOTE_TYPE_COUNT, &n,
                               behavior) == CUDNN_STATUS_SUCCESS)
    for (int64_t i = 0; i < n; ++i)
      if (behavior[i] == CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION) {
        if (!runtime_compilation) return false;
        *compiles = true;
      }
  cudnnBackendNumericalNote_t numerical[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
  if (cudnnBackendGetAttribute(e, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                               CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &n,
                               numerical) == CUDNN_STATUS_SUCCESS)
    for (int64_t i = 0; i < n; ++i)
      if (numerical[i] == CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION) return false;
  *index = -1;
  cudnnBackendGetAttribute(e, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n, index);
  return true;
}

// The knob choices of an engine configuration (empty when cuDNN does not say).
std::vector<GraphKnob> knobs_of(Handle cfg) {
  std::vector<Desc> choices;
  std::vector<Handle> raw;
  for (int i = 0; i < CUDNN_KNOB_TYPE_COUNTS; ++i) {
    raw.push_back(choices.emplace_back(CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR).get());
    if (!raw.back()) return {};
  }
  int64_t n = 0;
  if (cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_KNOB_CHOICES,
                               CUDNN_TYPE_BACKEND_DESCRIPTOR, CUDNN_KNOB_TYPE_COUNTS, &n,
                               raw.data()) != CUDNN_STATUS_SUCCESS)
    return {};
  std::vector<GraphKnob> out;
  for (int64_t i = 0; i < n; ++i) {
    cudnnBackendKnobType_t type{};
    int64_t value = 0, c = 0;
    if (cudnnBackendGetAttribute(raw[i], CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE, CUDNN_TYPE_KNOB_TYPE,
                                 1, &c, &type) != CUDNN_STATUS_SUCCESS ||
        cudnnBackendGetAttribute(raw[i], CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE, CUDNN_TYPE_INT64, 1,
                                 &c, &value) != CUDNN_STATUS_SUCCESS)
      return {};
    out.push_back({static_cast<int64_t>(type), value});
  }
  return out;
}

// The plan of engine configuration parts[0] (the other parts: what it refers to), or null when
// cuDNN refuses it or it needs more than max_workspace bytes.
std::unique_ptr<GraphConvPlan> finalize_plan(cudnnHandle_t h,
                                             const std::shared_ptr<const OpGraph>& g,
                                             std::vector<Desc> parts, int64_t engine,
                                             size_t max_workspace) {
  Builder b;
  Desc plan = b.make(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
  Handle cfg = parts.front().get();
  b.set(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
  b.set(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg);
  b.finalize(plan);
  int64_t workspace = -1, n = 0;
  if (!b.ok || cudnnBackendGetAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                        CUDNN_TYPE_INT64, 1, &n,
                                        &workspace) != CUDNN_STATUS_SUCCESS)
    return nullptr;
  if (workspace < 0 || static_cast<uint64_t>(workspace) > max_workspace) return nullptr;
  auto impl = std::make_unique<GraphConvPlan::Impl>();
  impl->graph = g;
  impl->knobs = knobs_of(cfg);
  impl->parts = std::move(parts);
  impl->plan = std::move(plan);
  impl->workspace = static_cast<size_t>(workspace);
  impl->engine = engine;
  return std::make_unique<GraphConvPlan>(std::move(impl));
}

// Up to `limit` finalized plans of g, in the heuristics' order.
void add_plans(cudnnHandle_t h, const std::shared_ptr<const OpGraph>& g, int limit,
               size_t max_workspace, std::vector<std::unique_ptr<GraphConvPlan>>& out) {
  Builder b;
  Desc heur = b.make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
  b.set(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, g->graph);
  b.set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
  b.finalize(heur);
  int64_t count = 0;
  if (!b.ok || cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                        CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count,
                                        nullptr) != CUDNN_STATUS_SUCCESS)
    return;
  std::vector<Desc> configs;
  std::vector<Handle> raw;
  for (int64_t i = 0; i < count; ++i) {
    raw.push_back(configs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR).get());
    if (!raw.back()) return;
  }
  int64_t got = 0;
  if (count == 0 || cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                             CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got,
                                             raw.data()) != CUDNN_STATUS_SUCCESS)
    return;
  const bool runtime_compilation = env::cudnn_runtime_fusion();
  int taken = 0, compiled = 0;
  for (int64_t i = 0; i < got && taken < limit; ++i) {
    int64_t engine = -1;
    bool compiles = false;
    if (!usable_engine(raw[i], runtime_compilation, &engine, &compiles)) continue;
    // each such plan compiles its kernels when finalized (about a second): two at most
    if (compiles && compiled == kMaxCompiledPlans) continue;
    compiled += compiles;
    std::vector<Desc> parts;
    parts.push_back(std::move(configs[i]));
    auto plan = finalize_plan(h, g, std::move(parts), engine, max_workspace);
    if (!plan) continue;
    out.push_back(std::move(plan));
    ++taken;
  }
}

}  // namespace

std::unique_ptr<GraphConvPlan> graph_conv_plan(cudnnHandle_t h, const GraphConvProblem& p,
                                               bool fused, int64_t engine,
                                               const std::vector<GraphKnob>& knobs,
                                               size_t max_workspace) {
  if (!graph_dtype(p.t) || engine < 0) return nullptr;
  if (fused && !(p.bias || p.residual || p.relu)) return nullptr;
  const auto g = build_graph(h, p, fused);
  if (!g) return nullptr;
  Builder b;
  std::vector<Desc> parts;
  parts.push_back(b.make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
  Desc& engine_desc = parts.emplace_back(b.make(CUDNN_BACKEND_ENGINE_DESCRIPTOR));
  b.set(engine_desc, CUDNN_ATTR_ENGINE_OPERATION_GRAPH, g->graph);
  b.set(engine_desc, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &engine);
  b.finalize(engine_desc);
  std::vector<Handle> choices;
  for (const GraphKnob& k : knobs) {
    Desc& d = parts.emplace_back(b.make(CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR));
    const auto type = static_cast<cudnnBackendKnobType_t>(k.type);
    b.set(d, CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE, CUDNN_TYPE_KNOB_TYPE, 1, &type);
    b.set(d, CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE, CUDNN_TYPE_INT64, 1, &k.value);
    b.finalize(d);
    choices.push_back(d.get());
  }
  const Desc& cfg = parts.front();
  b.set(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, parts[1]);
  if (!choices.empty())
    b.set(cfg, CUDNN_ATTR_ENGINECFG_KNOB_CHOICES, CUDNN_TYPE_BACKEND_DESCRIPTOR,
          static_cast<int64_t>(choices.size()), choices.data());
  b.finalize(cfg);
  if (!b.ok) return nullptr;
  return finalize_plan(h, g, std::move(parts), engine, max_workspace);
}

std::vector<std::unique_ptr<GraphConvPlan>> graph_conv_plans(cudnnHandle_t h,
                                                             const GraphConvProblem& p,
                                                             int per_graph, size_t max_workspace) {
  std::vector<std::unique_ptr<GraphConvPlan>> out;
  if (!graph_dtype(p.t)) return out;
  if (p.bias || p.residual || p.relu)
    if (auto g = build_graph(h, p, true)) add_plans(h, g, per_graph, max_workspace, out);
  if (auto g = build_graph(h, p, false)) add_plans(h, g, per_graph, max_workspace, out);
  return out;
}

}  // namespace kiln::cuda
