// Conditional nodes of CUDA graphs (IF and WHILE), for control ops recorded into a run: what the
// backend's DeviceBackend overrides call (control_nodes.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "core/device_backend.h"

namespace kiln::cuda {

/// A condition of the graph `stream` records into, reset to false at each launch.
uint64_t create_condition(cudaStream_t stream);
/// Enqueues the kernel that makes `copies` and evaluates `u` to set condition `handle`.
void set_condition(cudaStream_t stream, uint64_t handle, const DeviceBackend::ConditionUpdate& u,
                   const std::vector<DeviceBackend::DeviceCopy>& copies);
/// Adds an IF (two bodies: with an else) or WHILE node after the work `stream` has recorded;
/// returns its body graphs.
std::vector<void*> add_conditional(cudaStream_t stream, uint64_t handle, bool loop, int bodies);
/// A stream of `device` recording into `body`, and its end (the stream goes back to a pool).
cudaStream_t begin_body(int device, cudaGraph_t body);
void end_body(int device, cudaStream_t stream);

}  // namespace kiln::cuda
