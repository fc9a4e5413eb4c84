// Executable: a compiled, shape-specialized plan for one device.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kiln/array.h"
#include "kiln/device.h"
#include "kiln/event.h"
#include "kiln/graph.h"

namespace kiln {

namespace detail {
struct ExecutableImpl;
}

/// What Executable::save writes besides the compiled program.
struct PackageOptions {
  /// Who wrote the package ("kiln convert", an application's name).
  std::string producer;
  /// An identifier of the source model (e.g. its SHA-256 in hex), for tools to compare.
  std::string source_hash;
  /// Names of the returned values, in order (empty: the names they have now).
  std::vector<std::string> output_names;
  /// Also store the constant weights the CPU's kernels laid out for oneDNN in the runs so far
  /// (docs/package-format.md, LAID OUT): a load on a CPU of the same oneDNN and instruction set
  /// then skips converting them on its first run (ResNet-50's first run 59 -> 30 ms), at the
  /// price of a file about twice as large, which takes about twice as long to load.
  bool laid_out_weights = false;
};

struct LoadOptions {
  /// Check the checksum of every constant and variable (the manifest's is always checked).
  bool verify_weights = true;
  /// A package compiled for another kind of device throws UnsupportedError instead of being
  /// placed and planned again for `device`; so do tuning decisions made on another GPU, SM
  /// architecture or library version, instead of being measured again.
  bool strict = false;
};

/// Where a loaded executable came from.
struct PackageInfo {
  std::string path;
  std::string producer;
  std::string kiln_version;  // of the writer
  std::string source_hash;
  std::string compiled_for;  // the device it was compiled for ("cpu", "cuda:0")
  uint32_t format_version = 0;
  bool replanned = false;  // placed and planned again for another kind of device
  /// Bytes of the file, of its data sections (with their alignment) and of its manifest.
  uint64_t file_bytes = 0, data_bytes = 0, manifest_bytes = 0;
  /// The CPU's laid-out weights the file holds (docs/package-format.md, LAID OUT), how many this
  /// load takes instead of converting them on its first run (on a CPU of the identity they were
  /// laid out for), and that identity (e.g. "onednn 2.6.3 avx512_core_bf16"; empty without any).
  size_t laid_out_weights = 0, laid_out_taken = 0;
  std::string laid_out_for;
};

/// Whether the first `size` bytes of a file (8 suffice) are a kiln package's magic, or at least 4
/// bytes of it: a package cut short, which Executable::load then reports as truncated.
bool is_package_magic(const void* head, size_t size);

/// How an asynchronous run is ordered and reported (Executable::run_async).
struct ExecutionDescriptor {
  struct Wait {
    Event event;
    uint64_t value = 0;
  };
  struct Signal {
    Event event;
    uint64_t value = 0;
    Stage stage = Stage::completed;
  };
  /// The run starts only once every event has reached its value.
  std::vector<Wait> wait_events;
  /// Events set to their values when the run reaches the stage (failed: see Event).
  std::vector<Signal> signal_events;
  /// Called exactly once, on a kiln thread, when the run is scheduled on its queue, or with the
  /// error that stopped it before.
  std::function<void(std::exception_ptr)> scheduled_handler;
  /// Called exactly once, on a kiln thread, when the run has completed: with its outputs, or with
  /// no outputs and the error it failed with.
  std::function<void(const std::vector<Array>&, std::exception_ptr)> completed_handler;
};

class Executable {
 public:
  Executable();
  ~Executable();
  Executable(Executable&&) noexcept;
  Executable& operator=(Executable&&) noexcept;
  explicit Executable(std::shared_ptr<detail::ExecutableImpl> impl);

  /// Runs with the given placeholder values; returns the targets in order.
  /// Throws ShapeError / DTypeError naming the placeholder when a feed does not match.
  std::vector<Array> run(const Feeds& feeds) const;
  /// Same, with placeholders named by their names.
  std::vector<Array> run(const std::map<std::string, Array>& feeds) const;

  /// Runs on `queue` (of the executable's device) after the work submitted to it before, and
  /// returns at once: a future of the outputs, set when the run has completed (or with the error
  /// it failed with). Feeds are checked now (ShapeError / DTypeError / ValueError are thrown
  /// here) and read when the run starts: keep their contents unchanged until it has completed.
  /// Outputs live on the executable's device. One executable may run on several queues at once:
  /// each run in flight takes an intermediate-memory arena of its own from the executable's pool
  /// (a run started while all are busy adds one), and gives it back when it completes.
  std::future<std::vector<Array>> run_async(Queue& queue, const Feeds& feeds,
                                            ExecutionDescriptor descriptor = {}) const;
  std::future<std::vector<Array>> run_async(Queue& queue,
                                            const std::map<std::string, Array>& feeds,
                                            ExecutionDescriptor descriptor = {}) const;

  Device device() const;
  /// Bytes of the intermediate-buffer arena (peak intermediate memory of one run). For a dynamic
  /// executable, this, num_steps, placement, dump and capture_status describe the specialization
  /// run last (none before the first run).
  size_t peak_intermediate_bytes() const;
  /// Number of kernels one run executes.
  size_t num_steps() const;
  /// GPU executables: how many runs were replayed from a recording (CompileOptions::capture).
  int64_t replayed_runs() const;
  /// Whether runs are recorded and replayed, or why not ("off: ..."; "not run yet" before the
  /// first run decides).
  std::string capture_status() const;
  /// Whether some input has dynamic dims: each new set of feed shapes compiles a specialization
  /// (kept in a cache bounded by CompileOptions::max_specializations and
  /// max_specialization_bytes, least recently used first).
  bool is_dynamic() const;
  /// The specialization cache of a dynamic executable (all zero for a static one).
  struct ShapeCacheStats {
    int64_t hits = 0;                       // runs whose shapes had a specialization
    int64_t misses = 0;                     // runs that compiled one
    int64_t evictions = 0;                  // specializations dropped for the bounds
    size_t entries = 0;                     // specializations held now
    size_t bytes = 0;                       // their intermediate memory and own constants
    size_t max_entries = 0, max_bytes = 0;  // the bounds (0: none)
    size_t peak_bytes = 0;                  // the most `bytes` has been
    /// Whether misses specialize a symbolic program optimized once for every shape (else each
    /// miss runs every pass: some dim of the program stays unknown without its values).
    bool symbolic = false;
    int64_t symbolic_misses = 0;  // misses specialized from it
    std::string not_symbolic;     // when not symbolic: the first dim left unknown, or the error
  };
  ShapeCacheStats shape_cache() const;
  /// Names of the placeholders the executable reads, with their compiled shapes (-1 for a
  /// dynamic dim) and dtypes.
  struct IoInfo {
    std::string name;
    Shape shape;
    DType dtype;
    /// Inputs: the names and ranges of dynamic dims that have them (Graph::placeholder).
    std::vector<DimSpec> dims = {};
  };
  std::vector<IoInfo> inputs() const;
  std::vector<IoInfo> outputs() const;
  /// Where each kernel of a run executes; `fallback_reason` says why a step of a GPU executable
  /// runs on the CPU (its inputs and outputs are then copied between host and device).
  struct StepInfo {
    int node = -1;
    std::string op;
    std::string backend;  // "cpu" or "cuda"
    std::string fallback_reason;
  };
  std::vector<StepInfo> placement() const;
  /// A readable report: the device, kernels per backend, and every CPU fallback with its reason.
  std::string report() const;
  /// A readable listing of the optimized program and its memory plan.
  std::string dump() const;

  /// Writes the executable as a package (format: docs/package-format.md): the optimized
  /// program, its memory plan and schedule, constants, and variables' current values.
  /// Throws IoError when the file cannot be written.
  void save(const std::string& path, const PackageOptions& options = {}) const;
  /// Loads a package for `device` without compiling. Safe on untrusted files: a malformed file
  /// throws FormatError naming the section and offset; a format too new throws FormatError
  /// naming the versions. A loaded executable has no source graph: feed it by placeholder name.
  static Executable load(const std::string& path, Device device, const LoadOptions& options = {});
  /// The same from bytes in memory (copied).
  static Executable load_bytes(const void* data, size_t size, Device device,
                               const LoadOptions& options = {});
  /// Set for executables made by load(): where they came from.
  const PackageInfo* package_info() const;

  /// Names of the variables the program reads or updates, in program order.
  std::vector<std::string> variable_names() const;
  /// A host copy of a variable's current value. Throws ValueError for an unknown name.
  Array read_variable(const std::string& name) const;
  /// Replaces a variable's value (same shape and dtype). Not while a run is in flight.
  void write_variable(const std::string& name, const Array& value);

  const detail::ExecutableImpl& impl() const { return *impl_; }

 private:
  std::shared_ptr<detail::ExecutableImpl> impl_;
};

}  // namespace kiln
