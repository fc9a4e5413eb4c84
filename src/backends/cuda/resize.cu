// CUDA kernels of resize and grid_sample, computing the same taps as the CPU reference
// (ops/resize_util.h, ops/grid_sample_util.h) on the device. resize: nearest is one gather over
// element bytes (every dtype); linear and cubic resize one dim per pass, last dim first, through
// scratch buffers in the accumulation type (float for half types and f32, double for f64).
// grid_sample: one thread per output element sums the product of each dim's taps.
#include <string>
#include <vector>

#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/kernels.h"
#include "kiln/array.h"
#include "ops/grid_sample_util.h"
#include "ops/resize_params.h"
#include "ops/resize_util.h"

namespace kiln::cuda {

void register_resize_kernels();

namespace {

#define KILN_GRID_LOOP(i, n)                                                 \
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < (n); \
       i += int64_t{gridDim.x} * blockDim.x)

/// Every dim's resize and the input's strides, passed by value.
struct Geometry {
  int rank = 0;
  resize_math::Dim dims[kMaxRank];
  int64_t in_strides[kMaxRank] = {};
};

template <typename U>
__global__ void nearest_kernel(const U* __restrict__ x, U* __restrict__ out, Geometry g,
                               resize_math::Params p, U fill, int64_t total) {
  KILN_GRID_LOOP(i, total) {
    int64_t rem = i, off = 0;
    bool outside = false;
    for (int d = g.rank - 1; d >= 0; --d) {
      const resize_math::Dim& dim = g.dims[d];
      const int64_t o = rem % dim.out;
      rem /= dim.out;
      const double xo = resize_math::source_coordinate(p, dim, o);
      outside = outside || resize_math::extrapolates(p, dim, xo);
      if (!outside) off += resize_math::nearest_index(p, dim, xo) * g.in_strides[d];
    }
    out[i] = outside ? fill : x[off];
  }
}

// One pass along a dim: (outer, dim.in, inner) -> (outer, dim.out, inner).
template <typename TI, typename TO>
__global__ void pass_kernel(const TI* __restrict__ src, TO* __restrict__ dst, resize_math::Dim dim,
                            resize_math::Params p, int64_t inner, int64_t total) {
  using A = std::conditional_t<std::is_same_v<TI, double> || std::is_same_v<TO, double>, double,
                               float>;
  KILN_GRID_LOOP(i, total) {
    const int64_t j = i % inner, l = i / inner, q = l % dim.out, o = l / dim.out;
    const double xo = resize_math::source_coordinate(p, dim, q);
    if (resize_math::extrapolates(p, dim, xo)) {
      dst[i] = from_acc<TO>(static_cast<A>(p.extrapolation));
      continue;
    }
    const resize_math::Taps t = resize_math::make_taps(p, dim, xo);
    A acc = 0;
    for (int k = 0; k < t.n; ++k) {
      const double w = resize_math::tap_weight(p, dim, t, k);
      if (w == 0) continue;
      const int64_t at = resize_math::clamp_index(t.first + k, dim.in);
      acc += static_cast<A>(w) * static_cast<A>(to_acc(src[(o * dim.in + at) * inner + j]));
    }
    dst[i] = from_acc<TO>(acc);
  }
}

/// Calls f(U{}) with an unsigned type of one element of `bytes` bytes.
template <typename F> void dispatch_elem(size_t bytes, F&& f) {
  switch (bytes) {
    case 1: f(uint8_t{}); return;
    case 2: f(uint16_t{}); return;
    case 4: f(uint32_t{}); return;
    case 8: f(uint64_t{}); return;
    default: fail<UnsupportedError>("[resize] cuda kernel got element size {}", bytes);
  }
}

void resize(KernelContext& ctx) {
  const TensorView &x = ctx.in(0), &out = ctx.out(0);
  const int64_t total = out.numel();
  if (total == 0) return;
  ResizeParams spare;
  const ResizeParams& rp = params_of(ctx, spare);
  const resize_math::Params& p = rp.math;
  const int r = out.rank();
  if (r > kMaxRank)
    fail<UnsupportedError>("[resize] cuda kernel takes rank <= {}, got {}", kMaxRank, r);
  Geometry g;
  g.rank = r;
  const auto xs = contiguous_strides(x.shape);
  for (int d = 0; d < r; ++d) {
    g.dims[d] = rp.dim(x.shape, out.shape, d);
    g.in_strides[d] = xs[d];
  }
  const cudaStream_t s = stream_of(ctx);
  if (p.mode == resize_math::Mode::nearest) {
    dispatch_elem(size_of(x.dtype), [&](auto u) {
      using U = decltype(u);
      U fill{};
      convert(&p.extrapolation, DType::f64, &fill, x.dtype, 1);
      nearest_kernel<U><<<blocks_for(total), kThreads, 0, s>>>(x.ptr<U>(), out.ptr<U>(), g, p,
                                                               fill, total);
    });
    check_launch("resize");
    return;
  }
  std::vector<int> todo;
  for (int d = r - 1; d >= 0; --d)
    if (!resize_math::is_identity(p, g.dims[d])) todo.push_back(d);
  if (todo.empty()) {
    KILN_CUDA_CHECK(cudaMemcpyAsync(out.data, x.data, total * size_of(x.dtype),
                                    cudaMemcpyDeviceToDevice, s));
    return;
  }
  dispatch_float(x.dtype, "resize", [&](auto t) {
    using T = decltype(t);
    using A = acc_t<T>;
    Shape cur = x.shape;
    const void* src = x.data;
    for (size_t k = 0; k < todo.size(); ++k) {
      const int d = todo[k];
      int64_t inner = 1;
      for (int e = d + 1; e < r; ++e) inner *= cur[e];
      cur[d] = g.dims[d].out;
      const int64_t n = numel(cur);
      const bool first = k == 0, last = k + 1 == todo.size();
      void* dst = last ? out.data : ctx.scratch(static_cast<size_t>(n) * sizeof(A));
      auto launch = [&](auto ti, auto to) {
        using TI = decltype(ti);
        using TO = decltype(to);
        pass_kernel<TI, TO><<<blocks_for(n), kThreads, 0, s>>>(
            static_cast<const TI*>(src), static_cast<TO*>(dst), g.dims[d], p, inner, n);
      };
      if (first && last) launch(T{}, T{});
      else if (first) launch(T{}, A{});
      else if (last) launch(A{}, T{});
      else launch(A{}, A{});
      check_launch("resize");
      src = dst;
    }
  });
}

struct SampleGeometry {
  int64_t channels = 1, points = 1, plane = 1;
  int64_t dims[grid_math::kMaxSpatial] = {}, strides[grid_math::kMaxSpatial] = {};
};

template <typename T>
__global__ void grid_sample_kernel(const T* __restrict__ x, const T* __restrict__ grid,
                                   T* __restrict__ out, SampleGeometry g, grid_math::Params p,
                                   int64_t total) {
  using A = acc_t<T>;
  const int k = p.spatial;
  KILN_GRID_LOOP(i, total) {
    const int64_t pt = i % g.points, nc = i / g.points, n = nc / g.channels;
    const int64_t q = n * g.points + pt;
    grid_math::AxisTaps taps[grid_math::kMaxSpatial];
    for (int d = 0; d < k; ++d)  // the grid lists the innermost dim first
      taps[d] = grid_math::axis_taps(p, static_cast<double>(to_acc(grid[q * k + k - 1 - d])),
                                       g.dims[d]);
    const T* src = x + nc * g.plane;
    double acc = 0;
    int at[grid_math::kMaxSpatial] = {};
    while (true) {
      double w = 1;
      int64_t off = 0;
      for (int d = 0; d < k && off >= 0; ++d) {
        const int64_t j = taps[d].idx[at[d]];
        w *= taps[d].w[at[d]];
        off = j < 0 ? -1 : off + j * g.strides[d];
      }
      if (off >= 0) acc += w * static_cast<double>(to_acc(src[off]));
      int d = k - 1;
      while (d >= 0 && ++at[d] == taps[d].n) at[d--] = 0;
      if (d < 0) break;
    }
    out[i] = from_acc<T>(static_cast<A>(acc));
  }
}

void grid_sample(KernelContext& ctx) {
  const TensorView &x = ctx.in(0), &grid = ctx.in(1), &out = ctx.out(0);
  const int64_t total = out.numel();
  if (total == 0) return;
  const int k = x.rank() - 2;
  const grid_math::Params p = params_of<GridSampleParams>(ctx).math(k);
  SampleGeometry g;
  g.channels = x.shape[1];
  g.points = numel(Shape(out.shape.begin() + 2, out.shape.end()));
  const Shape spatial(x.shape.begin() + 2, x.shape.end());
  g.plane = numel(spatial);
  const auto xs = contiguous_strides(spatial);
  for (int d = 0; d < k; ++d) {
    g.dims[d] = spatial[d];
    g.strides[d] = xs[d];
  }
  dispatch_float(x.dtype, "grid_sample", [&](auto t) {
    using T = decltype(t);
    grid_sample_kernel<T><<<blocks_for(total), kThreads, 0, stream_of(ctx)>>>(
        x.ptr<T>(), grid.ptr<T>(), out.ptr<T>(), g, p, total);
  });
  check_launch("grid_sample");
}
}  // namespace
#undef KILN_GRID_LOOP

void register_resize_kernels() {
  register_kernel(OpId::Resize, Backend::cuda, {resize, kAllTypes, 0, /*half_via_f32=*/false});
  register_kernel(OpId::GridSample, Backend::cuda,
                  {grid_sample, kFloatTypes, 0, /*half_via_f32=*/false});
}

}  // namespace kiln::cuda
