// kiln's built-in ops by name: what `kiln ops` lists and `--cpu-op` takes.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace kiln {

enum class OpId : uint16_t;

/// Every built-in op, in the order of the op list (src/ops/op_list.inc).
const std::vector<OpId>& all_ops();
/// "add", "conv", ... (the snake name used in the API, docs and errors).
const char* op_name(OpId op);
/// The family the op belongs to ("elementwise", "conv", ...).
const char* op_family(OpId op);
/// Looks up by snake name; returns false when unknown.
bool op_from_name(std::string_view name, OpId& out);

}  // namespace kiln
