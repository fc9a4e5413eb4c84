// CPU kernels of resize and grid_sample (the reference; math in ops/resize_util.h and
// ops/grid_sample_util.h). resize: nearest is one gather pass over element bytes (every dtype);
// linear and cubic resize one dim per pass, last dim first as the ONNX reference does,
// accumulating in double. grid_sample: per output element, the product of each dim's taps.
#include "backends/cpu/kernels.h"
#include "backends/cpu/transform_common.h"
#include "ops/grid_sample_util.h"
#include "ops/resize_params.h"
#include "ops/resize_util.h"

namespace kiln::cpu {

namespace {

void resize_nearest(KernelContext& ctx, const resize_math::Params& p,
                    const std::vector<resize_math::Dim>& dims) {
  const TensorView &x = ctx.in(0), &out = ctx.out(0);
  const int r = out.rank();
  const auto xs = contiguous_strides(x.shape);
  // per dim, the input offset each output coordinate reads, or -1 (extrapolation)
  std::vector<std::vector<int64_t>> at(r);
  for (int d = 0; d < r; ++d)
    for (int64_t o = 0; o < dims[d].out; ++o) {
      const double xo = resize_math::source_coordinate(p, dims[d], o);
      at[d].push_back(resize_math::extrapolates(p, dims[d], xo)
                          ? -1
                          : resize_math::nearest_index(p, dims[d], xo) * xs[d]);
    }
  dispatch_size(size_of(x.dtype), [&](auto u) {
    using U = decltype(u);
    U fill{};
    convert(&p.extrapolation, f64, &fill, x.dtype, 1);
    const U* src = x.ptr<U>();
    U* dst = out.ptr<U>();
    // row by row along the last dim: the other dims' offset once per row, then a table lookup
    // per element
    const int64_t width = out.shape[r - 1], rows = out.numel() / width;
    const std::vector<int64_t>& last = at[r - 1];
    ctx.parallel_for(rows, std::max<int64_t>(1, 4096 / width), [&](int64_t b, int64_t e) {
      for (int64_t row = b; row < e; ++row) {
        int64_t rem = row, off = 0;
        for (int d = r - 2; d >= 0 && off >= 0; --d) {
          const int64_t o = at[d][rem % out.shape[d]];
          rem /= out.shape[d];
          off = o < 0 ? -1 : off + o;
        }
        U* y = dst + row * width;
        if (off < 0) {
          std::fill(y, y + width, fill);
          continue;
        }
        const U* xr = src + off;
        for (int64_t j = 0; j < width; ++j) y[j] = last[j] < 0 ? fill : xr[last[j]];
      }
    });
  });
}

// One pass along dim d: (outer, in, inner) -> (outer, out, inner).
template <typename T>
void resize_pass(const KernelContext& ctx, const resize_math::Params& p,
                 const resize_math::Dim& dim, const T* src, T* dst, int64_t outer, int64_t inner) {
  struct Row {
    bool extrapolate = false;
    std::vector<int64_t> idx;
    std::vector<double> w;
  };
  std::vector<Row> rows(static_cast<size_t>(dim.out));
  for (int64_t o = 0; o < dim.out; ++o) {
    const double xo = resize_math::source_coordinate(p, dim, o);
    Row& row = rows[o];
    row.extrapolate = resize_math::extrapolates(p, dim, xo);
    if (row.extrapolate) continue;
    const resize_math::Taps t = resize_math::make_taps(p, dim, xo);
    for (int i = 0; i < t.n; ++i) {
      const double w = resize_math::tap_weight(p, dim, t, i);
      if (w == 0) continue;
      row.idx.push_back(resize_math::clamp_index(t.first + i, dim.in));
      row.w.push_back(w);
    }
  }
  const int64_t lines = outer * dim.out;
  ctx.parallel_for(lines, std::max<int64_t>(1, 4096 / std::max<int64_t>(inner, 1)),
                   [&](int64_t b, int64_t e) {
                     std::vector<double> acc(static_cast<size_t>(inner));
                     for (int64_t l = b; l < e; ++l) {
                       const int64_t o = l / dim.out, q = l % dim.out;
                       const Row& row = rows[q];
                       T* d = dst + l * inner;
                       if (row.extrapolate) {
                         std::fill(d, d + inner, static_cast<T>(p.extrapolation));
                         continue;
                       }
                       std::fill(acc.begin(), acc.end(), 0.0);
                       for (size_t k = 0; k < row.idx.size(); ++k) {
                         const T* s = src + (o * dim.in + row.idx[k]) * inner;
                         for (int64_t j = 0; j < inner; ++j) acc[j] += row.w[k] * s[j];
                       }
                       for (int64_t j = 0; j < inner; ++j) d[j] = static_cast<T>(acc[j]);
                     }
                   });
}

void resize(KernelContext& ctx) {
  const TensorView &x = ctx.in(0), &out = ctx.out(0);
  ResizeParams spare;
  const ResizeParams& rp = params_of(ctx, spare);
  const resize_math::Params& p = rp.math;
  const int r = out.rank();
  std::vector<resize_math::Dim> dims;
  for (int d = 0; d < r; ++d) dims.push_back(rp.dim(x.shape, out.shape, d));
  if (out.numel() == 0) return;
  if (p.mode == resize_math::Mode::nearest) return resize_nearest(ctx, p, dims);
  dispatch_float(x.dtype, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    Shape cur = x.shape;
    std::vector<T> bufs[2];
    const T* src = x.ptr<T>();
    int which = 0;
    std::vector<int> todo;
    for (int d = r - 1; d >= 0; --d)
      if (!resize_math::is_identity(p, dims[d])) todo.push_back(d);
    if (todo.empty()) {
      std::memcpy(out.data, x.data, x.numel() * sizeof(T));
      return;
    }
    for (size_t k = 0; k < todo.size(); ++k) {
      const int d = todo[k];
      const AxisView v(cur, d);
      cur[d] = dims[d].out;
      T* dst = out.ptr<T>();
      if (k + 1 < todo.size()) {
        bufs[which].resize(static_cast<size_t>(numel(cur)));
        dst = bufs[which].data();
      }
      resize_pass<T>(ctx, p, dims[d], src, dst, v.outer, v.inner);
      src = dst;
      which ^= 1;
    }
  });
}

// Sum over every combination of the dims' taps of weight * x (a tap that reads 0 adds nothing).
template <typename T>
double sum_taps(const T* src, const grid_math::AxisTaps* taps, int k,
                const std::vector<int64_t>& strides) {
  double acc = 0;
  int at[grid_math::kMaxSpatial] = {};
  while (true) {
    double w = 1;
    int64_t off = 0;
    for (int d = 0; d < k && off >= 0; ++d) {
      const int64_t i = taps[d].idx[at[d]];
      w *= taps[d].w[at[d]];
      off = i < 0 ? -1 : off + i * strides[d];
    }
    if (off >= 0) acc += w * static_cast<double>(src[off]);
    int d = k - 1;
    while (d >= 0 && ++at[d] == taps[d].n) at[d--] = 0;
    if (d < 0) return acc;
  }
}

void grid_sample(KernelContext& ctx) {
  const TensorView &x = ctx.in(0), &grid = ctx.in(1), &out = ctx.out(0);
  const int k = x.rank() - 2;
  const grid_math::Params p = params_of<GridSampleParams>(ctx).math(k);
  const Shape spatial(x.shape.begin() + 2, x.shape.end());
  const int64_t channels = x.shape[1], plane = numel(spatial);
  const int64_t points = numel(Shape(out.shape.begin() + 2, out.shape.end()));
  const auto xs = contiguous_strides(spatial);
  dispatch_float(x.dtype, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    const T *xp = x.ptr<T>(), *gp = grid.ptr<T>();
    T* op = out.ptr<T>();
    // one task per (batch, output point): its taps serve every channel
    const int64_t grain = std::max<int64_t>(1, 1024 / std::max<int64_t>(channels, 1));
    ctx.parallel_for(x.shape[0] * points, grain, [&](int64_t b, int64_t e) {
      for (int64_t q = b; q < e; ++q) {
        const int64_t n = q / points, pt = q % points;
        grid_math::AxisTaps taps[grid_math::kMaxSpatial];
        for (int d = 0; d < k; ++d)  // the grid lists the innermost dim first
          taps[d] = grid_math::axis_taps(p, static_cast<double>(gp[q * k + k - 1 - d]), spatial[d]);
        for (int64_t c = 0; c < channels; ++c)
          op[(n * channels + c) * points + pt] =
              static_cast<T>(sum_taps(xp + (n * channels + c) * plane, taps, k, xs));
      }
    });
  });
}
}  // namespace

void register_resize_kernels() {
  register_kernel(OpId::Resize, Backend::cpu, {resize, kAllTypes, 0});
  register_kernel(OpId::GridSample, Backend::cpu, {grid_sample, kFloatTypes, 0});
}

}  // namespace kiln::cpu
