// Memory, copies and streams of a non-CPU device kind, provided by its backend (the CUDA backend
// in src/backends/cuda/runtime.cpp; nullptr when kiln is built without it). The core and the
// runtime reach devices only through this interface.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/graph_impl.h"
#include "core/op_id.h"
#include "core/tuning.h"
#include "kiln/array.h"
#include "kiln/device.h"
#include "kiln/kernel.h"

namespace kiln {

/// A kernel call of an executable as a backend sees it for tuning: the op, its attributes (and
/// layout), and the types of its inputs and outputs.
struct KernelCall {
  OpId op{};
  const Attrs* attrs = nullptr;
  std::vector<TensorInfo> inputs, outputs;
  Layout layout = Layout::plain;
};

/// A generated kernel's binary: built for `arch`, named by `key` (a hash of its source and
/// architecture).
struct KernelBinary {
  std::string arch;
  uint64_t key = 0;
  std::vector<char> bytes;
};

/// How the tuning decisions of a process were made.
struct TuningStats {
  int64_t measured = 0;   // by running candidates (cudnnFind...)
  int64_t seeded = 0;     // taken from a package
  int64_t heuristic = 0;  // from the library's heuristics, without running
  // CUDA f16/bf16 channels_last convolutions: problems for which cuDNN's graph API offered plans,
  // and those where one of its plans ran faster than the legacy algorithm and was kept
  int64_t graph_offered = 0;
  int64_t graph_chosen = 0;
  int64_t graph_seeded = 0;  // such problems whose way a package's record gave (no timing)
};

class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;
  /// How many devices of this backend the process sees.
  virtual int device_count() { return 0; }
  /// Device memory for work on `stream` (stream-ordered reuse; nullptr stream: the default one).
  /// Throws OutOfMemory.
  virtual void* allocate(int device, size_t bytes, void* stream) = 0;
  virtual void release(int device, void* ptr) = 0;
  /// Enqueues a copy on `stream`. `dst_host`/`src_host` say which side is host memory (pageable
  /// host memory goes through pinned staging buffers).
  virtual void copy_async(int device, void* dst, bool dst_host, const void* src, bool src_host,
                          size_t bytes, void* stream) = 0;
  /// Enqueues a copy from the device into pinned host memory (allocate_mapped) without waiting.
  virtual void copy_to_pinned_async(int device, void* dst, const void* src, size_t bytes,
                                    void* stream) {
    copy_async(device, dst, true, src, false, bytes, stream);
  }
  virtual void memset_async(int device, void* dst, int value, size_t bytes, void* stream) = 0;
  /// One host-to-device copy of upload_all.
  struct HostUpload {
    void* dst = nullptr;
    const void* src = nullptr;
    size_t bytes = 0;
  };
  /// Copies every upload from (pageable) host memory to the device and waits for them, staging
  /// through pinned buffers from several host threads at once (a package's weights).
  virtual void upload_all(int device, const std::vector<HostUpload>& uploads) {
    for (const auto& u : uploads) copy_async(device, u.dst, false, u.src, true, u.bytes, nullptr);
    synchronize(device, nullptr);
  }
  virtual void* create_stream(int device) = 0;
  virtual void destroy_stream(int device, void* stream) = 0;
  /// Blocks until all work on `stream` has finished; rethrows an asynchronous error as DeviceError.
  virtual void synchronize(int device, void* stream) = 0;
  /// The environment kernels of `device` get when running on `stream`; makes `device` current
  /// on the calling thread.
  virtual KernelEnv kernel_env(int device, void* stream) = 0;
  /// Pinned host memory the device can write directly (zeroed), and its release.
  virtual void* allocate_mapped(size_t bytes) = 0;
  virtual void release_mapped(void* ptr) = 0;
  /// Bytes free on the device and its total memory.
  virtual void memory_info(int device, size_t* free, size_t* total) = 0;
  /// The allocator's figures (kiln::memory_stats) and the release of its cache.
  virtual MemoryStats memory_stats(int device) { return {}; }
  virtual void empty_cache(int device) {}

  // Recorded runs (CUDA graphs): the work the calling thread enqueues on `stream` between
  // begin_capture and end_capture is recorded instead of run, then replayed by launch_graph.
  // Backends without them return false from can_capture.

  virtual bool can_capture() { return false; }
  virtual void begin_capture(int device, void* stream) {}
  /// Ends the recording on `stream` and prepares it for replay. Returns nullptr, with the reason
  /// in `error`, when the recording failed (some call could not be recorded); the stream is
  /// usable again either way.
  virtual void* end_capture(int device, void* stream, std::string* error) { return nullptr; }
  virtual void launch_graph(int device, void* graph, void* stream) {}
  virtual void destroy_graph(int device, void* graph) {}

  // Conditional nodes of recorded runs (CUDA graphs' IF and WHILE nodes): a control op recorded
  // into a run branches and loops on the device, its bodies recorded into the node's body graphs.
  // Every call below is made while `stream` records (begin_capture, or a body's stream).

  /// Whether runs holding control ops can be recorded (conditional nodes exist).
  virtual bool can_record_conditionals() { return false; }
  /// A new condition of the graph `stream` is recording into, false at each launch until set.
  virtual uint64_t create_condition(int device, void* stream) { return 0; }
  /// How a condition is set by the work enqueued on the device (set_condition).
  struct ConditionUpdate {
    /// predicate: condition = *value (a bool) and, with `counter`, no more than max_trips
    /// true evaluations after the first; count: condition = *counter < *value (a trip count of
    /// integer type `count_type`).
    enum Kind { predicate, count } kind = predicate;
    const void* value = nullptr;
    DType count_type = DType::i64;
    /// The loop's device counter (may be null for a predicate): set to 0 when `first`, else
    /// incremented before the condition is evaluated.
    int64_t* counter = nullptr;
    bool first = true;
    /// A predicate that still holds after max_trips evaluations that followed the first ends the
    /// loop and reports the count in `errors` (an error slot, KernelEnv::errors). -1: no limit.
    int64_t max_trips = -1;
    int64_t* errors = nullptr;
    /// A body that runs several steps (kMaxLoopSteps at most). count: the steps of one body run
    /// (`block`; condition = *counter + block <= *value), what each evaluation after the first
    /// adds to the counter (`advance`; 0 resumes the count of an earlier loop), and buffers set
    /// to *counter + 1, *counter + 2, ... (the loop index of each later step of the next run).
    int64_t block = 1;
    int64_t advance = 1;
    std::vector<int64_t*> index;
    /// predicate: the predicates of one body run's steps in order (`value` unused). The steps up
    /// to the first false one count (the counter grows by that many, max_trips applies to each),
    /// copies take the sources of that step, and the condition holds when all are true.
    std::vector<const bool*> steps;
  };
  static constexpr int kMaxLoopSteps = 16;
  /// A device-to-device copy of set_condition: from `src`, or with ConditionUpdate::steps from
  /// by_step[s] where s is the last step that counts.
  struct DeviceCopy {
    void* dst = nullptr;
    const void* src = nullptr;
    size_t bytes = 0;
    std::vector<const void*> by_step;
  };
  /// Enqueues on `stream` the evaluation of condition `handle`, in one kernel with `copies` (a
  /// loop's results into its carried values; none may write what the condition reads).
  virtual void set_condition(int device, void* stream, uint64_t handle, const ConditionUpdate& u,
                             const std::vector<DeviceCopy>& copies = {}) {}
  /// Adds to the recording on `stream`, after the work recorded so far, a node that runs its
  /// bodies while (`loop`) or if `handle` holds: one body for a loop, two for an if (the second
  /// runs when it does not hold). Returns the bodies' graphs; the stream's next work follows
  /// the node.
  virtual std::vector<void*> add_conditional(int device, void* stream, uint64_t handle, bool loop,
                                             int bodies) {
    return {};
  }
  /// A stream recording into `body` (a graph add_conditional returned), and its end.
  virtual void* begin_body(int device, void* body) { return nullptr; }
  virtual void end_body(int device, void* stream) {}

  // Timing events (KILN_STEP_TIMES=device, the profiler): recorded on a stream without waiting;
  // the device time between two of them once both have completed.
  virtual void* create_timing_event(int device) { return nullptr; }
  virtual void record_event(int device, void* event, void* stream) {}
  virtual double elapsed_ms(int device, void* start, void* end) { return 0; }
  virtual void destroy_event(int device, void* event) {}
  /// Named ranges for external tools (NVTX on CUDA, so Nsight shows kiln's ops): pushed and
  /// popped on the calling thread while the profiler is on.
  virtual void range_push(const char* name) {}
  virtual void range_pop() {}

  // Ordering between streams and with the host (Event, Queue): an event without timing, recorded
  // on a stream with record_event and destroyed with destroy_event; a stream made to wait for the
  // work before an event's last record.
  virtual void* create_sync_event(int device) { return nullptr; }
  virtual void stream_wait_event(int device, void* stream, void* event) {}
  /// An event whose host waits sleep instead of spinning (recorded with record_event), and the
  /// host wait for its last record.
  virtual void* create_blocking_event(int device) { return nullptr; }
  virtual void host_wait_event(int device, void* event) {}

  // Tuning decisions (library algorithms chosen per problem, e.g. by measuring on a first run),
  // so that a package can carry them (src/core/tuning.h). Backends without any keep the defaults.

  /// What decisions made on `device` hold for (its name, architecture, library versions).
  virtual TuningIdentity tuning_identity(int device) { return {}; }
  /// The decisions made so far on `device` for the problems of `calls` (the executable's steps on
  /// this backend). Measures nothing: problems not run yet are absent.
  virtual std::vector<TuningRecord> export_tuning(int device,
                                                  const std::vector<KernelCall>& calls) {
    return {};
  }
  /// Seeds the decisions of `device` with `records` (of a matching identity), so that their
  /// problems are not measured again; decisions already made are kept, records of unknown kinds
  /// are skipped. Returns why a record is invalid ("record 3: ..."; nothing is seeded then), or
  /// an empty string. `seeded` counts the records taken.
  virtual std::string import_tuning(int device, const std::vector<TuningRecord>& records,
                                    size_t* seeded) {
    if (seeded) *seeded = 0;
    return {};
  }
  /// Counts of the decisions this process made, for tests and benchmarks.
  virtual TuningStats tuning_stats() { return {}; }
  /// Forgets every decision and seed (tests and benchmarks: the next run measures again).
  virtual void clear_tuning() {}

  // Device code kiln generated (fused elementwise kernels), so that a package can carry it.

  /// The binaries of the generated kernels that `calls` run on `device`, compiling any not
  /// compiled yet; `arch` names what each runs on (e.g. "sm_90"), `key` names its source.
  virtual std::vector<KernelBinary> export_kernels(int device,
                                                   const std::vector<KernelCall>& calls) {
    return {};
  }
  /// Offers binaries to `device`: those built for its architecture are used instead of compiling
  /// their source again (a binary the driver rejects is compiled afresh); others are skipped.
  /// Returns how many were taken.
  virtual size_t import_kernels(int device, const std::vector<KernelBinary>& binaries) {
    return 0;
  }
  /// Forgets every generated kernel, compiled or imported (tests and benchmarks: the next run
  /// starts as a new process would). Not while a run is in flight.
  virtual void forget_kernels() {}
  /// How many kernels the process has compiled from source (tests and benchmarks).
  virtual int64_t kernels_compiled() { return 0; }
};

/// Moves the bytes of `storage` to `device` in place (every Array sharing it follows): how a
/// graph's variables follow the executables that use them. No-op when already there.
void move_storage(Storage& storage, Device device);

/// The CUDA backend's device interface; nullptr without CUDA (device_backend names it).
DeviceBackend* cuda_backend();
/// The kernel table that executables compiled for `device` dispatch to.
inline Backend backend_for(Device device) {
  return device.kind == Device::Kind::cpu ? Backend::cpu : Backend::cuda;
}
/// The device interface of backend `b`: nullptr for the CPU (its kernels run on the host) and for
/// a backend this build or machine lacks.
DeviceBackend* device_backend(Backend b);
/// The device interface of `device`, or nullptr for the CPU. Throws UnsupportedError when the
/// device does not exist in this build or on this machine.
DeviceBackend* backend_of(Device device);

}  // namespace kiln
