// The custom-op registry as the rest of kiln sees it (include/kiln/custom_op.h is the user side).
// A node of op `custom`/`custom_impure` names its op in attribute kCustomOpKey and the library
// that registered it in kCustomLibraryKey.
#pragma once

#include <array>
#include <memory>
#include <string>

#include "core/graph_impl.h"
#include "kiln/custom_op.h"

namespace kiln::detail {

inline constexpr const char* kCustomOpKey = "custom_op";
inline constexpr const char* kCustomLibraryKey = "custom_library";

struct CustomOpEntry {
  CustomOpDef def;
  std::array<CustomKernel, kNumBackends> kernels;
};

inline bool is_custom(OpId op) { return op == OpId::Custom || op == OpId::CustomImpure; }
/// The registered entry of `name`, or nullptr.
std::shared_ptr<const CustomOpEntry> find_custom_op(const std::string& name);
/// The entry a custom node's attributes name; throws UnsupportedError saying what to load.
std::shared_ptr<const CustomOpEntry> custom_op_of(const Attrs& attrs);
/// Why a custom node cannot be used in this process ("" when its op is registered).
std::string custom_op_missing(const Attrs& attrs);
/// Whether node `n` has a kernel on `backend` (true for every built-in op: their tables decide).
bool node_has_kernel(const Node& n, Backend backend);
/// Puts the dispatcher of `custom` and `custom_impure` in `backend`'s kernel table.
void register_custom_dispatch(Backend backend);

}  // namespace kiln::detail
