// Control flow: ops whose bodies are graphs (MPSGraph's if, while and for; ONNX If and Loop).
//
// A body is a function from its operands to its results, called once while the op is built, on
// a graph of its own: the Tensors it gets are that graph's placeholders. A value of the graph
// around it (a weight, an input) that the body reads is captured: it becomes an operand of the
// node, so bodies never refer to nodes outside them. Bodies may nest. A body may not assign
// variables. Carried values keep their dtypes and shapes from one iteration to the next.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "kiln/graph.h"

namespace kiln {

/// A body: its results from its operands.
using BodyFn = std::function<std::vector<Tensor>(const std::vector<Tensor>& operands)>;

/// then_fn(operands) when pred (a bool with one element) is true, else else_fn(operands); only
/// the branch taken runs. The branches give results of matching dtypes and shapes.
std::vector<Tensor> cond(const Tensor& pred, const std::vector<Tensor>& operands,
                         const BodyFn& then_fn, const BodyFn& else_fn);

struct WhileLoopOptions {
  /// More iterations than this fail the run with a ValueError giving the count (-1: no limit).
  int64_t max_trip_count = -1;
};

/// While cond_fn(carried) (one bool) is true, carried = body_fn(carried); returns the last
/// carried values (init when cond_fn is false at once).
std::vector<Tensor> while_loop(const std::vector<Tensor>& init, const BodyFn& cond_fn,
                               const BodyFn& body_fn, const WhileLoopOptions& options = {});

/// carried = body_fn({i, carried...}) for i = 0 .. n-1 (i a 0-d int64); `n` is a 0-d integer
/// read when the run reaches the loop (none runs when it is 0 or less). Returns the last carried
/// values.
std::vector<Tensor> for_loop(const Tensor& n, const std::vector<Tensor>& init,
                             const BodyFn& body_fn);
std::vector<Tensor> for_loop(int64_t n, const std::vector<Tensor>& init, const BodyFn& body_fn);

}  // namespace kiln
