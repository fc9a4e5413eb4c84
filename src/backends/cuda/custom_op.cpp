// custom, custom_impure on CUDA: run the registered CUDA kernel of the node's custom op on the
// step's stream (placement sends nodes whose op has none to the CPU).
#include "runtime/custom_op.h"

#include "backends/cuda/kernels.h"

namespace kiln::cuda {

void register_custom_op_kernels() { detail::register_custom_dispatch(Backend::cuda); }

}  // namespace kiln::cuda
