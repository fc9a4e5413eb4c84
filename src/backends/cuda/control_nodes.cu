// Conditional nodes of CUDA graphs for recorded control ops (src/runtime/control_recorded.cpp):
// conditions created in the recording's graph, the kernel that sets one from a value on the
// device, the IF and WHILE nodes, and streams that record into their bodies.
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>

#include "backends/cuda/control_nodes.h"
#include "backends/cuda/cuda_check.h"
#include "core/errors.h"

namespace kiln::cuda {

namespace {

// The graph `stream` is recording into, and the nodes its next work depends on.
struct CaptureState {
  cudaGraph_t graph = nullptr;
  const cudaGraphNode_t* deps = nullptr;
  const cudaGraphEdgeData* edges = nullptr;
  size_t num_deps = 0;
};

CaptureState capture_state(cudaStream_t stream) {
  CaptureState c;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  KILN_CUDA_CHECK(
      cudaStreamGetCaptureInfo(stream, &status, nullptr, &c.graph, &c.deps, &c.edges, &c.num_deps));
  if (status != cudaStreamCaptureStatusActive || !c.graph)
    fail<DeviceError>("[cuda] a conditional node needs a stream that is recording");
  return c;
}

constexpr int kMaxSteps = DeviceBackend::kMaxLoopSteps;

// The condition's arguments (see DeviceBackend::ConditionUpdate).
struct Condition {
  cudaGraphConditionalHandle handle;
  bool count;
  const void* value;
  DType count_type;
  int64_t* counter;
  bool first;
  int64_t max_trips;
  int64_t* errors;
  int64_t block;
  int64_t advance;
  int64_t* index[kMaxSteps];
  int num_index;
  const bool* steps[kMaxSteps];
  int num_steps;
};

// Copies made with the condition: up to kMaxCopies a launch, each from one source per step.
constexpr int kMaxCopies = 8;
struct Copies {
  char* dst[kMaxCopies];
  const char* src[kMaxCopies][kMaxSteps];
  size_t bytes[kMaxCopies];
  int n;
};

// How many of a body run's steps count (ConditionUpdate::steps): those up to the first false
// predicate; all of them when every one holds (then *all).
__device__ int steps_taken(const Condition& c, bool* all) {
  int t = 0;
  while (t < c.num_steps && *c.steps[t]) ++t;
  *all = t == c.num_steps;
  return t;
}

__device__ void evaluate(const Condition& c) {
  bool all = true;
  const int held = c.num_steps ? steps_taken(c, &all) : 0;  // leading true predicates
  int64_t trips = 0;
  if (c.counter) {
    if (c.first) trips = 0;
    else if (c.num_steps) trips = *c.counter + (all ? held : held + 1);
    else trips = *c.counter + c.advance;
    *c.counter = trips;
    for (int k = 0; k < c.num_index; ++k) *c.index[k] = trips + k + 1;
  }
  bool go;
  if (c.count) {
    int64_t n = 0;
    switch (c.count_type) {
      case DType::i8:
        n = *static_cast<const int8_t*>(c.value);
        break;
      case DType::u8:
        n = *static_cast<const uint8_t*>(c.value);
        break;
      case DType::i16:
        n = *static_cast<const int16_t*>(c.value);
        break;
      case DType::i32:
        n = *static_cast<const int32_t*>(c.value);
        break;
      case DType::u16:
        n = *static_cast<const uint16_t*>(c.value);
        break;
      case DType::u32:
        n = *static_cast<const uint32_t*>(c.value);
        break;
      case DType::u64: {  // (a count past INT64_MAX runs as long as INT64_MAX would)
        const uint64_t u = *static_cast<const uint64_t*>(c.value);
        n = u > static_cast<uint64_t>(INT64_MAX) ? INT64_MAX : static_cast<int64_t>(u);
        break;
      }
      default:
        n = *static_cast<const int64_t*>(c.value);
        break;
    }
    go = trips + c.block <= n;
  } else {
    go = c.num_steps ? all : *static_cast<const bool*>(c.value);
    // the trips when the last true predicate was evaluated
    const bool held_once = c.num_steps ? held > 0 : go;
    const int64_t at = c.num_steps && !all ? trips - 1 : trips;
    if (held_once && c.counter && c.max_trips >= 0 && at >= c.max_trips) {
      go = false;
      if (c.errors) {  // position 0, the value max_trips (the error slot's packing)
        c.errors[0] = c.max_trips < 0x80000000ll ? c.max_trips : 0x80000000ll;
        c.errors[1] = c.max_trips;
      }
    }
  }
  cudaGraphSetConditional(c.handle, go ? 1u : 0u);
}

// The copies over the whole grid (16 bytes a thread where both ends are aligned), and the
// condition by the first thread (it reads nothing the copies write). With no condition
// (evaluate false), copies only.
__global__ void set_condition_kernel(Condition c, Copies copies, bool set) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t tid = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (set && tid == 0) evaluate(c);
  // the step whose results the copies take: the last that counts
  int step = 0;
  if (c.num_steps) {
    bool all = true;
    step = steps_taken(c, &all);
    if (all) step = c.num_steps - 1;
  }
  for (int k = 0; k < copies.n; ++k) {
    char* dst = copies.dst[k];
    const char* src = copies.src[k][step];
    const size_t bytes = copies.bytes[k];
    size_t done = 0;
    if (((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) & 15) == 0) {
      const size_t vecs = bytes / 16;
      for (size_t i = tid; i < vecs; i += stride)
        reinterpret_cast<uint4*>(dst)[i] = reinterpret_cast<const uint4*>(src)[i];
      done = vecs * 16;
    }
    for (size_t i = done + tid; i < bytes; i += stride) dst[i] = src[i];
  }
}

struct BodyStreams {
  std::mutex mu;
  std::map<int, std::vector<cudaStream_t>> free;
};
BodyStreams& body_streams() {
  static BodyStreams* s = new BodyStreams;  // outlives every recording
  return *s;
}

}  // namespace

uint64_t create_condition(cudaStream_t stream) {
  const CaptureState c = capture_state(stream);
  cudaGraphConditionalHandle h = 0;
  KILN_CUDA_CHECK(cudaGraphConditionalHandleCreate(&h, c.graph, 0, cudaGraphCondAssignDefault));
  return h;
}

void set_condition(cudaStream_t stream, uint64_t handle, const DeviceBackend::ConditionUpdate& u,
                   const std::vector<DeviceBackend::DeviceCopy>& copies) {
  using U = DeviceBackend::ConditionUpdate;
  if (u.kind == U::count && !is_integer(u.count_type))
    fail<DTypeError>("[cuda] a trip count must be an integer, got {}", name(u.count_type));
  if (u.index.size() > static_cast<size_t>(kMaxSteps) ||
      u.steps.size() > static_cast<size_t>(kMaxSteps))
    fail<ValueError>("[cuda] a loop body of more than {} steps", kMaxSteps);
  Condition c{handle,      u.kind == U::count,
              u.value,     u.count_type,
              u.counter,   u.first,
              u.max_trips, u.errors,
              u.block,     u.advance,
              {},          0,
              {},          0};
  for (int64_t* p : u.index) c.index[c.num_index++] = p;
  for (const bool* p : u.steps) c.steps[c.num_steps++] = p;
  // copies in launches of kMaxCopies; the condition with the last
  size_t k = 0;
  do {
    Copies batch{};
    size_t largest = 0;
    for (; k < copies.size() && batch.n < kMaxCopies; ++k) {
      if (!copies[k].bytes) continue;
      const auto& by_step = copies[k].by_step;
      if (!by_step.empty() && by_step.size() != u.steps.size())
        fail<ValueError>("[cuda] a copy has {} sources for {} steps", by_step.size(),
                         u.steps.size());
      batch.dst[batch.n] = static_cast<char*>(copies[k].dst);
      for (int j = 0; j < kMaxSteps; ++j)
        batch.src[batch.n][j] = static_cast<const char*>(
            by_step.empty() ? copies[k].src : by_step[std::min<size_t>(j, by_step.size() - 1)]);
      batch.bytes[batch.n++] = copies[k].bytes;
      largest = std::max(largest, copies[k].bytes);
    }
    const bool last = k >= copies.size();
    constexpr int kThreads = 256;
    const size_t per_block = kThreads * 16 * 4;  // about 4 vectors a thread
    const int blocks =
        static_cast<int>(std::clamp<size_t>((largest + per_block - 1) / per_block, 1, 1024));
    set_condition_kernel<<<blocks, kThreads, 0, stream>>>(c, batch, last);
    KILN_CUDA_CHECK(cudaGetLastError());
  } while (k < copies.size());
}

std::vector<void*> add_conditional(cudaStream_t stream, uint64_t handle, bool loop, int bodies) {
  const CaptureState c = capture_state(stream);
  cudaGraphNodeParams params{};
  params.type = cudaGraphNodeTypeConditional;
  params.conditional.handle = handle;
  params.conditional.type = loop ? cudaGraphCondTypeWhile : cudaGraphCondTypeIf;
  params.conditional.size = static_cast<unsigned>(bodies);
  cudaGraphNode_t node = nullptr;
  KILN_CUDA_CHECK(cudaGraphAddNode(&node, c.graph, c.deps, c.edges, c.num_deps, &params));
  KILN_CUDA_CHECK(cudaStreamUpdateCaptureDependencies(stream, &node, nullptr, 1,
                                                      cudaStreamSetCaptureDependencies));
  std::vector<void*> out;
  for (int k = 0; k < bodies; ++k) out.push_back(params.conditional.phGraph_out[k]);
  return out;
}

cudaStream_t begin_body(int device, cudaGraph_t body) {
  BodyStreams& p = body_streams();
  cudaStream_t s = nullptr;
  {
    std::lock_guard<std::mutex> l(p.mu);
    auto& free = p.free[device];
    if (!free.empty()) {
      s = free.back();
      free.pop_back();
    }
  }
  if (!s) KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const cudaError_t e =
      cudaStreamBeginCaptureToGraph(s, body, nullptr, nullptr, 0, cudaStreamCaptureModeRelaxed);
  if (e != cudaSuccess) {
    std::lock_guard<std::mutex> l(p.mu);
    p.free[device].push_back(s);
    throw_cuda_error(e, "cudaStreamBeginCaptureToGraph", __FILE__, __LINE__);
  }
  return s;
}

void end_body(int device, cudaStream_t stream) {
  cudaGraph_t g = nullptr;
  const cudaError_t e = cudaStreamEndCapture(stream, &g);
  {
    std::lock_guard<std::mutex> l(body_streams().mu);
    body_streams().free[device].push_back(stream);
  }
  if (e != cudaSuccess) throw_cuda_error(e, "cudaStreamEndCapture", __FILE__, __LINE__);
}

}  // namespace kiln::cuda
