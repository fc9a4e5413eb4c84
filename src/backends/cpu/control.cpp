// cond, while_loop and for_loop on the CPU: the runtime runs their bodies
// (src/runtime/control.cpp).
#include "runtime/control.h"

#include "backends/cpu/kernels.h"

namespace kiln::cpu {

void register_control_kernels() { detail::register_control_dispatch(Backend::cpu); }

}  // namespace kiln::cpu
