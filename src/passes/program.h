// What passes transform: a graph (nodes in topological order) and the values it must produce.
// Every pass is a pure function Program -> Program.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "core/graph_impl.h"
#include "kiln/kernel.h"

namespace kiln {

struct Program {
  detail::GraphImpl graph;
  /// Values to produce: the first `num_returned` are returned by runs; the rest (updates) only
  /// keep their nodes alive.
  std::vector<detail::ValueRef> outputs;
  size_t num_returned = 0;
};

/// Copies the nodes of `g` that `targets` need, in order; each copy records its origin.
Program extract_program(const detail::GraphImpl& g, const std::vector<detail::ValueRef>& targets);

/// For each node, the one node that reads it (-1: none; -2: several, or a program output is one
/// of its values): what a fusing pass may absorb.
std::vector<int32_t> sole_readers(const Program& p);
/// Whether v is a one-element float constant with a finite value, written to `c`.
bool scalar_constant(const Program& p, detail::ValueRef v, double& c);
/// Evaluates one node on concrete inputs (constant folding runs kernels through this).
using NodeEvaluator =
    std::function<std::vector<Array>(const detail::Node&, const std::vector<Array>&)>;

/// Fixes placeholder shapes (by origin id) and re-infers every node. Throws ShapeError when a
/// given shape contradicts its declared one, or (unless `allow_dynamic`) when a needed
/// placeholder stays dynamic. Returns whether every placeholder is static.
/// Shape values resolve on the way: shape_of of a static shape becomes a constant, the small pure
/// nodes whose values size something (they feed attributes taken from values) are computed with
/// `eval` (when given) once their inputs are constants and become constants too, and
/// attributes taken from values (OpDef::value_attrs) are written in once their values are
/// constants. Unless `allow_dynamic`, a value still unknown then (computed from a run's data)
/// throws ShapeError naming the node.
bool specialize_shapes(Program& p, const std::vector<std::pair<int32_t, Shape>>& shapes,
                       bool allow_dynamic = false, const NodeEvaluator* eval = nullptr);
/// Makes a dynamic program symbolic (src/passes/symbolic.cpp, core/sym_dim.h): each placeholder's
/// dynamic dim becomes the symbol of its name ("batch") or of its place ("input_ids.1"), every
/// node is inferred again, and shape arithmetic (shape_of and the integer ops on its values) is
/// followed into the reshape, broadcast and full nodes that take their shape from it, whose
/// attributes then hold the symbolic dims. With `seen` (feed shapes by placeholder origin), each
/// min and max of dims is resolved as those shapes resolve it (sym::choose), so that a slice of
/// a position table to the sequence's length has the sequence's length. Returns how many output
/// dims stay unknown.
size_t symbolize(Program& p, const std::vector<std::pair<int32_t, Shape>>* seen = nullptr);
/// The first node of p with an unknown output dim (neither a size nor symbolic), as
/// "node %12 (slice) has shape (?, 768)"; "" when there is none.
std::string first_unknown_dim(const Program& p);
/// The symbolic shapes of a symbolic program's placeholders, by origin (taken before passes drop
/// a placeholder read only for its shape).
std::vector<std::pair<int32_t, Shape>> symbolic_inputs(const Program& p);
/// The concrete program of a symbolic one for the feed shapes (placeholders by origin; `inputs`
/// from symbolic_inputs gives each symbol's placeholder dim): every
/// symbolic dim of attributes and infos evaluated, shapes specialized (specialize_shapes with
/// `eval`). Throws ShapeError when a node's inferred shape differs from its symbolic shape's
/// value (a pass assumed of the dims what these sizes do not hold).
Program instantiate(const Program& symbolic, const std::vector<std::pair<int32_t, Shape>>& inputs,
                    const std::vector<std::pair<int32_t, Shape>>& shapes,
                    const NodeEvaluator* eval);
/// Checks topological order, input references and inferred infos; throws on a broken program.
void verify_program(const Program& p, const std::string& after_pass);

Program fold_constants(const Program& p, const NodeEvaluator& eval);
Program eliminate_common_subexpressions(const Program& p);
Program eliminate_dead_code(const Program& p);
/// Whether p has a broadcast_to whose input has its output's shape, each dim a size or the same
/// symbolic dim (broadcasts a builder added before the shapes were known: attention's operands of
/// an ONNX import with dim_params).
bool has_identity_broadcasts(const Program& p);
/// The program without them: their readers read the input (a copy less each).
Program drop_identity_broadcasts(const Program& p);
/// Folds inference batch norms whose parameters are constants into the convolution before them
/// (when nothing else reads the convolution's output).
Program fold_batch_norms(const Program& p);
/// Runs the nodes of ops marked OpDef::autocast_low (Matmul, Linear, Conv, ConvTranspose,
/// ConvGradWeight and ScaledDotProductAttention) whose inputs are f32 (an attention's mask may be
/// bool) in `low` (f16 or bf16): casts their f32 inputs to `low` (once per value) and their
/// outputs back to f32.
Program autocast(const Program& p, DType low);
/// Replaces attention written out (softmax(s · q kᵀ + mask) v from products, scalar scales, a
/// transpose, an add and a softmax) by scaled_dot_product_attention nodes
/// (src/passes/fuse_attention.cpp).
Program fuse_attention(const Program& p);
/// Moves a cast that narrows a float and reads a chain of reshapes and transposes (read only by
/// the chain) to the chain's start, dropping it where the start widened the same narrow value
/// (src/passes/hoist_casts.cpp).
Program hoist_casts(const Program& p);
/// Sets attr tf32 on matmul, linear, conv, conv_transpose and conv_grad_weight nodes whose inputs
/// are f32 (CompileOptions::allow_tf32; CUDA kernels read it, the CPU's ignore it).
Program allow_tf32(const Program& p);
/// Moves every assign (and whatever reads its result) after all other nodes, so each read of a
/// variable in a run sees the value it had when the run started.
Program order_assignments(const Program& p);

/// Which phases of fuse_elementwise run: both; only the chains of one shape (decisions that
/// hold for any sizes of a symbolic program's dims); or only the groups of small values (on a
/// program whose chains are fused: a dynamic executable's specialization).
enum class FusePhases { all, chains, small_groups };
/// Replaces connected groups of two or more elementwise nodes of one output shape, whose
/// intermediate values are read only inside the group, by one fused_elementwise node each. Only
/// nodes whose op has a kernel on `target` for their dtype join a group. Then (with
/// KILN_FUSE_GROUPS on) independent small values are grouped into one launch.
Program fuse_elementwise(const Program& p, Backend target, FusePhases phases = FusePhases::all);

/// GELU written out (x · 0.5 · (1 + erf(x / √2)), and the tanh form with x + 0.044715 x³), as
/// exporters write it, becomes one gelu node; the chain's values must have no other reader
/// (src/passes/gelu.cpp).
Program recognize_gelu(const Program& p);

/// Replaces quantize(relu?(dequantize(a) @ dequantize(w) (+ bias) (+ residual))) by one
/// quantized_matmul node (matmul or linear), and the same around a 2-D conv by one
/// quantized_conv node (per-tensor a and output, per-tensor or per-output-channel w), when the
/// float intermediates have no other reader (src/passes/fuse_quant.cpp).
Program fuse_quant(const Program& p);

/// Gives quantized_conv nodes (and on CUDA f16/bf16/TF32 convs, their gradients, and the batch
/// norms and pooling gradients of training programs) NHWC data (attr channels_last) and keeps the
/// values between them NHWC, with transposes only where NCHW and NHWC meet
/// (src/passes/channels_last.cpp).
Program channels_last(const Program& p, Backend target);
/// Whether channels_last changes anything in `p` (a program without convolutions: no).
bool channels_last_applies(const Program& p, Backend target);

/// CPU, f32 plain-layout convolutions: with `fuse_epilogues`, conv -> add(., residual) -> relu
/// (either or both, each value read only by the next) becomes one fused_conv node, whose oneDNN
/// primitive applies them as post-ops; and convs whose weight is a constant get const_weight
/// (src/passes/cpu_convs.cpp).
Program prepare_cpu_convs(const Program& p, bool fuse_epilogues);
/// Sets no_indices on max_pool nodes whose indices (output 1) nothing reads, so that kernels
/// leave them unwritten (src/passes/cpu_convs.cpp).
Program drop_unread_pool_indices(const Program& p);
/// CPU, f32: a matmul whose B is a matrix, or a linear, and the chain after it (add or mul with
/// an operand of the product's shape or a row of it; relu, gelu, sigmoid, silu, tanh; each value
/// read only by the next) become one fused_matmul node, whose oneDNN primitive applies the chain
/// as post-ops (src/passes/cpu_matmuls.cpp).
Program fuse_cpu_matmul_epilogues(const Program& p);
/// CPU: matmul, linear and fused_matmul nodes (f32, bf16) whose weight (input 1) is a constant
/// matrix get
/// const_weight: their kernel lays the weight out for oneDNN's primitive once (a blocked layout
/// its kernels read faster than the plain one) instead of reading it plain at every run.
Program mark_cpu_const_weights(const Program& p);

/// Runs every all_reduce start as early and every collective wait as late as dependencies
/// allow, so communication overlaps computation.
Program schedule_collectives(const Program& p);

/// Helper for passes: copies nodes into a new program with remapped inputs.
class ProgramBuilder {
 public:
  explicit ProgramBuilder(const Program& src) : src_(src), map_(src.graph.nodes.size()) {}
  /// Copies node `id` of the source with remapped inputs; returns its new id.
  int32_t copy(int32_t id);
  /// Maps every output of source node `id` to new values.
  void map(int32_t id, std::vector<detail::ValueRef> values) { map_[id] = std::move(values); }
  detail::ValueRef remap(detail::ValueRef v) const { return map_[v.node][v.index]; }
  detail::GraphImpl& graph() { return out_.graph; }
  Program finish();

 private:
  const Program& src_;
  Program out_;
  std::vector<std::vector<detail::ValueRef>> map_;
};

}  // namespace kiln
