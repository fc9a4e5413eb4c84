// The kernels of the collective ops, shared by the backends: they look up the op's group and
// hand the buffers to its communicator (the backend only supplies its copy for a group of one).
#pragma once

#include <cstddef>

#include "kiln/kernel.h"

namespace kiln::dist::detail {

/// Copies `bytes` from src to dst after the work on `stream` (nullptr on the CPU).
using CopyFn = void (*)(void* dst, const void* src, size_t bytes, void* stream);

/// all_reduce: starts the collective on the kernel's stream; without a registered group (a single
/// process) the result is a copy of the input.
void all_reduce_kernel(KernelContext& ctx, CopyFn copy);
/// collective_wait: orders the kernel's stream after the collective its input comes from (CUDA),
/// or blocks until it completes (CPU), then copies the result when the output is not a view of it
/// (a returned value). Throws CommError when it failed.
void collective_wait_kernel(KernelContext& ctx, CopyFn copy);

}  // namespace kiln::dist::detail
