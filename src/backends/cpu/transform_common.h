// Helpers shared by the CPU kernels of the transform family.
#pragma once

#include <atomic>
#include <limits>

#include "backends/cpu/cpu_common.h"

namespace kiln::cpu {

void register_transform_index_kernels();
void register_transform_sort_kernels();
void register_transform_nd_kernels();
void register_resize_kernels();

/// Calls f(U{}) with an unsigned type of `bytes` bytes: moving data needs only the element size,
/// so f16/bf16 and bool move untouched.
template <typename F> void dispatch_size(size_t bytes, F&& f) {
  switch (bytes) {
    case 1: f(uint8_t{}); return;
    case 2: f(uint16_t{}); return;
    case 4: f(uint32_t{}); return;
    case 8: f(uint64_t{}); return;
    default: KILN_ASSERT(false);
  }
}

/// A shape seen as (outer, n, inner) around `axis`.
struct AxisView {
  int64_t outer = 1, n = 1, inner = 1;
  AxisView(const Shape& s, int axis) {
    for (int d = 0; d < static_cast<int>(s.size()); ++d)
      (d < axis ? outer : d == axis ? n : inner) *= s[d];
  }
};

/// The lowest flat position of an out-of-range index seen by parallel workers; kernels report it
/// after their loop (they cannot throw inside it).
class FirstBadIndex {
 public:
  void record(int64_t pos) {
    int64_t cur = pos_.load(std::memory_order_relaxed);
    while (pos < cur && !pos_.compare_exchange_weak(cur, pos, std::memory_order_relaxed)) {}
  }
  bool any() const { return pos_.load() != kNone; }
  int64_t pos() const { return pos_.load(); }

 private:
  static constexpr int64_t kNone = std::numeric_limits<int64_t>::max();
  std::atomic<int64_t> pos_{kNone};
};

}  // namespace kiln::cpu
