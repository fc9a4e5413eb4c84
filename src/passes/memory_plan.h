// Liveness-based memory planning: every intermediate value gets an offset in one arena; a
// buffer is reused once its last reader has run. Elementwise ops may write over a dying input,
// and view ops (reshape) share their input's bytes.
#pragma once

#include <cstddef>
#include <vector>

#include "passes/program.h"

namespace kiln {

struct ValueSlot {
  enum class Where : uint8_t { none, feed, constant, arena, output };
  Where where = Where::none;
  size_t offset = 0;  // arena: byte offset
  int index = -1;     // output: position in Program::outputs; feed/constant: node id
  int storage = -1;   // buffer group id (aliases and in-place share one)
};

struct MemoryPlan {
  std::vector<std::vector<ValueSlot>> slots;  // [node][output]
  size_t arena_bytes = 0;
  int num_buffers = 0;  // distinct arena buffers (after reuse)
};

struct MemoryPlanOptions {
  bool reuse = true;     // off: every value gets its own buffer
  bool in_place = true;  // ops with OpDef::inplace_input may write over a dying input
  /// (with in_place) The CPU's: a fused_conv's output takes its residual's buffer where the
  /// residual dies there and is none of its other inputs (the residual is the sum post-op's
  /// starting value: no copy into the output first). The CPU's kernels add it in place.
  bool residual_in_place = false;
};

MemoryPlan plan_memory(const Program& p, const MemoryPlanOptions& opts);

}  // namespace kiln
