// all_reduce and collective_wait on CUDA: the group's communicator (NCCL) enqueues on its own
// stream, ordered after and before the run's stream with CUDA events; no host synchronization.
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels.h"
#include "core/op_id.h"
#include "dist/collective_kernels.h"

namespace kiln::cuda {

namespace {
void device_copy(void* dst, const void* src, size_t bytes, void* stream) {
  KILN_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice,
                                  static_cast<cudaStream_t>(stream)));
}
void all_reduce(KernelContext& ctx) { dist::detail::all_reduce_kernel(ctx, device_copy); }
void collective_wait(KernelContext& ctx) { dist::detail::collective_wait_kernel(ctx, device_copy); }
}  // namespace

void register_dist_kernels() {
  register_kernel(OpId::AllReduce, Backend::cuda, {all_reduce, kNumericTypes, 0, false});
  register_kernel(OpId::CollectiveWait, Backend::cuda, {collective_wait, kNumericTypes, 0, false});
}

}  // namespace kiln::cuda
