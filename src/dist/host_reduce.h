// Reductions of host buffers, shared by the in-process group and the MPI communicator.
#pragma once

#include <cstdint>
#include <vector>

#include "kiln/dist.h"

namespace kiln::dist::detail {

/// dst[i] = op over r of srcs[r][i], in rank order, computed in the dtype's arithmetic type
/// (float for f16/bf16). `dst` may be one of `srcs`. mean divides the sum by the number of
/// sources (integer division for integer dtypes). Throws DTypeError for bool.
void reduce_host(DType t, Reduction op, const std::vector<const void*>& srcs, void* dst,
                 int64_t count);

/// Divides `count` elements of `buf` by `n` in place (mean after a sum).
void divide_host(DType t, void* buf, int64_t count, int n);

/// The registered group `name` for a run on this thread: the thread's scoped group, else the
/// process-wide one; nullptr when there is none and the process was not launched as one rank of
/// several (a run then acts as a group of one). Throws ValueError when a launcher started this
/// process as one of several ranks but no such group is registered.
std::shared_ptr<Communicator> group_for_run(const std::string& name, const char* op);

}  // namespace kiln::dist::detail
