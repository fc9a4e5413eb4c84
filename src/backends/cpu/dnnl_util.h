// oneDNN glue of the CPU kernels: one engine, memory descriptors for kiln's row-major buffers,
// and a process-wide cache of primitives (creating one costs far more than running a small op).
#pragma once

#include <functional>
#include <memory>
#include <oneapi/dnnl/dnnl.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/op_params.h"
#include "kiln/dtype.h"

namespace kiln::cpu::dnnl_util {

using Dims = std::vector<int64_t>;

/// The CPU engine (index 0) shared by all kernels.
const dnnl::engine& engine();
/// Descriptor of a row-major buffer of `dims` (f32 unless told).
dnnl::memory::desc plain_md(const Dims& dims,
                            dnnl::memory::data_type t = dnnl::memory::data_type::f32);
/// Descriptor with explicit strides (in elements; f32 unless told).
dnnl::memory::desc strided_md(const Dims& dims, const Dims& strides,
                              dnnl::memory::data_type t = dnnl::memory::data_type::f32);
/// oneDNN's type for f32 or bf16 data.
dnnl::memory::data_type data_type(DType t);
/// Whether oneDNN runs bf16 matmuls natively on this CPU (AVX-512 BF16 or AMX; elsewhere its
/// reference kernel, far slower than converting through f32). Probed once.
bool native_bf16_matmul();
/// Same dims with format `any`, letting the primitive choose a (blocked) layout.
dnnl::memory::desc any_md(const Dims& dims);

/// One argument of a cached primitive: the layout of kiln's buffer and the one the primitive
/// wants; when they differ, `reorder` converts between them around each execution (and, for an
/// output that starts from a value, a sum post-op's destination, `reorder_in` converts that value
/// in first).
struct Arg {
  int id = 0;  // DNNL_ARG_*
  dnnl::memory::desc user, chosen;
  bool output = false;
  std::optional<dnnl::reorder> reorder, reorder_in;
};
Arg make_arg(int id, const dnnl::memory::desc& user, const dnnl::memory::desc& chosen,
             bool output = false, bool accumulates = false);

/// The oneDNN memory objects of a call, kept for the next (dnnl_util.cpp).
struct Bindings;
std::shared_ptr<Bindings> new_bindings();

struct CachedPrimitive {
  dnnl::primitive prim;
  std::vector<Arg> args;
  /// The primitive's scratchpad, given per call from per-thread memory so that several threads
  /// can run one primitive at once (the library-managed scratchpad is shared).
  dnnl::memory::desc scratchpad;
  /// Memory objects of earlier calls, each taken by one call at a time and pointed at that
  /// call's buffers: a call creates none (a small op's run cost more in allocations than in
  /// arithmetic).
  std::shared_ptr<Bindings> bindings = new_bindings();
};

/// Attributes every kiln primitive is made with (user-managed scratchpad).
const dnnl::primitive_attr& attr();

/// The cached primitive under `key` (the op id, then every shape and attribute the primitive
/// depends on), made by `make` on a miss. oneDNN errors become
/// UnsupportedError naming `op`.
std::shared_ptr<const CachedPrimitive> cached(const char* op, const Dims& key,
                                              const std::function<CachedPrimitive()>& make);

/// Runs `p` on kiln's buffers, given in the order of p.args, reordering where layouts differ.
/// With `dst_init`, the output (made with `accumulates`) starts as a copy of that buffer (in the
/// output's layout; it may be the output itself), which a sum post-op adds to.
/// oneDNN errors become UnsupportedError naming `op`.
/// `chosen_arg`: the index of an argument whose buffer is already in the primitive's layout
/// (from reordered()).
void execute(const char* op, const CachedPrimitive& p, const std::vector<void*>& buffers,
             const void* dst_init = nullptr, int chosen_arg = -1);
/// `data` (in a's user layout) converted to the layout a's primitive wants, in new memory, by a's
/// own reorder: for an input (with a reorder) that stays the same over calls (constant weights),
/// converted once.
std::shared_ptr<void> reordered(const char* op, const Arg& a, const void* data);

/// A constant weight at `data` (argument `a` of its primitive, which reorders it) in the layout
/// the primitive chose: converted on first use and kept in `state` with its node, converted again
/// where the buffer or the chosen layout changes; nodes of other executables that read the same
/// live weight in the same layout (the specializations of a dynamic executable) share the copy.
/// The result holds the memory for the call.
std::shared_ptr<const void> packed_weight(const char* op, const Arg& a, const void* data,
                                          KernelState& state);
/// The key of the layout packed_weight lays `a`'s weight out in (its user and chosen
/// descriptions: dims, blocking, padding, extra data), never 0: packages store laid-out weights
/// under it, and a stored one is taken only where the primitive asks for the same key.
uint64_t layout_key(const Arg& a);
/// What laid-out weights hold for (packages use them only where this is equal): oneDNN's version
/// and the instruction set it runs on, e.g. "onednn 2.6.3 avx512_core_bf16".
const std::string& layout_identity();
/// How many times packed_weight has laid a weight out in this process (tests: the
/// specializations of a dynamic executable share one copy of each weight).
size_t weights_laid_out();

}  // namespace kiln::cpu::dnnl_util
