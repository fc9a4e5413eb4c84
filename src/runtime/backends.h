// The built-in backends register their kernels through this hook (defined in src/backends/).
#pragma once

namespace kiln {

/// Fills the kernel tables of every backend compiled in. Called once, on first lookup.
void register_builtin_backends();

}  // namespace kiln
