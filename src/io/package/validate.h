// Checks of a program, memory plan and schedule read from a package, before anything runs them.
// Each returns an empty string when the object is sound, else what is wrong.
#pragma once

#include <string>
#include <vector>

#include "passes/memory_plan.h"
#include "passes/program.h"
#include "runtime/executable_impl.h"

namespace kiln::package {

/// The op with stable id `id` (op_list.inc); false when no op has it.
bool op_from_id(uint16_t id, OpId& out);
/// The inputs `op` takes with `attrs` ([lo, hi]); false when packages do not know the op yet.
bool arity(OpId op, const Attrs& attrs, int& lo, int& hi);
/// Dims non-negative (or -1 in a dynamic program), rank at most 64, bytes representable (below
/// 2^62).
std::string check_shape(const TensorInfo& info, bool dynamic = false);
/// A placeholder's dim names and ranges (runtime/shape_cache.h): one per dim, ranges non-empty.
std::string check_dim_specs(const detail::Node& n);
/// Node `i` of `g` (its inputs already checked to name earlier values): the number of inputs its
/// op takes, its outputs equal to the op's inference, and source nodes' single output.
std::string check_node(const detail::GraphImpl& g, size_t i);
/// Every slot a run reads or writes: inside the arena, naming a placeholder, constant or returned
/// value that fits; steps write to feeds or constants only as views of their input.
std::string check_plan(const Program& p, const MemoryPlan& plan);
/// Steps are the executed nodes in order, on `target` or the CPU, each with a kernel for its dtype.
std::string check_steps(const Program& p, const std::vector<Step>& steps, Backend target);

}  // namespace kiln::package
