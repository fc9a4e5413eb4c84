// Custom ops: ops and kernels registered at run time, from C++ or from a shared library.
//
// A custom op is a name, typed inputs and outputs, declared attributes with defaults, a shape
// function and an optional gradient builder, plus one kernel per backend. In a graph it is a node
// of the built-in op `custom` (or `custom_impure`) whose attribute "custom_op" names it, so
// passes, autodiff, placement (CPU fallback when it has no kernel for the device), memory
// planning, the profiler and packages handle it like any built-in op.
//
// A kernel receives the KernelContext (inputs, outputs, attributes, scratch memory) and the
// Stream of the executable: a GPU kernel enqueues its work on stream.native_handle() and never
// synchronizes the device, so the op leaves no hole in the GPU timeline.
//
//   kiln::CustomOpDef def;
//   def.name = "softshrink2";
//   def.inputs = {{"x", {kiln::f32, kiln::f64}}};
//   def.outputs = {{"y", kiln::f32, /*like_input=*/0}};
//   def.attrs = {{"lambda", 0.5}};
//   kiln::register_custom_op(def);
//   kiln::register_custom_kernel("softshrink2", kiln::Backend::cpu, my_cpu_kernel);
//   kiln::Tensor y = kiln::custom_op1("softshrink2", {x}, {{"lambda", 0.25}});
//
// An op library is a shared library that exports its registration (see KILN_OP_LIBRARY below);
// kiln::load_op_library(path) loads it. The library resolves kiln's symbols from the process
// that loads it: link the program with kiln_enable_op_libraries(target) (cmake/KilnOpLibrary.cmake)
// or use a shared libkiln. docs/custom_ops.md has the details.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kiln/attrs.h"
#include "kiln/dtype.h"
#include "kiln/graph.h"
#include "kiln/kernel.h"
#include "kiln/shape.h"

/// The version of the op-library interface (this header's types and the registrar). A library
/// built against another version is refused by load_op_library.
#define KILN_OP_ABI_VERSION 1

namespace kiln {

/// What a custom kernel encodes its work into: the executable's own stream.
class Stream {
 public:
  Stream(Backend backend, int device, void* native)
      : backend_(backend), device_(device), native_(native) {}
  /// cudaStream_t on CUDA; nullptr on the CPU (where a kernel just computes).
  void* native_handle() const { return native_; }
  Backend backend() const { return backend_; }
  int device() const { return device_; }
  /// Runs `encode` now, serialized with every other dispatch to the same native stream: several
  /// host threads may encode into one stream this way.
  void dispatch(const std::function<void()>& encode);
  /// Submits the work encoded so far (CUDA submits at enqueue, so nothing waits here).
  void commit();
  /// Submits and blocks until all work on the stream is done. Avoid it in kernels: it stalls the
  /// pipeline and breaks recorded runs (CUDA graphs).
  void commit_and_wait();

 private:
  Backend backend_;
  int device_;
  void* native_;
};

/// An input of a custom op and the dtypes it takes.
struct CustomInput {
  std::string name;
  DTypeSet dtypes{f32};
};
/// An output: of dtype `dtype`, or of input `like_input`'s dtype when that is >= 0.
struct CustomOutput {
  std::string name;
  DType dtype = f32;
  int like_input = -1;
};

/// What a shape function sees; it returns one shape per output and throws kiln::ShapeError (or
/// ValueError for a bad attribute) naming the op.
struct CustomShapeContext {
  const std::string& op;
  const Attrs& attrs;
  const std::vector<Shape>& inputs;
  const std::vector<DType>& dtypes;
};
using CustomShapeFn = std::function<std::vector<Shape>(const CustomShapeContext&)>;

/// What a gradient builder sees: the node's inputs and outputs, its attributes (declared ones
/// filled in), and the incoming gradient of each output (nullopt where none flows).
struct CustomGradContext {
  const std::string& op;
  const Attrs& attrs;
  const std::vector<Tensor>& inputs;
  const std::vector<Tensor>& outputs;
  const std::vector<std::optional<Tensor>>& cotangents;
  /// The cotangent of output i, or zeros of its shape.
  Tensor cotangent_or_zeros(int i) const;
};
/// Returns one gradient per input (nullopt: none), written with kiln ops (built-in or custom), so
/// it runs on every backend and is itself differentiable when those ops are.
using CustomGradFn = std::function<std::vector<std::optional<Tensor>>(const CustomGradContext&)>;

/// A custom kernel: reads ctx.in(i), writes ctx.out(i), and on a GPU enqueues on the stream.
using CustomKernel = std::function<void(KernelContext& ctx, Stream& stream)>;

struct CustomOpDef {
  /// Unique among custom ops; letters, digits, '_' and '.'.
  std::string name;
  std::vector<CustomInput> inputs;
  std::vector<CustomOutput> outputs;
  /// Declared attributes and their defaults (the value's type is the attribute's type). Keys
  /// starting with "custom_" are kiln's.
  std::vector<std::pair<std::string, AttrValue>> attrs;
  /// Empty: every output has input 0's shape.
  CustomShapeFn shape;
  /// Empty: the op is not differentiable (gradients() through it throws).
  CustomGradFn gradient;
  /// Same inputs give the same outputs: CSE may merge two such nodes and constant folding may run
  /// it on the CPU at compile time. Set false for ops with side effects or randomness.
  bool pure = true;
  /// The library that registered the op (set by load_op_library; empty for ops registered from
  /// the program itself). Packages record it to tell users what to load.
  std::string library;
};

/// Registers an op. Throws ValueError when the name is taken or the definition is malformed.
void register_custom_op(CustomOpDef def);
/// Registers (or replaces) the kernel of custom op `op` on `backend`. Throws ValueError when the
/// op is not registered.
void register_custom_kernel(const std::string& op, Backend backend, CustomKernel kernel);
/// Removes a custom op and its kernels (nodes that use it fail to compile, run or load after);
/// false when it was not registered. Not while an executable using it runs.
bool unregister_custom_op(const std::string& op);
/// Whether `op` is registered, and the registered names.
bool is_custom_op_registered(const std::string& op);
std::vector<std::string> custom_op_names();

/// Adds a node of custom op `op` on `inputs` (at least one; all of one graph). Attributes not
/// given take their declared defaults; undeclared or mistyped ones throw ValueError.
std::vector<Tensor> custom_op(const std::string& op, const std::vector<Tensor>& inputs,
                              const Attrs& attrs = {});
/// Single-output shorthand.
Tensor custom_op1(const std::string& op, const std::vector<Tensor>& inputs,
                  const Attrs& attrs = {});

/// What an op library's registration function gets: everything it registers is taken at once
/// after the function returns (nothing is when one name is taken or the function throws).
class OpLibraryRegistrar {
 public:
  virtual ~OpLibraryRegistrar() = default;
  virtual void register_op(CustomOpDef def) = 0;
  virtual void register_kernel(const std::string& op, Backend backend, CustomKernel kernel) = 0;
};

/// Loads the op library at `path` (dlopen) and registers its ops, tagged with the library's file
/// name. Throws IoError when it cannot be opened, UnsupportedError when it was built for another
/// KILN_OP_ABI_VERSION or lacks the entry points, ValueError when it registers a name that is
/// taken. Loading the same file again does nothing.
void load_op_library(const std::string& path);

}  // namespace kiln

/// Defines an op library's entry points:
///   KILN_OP_LIBRARY(registrar) { registrar.register_op(...); registrar.register_kernel(...); }
#define KILN_OP_LIBRARY(registrar)                                              \
  extern "C" __attribute__((visibility("default"))) int kiln_op_abi_version() { \
    return KILN_OP_ABI_VERSION;                                                 \
  }                                                                             \
  extern "C" __attribute__((visibility("default"))) void kiln_register_ops(     \
      kiln::OpLibraryRegistrar& registrar)
