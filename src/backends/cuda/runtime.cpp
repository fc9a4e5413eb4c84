// The CUDA backend's DeviceBackend: caching allocators, streams, and host<->device copies through
// pinned staging buffers.
#include <cuda_runtime.h>
#include <fmt/format.h>
#include <nvtx3/nvToolsExt.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "backends/cuda/allocator.h"
#include "backends/cuda/control_nodes.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/fused_elementwise.h"
#include "backends/cuda/tuning.h"
#include "core/device_backend.h"
#include "core/errors.h"
#include "runtime/thread_pool.h"

namespace kiln::cuda {

namespace {
constexpr size_t kStagingChunk = size_t{8} << 20;  // bytes per pinned staging buffer
constexpr size_t kMaxStaging = 8;                  // buffers per device

class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    KILN_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device) KILN_CUDA_CHECK(cudaSetDevice(device));
  }
  ~DeviceScope() { cudaSetDevice(previous_); }

 private:
  int previous_ = 0;
};

// Pinned host buffers for copies from pageable memory: the host copies into a free buffer, the
// device copies from it asynchronously, and an event says when the buffer may be refilled.
class StagingPool {
 public:
  ~StagingPool() {
    for (auto& b : buffers_) {
      cudaEventSynchronize(b.done);
      cudaEventDestroy(b.done);
      cudaFreeHost(b.ptr);
    }
  }
  // Copies `bytes` (≤ kStagingChunk) from host `src` to device `dst` on `stream`.
  void upload(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
    std::lock_guard<std::mutex> l(mu_);
    Buffer& b = acquire_locked();
    std::memcpy(b.ptr, src, bytes);
    KILN_CUDA_CHECK(cudaMemcpyAsync(dst, b.ptr, bytes, cudaMemcpyHostToDevice, stream));
    KILN_CUDA_CHECK(cudaEventRecord(b.done, stream));
  }

 private:
  struct Buffer {
    void* ptr = nullptr;
    cudaEvent_t done = nullptr;
  };
  Buffer& acquire_locked() {
    for (auto& b : buffers_)
      if (cudaEventQuery(b.done) == cudaSuccess) return b;
    cudaGetLastError();  // cudaErrorNotReady is not an error
    if (buffers_.size() < kMaxStaging) {
      Buffer b;
      KILN_CUDA_CHECK(cudaHostAlloc(&b.ptr, kStagingChunk, cudaHostAllocDefault));
      KILN_CUDA_CHECK(cudaEventCreateWithFlags(&b.done, cudaEventDisableTiming));
      buffers_.push_back(b);
      return buffers_.back();
    }
    // every buffer is in flight: wait for the oldest one (round robin)
    Buffer& b = buffers_[next_++ % buffers_.size()];
    KILN_CUDA_CHECK(cudaEventSynchronize(b.done));
    return b;
  }
  std::mutex mu_;
  std::vector<Buffer> buffers_;
  size_t next_ = 0;
};

// Upload lanes of upload_all: each has a stream and two pinned buffers, filled by one host thread
// while the other is in flight.
constexpr size_t kLaneChunk = size_t{2} << 20;
constexpr int kMaxLanes = 8;
struct UploadLanes {
  struct Lane {
    cudaStream_t stream = nullptr;
    void* buf[2] = {nullptr, nullptr};
    cudaEvent_t done[2] = {nullptr, nullptr};
  };
  std::mutex mu;  // one upload_all at a time per device
  std::vector<Lane> lanes;
  ~UploadLanes() {
    for (auto& l : lanes) {
      if (l.stream) cudaStreamSynchronize(l.stream), cudaStreamDestroy(l.stream);
      for (int k = 0; k < 2; ++k) {
        if (l.done[k]) cudaEventDestroy(l.done[k]);
        if (l.buf[k]) cudaFreeHost(l.buf[k]);
      }
    }
  }
  void ensure(int n) {
    while (static_cast<int>(lanes.size()) < n) {
      Lane l;
      KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&l.stream, cudaStreamNonBlocking));
      for (int k = 0; k < 2; ++k) {
        KILN_CUDA_CHECK(cudaHostAlloc(&l.buf[k], kLaneChunk, cudaHostAllocDefault));
        KILN_CUDA_CHECK(cudaEventCreateWithFlags(&l.done[k], cudaEventDisableTiming));
      }
      lanes.push_back(l);
    }
  }
};

struct PerDevice {
  std::unique_ptr<CachingAllocator> allocator;
  std::unique_ptr<StagingPool> staging;
  std::unique_ptr<UploadLanes> lanes;
};

class CudaBackend final : public DeviceBackend {
 public:
  CudaBackend() : devices_(static_cast<size_t>(cuda_device_count())) {}

  int device_count() override { return static_cast<int>(devices_.size()); }

  PerDevice& dev(int device) {
    if (device < 0 || device >= static_cast<int>(devices_.size()))
      fail<UnsupportedError>("[cuda] no device cuda:{} ({} CUDA devices visible)", device,
                             devices_.size());
    std::lock_guard<std::mutex> l(mu_);
    PerDevice& d = devices_[device];
    if (!d.allocator) {
      d.allocator = std::make_unique<CachingAllocator>(device);
      d.staging = std::make_unique<StagingPool>();
      d.lanes = std::make_unique<UploadLanes>();
    }
    return d;
  }

  void* allocate(int device, size_t bytes, void* stream) override {
    return dev(device).allocator->allocate(bytes, static_cast<cudaStream_t>(stream));
  }
  void release(int device, void* ptr) override { dev(device).allocator->release(ptr); }

  void copy_async(int device, void* dst, bool dst_host, const void* src, bool src_host,
                  size_t bytes, void* stream) override {
    if (bytes == 0) return;
    DeviceScope g(device);
    auto s = static_cast<cudaStream_t>(stream);
    if (src_host && !dst_host) {
      StagingPool& pool = *dev(device).staging;
      for (size_t off = 0; off < bytes; off += kStagingChunk)
        pool.upload(static_cast<char*>(dst) + off, static_cast<const char*>(src) + off,
                    std::min(kStagingChunk, bytes - off), s);
      return;
    }
    if (dst_host && !src_host) {
      // into pageable memory the copy completes before it returns
      KILN_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s));
      KILN_CUDA_CHECK(cudaStreamSynchronize(s));
      return;
    }
    KILN_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s));
  }

  void upload_all(int device, const std::vector<HostUpload>& uploads) override {
    struct Chunk {
      char* dst;
      const char* src;
      size_t bytes;
    };
    std::vector<Chunk> chunks;
    size_t total = 0;
    for (const auto& u : uploads)
      for (size_t off = 0; off < u.bytes; off += kLaneChunk) {
        chunks.push_back({static_cast<char*>(u.dst) + off, static_cast<const char*>(u.src) + off,
                          std::min(kLaneChunk, u.bytes - off)});
        total += chunks.back().bytes;
      }
    if (chunks.empty()) return;
    DeviceScope g(device);
    // the lanes' streams do not wait for the default stream, where the destinations were allocated
    KILN_CUDA_CHECK(cudaStreamSynchronize(nullptr));
    UploadLanes& lanes = *dev(device).lanes;
    std::lock_guard<std::mutex> l(lanes.mu);
    ThreadPool& pool = ThreadPool::global();
    const int n = static_cast<int>(
        std::clamp<size_t>(total / (4 * kLaneChunk), 1, std::min(kMaxLanes, pool.size())));
    lanes.ensure(n);
    std::atomic<size_t> next{0};
    pool.parallel_for(n, 1, [&](int64_t begin, int64_t end) {
      KILN_CUDA_CHECK(cudaSetDevice(device));
      for (int64_t k = begin; k < end; ++k) {
        UploadLanes::Lane& lane = lanes.lanes[k];
        int turn = 0;
        for (size_t i; (i = next.fetch_add(1)) < chunks.size(); turn ^= 1) {
          // the buffer's previous transfer must be done before it is refilled
          KILN_CUDA_CHECK(cudaEventSynchronize(lane.done[turn]));
          std::memcpy(lane.buf[turn], chunks[i].src, chunks[i].bytes);
          KILN_CUDA_CHECK(cudaMemcpyAsync(chunks[i].dst, lane.buf[turn], chunks[i].bytes,
                                          cudaMemcpyHostToDevice, lane.stream));
          KILN_CUDA_CHECK(cudaEventRecord(lane.done[turn], lane.stream));
        }
        KILN_CUDA_CHECK(cudaStreamSynchronize(lane.stream));
      }
    });
  }

  void copy_to_pinned_async(int device, void* dst, const void* src, size_t bytes,
                            void* stream) override {
    if (bytes == 0) return;
    DeviceScope g(device);
    KILN_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost,
                                    static_cast<cudaStream_t>(stream)));
  }
  void memset_async(int device, void* dst, int value, size_t bytes, void* stream) override {
    DeviceScope g(device);
    KILN_CUDA_CHECK(cudaMemsetAsync(dst, value, bytes, static_cast<cudaStream_t>(stream)));
  }

  void* create_stream(int device) override {
    dev(device);
    DeviceScope g(device);
    cudaStream_t s = nullptr;
    KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    return s;
  }
  void destroy_stream(int device, void* stream) override {
    DeviceScope g(device);
    cudaStreamSynchronize(static_cast<cudaStream_t>(stream));
    cudaStreamDestroy(static_cast<cudaStream_t>(stream));
  }
  void synchronize(int device, void* stream) override {
    DeviceScope g(device);
    KILN_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
  }
  KernelEnv kernel_env(int device, void* stream) override {
    // the run's thread launches every kernel (and library call) on this device
    KILN_CUDA_CHECK(cudaSetDevice(device));
    KernelEnv e;
    e.device = device;
    e.stream = stream;
    e.allocate = [](void*, int d, size_t bytes, void* s) { return cuda_backend()->allocate(d, bytes, s); };
    e.release = [](void*, int d, void* p) { cuda_backend()->release(d, p); };
    return e;
  }
  void* allocate_mapped(size_t bytes) override {
    void* p = nullptr;
    KILN_CUDA_CHECK(cudaHostAlloc(&p, std::max<size_t>(bytes, 16), cudaHostAllocMapped));
    std::memset(p, 0, std::max<size_t>(bytes, 16));
    return p;
  }
  void release_mapped(void* ptr) override { cudaFreeHost(ptr); }
  void memory_info(int device, size_t* free, size_t* total) override {
    DeviceScope g(device);
    KILN_CUDA_CHECK(cudaMemGetInfo(free, total));
  }
  bool can_capture() override { return true; }
  void begin_capture(int device, void* stream) override {
    DeviceScope g(device);
    // relaxed: the caching allocator may call cudaMalloc while a run is recorded
    KILN_CUDA_CHECK(
        cudaStreamBeginCapture(static_cast<cudaStream_t>(stream), cudaStreamCaptureModeRelaxed));
  }
  void* end_capture(int device, void* stream, std::string* error) override {
    DeviceScope g(device);
    cudaGraph_t graph = nullptr;
    cudaError_t e = cudaStreamEndCapture(static_cast<cudaStream_t>(stream), &graph);
    cudaGetLastError();  // a failed recording is reported here, not left behind
    if (e != cudaSuccess || !graph) {
      if (error) *error = fmt::format("recording the run failed: {}", cudaGetErrorString(e));
      if (graph) cudaGraphDestroy(graph);
      return nullptr;
    }
    cudaGraphExec_t exec = nullptr;
    e = cudaGraphInstantiateWithFlags(&exec, graph, 0);
    cudaGraphDestroy(graph);
    if (e != cudaSuccess) {
      cudaGetLastError();
      if (error) *error = fmt::format("preparing the recorded run failed: {}", cudaGetErrorString(e));
      return nullptr;
    }
    return exec;
  }
  void launch_graph(int device, void* graph, void* stream) override {
    DeviceScope g(device);
    const auto exec = static_cast<cudaGraphExec_t>(graph);
    const auto s = static_cast<cudaStream_t>(stream);
    // A graph's first launch uploads it to the device, which needs memory: when another process
    // holds it all, the cache is returned and the launch tried once more, as allocations are.
    cudaError_t e = cudaGraphLaunch(exec, s);
    if (e == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      dev(device).allocator->empty_cache();
      e = cudaGraphLaunch(exec, s);
    }
    if (e != cudaSuccess) throw_cuda_error(e, "cudaGraphLaunch", __FILE__, __LINE__);
  }
  void destroy_graph(int device, void* graph) override {
    DeviceScope g(device);
    cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(graph));
  }
  bool can_record_conditionals() override { return true; }
  uint64_t create_condition(int device, void* stream) override {
    DeviceScope g(device);
    return cuda::create_condition(static_cast<cudaStream_t>(stream));
  }
  void set_condition(int device, void* stream, uint64_t handle, const ConditionUpdate& u,
                     const std::vector<DeviceCopy>& copies) override {
    DeviceScope g(device);
    cuda::set_condition(static_cast<cudaStream_t>(stream), handle, u, copies);
  }
  std::vector<void*> add_conditional(int device, void* stream, uint64_t handle, bool loop,
                                     int bodies) override {
    DeviceScope g(device);
    return cuda::add_conditional(static_cast<cudaStream_t>(stream), handle, loop, bodies);
  }
  void* begin_body(int device, void* body) override {
    DeviceScope g(device);
    return cuda::begin_body(device, static_cast<cudaGraph_t>(body));
  }
  void end_body(int device, void* stream) override {
    DeviceScope g(device);
    cuda::end_body(device, static_cast<cudaStream_t>(stream));
  }
  void* create_timing_event(int device) override {
    DeviceScope g(device);
    cudaEvent_t e = nullptr;
    KILN_CUDA_CHECK(cudaEventCreate(&e));
    return e;
  }
  void record_event(int device, void* event, void* stream) override {
    KILN_CUDA_CHECK(
        cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream)));
  }
  double elapsed_ms(int device, void* start, void* end) override {
    float ms = 0;
    KILN_CUDA_CHECK(
        cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start), static_cast<cudaEvent_t>(end)));
    return ms;
  }
  void destroy_event(int device, void* event) override {
    cudaEventDestroy(static_cast<cudaEvent_t>(event));
  }
  // NVTX ranges: free when no tool (Nsight Systems, ncu) is attached
  void range_push(const char* name) override { nvtxRangePushA(name); }
  void range_pop() override { nvtxRangePop(); }
  void* create_sync_event(int device) override {
    DeviceScope g(device);
    cudaEvent_t e = nullptr;
    KILN_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
  }
  void stream_wait_event(int device, void* stream, void* event) override {
    DeviceScope g(device);
    KILN_CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream),
                                        static_cast<cudaEvent_t>(event), 0));
  }
  void* create_blocking_event(int device) override {
    DeviceScope g(device);
    cudaEvent_t e = nullptr;
    KILN_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming | cudaEventBlockingSync));
    return e;
  }
  void host_wait_event(int device, void* event) override {
    KILN_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(event)));
  }
  TuningIdentity tuning_identity(int device) override {
    dev(device);
    return conv_tuning_identity(device);
  }
  std::vector<TuningRecord> export_tuning(int device,
                                          const std::vector<KernelCall>& calls) override {
    return export_conv_tuning(device, calls);
  }
  std::string import_tuning(int device, const std::vector<TuningRecord>& records,
                            size_t* seeded) override {
    return import_conv_tuning(device, records, seeded);
  }
  TuningStats tuning_stats() override { return conv_tuning_stats(); }
  void clear_tuning() override { clear_conv_tuning(); }
  std::vector<KernelBinary> export_kernels(int device,
                                           const std::vector<KernelCall>& calls) override {
    DeviceScope g(device);
    return export_fused_kernels(device, calls);
  }
  size_t import_kernels(int device, const std::vector<KernelBinary>& binaries) override {
    return import_fused_kernels(device, binaries);
  }
  void forget_kernels() override { forget_fused_kernels(); }
  int64_t kernels_compiled() override { return fused_kernels_compiled(); }
  MemoryStats memory_stats(int device) override {
    const AllocatorStats a = dev(device).allocator->stats();
    return {a.allocated_bytes, a.reserved_bytes,  a.peak_allocated_bytes,
            a.allocations,     a.device_mallocs,  a.cache_flushes};
  }
  void empty_cache(int device) override { dev(device).allocator->empty_cache(); }

 private:
  std::mutex mu_;
  std::vector<PerDevice> devices_;
};
}  // namespace

}  // namespace kiln::cuda

namespace kiln {

DeviceBackend* cuda_backend() {
  if (cuda_device_count() == 0) return nullptr;
  static cuda::CudaBackend backend;
  return &backend;
}

}  // namespace kiln
