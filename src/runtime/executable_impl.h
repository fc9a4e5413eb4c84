// The compiled plan behind an Executable.
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "kiln/executable.h"
#include "kiln/kernel.h"
#include "passes/memory_plan.h"
#include "passes/program.h"
#include "runtime/arena_pool.h"
#include "runtime/thread_pool.h"

namespace kiln {

struct Step {
  int32_t node = -1;
  const KernelEntry* kernel = nullptr;
  /// Where the kernel runs: the executable's backend, or the CPU as a fallback (with copies).
  Backend backend = Backend::cpu;
  /// Why a step of a GPU executable runs on the CPU (empty otherwise).
  std::string fallback_reason;
};

class DeviceBackend;

namespace detail {
class ShapeCache;

struct ExecutableImpl {
  Device device;
  const GraphImpl* source = nullptr;  // the user's graph, to match feeds (none when loaded)
  Program program;
  MemoryPlan plan;
  std::vector<Step> steps;
  std::vector<int32_t> placeholders;  // program node ids
  CompileOptions options;
  ThreadPool* pool = nullptr;
  std::unique_ptr<ThreadPool> own_pool;

  // CPU runs' arenas (concurrent runs each take their own): the executable's, or shared by the
  // specializations of a dynamic executable.
  std::shared_ptr<ArenaPool> arenas = std::make_shared<ArenaPool>();
  std::mutex arena_mu;  // guards the device slots and capture_off

  // GPU executables: the device's backend, the variables to keep on the device, and the
  // (stream, arena) pairs not in use by a run.
  DeviceBackend* backend = nullptr;
  std::vector<int32_t> variables;  // program node ids
  struct Recording;
  struct DeviceSlot {
    int64_t runs = 0;  // finished runs on this slot
    std::shared_ptr<Recording> recording;
    void* stream = nullptr;
    std::shared_ptr<Storage> arena;
    // error slots (KernelEnv::errors): 2 words per step on the device, their copy in pinned
    // host memory, and the host words kernels fill while encoding (3 per step)
    std::shared_ptr<Storage> errors;
    int64_t* errors_host = nullptr;
    std::vector<int64_t> error_info;
  };
  // A run recorded on a slot's stream (CompileOptions::capture): the CUDA graph, the variable
  // pointers it was recorded with, the input and output buffers it reads and writes, and the
  // scratch blocks its kernels use (kept until the recording is dropped). Control ops recorded as
  // conditional nodes add their bodies' buffers (arenas, results, carried values, counters) and
  // the error slots of bodies that report errors (checked after each replay).
  struct Recording {
    DeviceBackend* backend = nullptr;
    int device = 0;
    void* stream = nullptr;  // recorded on (the key of its scratch in the device's allocator)
    void* graph = nullptr;
    std::vector<void*> signature;
    std::vector<Array> feeds;    // by program node id (placeholders)
    std::vector<Array> outputs;  // by returned index
    std::vector<std::pair<size_t, void*>> scratch;
    std::vector<size_t> free_scratch;  // indices into scratch released while recording
    std::vector<Array> buffers;
    // (a deque: a body's slot stays in place while the bodies nested in it add theirs)
    std::deque<std::pair<std::shared_ptr<const ExecutableImpl>, DeviceSlot>> body_errors;
    Recording(DeviceBackend* b, int dev) : backend(b), device(dev) {}
    Recording(const Recording&) = delete;
    Recording& operator=(const Recording&) = delete;
    ~Recording();
  };
  bool reports_errors = false;  // some step's kernel may report rejected inputs
  bool many_shapes = false;     // a dynamic executable's specialization (KernelEnv::many_shapes)
  // KILN_STEP_TIMES: milliseconds and calls per op name, over every run
  std::mutex times_mu;
  std::map<std::string, std::pair<double, int64_t>> step_ms;
  std::vector<DeviceSlot> free_slots;
  // why runs are not recorded (CompileOptions::capture); decided on the first run (under
  // arena_mu): empty when they are
  std::optional<std::string> capture_off;
  std::atomic<int64_t> replays{0};  // runs replayed from a recording
  // loaded from a package: where from, and the names of the returned values (empty: node names)
  std::optional<PackageInfo> package;
  std::vector<std::string> output_names;
  // Dynamic executables (some input dim stays dynamic): the specializations per feed shapes.
  // Such an impl holds the program before any pass (placeholders as declared, constants on the
  // host) and no steps or plan of its own (runtime/shape_cache.h).
  std::shared_ptr<ShapeCache> dynamic;
  ~ExecutableImpl();
};
}  // namespace detail

/// Chooses the backend and kernel of every executed node of `p` for `device` (impl.steps,
/// impl.placeholders). Throws UnsupportedError for a node without a kernel.
void place(const Program& p, Device device, bool strict, detail::ExecutableImpl& impl);
/// Moves `p` into `impl` (impl.device and impl.options set): constants to the device, the list of
/// variables, the thread pool.
void attach_program(detail::ExecutableImpl& impl, Program p);
/// The passes of the compile pipeline whose decisions hold for any sizes of the dims they compare
/// (folding, batch norms, attention, autocast, casts, CSE, DCE, TF32): run once on a symbolic
/// program for all its shapes.
void optimize_for_any_shape(Program& p, const CompileOptions& options, const NodeEvaluator& fold);
/// For a symbolic program that optimize_for_any_shape has seen and that will run on `device`:
/// identity broadcasts dropped and elementwise chains fused (FusePhases::chains), once for all its
/// shapes, where no pass of the per-shape pipeline must see the program first: no convolution
/// (channels_last decides per size), assignment or collective, and on the CPU no product (their
/// epilogues). Returns whether it fused: each specialization then groups only its small values.
bool fuse_for_any_shape(Program& p, const CompileOptions& options, Device device);
/// The rest of the pipeline on a static program that optimize_for_any_shape has seen: layouts,
/// fusion, placement, generated kernels, the memory plan, attaching (`before_attach` as below).
/// `many_shapes`: the executable is a dynamic executable's specialization (KernelEnv::many_shapes);
/// `chains_fused`: fuse_for_any_shape fused its symbolic program.
std::shared_ptr<detail::ExecutableImpl> compile_optimized(
    Program p, Device device, const CompileOptions& options,
    const std::function<void(Program&)>& before_attach, bool many_shapes = false,
    bool chains_fused = false);
/// Runs the compile pipeline on an extracted program whose placeholder shapes `shapes` (by node
/// origin) make static: specialization, the passes, placement, generated kernels, the memory plan.
/// `options` has its environment overrides applied. `before_attach` (may be empty) sees the
/// optimized program before its constants move to the device. `fold` (empty: evaluate_node_cpu)
/// evaluates the nodes constant folding and shape values compute.
std::shared_ptr<detail::ExecutableImpl> compile_program(
    Program p, Device device, const CompileOptions& options,
    const std::vector<std::pair<int32_t, Shape>>& shapes,
    const std::function<void(Program&)>& before_attach = {}, NodeEvaluator fold = {});

}  // namespace kiln
