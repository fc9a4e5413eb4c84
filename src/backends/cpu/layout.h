// Layout helpers of the CPU kernels for channels_last nodes (NHWC data), which the channels_last
// pass gives GPU programs: a package compiled for a GPU runs here through NCHW copies.
#pragma once

#include <array>
#include <cstdint>

#include "kiln/kernel.h"

namespace kiln::cpu {

/// dst = src (4-D, shape s) with its dims in the order `perm` (dst dim i is src dim perm[i]).
template <typename T>
void permute4(const KernelContext& ctx, const T* src, const Shape& s, T* dst,
              const std::array<int, 4>& perm) {
  const int64_t ss[4] = {s[1] * s[2] * s[3], s[2] * s[3], s[3], 1};
  const int64_t d[4] = {s[perm[0]], s[perm[1]], s[perm[2]], s[perm[3]]};
  const int64_t st[4] = {ss[perm[0]], ss[perm[1]], ss[perm[2]], ss[perm[3]]};
  ctx.parallel_for(d[0] * d[1], 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* in = src + (r / d[1]) * st[0] + (r % d[1]) * st[1];
      T* out = dst + r * d[2] * d[3];
      for (int64_t i = 0; i < d[2]; ++i)
        for (int64_t j = 0; j < d[3]; ++j) *out++ = in[i * st[2] + j * st[3]];
    }
  });
}

/// (N, H, W, C) as (N, C, H, W), and back.
inline Shape nchw_of(const Shape& s) { return {s[0], s[3], s[1], s[2]}; }
inline Shape nhwc_of(const Shape& s) { return {s[0], s[2], s[3], s[1]}; }
/// A 4-D shape as it is, or (nhwc) nchw_of's, without allocating.
inline std::array<int64_t, 4> nchw4(const Shape& s, bool nhwc) {
  return nhwc ? std::array<int64_t, 4>{s[0], s[3], s[1], s[2]}
              : std::array<int64_t, 4>{s[0], s[1], s[2], s[3]};
}
inline constexpr std::array<int, 4> kNhwcToNchw{0, 3, 1, 2}, kNchwToNhwc{0, 2, 3, 1};

/// Runs `kernel` for a channels_last node whose 4-D inputs and outputs are NHWC (a conv weight
/// (O, kh, kw, C/G); inputs of other ranks do not depend on the layout): on NCHW copies of the
/// 4-D inputs, into NCHW scratch outputs that are permuted back, with channels_last off.
void run_via_nchw(KernelContext& ctx, KernelFn kernel);

}  // namespace kiln::cpu
