// Attention helpers shared by the op, the CPU and the CUDA kernels: how the mask broadcasts over
// the output's batch dims (the resolved scale: AttentionParams::scale_for, ops/attention_params.h).
#pragma once

#include <cstdint>

#include "kiln/shape.h"

namespace kiln::attention {

constexpr int kMaxBatchRank = 8;

/// Where mask element (b, i, j) lives, for output batch index b (flattened batch dims), query i
/// and key j: strides are 0 along broadcast dims.
struct MaskLayout {
  int rank = 0;                           // batch dims
  int64_t dims[kMaxBatchRank] = {};       // the output's batch dims
  int64_t strides[kMaxBatchRank] = {};    // the mask's strides along them
  int64_t sq = 0, sk = 0;                 // strides along Lq and Lk
#if defined(__CUDACC__)
  __host__ __device__
#endif
  int64_t batch_offset(int64_t b) const {
    int64_t off = 0;
    for (int d = rank - 1; d >= 0; --d) {
      const int64_t q = b / dims[d];
      off += (b - q * dims[d]) * strides[d];
      b = q;
    }
    return off;
  }
};

/// The layout of a mask of shape `m` broadcast to (batch..., lq, lk); false when the batch
/// rank exceeds kMaxBatchRank.
inline bool mask_layout(const Shape& m, const Shape& batch, int64_t lq, int64_t lk,
                        MaskLayout& out) {
  if (batch.size() > static_cast<size_t>(kMaxBatchRank)) return false;
  const int r = static_cast<int>(m.size());
  int64_t stride = 1;
  int64_t st[kMaxBatchRank + 2] = {};
  for (int d = r - 1; d >= 0; --d) {
    st[d] = m[d] == 1 ? 0 : stride;
    stride *= m[d];
  }
  const int full = static_cast<int>(batch.size()) + 2;
  auto stride_at = [&](int out_dim) -> int64_t {  // out_dim in [0, full)
    const int d = out_dim - (full - r);
    return d < 0 ? 0 : st[d];
  };
  out.rank = static_cast<int>(batch.size());
  for (int d = 0; d < out.rank; ++d) {
    out.dims[d] = batch[d];
    out.strides[d] = stride_at(d);
  }
  out.sq = lq == 1 ? 0 : stride_at(full - 2);
  out.sk = lk == 1 ? 0 : stride_at(full - 1);
  return true;
}

}  // namespace kiln::attention
