// Kernel calls: one kernel on given views, on the host or on a device's stream, with f16/bf16
// converted through f32 when the kernel asks; and a CPU kernel inside a device run.
#pragma once

#include <vector>

#include "core/graph_impl.h"
#include "kiln/array.h"
#include "kiln/kernel.h"
#include "runtime/thread_pool.h"

namespace kiln {

class DeviceBackend;
namespace prof {
class RunProfile;
}

/// Runs the host kernel `entry` for `node` on the given views, converting f16/bf16 through f32
/// when the kernel asks for it. Used by runs and by constant folding. The views are lent to the
/// kernel's context and come back unchanged.
void run_kernel(const KernelEntry& entry, const detail::Node& node, std::vector<TensorView>& in,
                std::vector<TensorView>& out, ThreadPool* pool);
/// Enqueues the device kernel `entry` (of kernel table `backend`) for `node` on env's stream;
/// f16/bf16 go through f32 with that table's cast kernel, in scratch memory of `env`. The views
/// are lent as run_kernel's.
void run_device_kernel(const KernelEntry& entry, Backend backend, const detail::Node& node,
                       std::vector<TensorView>& in, std::vector<TensorView>& out, ThreadPool* pool,
                       const KernelEnv& env);
/// Runs the CPU kernel `k` inside a device run: inputs are copied to the host (waiting for
/// `stream`), outputs back to the device, or left on the host in `host_outputs` when given.
/// `prof` (may be null) times the copies.
void run_on_host(const KernelEntry& k, const detail::Node& n, const std::vector<TensorView>& in,
                 const std::vector<TensorView>& out, DeviceBackend& b, int dev, void* stream,
                 ThreadPool* pool, std::vector<Array>* host_outputs = nullptr,
                 prof::RunProfile* prof = nullptr);
/// Evaluates one node on host arrays with the CPU kernels.
std::vector<Array> evaluate_node_cpu(const detail::Node& node, const std::vector<Array>& inputs);
/// The dtype a kernel entry is looked up by for `node`.
DType kernel_dtype(const KernelEntry& entry, const detail::Node& node,
                   const std::vector<TensorInfo>& inputs);

}  // namespace kiln
