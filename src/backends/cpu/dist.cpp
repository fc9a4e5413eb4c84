// all_reduce and collective_wait on the CPU: the group's communicator does the work.
#include <cstring>

#include "backends/cpu/kernels.h"
#include "core/op_id.h"
#include "dist/collective_kernels.h"

namespace kiln::cpu {

namespace {
void host_copy(void* dst, const void* src, size_t bytes, void*) { std::memcpy(dst, src, bytes); }
void all_reduce(KernelContext& ctx) { dist::detail::all_reduce_kernel(ctx, host_copy); }
void collective_wait(KernelContext& ctx) { dist::detail::collective_wait_kernel(ctx, host_copy); }
}  // namespace

void register_dist_kernels() {
  // every dtype natively: the communicator reads and writes the buffers after the kernel returns
  const DTypeSet all = kNumericTypes;
  register_kernel(OpId::AllReduce, Backend::cpu, {all_reduce, all, 0, false});
  register_kernel(OpId::CollectiveWait, Backend::cpu, {collective_wait, all, 0, false});
}

}  // namespace kiln::cpu
