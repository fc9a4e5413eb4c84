// custom, custom_impure on the CPU: run the registered CPU kernel of the node's custom op.
#include "runtime/custom_op.h"

#include "backends/cpu/kernels.h"

namespace kiln::cpu {

void register_custom_op_kernels() { detail::register_custom_dispatch(Backend::cpu); }

}  // namespace kiln::cpu
