// Graph and Tensor: build a DAG of ops, then compile it to an Executable.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kiln/array.h"
#include "kiln/attrs.h"
#include "kiln/device.h"
#include "kiln/dtype.h"
#include "kiln/kernel_choices.h"
#include "kiln/shape.h"

namespace kiln {

namespace detail {
struct GraphImpl;
struct Node;
}  // namespace detail

class Graph;
class Executable;

/// A symbolic value: output `index` of node `node` of a graph. Cheap to copy.
/// The Graph must outlive its Tensors.
class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(detail::GraphImpl* g, int32_t node, int32_t index)
      : g_(g), node_(node), index_(index) {}

  bool valid() const { return g_ != nullptr; }
  Shape shape() const;
  DType dtype() const;
  int rank() const;
  /// Dim `axis` (negative counts from the end); -1 if dynamic.
  int64_t dim(int axis) const;
  /// Name of the producing node (placeholders keep the name they were given).
  std::string name() const;
  /// Name of the producing op ("add", "conv", ...).
  std::string op_name() const;

  detail::GraphImpl* graph_impl() const { return g_; }
  int32_t node_id() const { return node_; }
  int32_t output_index() const { return index_; }
  bool operator==(const Tensor& o) const {
    return g_ == o.g_ && node_ == o.node_ && index_ == o.index_;
  }
  bool operator<(const Tensor& o) const {
    return std::tie(g_, node_, index_) < std::tie(o.g_, o.node_, o.index_);
  }

 private:
  detail::GraphImpl* g_ = nullptr;
  int32_t node_ = -1;
  int32_t index_ = 0;
};

/// The name and range of a dynamic (-1) dim of a placeholder (Graph::placeholder).
struct DimSpec {
  /// Which dim (negative counts from the end).
  int axis = 0;
  /// Dims that share a name, in any placeholders of the graph, have one size in a run (a feed
  /// that breaks it is refused before anything runs). Empty: the dim is free.
  std::string name;
  /// The sizes a feed may have: min <= size <= max (max -1: no upper bound).
  int64_t min = 0;
  int64_t max = -1;
  /// Batch buckets: ascending sizes this dim is rounded up to. A feed of size n runs the
  /// specialization of the smallest bucket >= n (one compile and one CUDA graph for all the sizes
  /// up to it): its inputs are padded with zeros along the dim and the outputs whose first dim is
  /// this dim come back cut to n rows (views). Only for dims along which rows do not mix, a
  /// batch; sizes above the last bucket run at their own size. Every dim sharing the name pads.
  std::vector<int64_t> buckets = {};
};

/// Placeholder shapes to specialize at compile time.
using FeedShapes = std::vector<std::pair<Tensor, Shape>>;
/// Concrete values for placeholders at run time.
using Feeds = std::vector<std::pair<Tensor, Array>>;

/// Ops a run executes for their effect on variables (assign results, optimizer steps) without
/// returning them.
struct Updates {
  std::vector<Tensor> ops;
  Updates() = default;
  Updates(std::vector<Tensor> t) : ops(std::move(t)) {}
  Updates(std::initializer_list<Tensor> t) : ops(t) {}
};

struct CompileOptions {
  /// Constant folding, common-subexpression elimination and dead-code elimination.
  bool optimize = true;
  /// Liveness-based reuse of intermediate buffers; off gives every value its own buffer.
  bool plan_memory = true;
  /// Let elementwise ops write over an input whose last reader they are.
  bool in_place = true;
  /// Threads for CPU kernels (0: one per core).
  int num_threads = 0;
  /// Mixed precision: f16 or bf16 runs matmul, linear and the convolutions (forward and
  /// gradient) whose inputs are f32 in that precision; every other op and every variable stays
  /// f32. Other dtypes throw ValueError.
  std::optional<DType> autocast;
  /// Every op must run on the compiled device: an op whose backend lacks a kernel for its dtype
  /// throws UnsupportedError instead of falling back to the CPU.
  bool strict_placement = false;
  /// GPU executables: from the second run on, a run is recorded once as a CUDA graph and then
  /// replayed with a single launch (feeds are copied into the recording's own input buffers
  /// and outputs out of its output buffers). Runs with CPU fallbacks, collectives,
  /// KILN_VALIDATE or KILN_STEP_TIMES are never recorded; KILN_CAPTURE=0 turns it off.
  bool capture = true;
  /// With optimize: chains of elementwise ops run as one generated kernel, and on the CPU a
  /// convolution's residual add and relu run in its oneDNN primitive (KILN_FUSION=0 disables
  /// both).
  bool fuse_elementwise = true;
  /// With optimize: dequantize -> matmul/linear (+bias +residual +relu) -> quantize runs as one
  /// int8 quantized_matmul (docs/quantization.md).
  bool fuse_quant = true;
  /// CUDA: f32 matmul, linear and convolutions (forward and gradients) may use TF32 tensor cores
  /// (products of 10-bit-mantissa roundings of the inputs, f32 sums), as PyTorch's
  /// `allow_tf32`: several times faster, results within about 1e-3 relative of true f32. Off,
  /// f32 is computed in f32 (as on the CPU, which ignores this option).
  bool allow_tf32 = false;
  /// CUDA: bitwise-identical outputs, gradients and variable updates from run to run and from
  /// process to process on the same GPU model, driver and library versions (docs/design.md,
  /// "Determinism"): cuDNN convolution algorithms chosen by heuristics among its deterministic
  /// ones (never timed), reductions and scatters that add in a fixed order, splits fixed by
  /// shapes. An op without a deterministic kernel throws UnsupportedError naming it.
  /// KILN_DETERMINISTIC=1 turns it on for every executable. The CPU ignores it (its kernels are
  /// deterministic for a fixed thread count).
  bool deterministic = false;
  /// Which kernel runs where a backend has two exact ones (kiln/kernel_choices.h).
  KernelChoices kernels;
  /// Executables with dynamic dims (docs/dynamic-shapes.md) compile a specialization for each
  /// new set of feed shapes when it is first run, and keep the most recently used ones: at most
  /// `max_specializations` of them, holding at most `max_specialization_bytes` of intermediate
  /// memory and constants of their own (the least recently used go first; the one running
  /// always stays). 0 means no limit.
  size_t max_specializations = 64;
  size_t max_specialization_bytes = size_t{4} << 30;
};

class Graph {
 public:
  Graph();
  ~Graph();
  Graph(Graph&&) noexcept;
  Graph& operator=(Graph&&) noexcept;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  /// A graph input. Dims of -1 are dynamic: a feed shape given to compile fixes them, and those
  /// left dynamic take any size at run time (the executable specializes itself per shape).
  Tensor placeholder(const Shape& shape, DType dtype, const std::string& name = "");
  /// Same, with names and ranges for dynamic dims: `g.placeholder({-1, -1}, i64, "ids",
  /// {{0, "batch", 1, 32}, {1, "seq", 1, 512}})`. Throws ShapeError for a spec of a fixed dim, an
  /// axis out of range, an empty range, or a name used with another range.
  Tensor placeholder(const Shape& shape, DType dtype, const std::string& name,
                     const std::vector<DimSpec>& dims);
  /// The names and ranges of a placeholder's dynamic dims (empty when it has none with either).
  std::vector<DimSpec> dim_specs(const Tensor& placeholder) const;
  /// A constant holding a copy of `value`'s handle (the data is shared, not copied).
  Tensor constant(const Array& value, const std::string& name = "");
  /// A 0-d constant.
  Tensor scalar(double value, DType dtype = f32);

  /// A variable: a value that lives across runs, starting as a copy of `initial`. Every
  /// executable compiled from this graph reads and updates the same data (see kiln::assign).
  /// Names are unique within a graph (empty: "variable<N>").
  Tensor variable(const Array& initial, const std::string& name = "");
  /// Every variable of the graph, in creation order.
  std::vector<Tensor> variables() const;
  /// A copy of the variable's current value.
  Array read_variable(const Tensor& variable) const;
  /// Replaces the variable's value (same shape and dtype). Not while a run is in flight.
  void write_variable(const Tensor& variable, const Array& value);
  /// Writes every variable (name, dtype, shape, data) to a checkpoint file.
  void save_variables(const std::string& path) const;
  /// Restores variables from a checkpoint by name. Throws IoError/FormatError on a bad file and
  /// ShapeError/DTypeError/ValueError when a variable is missing or does not match.
  void load_variables(const std::string& path);

  /// Compiles the part of the graph that `targets` need for `device`.
  /// `feeds` may fix the shapes of placeholders with dynamic dims (a named dim fixed in one
  /// placeholder is fixed in all). When some needed dim stays dynamic, the executable runs any
  /// feed its dims allow, compiling a specialization per new shape (Executable::shape_cache).
  Executable compile(Device device, const FeedShapes& feeds, const std::vector<Tensor>& targets,
                     const CompileOptions& options = {}) const;
  /// Same, also running `updates` (assign results, optimizer steps) each run without returning
  /// them.
  Executable compile(Device device, const FeedShapes& feeds, const std::vector<Tensor>& targets,
                     const Updates& updates, const CompileOptions& options = {}) const;

  /// Number of nodes (for tests and tools).
  size_t num_nodes() const;
  /// A readable listing of the nodes.
  std::string dump() const;

  detail::GraphImpl& impl() const { return *impl_; }

 private:
  std::unique_ptr<detail::GraphImpl> impl_;
};

}  // namespace kiln
