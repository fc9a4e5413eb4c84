// The most elements a tensor may hold: past 2^59, bytes and strides of any dtype overflow 64 bits.
// Shapes are checked where they first appear (graph nodes, arrays), so no planner, allocator or
// kernel sees a count that wrapped.
#pragma once

#include <cstdint>

#include "kiln/shape.h"

namespace kiln {

inline constexpr int64_t kMaxElements = int64_t{1} << 59;

/// True when the product of the positive dims is at most kMaxElements. Zero dims do not excuse
/// the others (strides are products of them too); unknown dims are left out.
inline bool within_element_limit(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) {
    if (d <= 0) continue;
    if (n > kMaxElements / d) return false;
    n *= d;
  }
  return true;
}

}  // namespace kiln
