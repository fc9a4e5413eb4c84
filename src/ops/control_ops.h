// What the runtime and the package reader need to know of the control family
// (src/ops/control.cpp).
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "core/op_id.h"
#include "kiln/shape.h"

namespace kiln {

struct Body;
struct TensorInfo;

/// How many bodies (Node::bodies) a node of `op` has: 2 for cond and while_loop, 1 for for_loop,
/// 0 for every other op.
size_t num_bodies(OpId op);

/// A while_loop's step: its body followed by its condition on the body's results, one program
/// (results: the next carried values, then the condition), so that an iteration is one run.
/// `operands` are the infos of the node's inputs (carried, then captured); `carried` how many
/// are carried. Null when the loop has nothing to carry.
std::shared_ptr<const Body> while_step_body(const Body& cond, const Body& body,
                                            const std::vector<TensorInfo>& operands,
                                            size_t carried);

}  // namespace kiln
