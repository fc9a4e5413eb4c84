// Integer to integer conversion as Array::convert and CUDA's cast do it: the value itself where
// the target type holds it, else the nearest end of the target's range (as float to integer
// saturates), in integer arithmetic (no rounding through double for 64-bit values). Not for bool.
#pragma once

#include <cstdint>
#include <limits>
#include <type_traits>

#if defined(__CUDACC__)
#define KILN_INT_CAST_HD __host__ __device__
#else
#define KILN_INT_CAST_HD
#endif

namespace kiln {

template <typename D, typename S> KILN_INT_CAST_HD constexpr D saturate_int(S v) {
  static_assert(std::is_integral_v<D> && std::is_integral_v<S>);
  if constexpr (std::is_signed_v<S>) {
    if (v < 0) {
      if constexpr (std::is_signed_v<D>) {
        constexpr int64_t lo = static_cast<int64_t>(std::numeric_limits<D>::min());
        return static_cast<int64_t>(v) < lo ? std::numeric_limits<D>::min() : static_cast<D>(v);
      } else {
        return D(0);
      }
    }
  }
  constexpr uint64_t hi = static_cast<uint64_t>(std::numeric_limits<D>::max());
  return static_cast<uint64_t>(v) > hi ? std::numeric_limits<D>::max() : static_cast<D>(v);
}

}  // namespace kiln
