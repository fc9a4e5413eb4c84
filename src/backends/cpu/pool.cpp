// CPU kernels of the pool family. Every op runs as 3-D pooling (1-D and 2-D get leading
// spatial dims of size 1), in parallel over output rows (n, c, od, oh); the gradient ops scatter
// into the input, so they run in parallel over (n, c) planes instead.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backends/cpu/cpu_common.h"
#include "backends/cpu/kernels.h"
#include "backends/cpu/layout.h"
#include "backends/cpu/transform_common.h"
#include "ops/pool_params.h"

namespace kiln::cpu {

namespace {

// Pooling geometry over (D, H, W); unused leading dims have size 1 and a 1-wide window.
struct PoolGeom {
  int64_t planes = 1;  // N * C
  int64_t in[3] = {1, 1, 1}, out[3] = {1, 1, 1};
  int64_t k[3] = {1, 1, 1}, s[3] = {1, 1, 1}, pad[3] = {0, 0, 0}, pad_end[3] = {0, 0, 0};
  int64_t dil[3] = {1, 1, 1};
  int64_t in_plane() const { return in[0] * in[1] * in[2]; }
  int64_t rows() const { return planes * out[0] * out[1]; }
};

// Geometry of pooling input x to output y (for the gradient ops: dx to dy) with 1-wide windows:
// adaptive pooling and max_pool_grad, whose windows follow from the shapes.
PoolGeom pool_geom(const Shape& x, const Shape& y) {
  const int nd = static_cast<int>(x.size()) - 2;
  PoolGeom g;
  g.planes = x[0] * x[1];
  for (int d = 0; d < nd; ++d) {
    g.in[3 - nd + d] = x[2 + d];
    g.out[3 - nd + d] = y[2 + d];
  }
  return g;
}
// The same with the node's window (max_pool, avg_pool, avg_pool_grad).
PoolGeom pool_geom(const PoolParams& p, const Shape& x, const Shape& y) {
  PoolGeom g = pool_geom(x, y);
  const int nd = static_cast<int>(x.size()) - 2;
  for (int d = 0; d < nd; ++d) {
    const int e = 3 - nd + d;
    g.k[e] = p.kernel[d];
    g.s[e] = p.stride[d];
    g.pad[e] = p.pads[d];
    g.pad_end[e] = p.pads[nd + d];
    g.dil[e] = p.dilation[d];
  }
  return g;
}

// Taps [lo, hi) of a window starting at `start` (step `dil`) that fall inside [0, size).
struct Taps {
  int64_t lo, hi;
};
Taps valid_taps(int64_t start, int64_t k, int64_t dil, int64_t size) {
  const int64_t lo = start < 0 ? (-start + dil - 1) / dil : 0;
  const int64_t hi = start >= size ? 0 : std::min(k, (size - start + dil - 1) / dil);
  return {lo, std::max(lo, hi)};
}

// Output row r, counted over (plane, od, oh).
struct Row {
  int64_t plane, od, oh;
};
Row row_at(const PoolGeom& g, int64_t r) {
  return {r / (g.out[0] * g.out[1]), r / g.out[1] % g.out[0], r % g.out[1]};
}
int64_t row_grain(const PoolGeom& g) {
  return std::max<int64_t>(1, 32768 / std::max<int64_t>(1, g.out[2] * g.k[0] * g.k[1] * g.k[2]));
}

// Runs body(row) over all output rows in parallel.
template <typename F> void for_rows(const KernelContext& ctx, const PoolGeom& g, F&& body) {
  ctx.parallel_for(g.rows(), row_grain(g), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) body(row_at(g, r));
  });
}

// ---- max pooling ----

template <typename T> bool takes_max(T v, T best) {
  if constexpr (std::is_floating_point_v<T>) return v > best || std::isnan(v);
  else return v > best;
}

// One output row of max pooling. Windows inside the input along W share one list of tap
// offsets; the few border windows clip their taps one by one.
template <typename T> struct MaxPoolRow {
  const PoolGeom& g;
  const T* x;        // this plane
  T* y;              // this output row
  int64_t* arg;      // its indices
  Taps td, th;       // valid taps along D and H for this row
  int64_t id0, ih0;  // window start along D and H

  int64_t tap_offset(int64_t kd, int64_t kh) const {
    return ((id0 + kd * g.dil[0]) * g.in[1] + ih0 + kh * g.dil[1]) * g.in[2];
  }
  // A single output ow, over its own valid W taps.
  void border(int64_t ow) const {
    const int64_t iw0 = ow * g.s[2] - g.pad[2];
    const Taps tw = valid_taps(iw0, g.k[2], g.dil[2], g.in[2]);
    T best = std::numeric_limits<T>::lowest();
    int64_t where = -1;
    for (int64_t kd = td.lo; kd < td.hi; ++kd)
      for (int64_t kh = th.lo; kh < th.hi; ++kh)
        for (int64_t kw = tw.lo; kw < tw.hi; ++kw) {
          const int64_t i = tap_offset(kd, kh) + iw0 + kw * g.dil[2];
          if (where < 0 || takes_max(x[i], best)) {
            best = x[i];
            where = i;
          }
        }
    y[ow] = best;
    if (arg) arg[ow] = where;
  }
  // Offsets of the window taps of output 0 in (kd, kh, kw) order; output ow adds ow * stride.
  void list_taps(std::vector<int64_t>& taps) const {
    taps.clear();
    for (int64_t kd = td.lo; kd < td.hi; ++kd)
      for (int64_t kh = th.lo; kh < th.hi; ++kh)
        for (int64_t kw = 0; kw < g.k[2]; ++kw)
          taps.push_back(tap_offset(kd, kh) + kw * g.dil[2] - g.pad[2]);
  }
  // An output whose window is inside the input along W; the first maximum wins.
  void interior(int64_t ow, const std::vector<int64_t>& taps) const {
    const int64_t at = ow * g.s[2];
    size_t best = 0;
    for (size_t k = 1; k < taps.size(); ++k)
      if (takes_max(x[taps[k] + at], x[taps[best] + at])) best = k;
    y[ow] = x[taps[best] + at];
    if (arg) arg[ow] = taps[best] + at;
  }
};

using f32x4 = float __attribute__((vector_size(16)));
using i32x4 = int32_t __attribute__((vector_size(16)));

f32x4 load_strided(const float* p, int64_t stride) {
  if (stride == 1) {
    f32x4 v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
  return f32x4{p[0], p[stride], p[2 * stride], p[3 * stride]};
}

// Interior f32 outputs [lo, hi) eight at a time in SIMD lanes, each lane keeping its running
// maximum and tap number (compare and select, no branches). Returns where it stopped.
int64_t max_pool_simd(const MaxPoolRow<float>& r, const std::vector<int64_t>& taps, int64_t lo,
                      int64_t hi) {
  const int64_t s = r.g.s[2];
  int64_t ow = lo;
  for (; ow + 8 <= hi; ow += 8) {
    f32x4 best[2];
    i32x4 tap[2] = {};
    for (int h = 0; h < 2; ++h) best[h] = load_strided(r.x + (taps[0] + (ow + 4 * h) * s), s);
    for (size_t k = 1; k < taps.size(); ++k) {
      const i32x4 kk = i32x4{} + static_cast<int32_t>(k);
      for (int h = 0; h < 2; ++h) {
        const f32x4 v = load_strided(r.x + (taps[k] + (ow + 4 * h) * s), s);
        const i32x4 take = (v > best[h]) | (v != v);  // NaN wins, as in takes_max
        best[h] = take ? v : best[h];
        tap[h] = take ? kk : tap[h];
      }
    }
    for (int u = 0; u < 8; ++u) {
      r.y[ow + u] = best[u / 4][u % 4];
      r.arg[ow + u] = taps[tap[u / 4][u % 4]] + (ow + u) * s;
    }
  }
  return ow;
}

// Interior f32 outputs [lo, hi) of a row without indices: the first tap's values, then each
// other tap's taken where larger (or NaN), tap by tap along the row, so that the loop over
// outputs vectorizes (S: the W stride, written out for 1 and 2; 0 for any other, `s`).
template <int S> void max_pool_values(const float* x, float* y, const std::vector<int64_t>& taps,
                                      int64_t lo, int64_t hi, int64_t s) {
  const int64_t st = S ? S : s;
  const float* x0 = x + taps[0];
  for (int64_t ow = lo; ow < hi; ++ow) y[ow] = x0[ow * st];
  for (size_t k = 1; k < taps.size(); ++k) {
    const float* xk = x + taps[k];
    for (int64_t ow = lo; ow < hi; ++ow) {
      const float v = xk[ow * st], b = y[ow];
      y[ow] = v > b || v != v ? v : b;
    }
  }
}

// (no_indices: nothing reads output 1, which is then left unwritten)
template <typename T> void max_pool_typed(KernelContext& ctx, const PoolGeom& g, bool no_indices) {
  const T* x = ctx.in(0).ptr<T>();
  T* y = ctx.out(0).ptr<T>();
  int64_t* arg = no_indices ? nullptr : ctx.out(1).ptr<int64_t>();
  const int64_t ow_count = g.out[2];
  // outputs whose W window is inside the input: ow*s - pad >= 0 and its last tap < in
  const int64_t last = g.in[2] - 1 - (g.k[2] - 1) * g.dil[2] + g.pad[2];
  const int64_t lo = std::min(ow_count, (g.pad[2] + g.s[2] - 1) / g.s[2]);
  const int64_t hi = std::clamp(last < 0 ? 0 : last / g.s[2] + 1, lo, ow_count);
  ctx.parallel_for(g.rows(), row_grain(g), [&](int64_t r0, int64_t r1) {
    std::vector<int64_t> taps;
    for (int64_t ri = r0; ri < r1; ++ri) {
      const Row rw = row_at(g, ri);
      const int64_t out_row = ri * ow_count;
      const int64_t id0 = rw.od * g.s[0] - g.pad[0], ih0 = rw.oh * g.s[1] - g.pad[1];
      const MaxPoolRow<T> r{g,
                            x + rw.plane * g.in_plane(),
                            y + out_row,
                            arg ? arg + out_row : nullptr,
                            valid_taps(id0, g.k[0], g.dil[0], g.in[0]),
                            valid_taps(ih0, g.k[1], g.dil[1], g.in[1]),
                            id0,
                            ih0};
      r.list_taps(taps);
      for (int64_t ow = 0; ow < (taps.empty() ? ow_count : lo); ++ow) r.border(ow);
      if (taps.empty()) continue;
      int64_t ow = lo;
      if constexpr (std::is_same_v<T, float>) {
        if (!arg) {
          const int64_t s = g.s[2];
          if (s == 1) max_pool_values<1>(r.x, r.y, taps, lo, hi, s);
          else if (s == 2) max_pool_values<2>(r.x, r.y, taps, lo, hi, s);
          else max_pool_values<0>(r.x, r.y, taps, lo, hi, s);
          ow = hi;
        } else {
          ow = max_pool_simd(r, taps, lo, hi);
        }
      }
      for (; ow < hi; ++ow) r.interior(ow, taps);
      for (ow = hi; ow < ow_count; ++ow) r.border(ow);
    }
  });
}

void max_pool(KernelContext& ctx) {
  PoolParams spare;
  const PoolParams& p = params_of(ctx, spare);
  const PoolGeom g = pool_geom(p, ctx.in(0).shape, ctx.out(0).shape);
  dispatch(ctx.in(0).dtype, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    if constexpr (!std::is_same_v<T, bool>) max_pool_typed<T>(ctx, g, p.no_indices);
  });
}

// ---- average pooling ----

// Window of output o along one dim: the clipped input range and the size counted as padding
// included (clipped to the padded input, as PyTorch does).
struct AvgWindow {
  int64_t lo, hi, padded;
};
AvgWindow avg_window(const PoolGeom& g, int e, int64_t o) {
  const int64_t start = o * g.s[e] - g.pad[e];
  const int64_t end = std::min(start + g.k[e], g.in[e] + g.pad_end[e]);
  return {std::max<int64_t>(start, 0), std::min(end, g.in[e]), end - start};
}

// Sum of one plane's inputs in the box given by three windows.
template <typename T> double window_sum(const PoolGeom& g, const T* xp, const AvgWindow& wd,
                                        const AvgWindow& wh, const AvgWindow& ww) {
  double sum = 0;
  for (int64_t id = wd.lo; id < wd.hi; ++id)
    for (int64_t ih = wh.lo; ih < wh.hi; ++ih) {
      const T* line = xp + (id * g.in[1] + ih) * g.in[2];
      for (int64_t iw = ww.lo; iw < ww.hi; ++iw) sum += line[iw];
    }
  return sum;
}

template <typename T> void avg_pool_typed(KernelContext& ctx, const PoolGeom& g, bool include_pad) {
  const T* x = ctx.in(0).ptr<T>();
  T* y = ctx.out(0).ptr<T>();
  for_rows(ctx, g, [&](const Row& r) {
    const AvgWindow wd = avg_window(g, 0, r.od), wh = avg_window(g, 1, r.oh);
    const T* xp = x + r.plane * g.in_plane();
    T* yr = y + ((r.plane * g.out[0] + r.od) * g.out[1] + r.oh) * g.out[2];
    for (int64_t ow = 0; ow < g.out[2]; ++ow) {
      const AvgWindow ww = avg_window(g, 2, ow);
      const double sum = window_sum(g, xp, wd, wh, ww);
      const int64_t count = include_pad ? wd.padded * wh.padded * ww.padded
                                        : (wd.hi - wd.lo) * (wh.hi - wh.lo) * (ww.hi - ww.lo);
      yr[ow] = static_cast<T>(sum / static_cast<double>(count));
    }
  });
}

void avg_pool(KernelContext& ctx) {
  PoolParams spare;
  const PoolParams& p = params_of(ctx, spare);
  const PoolGeom g = pool_geom(p, ctx.in(0).shape, ctx.out(0).shape);
  dispatch_float(ctx.in(0).dtype, ctx.op_name(),
                 [&](auto t) { avg_pool_typed<decltype(t)>(ctx, g, p.count_include_pad); });
}

// ---- adaptive average pooling ----

// Output o of `out` covers inputs [floor(o*in/out), ceil((o+1)*in/out)).
AvgWindow adaptive_window(const PoolGeom& g, int e, int64_t o) {
  const int64_t lo = o * g.in[e] / g.out[e];
  const int64_t hi = ((o + 1) * g.in[e] + g.out[e] - 1) / g.out[e];
  return {lo, hi, hi - lo};
}

template <typename T> void adaptive_avg_pool_typed(KernelContext& ctx) {
  PoolGeom g = pool_geom(ctx.in(0).shape, ctx.out(0).shape);
  for (int e = 0; e < 3; ++e) g.k[e] = (g.in[e] + g.out[e] - 1) / g.out[e];  // work estimate
  const T* x = ctx.in(0).ptr<T>();
  T* y = ctx.out(0).ptr<T>();
  for_rows(ctx, g, [&](const Row& r) {
    const AvgWindow wd = adaptive_window(g, 0, r.od), wh = adaptive_window(g, 1, r.oh);
    const T* xp = x + r.plane * g.in_plane();
    T* yr = y + ((r.plane * g.out[0] + r.od) * g.out[1] + r.oh) * g.out[2];
    for (int64_t ow = 0; ow < g.out[2]; ++ow) {
      const AvgWindow ww = adaptive_window(g, 2, ow);
      const double sum = window_sum(g, xp, wd, wh, ww);
      const int64_t count = (wd.hi - wd.lo) * (wh.hi - wh.lo) * (ww.hi - ww.lo);
      yr[ow] = static_cast<T>(sum / static_cast<double>(count));
    }
  });
}

void adaptive_avg_pool(KernelContext& ctx) {
  dispatch_float(ctx.in(0).dtype, ctx.op_name(),
                 [&](auto t) { adaptive_avg_pool_typed<decltype(t)>(ctx); });
}

// ---- gradients ----

int64_t plane_grain(const PoolGeom& g) {
  return std::max<int64_t>(1, 65536 / std::max<int64_t>(1, g.in_plane()));
}
// dx (output 0) to dy (input 0), with 1-wide windows.
PoolGeom grad_geom(const KernelContext& ctx) {
  return pool_geom(ctx.out(0).shape, ctx.in(0).shape);
}

// dx plane = zeros, then dy[o] added at index[o]: the argmax the forward pass recorded.
template <typename T, typename I> void max_pool_grad_typed(KernelContext& ctx) {
  const PoolGeom g = grad_geom(ctx);
  const int64_t in_plane = g.in_plane(), out_plane = g.out[0] * g.out[1] * g.out[2];
  const T* dy = ctx.in(0).ptr<T>();
  const I* idx = ctx.in(1).ptr<I>();
  T* dx = ctx.out(0).ptr<T>();
  FirstBadIndex bad;
  ctx.parallel_for(g.planes, plane_grain(g), [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      T* d = dx + p * in_plane;
      std::fill(d, d + in_plane, T(0));
      const T* gp = dy + p * out_plane;
      const I* ip = idx + p * out_plane;
      for (int64_t o = 0; o < out_plane; ++o) {
        const auto i = static_cast<uint64_t>(ip[o]);
        if (i < static_cast<uint64_t>(in_plane)) d[i] += gp[o];
        else bad.record(p * out_plane + o);
      }
    }
  });
  if (bad.any())
    fail<ValueError>(
        "[{}] index {} out of range for an input plane of {} elements (input shape "
        "{}, indices shape {})",
        ctx.op_name(), static_cast<int64_t>(idx[bad.pos()]), in_plane, str(ctx.out(0).shape),
        str(ctx.in(1).shape));
}

void max_pool_grad(KernelContext& ctx) {
  dispatch_float(ctx.in(0).dtype, ctx.op_name(), [&](auto t) {
    dispatch_index(ctx.in(1).dtype, ctx.op_name(),
                   [&](auto i) { max_pool_grad_typed<decltype(t), decltype(i)>(ctx); });
  });
}
void max_pool_grad_channels_last(KernelContext& ctx) { run_via_nchw(ctx, max_pool_grad); }

// The transpose of averaging: each dy element divided by its window's count and added to every
// input of the window. window(e, o) is output o's box along dim e; count(wd, wh, ww) the divisor.
template <typename T, typename Window, typename Count>
void spread_windows(const KernelContext& ctx, const PoolGeom& g, Window&& window, Count&& count) {
  const int64_t in_plane = g.in_plane(), out_plane = g.out[0] * g.out[1] * g.out[2];
  const T* dy = ctx.in(0).ptr<T>();
  T* dx = ctx.out(0).ptr<T>();
  ctx.parallel_for(g.planes, plane_grain(g), [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      T* xp = dx + p * in_plane;
      std::fill(xp, xp + in_plane, T(0));
      const T* gp = dy + p * out_plane;
      for (int64_t od = 0; od < g.out[0]; ++od)
        for (int64_t oh = 0; oh < g.out[1]; ++oh)
          for (int64_t ow = 0; ow < g.out[2]; ++ow) {
            const AvgWindow wd = window(0, od), wh = window(1, oh), ww = window(2, ow);
            const T v = static_cast<T>(*gp++ / static_cast<double>(count(wd, wh, ww)));
            for (int64_t id = wd.lo; id < wd.hi; ++id)
              for (int64_t ih = wh.lo; ih < wh.hi; ++ih) {
                T* line = xp + (id * g.in[1] + ih) * g.in[2];
                for (int64_t iw = ww.lo; iw < ww.hi; ++iw) line[iw] += v;
              }
          }
    }
  });
}

int64_t box_size(const AvgWindow& wd, const AvgWindow& wh, const AvgWindow& ww) {
  return (wd.hi - wd.lo) * (wh.hi - wh.lo) * (ww.hi - ww.lo);
}

void avg_pool_grad(KernelContext& ctx) {
  PoolParams spare;
  const PoolParams& p = params_of(ctx, spare);
  const PoolGeom g = pool_geom(p, ctx.out(0).shape, ctx.in(0).shape);
  const bool include_pad = p.count_include_pad;
  auto window = [&](int e, int64_t o) { return avg_window(g, e, o); };
  auto count = [&](const AvgWindow& wd, const AvgWindow& wh, const AvgWindow& ww) {
    return include_pad ? wd.padded * wh.padded * ww.padded : box_size(wd, wh, ww);
  };
  dispatch_float(ctx.in(0).dtype, ctx.op_name(),
                 [&](auto t) { spread_windows<decltype(t)>(ctx, g, window, count); });
}

void adaptive_avg_pool_grad(KernelContext& ctx) {
  const PoolGeom g = grad_geom(ctx);
  auto window = [&](int e, int64_t o) { return adaptive_window(g, e, o); };
  dispatch_float(ctx.in(0).dtype, ctx.op_name(),
                 [&](auto t) { spread_windows<decltype(t)>(ctx, g, window, box_size); });
}
void adaptive_avg_pool_grad_channels_last(KernelContext& ctx) {
  run_via_nchw(ctx, adaptive_avg_pool_grad);
}

}  // namespace

void register_pool_kernels() {
  register_kernel(OpId::MaxPool, Backend::cpu, {max_pool, kNumericTypes});
  register_kernel(OpId::AvgPool, Backend::cpu, {avg_pool, kFloatTypes});
  register_kernel(OpId::AdaptiveAvgPool, Backend::cpu, {adaptive_avg_pool, kFloatTypes});
  register_kernel(OpId::MaxPoolGrad, Backend::cpu, {max_pool_grad, kFloatTypes});
  register_kernel(OpId::AvgPoolGrad, Backend::cpu, {avg_pool_grad, kFloatTypes});
  register_kernel(OpId::AdaptiveAvgPoolGrad, Backend::cpu, {adaptive_avg_pool_grad, kFloatTypes});
  // channels_last nodes (which the channels_last pass gives GPU training programs) through NCHW
  // copies (max_pool and adaptive_avg_pool: pool_nhwc.cpp)
  register_kernel(OpId::MaxPoolGrad, Backend::cpu, Layout::channels_last,
                  {max_pool_grad_channels_last, kFloatTypes});
  register_kernel(OpId::AdaptiveAvgPoolGrad, Backend::cpu, Layout::channels_last,
                  {adaptive_avg_pool_grad_channels_last, kFloatTypes});
}

}  // namespace kiln::cpu
