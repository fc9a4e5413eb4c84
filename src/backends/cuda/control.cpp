// cond, while_loop and for_loop on CUDA: the runtime runs their bodies from the host, on the
// run's stream (src/runtime/control.cpp).
#include "runtime/control.h"

#include "backends/cuda/kernels.h"

namespace kiln::cuda {

void register_control_kernels() { detail::register_control_dispatch(Backend::cuda); }

}  // namespace kiln::cuda
