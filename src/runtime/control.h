// Control-flow nodes at run time (src/ops/control.cpp defines the ops): each body compiled for
// the executable's device, and the kernels that run them from the host.
#pragma once

#include <memory>
#include <string>

#include "core/op_params.h"
#include "runtime/executable_impl.h"

namespace kiln::detail {

/// The bodies of control node `n` of `p`, compiled for `impl`'s device and options at the shapes
/// of the node's inputs: the node's params, which its kernels read.
std::shared_ptr<const OpParams> compile_bodies(const Program& p, const Node& n,
                                               const ExecutableImpl& impl);
/// Why the bodies of control node `n` (compiled) cannot be recorded into a run as conditional
/// nodes; empty when they can.
std::string bodies_capture_blocker(const Node& n);
/// Registers the kernels of cond, while_loop and for_loop on `backend` (called from the
/// backends' registrations, src/backends/*/control.cpp).
void register_control_dispatch(Backend backend);

}  // namespace kiln::detail
