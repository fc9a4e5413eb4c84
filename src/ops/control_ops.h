// What the runtime and the package reader need to know of the control family
// (src/ops/control.cpp).
#pragma once

#include <cstddef>

#include "core/op_id.h"

namespace kiln {

/// How many bodies (Node::bodies) a node of `op` has: 2 for cond and while_loop, 1 for for_loop,
/// 0 for every other op.
size_t num_bodies(OpId op);

}  // namespace kiln
