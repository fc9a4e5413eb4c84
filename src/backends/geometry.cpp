#include "backends/geometry.h"

#include <algorithm>

namespace kiln {

MatmulDims matmul_dims(const TensorView& a, const TensorView& b, const TensorView& out) {
  MatmulDims d;
  matmul_dims(a, b, out, d);
  return d;
}

void matmul_dims(const TensorView& a, const TensorView& b, const TensorView& out, MatmulDims& d) {
  d.K = a.shape.back();
  d.M = a.rank() >= 2 ? a.shape[a.rank() - 2] : 1;
  d.N = b.rank() >= 2 ? b.shape.back() : 1;
  const int rank = out.rank() - (a.rank() >= 2) - (b.rank() >= 2);
  d.batch.assign(out.shape.begin(), out.shape.begin() + rank);
  auto pad = [rank](const Shape& s, Shape& p) {  // (assign and insert reuse p's memory)
    p.assign(s.begin(), s.end() - std::min<int>(2, static_cast<int>(s.size())));
    p.insert(p.begin(), rank - p.size(), 1);
  };
  pad(a.shape, d.batch_a);
  pad(b.shape, d.batch_b);
}

ReducePlan plan_reduce(const Shape& shape, const std::vector<int64_t>& axes) {
  struct Group { int64_t size, stride; bool reduced; };
  const std::vector<int64_t> strides = contiguous_strides(shape);
  std::vector<Group> groups;
  ReducePlan p;
  for (size_t d = 0; d < shape.size(); ++d) {
    const bool r = std::find(axes.begin(), axes.end(), static_cast<int64_t>(d)) != axes.end();
    if (r) p.count *= shape[d];
    if (shape[d] == 1) continue;
    // adjacent dims of one kind form one dim of a dense tensor
    if (!groups.empty() && groups.back().reduced == r) {
      groups.back().size *= shape[d];
      groups.back().stride = strides[d];
    } else {
      groups.push_back({shape[d], strides[d], r});
    }
  }
  if (!groups.empty() && !groups.back().reduced) {
    p.lanes = groups.back().size;
    groups.pop_back();
  }
  for (size_t i = groups.size(); i-- > 0;) {
    if (!groups[i].reduced) continue;
    p.run = groups[i].size;
    p.run_stride = groups[i].stride;
    groups.erase(groups.begin() + static_cast<int64_t>(i));
    break;
  }
  for (const Group& g : groups) {
    (g.reduced ? p.outer_sizes : p.row_sizes).push_back(g.size);
    (g.reduced ? p.outer_strides : p.row_strides).push_back(g.stride);
  }
  for (int64_t s : p.row_sizes) p.rows *= s;
  return p;
}

}  // namespace kiln
