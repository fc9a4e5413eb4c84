// The op registry: one OpDef per op of op_list.inc, filled by the family files in src/ops/.
#pragma once

#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "core/graph_impl.h"
#include "core/op_id.h"
#include "core/op_params.h"

namespace kiln {

/// What shape/dtype inference sees.
struct InferContext {
  OpId op;
  const Attrs& attrs;
  const std::vector<TensorInfo>& inputs;
  /// The node's bodies (control-flow ops; nullptr or empty for the others).
  const std::vector<std::shared_ptr<const Body>>* bodies = nullptr;
  const char* name() const { return op_name(op); }
};
using InferFn = std::vector<TensorInfo> (*)(const InferContext&);

/// What a gradient rule sees: the node's inputs and outputs as Tensors, its attributes, and the
/// incoming gradient of each output (nullopt where none flows).
struct VjpContext {
  OpId op;
  Attrs attrs;
  std::vector<Tensor> inputs;
  std::vector<Tensor> outputs;
  std::vector<std::optional<Tensor>> cotangents;
  /// The node's bodies (control-flow ops).
  std::vector<std::shared_ptr<const Body>> bodies = {};
  const char* name() const { return op_name(op); }
  /// The cotangent of output i, or zeros of its shape.
  Tensor cotangent_or_zeros(int i) const;
};
/// Returns one gradient per input, written with kiln ops (nullopt: none, e.g. for indices).
/// Each gradient must have its input's shape; autodiff casts it to the input's dtype.
using VjpFn = std::vector<std::optional<Tensor>> (*)(const VjpContext&);

/// Inputs a node takes beyond its fixed and optional ones, from its attributes (for ops whose
/// count does not follow one bool attribute per input).
using ExtraInputsFn = int (*)(const Attrs&);

/// Checks of a stored (untrusted, package) node's attributes that inference and kernels trust
/// builders to hold, beyond the generic bounds of stored::check: what is wrong, or "" when sound.
/// Runs after the node's input count is checked.
using StoredAttrCheck = std::string (*)(const InferContext&);

/// An op's attributes decoded into its params struct (src/core/op_params.h); throws ValueError for
/// attributes the op cannot take.
using DecodeFn = std::shared_ptr<const OpParams> (*)(OpId, const Attrs&);

/// Which inputs of a channels_last node are (N, H, W, C): input k of a node with `num_inputs`
/// inputs and attributes `attrs`. Its other inputs keep their layout (a conv's weight apart:
/// OpDef::khwc_weight_input).
using NhwcInputFn = bool (*)(const Attrs& attrs, int k, int num_inputs);

namespace stored {
// Bounds on stored attributes: integers are bounded so that products of a dim and an attribute
// fit in 64 bits.
constexpr int64_t kMaxDim = int64_t{1} << 40;       // dims and most integer attributes
constexpr int64_t kMaxGeometry = int64_t{1} << 20;  // strides, pads, kernels, groups, repeats
constexpr uint64_t kMaxBytes = uint64_t{1} << 62;   // bytes of one value
/// "" when attribute `key` is absent or holds `want` integers in [lo, hi]; else what is wrong.
std::string check_ints(const Attrs& a, const char* key, size_t want, int64_t lo, int64_t hi);
}  // namespace stored

/// Whether an op has a gradient rule. Every op must decide: `undecided` fails a test.
enum class GradKind : uint8_t { undecided, rule, none };

struct OpDef {
  OpId id{};
  InferFn infer = nullptr;
  /// Writes attributes that wait for static input shapes (conv's "same" pads over dynamic
  /// spatial dims) once the node's inputs are static; specialize_shapes calls it before
  /// inference (nullptr: nothing waits).
  void (*resolve_static)(Attrs& attrs, const std::vector<TensorInfo>& inputs) = nullptr;
  /// Same inputs give the same outputs (CSE and constant folding may merge or fold it).
  bool pure = true;
  /// Output 0 may be written over input `inplace_input` when that input dies here (-1: never).
  int inplace_input = -1;
  /// Output 0 is a view of input 0 (same bytes, another shape): no copy, no new buffer.
  bool alias_input0 = false;
  /// Input 0 is a variable the op writes (assign, assign_slice): it runs after every other reader
  /// of the variable in a run (order_assignments), on the executable's device (never a fallback).
  bool writes_variable = false;

  /// The gradient rule (or GradKind::none for ops whose outputs are not differentiable).
  GradKind grad_kind = GradKind::undecided;
  VjpFn vjp = nullptr;

  /// Input arity: `min_inputs` required inputs (-1: undeclared, so packages cannot load the op),
  /// up to `max_inputs` for variadic ops; one more per key of `optional_inputs` whose bool
  /// attribute is true (ops::add_optional records has_<name>), and `extra_inputs(attrs)` more.
  int min_inputs = -1;
  int max_inputs = -1;
  std::vector<const char*> optional_input_keys;
  ExtraInputsFn extra_inputs = nullptr;
  /// Attributes a node may take from the values of its last inputs instead (bool attribute
  /// `from_values`: one more input per name, in order). Shape arithmetic computes such values
  /// (shape_of and the ops on its result); specialize_shapes writes them in once they are known
  /// (a 0-d value as a float, a 1-d one as ints) and drops the inputs. Until then the op's
  /// inference leaves the dims they decide dynamic.
  std::vector<const char*> value_attrs;
  /// Integer attributes (scalar or list) that may span all of int64 in stored nodes (the op's
  /// stored_check bounds them where it needs to); others are held to stored::kMaxDim.
  std::vector<const char*> wide_int_attrs;
  StoredAttrCheck stored_check = nullptr;
  /// Decodes the attributes into the struct the op's kernels read (nullptr: they read attrs()).
  DecodeFn decode = nullptr;

  /// The op's kernels may take Layout::channels_last (a dispatch key of find_kernel): which
  /// inputs are then NHWC, the input that is a (O, kh, kw, C/G) weight (-1: none), and the
  /// inference of such nodes (nullptr: the plain inference on NCHW views of the 4-D inputs, its
  /// 4-D outputs permuted to NHWC). The attribute channels_last stores the layout in programs
  /// and packages; nothing but layout_of reads it.
  NhwcInputFn nhwc_input = nullptr;
  int khwc_weight_input = -1;
  InferFn infer_channels_last = nullptr;

  /// Matrix products and convolutions: TF32 math may run them (the tf32 pass).
  bool tensor_core = false;
  /// Autocast runs the op in its low float precision when its inputs are f32 (input
  /// `autocast_bool_input`, a mask, may be bool instead); other ops stay as built.
  bool autocast_low = false;
  int autocast_bool_input = -1;

  OpDef& set_infer(InferFn f) { infer = f; return *this; }
  OpDef& when_static(void (*f)(Attrs&, const std::vector<TensorInfo>&)) {
    resolve_static = f;
    return *this;
  }
  OpDef& grad(VjpFn f) { vjp = f; grad_kind = GradKind::rule; return *this; }
  OpDef& not_differentiable() { grad_kind = GradKind::none; return *this; }
  OpDef& impure() { pure = false; return *this; }
  OpDef& inplace(int input) { inplace_input = input; return *this; }
  OpDef& alias() { alias_input0 = true; return *this; }
  /// Input 0 is a variable the op writes (impure, output 0 its storage): see writes_variable.
  OpDef& writes_input0() {
    writes_variable = alias_input0 = true;
    pure = false;
    return *this;
  }
  OpDef& inputs(int n) { min_inputs = max_inputs = n; return *this; }
  OpDef& variadic(int lo, int hi) { min_inputs = lo; max_inputs = hi; return *this; }
  OpDef& optional_inputs(std::initializer_list<const char*> keys) {
    optional_input_keys.assign(keys);
    return *this;
  }
  OpDef& more_inputs(ExtraInputsFn f) { extra_inputs = f; return *this; }
  OpDef& from_values(std::initializer_list<const char*> keys) {
    value_attrs.assign(keys);
    return *this;
  }
  OpDef& wide_ints(std::initializer_list<const char*> keys) {
    wide_int_attrs.assign(keys);
    return *this;
  }
  OpDef& check_stored(StoredAttrCheck f) { stored_check = f; return *this; }
  /// The op's kernels read params_of<P>: P::decode(op, attrs) decodes and checks its attributes.
  template <class P> OpDef& params() {
    decode = [](OpId op, const Attrs& a) -> std::shared_ptr<const OpParams> {
      return std::make_shared<const P>(P::decode(op, a));
    };
    return *this;
  }
  OpDef& channels_last(NhwcInputFn inputs, int khwc_weight = -1, InferFn infer = nullptr) {
    nhwc_input = inputs;
    khwc_weight_input = khwc_weight;
    infer_channels_last = infer;
    return *this;
  }
  OpDef& on_tensor_cores() { tensor_core = true; return *this; }
  OpDef& low_precision(int bool_input = -1) {
    autocast_low = true;
    autocast_bool_input = bool_input;
    return *this;
  }

  /// The inputs a node of the op takes with `attrs`: [lo, hi]; false when undeclared.
  bool input_range(const Attrs& attrs, int& lo, int& hi) const;
};

/// The def of `op` (all families registered on first use).
const OpDef& op_def(OpId op);
/// The layout a node of `op` with `attrs` runs in: channels_last where the op declares that
/// layout and the node's attribute channels_last is set; plain otherwise.
Layout layout_of(OpId op, const Attrs& attrs);
/// The node's output types and shapes: the op's inference for its layout. Throws like it.
std::vector<TensorInfo> infer_node(const InferContext& ctx);
/// For family registration functions.
OpDef& define_op(OpId op);

// One registration function per family file (src/ops/<family>.cpp).
void register_core_ops();
void register_elementwise_ops();
void register_linalg_ops();
void register_conv_ops();
void register_pool_ops();
void register_reduce_ops();
void register_norm_ops();
void register_transform_ops();
void register_loss_ops();
void register_dist_ops();
void register_random_ops();
void register_fused_elementwise_ops();
void register_rnn_ops();
void register_attention_ops();     // src/ops/attention.cpp
void register_factorization_ops();  // src/ops/factorization.cpp
void register_quant_ops();         // src/ops/quant.cpp
void register_custom_op_ops();     // src/ops/custom_op.cpp
void register_control_ops();       // src/ops/control.cpp

}  // namespace kiln
