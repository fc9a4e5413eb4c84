#include "backends/cuda/cuda_common.cuh"

namespace kiln::cuda {

BroadcastIndex make_broadcast_index(const Shape& in, const Shape& out, const char* op) {
  if (out.size() > kMaxRank)
    fail<UnsupportedError>("[{}] cuda kernels take rank <= {}, got {}", op, kMaxRank, out.size());
  BroadcastIndex b;
  b.rank = static_cast<int>(out.size());
  const int shift = b.rank - static_cast<int>(in.size());
  int64_t stride = 1;
  for (int d = b.rank - 1; d >= 0; --d) {
    b.dims[d] = out[d];
    const int k = d - shift;
    if (k < 0 || in[k] == 1) {
      b.strides[d] = 0;
    } else {
      b.strides[d] = stride;
    }
    if (k >= 0) stride *= in[k];
  }
  return b;
}

AxisSplit split_at(const Shape& s, int64_t axis) {
  AxisSplit a;
  for (int64_t d = 0; d < static_cast<int64_t>(s.size()); ++d) {
    if (d < axis) a.outer *= s[d];
    else if (d == axis) a.len = s[d];
    else a.inner *= s[d];
  }
  return a;
}

}  // namespace kiln::cuda
