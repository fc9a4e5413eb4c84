// The cross-backend harness (after ggml's test-backend-ops): every op of src/ops/op_list.inc, in
// every dtype its CPU kernel takes, runs through a table of cases on the CPU and on the target
// device (KILN_HARNESS_DEVICE, default cuda:0), and every output and gradient must agree.
//
// One registration per op (cases_<family>.cpp): a builder fills a Case (graph, fed placeholders,
// outputs) for a dtype and a case index, or returns false when that case does not apply to the
// dtype. A new op of op_list.inc fails Harness.EveryOpHasCases until it is registered.
//
// Each case compiles twice without graph optimization (constant folding would run the op on the
// CPU): for the CPU and for the target with strict placement. Float outputs agree within
// tolerance(dtype) * tol_scale relative to |cpu| + mean |cpu| of the output; integer and bool
// outputs exactly. For ops with a gradient rule, f32 and f16 cases also compare the gradients of
// sum_k sum(out_k * w_k) (fresh random w_k) with respect to every float input. Cases whose op has
// no target kernel for the dtype, or that need another op without a target kernel, are skipped
// (Harness.CudaKernelCoverage fails for the missing f32/f16/bf16 kernels). Every run prints
// "backend_ops: N cases, M passed, K failed, S skipped" at the end; KILN_TEST_SEED replays one.
//
//   KILN_HARNESS_DEVICE=cpu kiln_backend_ops          # every case on the CPU, twice
//   KILN_HARNESS_DTYPES=f32,f16 kiln_backend_ops      # only these dtypes
//   kiln_backend_ops --gtest_filter='*/Softmax'       # one op on cuda:0 (skips without a GPU)
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/op_id.h"
#include "support/reference.h"

namespace kiln::harness {

/// How an input reaches the op: as fed, or made non-contiguous inside the graph first.
enum class Layout {
  dense,
  transposed,  // fed with its last two dims swapped, then transposed back
  strided,     // fed with the last dim doubled, then sliced with step 2
};

/// Produces the host data of one input, given its fed (physical) shape.
using Gen = std::function<Array(const Shape&)>;

/// One case: a graph whose placeholders are fed fresh data, and the outputs to compare.
class Case {
 public:
  Graph g;
  Feeds feeds;
  std::vector<Tensor> outs;
  /// Short description of the case (shapes, attributes), printed with failures.
  std::string label;
  /// Multiplies the dtype tolerance (long accumulations, ops that amplify rounding).
  double tol_scale = 1;
  /// Whether the gradient check applies to this case (the op must also have a gradient rule).
  bool grad = true;
  /// Placeholders with every dim dynamic (-1) and no data: tests/backend_ops/dynamic_dims.cpp feeds
  /// them the data of the same case built with static shapes.
  bool dynamic_inputs = false;

  /// A placeholder of `shape` (logical) fed by `gen`, reaching the op through `layout`.
  Tensor input(const Shape& shape, DType t, const Gen& gen, Layout layout = Layout::dense);
  /// Uniform floats in [lo, hi); integers in the dtype's default range; fair bools.
  Tensor rand(const Shape& shape, DType t, Layout layout = Layout::dense);
  Tensor rand(const Shape& shape, DType t, double lo, double hi, Layout layout = Layout::dense);
  /// Values with |v| in [min_abs, max_abs] (integers: nonzero).
  Tensor nonzero(const Shape& shape, DType t, double min_abs = 0.25, double max_abs = 2.0,
                 Layout layout = Layout::dense);
  /// Integers in [lo, hi] stored as `t` (index inputs, small exact values).
  Tensor ints(const Shape& shape, int64_t lo, int64_t hi, DType t = i64,
              Layout layout = Layout::dense);
  /// Floats without ties (for argmax, sort, max pooling indices): distinct over the whole array
  /// when the dtype holds enough exact values, else over the last two fed dims, else the last;
  /// random integers for integer and bool dtypes.
  Tensor distinct(const Shape& shape, DType t, Layout layout = Layout::dense);
  /// A variable of `shape` whose initial value (a fixed pattern of exact values in [0.5, 6]) is
  /// the same in every build of the case: DynamicDims builds a case twice and compares the runs.
  Tensor variable(const Shape& shape, DType t);
  /// Adds `label` text ("; " separated).
  void note(const std::string& s) { label += label.empty() ? s : "; " + s; }
};

using Builder = std::function<bool(Case&, DType, int)>;

struct OpCases {
  OpId op;
  /// Case indices 0..num_cases-1 are tried for every dtype.
  int num_cases = 1;
  Builder build;
  /// The dtypes to try; empty: every dtype of kHarnessTypes the op's CPU kernel handles.
  std::vector<DType> dtypes;
};

/// The dtypes the harness tries.
inline constexpr DType kHarnessTypes[] = {f32, f16, bf16, f64, i32, i64,    i16,
                                          i8,  u8,  u16,  u32, u64, boolean};

/// Adds the cases of an op (one registration per op). Returns true, for static registration.
bool register_cases(OpCases cases);
/// The registration of `op`, or nullptr.
const OpCases* find_cases(OpId op);

// Data generators.
/// Default integer range of a dtype for random data (small enough to keep sums in range).
void int_range(DType t, int64_t& lo, int64_t& hi);
Gen uniform(DType t, double lo, double hi);
/// Floats k + f with integer k in [lo, hi] and f in [0.1, 0.4] or [0.6, 0.9]: away from the
/// ties of floor, ceil, round and casts.
Gen off_ties(DType t, int64_t lo, int64_t hi);
/// `base` with about one float element in six replaced by NaN (other dtypes unchanged).
Gen with_nans(DType t, Gen base);
/// Host array from doubles.
Array from_f64(const std::vector<double>& v, const Shape& shape, DType t);

// The target and the comparison (harness.cpp).
/// The device compared with the CPU: KILN_HARNESS_DEVICE, default cuda:0.
Device target_device();
/// Why the target cannot run here; "" when it can.
std::string target_unavailable();
/// "" when `got` matches `want` (exact for integer and bool dtypes, NaN where NaN, infinities
/// equal); else the first mismatching element and the number of them.
std::string compare(const Array& want, const Array& got, double tol);

/// The dtype an op's sweeps over every op try: its first listed dtype, else f32 when its CPU
/// kernel takes it, else the first harness dtype it takes.
DType first_dtype(const OpCases& oc);
/// Runs `check(cases, dtype, i)` over the cases of every registered op ("" right, "n/a" not
/// applicable, else what is wrong) and expects the ops that fail to be exactly those of `listed`
/// (each with its reason): a listed op that passes fails too, so the list stays true. `what`
/// names the failure ("ops fail on dynamic dims"); at least `min_checked` ops must apply.
void expect_listed_failures(const std::function<std::string(const OpCases&, DType, int)>& check,
                            const std::map<OpId, const char*>& listed, const char* what,
                            int min_checked);

/// Shape of `out` from a throwaway graph (for ops whose inputs depend on another op's output).
Shape shape_of(const std::function<Tensor(Graph&)>& f);

}  // namespace kiln::harness
