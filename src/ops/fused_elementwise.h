// fused_elementwise: a chain of elementwise ops run as one node (built only by the
// fuse_elementwise pass, src/passes/fuse_elementwise.cpp; not part of the public ops API).
//
// The node carries a small expression program. Values are numbered: 0 .. num_inputs-1 are the
// node's inputs (each broadcasts to the output shape), num_inputs + k is the result of
// instruction k; the last instruction's value is the node's output. Attributes:
//   code    ints, 5 per instruction: [stable op id, result dtype, operand a, b, c]
//           (unused operands -1; the op is one of the elementwise family, op_list.inc)
//   params  floats, 2 per instruction: the op's attributes (alpha, min/max, beta/threshold,
//           lambda; gelu: 1 for the tanh form; bit_shift: 1 for left) or 0
// Every instruction computes over the whole output shape and rounds to its dtype (f16/bf16 values
// are computed in f32 and rounded after each instruction, as the unfused kernels do), so a fused
// node gives the results of the ops it replaced. Inference checks each instruction with its op's
// own inference; a malformed program is a ValueError naming the instruction.
//
// A group (the attribute `parts` present) is several programs in one node, run as one kernel
// launch, each giving one output from some of the node's inputs: fuse_elementwise makes groups of
// small values (launches, not bytes, bound them), where each part's inputs are of its output's
// shape or single values. Attributes:
//   parts        ints, 2 per part: [its number of inputs, its number of instructions]
//   part_inputs  ints: each part's inputs as indices of the node's inputs, part after part
//   code/params  every part's instructions, part after part, each numbered as its own program
// Output k is part k's last value, of the broadcast shape of part k's inputs.
#pragma once

#include <string>
#include <vector>

#include "core/graph_impl.h"
#include "core/op_id.h"
#include "core/op_params.h"
#include "kiln/attrs.h"
#include "kiln/dtype.h"
#include "kiln/kernel.h"

namespace kiln::fused {

struct Instr {
  OpId op{};
  DType dtype = f32;
  int32_t a = -1, b = -1, c = -1;
  double p0 = 0, p1 = 0;
  int32_t operand(int i) const { return i == 0 ? a : i == 1 ? b : c; }
};

struct Program {
  int num_inputs = 0;
  std::vector<Instr> instrs;
  int num_values() const { return num_inputs + static_cast<int>(instrs.size()); }
};

inline constexpr int kMaxInputs = 32;
inline constexpr int kMaxInstrs = 256;
inline constexpr int kMaxParts = 16;

/// One program of a group: its inputs as indices of the node's inputs.
struct Part {
  std::vector<int32_t> inputs;
  Program program;
};

/// Number of operands the op takes inside a program (1 to 3), or 0 when it cannot be fused.
int arity(OpId op);
/// Packs a node's attributes of a fusable op into p0/p1. False when they cannot be carried
/// (a non-finite value, which packages would reject).
bool pack_params(OpId op, const Attrs& attrs, Instr& out);
/// The op's own attributes of an instruction (inverse of pack_params).
Attrs op_attrs(const Instr& in);

/// The node attributes of a program.
Attrs encode(const Program& p);
/// The node attributes of a group of parts.
Attrs encode_group(const std::vector<Part>& parts);
/// Whether the attributes are a group's.
bool is_group(const Attrs& attrs);
/// Decodes and validates a program against its input dtypes; throws ValueError naming the
/// instruction on a malformed one (a group: ValueError).
Program decode(const Attrs& attrs, const std::vector<DType>& input_dtypes);
/// Decodes and validates the parts of a node's program: a group's, or the one program over all
/// inputs. Throws ValueError naming the part and the instruction on a malformed one.
std::vector<Part> decode_parts(const Attrs& attrs, const std::vector<DType>& input_dtypes);
/// A node's program as its kernels read it, decoded once per executable (the op's params): the
/// instructions and each one's op attributes. Only the encoding is checked here (sizes, op ids,
/// dtypes); the operands and dtypes were checked against the node's inputs by inference (graph
/// build, package load), which the runtime's kernels rely on.
struct Decoded : OpParams {
  std::vector<Instr> instrs;  // (a group's: every part's, part after part)
  std::vector<Attrs> attrs;
  /// Each part's instructions [first, first + count) and inputs (one part over all inputs where
  /// the node is no group; its inputs then empty: all of them, in order).
  struct Range {
    size_t first = 0, count = 0;
    std::vector<int32_t> inputs;
  };
  std::vector<Range> parts;
  static Decoded decode(OpId op, const Attrs& a);
};
/// The dtype of every value (inputs, then instruction results).
std::vector<DType> value_dtypes(const Program& p, const std::vector<DType>& input_dtypes);
/// Stable text of a program and its input dtypes ("%2 = add.f32(%0, %1); ..."), a cache key.
std::string text(const Program& p, const std::vector<DType>& input_dtypes);

/// Compiles a node's kernel ahead of runs (the CUDA backend registers NVRTC compilation here), so
/// Graph::compile, not the first run, waits for it. `many_shapes`: for a dynamic executable's
/// specialization (KernelEnv::many_shapes), whose runs may take a kernel compiled for another.
using PrepareFn = void (*)(const Attrs& attrs, const std::vector<TensorInfo>& inputs,
                           const TensorInfo& output, int device, bool many_shapes);
void set_prepare(Backend backend, PrepareFn fn);
/// The backend's hook, or nullptr.
PrepareFn prepare(Backend backend);

}  // namespace kiln::fused
