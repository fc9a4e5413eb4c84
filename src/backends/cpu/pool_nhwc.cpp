// CPU kernels of 2-D max pooling and adaptive average pooling in layout channels_last: x (N, H, W,
// C), y (N, OH, OW, C), which the channels_last pass gives pools between the CPU's NHWC
// convolutions. Each output position takes its window's taps in the order the NCHW kernels do
// (row by row), a whole row of C contiguous channels at a time, so the loops over channels
// vectorize; the results are those of the NCHW kernels bit for bit (max_pool's indices are the
// same in-plane positions, ih * W + iw).
#include <algorithm>
#include <limits>
#include <vector>

#include "backends/cpu/cpu_common.h"
#include "backends/cpu/kernels.h"
#include "ops/pool_params.h"

namespace kiln::cpu {

namespace {

// The taps [lo, hi) of a window of k taps (step dil) starting at `start` that fall in [0, size).
std::pair<int64_t, int64_t> taps_inside(int64_t start, int64_t k, int64_t dil, int64_t size) {
  const int64_t lo = start < 0 ? (-start + dil - 1) / dil : 0;
  const int64_t hi = start >= size ? 0 : std::min(k, (size - start + dil - 1) / dil);
  return {lo, std::max(lo, hi)};
}

struct Nhwc {
  int64_t n, h, w, c, oh, ow;
  explicit Nhwc(const KernelContext& ctx)
      : n(ctx.in(0).shape[0]),
        h(ctx.in(0).shape[1]),
        w(ctx.in(0).shape[2]),
        c(ctx.in(0).shape[3]),
        oh(ctx.out(0).shape[1]),
        ow(ctx.out(0).shape[2]) {}
  // output rows (n, oh) per task: about 32K elements of work
  int64_t grain(int64_t taps) const {
    return std::max<int64_t>(1, 32768 / std::max<int64_t>(1, ow * c * taps));
  }
};

// One output position's window: its image n, its place in the output (flat, in positions), its
// first tap (h0, w0; may lie in the padding) and the taps inside the image, [ah, bh) x [aw, bw).
struct Window {
  int64_t n, at, h0, w0, ah, bh, aw, bw;
};
// f(window) for the output positions of output rows (n, oh) [r0, r1).
template <typename F>
void for_windows(const Nhwc& s, const PoolParams& p, int64_t r0, int64_t r1, F&& f) {
  const int64_t kh = p.kernel[0], kw = p.kernel[1];
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t h0 = (r % s.oh) * p.stride[0] - p.pads[0];
    const auto [ah, bh] = taps_inside(h0, kh, p.dilation[0], s.h);
    for (int64_t ow = 0; ow < s.ow; ++ow) {
      const int64_t w0 = ow * p.stride[1] - p.pads[1];
      const auto [aw, bw] = taps_inside(w0, kw, p.dilation[1], s.w);
      f(Window{r / s.oh, r * s.ow + ow, h0, w0, ah, bh, aw, bw});
    }
  }
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define KILN_POOL_AVX512 1
#include <immintrin.h>
#pragma GCC push_options
#pragma GCC target("avx512f")
// f32 max pooling without indices where C is a multiple of 16, on AVX-512: each block of 16
// channels of a window in one register across its taps (the generic loop below goes through y at
// every tap). Taps in the same order and the same rule (the first maximum wins; NaN wins), so the
// same results bit for bit.
void max_pool_nhwc_f32x16(const Nhwc& s, const PoolParams& p, const float* x, float* y, int64_t r0,
                          int64_t r1) {
  const int64_t row = p.dilation[0] * s.w * s.c, col = p.dilation[1] * s.c;
  for_windows(s, p, r0, r1, [&](const Window& w) {
    float* yo = y + w.at * s.c;
    if (w.ah == w.bh || w.aw == w.bw) {  // a window of padding only
      std::fill(yo, yo + s.c, std::numeric_limits<float>::lowest());
      return;
    }
    // (tap (0, 0) may lie in the padding: offsets from it, only taps inside read)
    const int64_t at = ((w.n * s.h + w.h0) * s.w + w.w0) * s.c;
    for (int64_t c0 = 0; c0 < s.c; c0 += 16) {
      const float* xc = x + c0;
      __m512 acc = _mm512_loadu_ps(xc + (at + w.ah * row + w.aw * col));
      for (int64_t i = w.ah; i < w.bh; ++i)
        for (int64_t j = i == w.ah ? w.aw + 1 : w.aw; j < w.bw; ++j) {
          const __m512 v = _mm512_loadu_ps(xc + (at + i * row + j * col));
          const __mmask16 take =
              _mm512_cmp_ps_mask(v, acc, _CMP_GT_OQ) | _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
          acc = _mm512_mask_blend_ps(take, acc, v);
        }
      _mm512_storeu_ps(yo + c0, acc);
    }
  });
}
#pragma GCC pop_options
#endif

// The first maximum wins; NaN wins (as the NCHW kernels' takes_max). (no_indices: idx is null)
template <typename T> void max_pool_nhwc_typed(KernelContext& ctx, const PoolParams& p) {
  const Nhwc s(ctx);
  const T* x = ctx.in(0).ptr<T>();
  T* y = ctx.out(0).ptr<T>();
  int64_t* idx = p.no_indices ? nullptr : ctx.out(1).ptr<int64_t>();
  const int64_t kh = p.kernel[0], kw = p.kernel[1];
#ifdef KILN_POOL_AVX512
  if constexpr (std::is_same_v<T, float>)
    if (!idx && s.c % 16 == 0 && cpu_isa() == CpuIsa::avx512) {
      ctx.parallel_for(s.n * s.oh, s.grain(kh * kw),
                       [&](int64_t r0, int64_t r1) { max_pool_nhwc_f32x16(s, p, x, y, r0, r1); });
      return;
    }
#endif
  ctx.parallel_for(s.n * s.oh, s.grain(kh * kw), [&](int64_t r0, int64_t r1) {
    for_windows(s, p, r0, r1, [&](const Window& w) {
      T* yo = y + w.at * s.c;
      int64_t* io = idx ? idx + w.at * s.c : nullptr;
      bool first = true;
      for (int64_t i = w.ah; i < w.bh; ++i)
        for (int64_t j = w.aw; j < w.bw; ++j) {
          const int64_t ih = w.h0 + i * p.dilation[0], iw = w.w0 + j * p.dilation[1];
          const int64_t at = ih * s.w + iw;
          const T* xv = x + ((w.n * s.h + ih) * s.w + iw) * s.c;
          if (first) {
            std::copy(xv, xv + s.c, yo);
            if (io) std::fill(io, io + s.c, at);
            first = false;
            continue;
          }
          // (blocks of constant length with ivdep: elementwise_loop, so that they vectorize)
          if (io) {
            elementwise_loop(0, s.c, [&](int64_t c) {
              const T v = xv[c], b = yo[c];
              const bool take = v > b || v != v;
              yo[c] = take ? v : b;
              io[c] = take ? at : io[c];
            });
          } else {
            elementwise_loop(0, s.c, [&](int64_t c) {
              const T v = xv[c], b = yo[c];
              yo[c] = v > b || v != v ? v : b;
            });
          }
        }
      if (first) {  // a window of padding only
        std::fill(yo, yo + s.c, std::numeric_limits<T>::lowest());
        if (io) std::fill(io, io + s.c, -1);
      }
    });
  });
}

void max_pool_nhwc(KernelContext& ctx) {
  PoolParams spare;
  const PoolParams& p = params_of(ctx, spare);
  dispatch(ctx.in(0).dtype, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    if constexpr (!std::is_same_v<T, bool>) max_pool_nhwc_typed<T>(ctx, p);
  });
}

// Output o of `out` covers inputs [floor(o*in/out), ceil((o+1)*in/out)); sums in double, row by
// row, as the NCHW kernel.
template <typename T> void adaptive_avg_pool_nhwc_typed(KernelContext& ctx) {
  const Nhwc s(ctx);
  const T* x = ctx.in(0).ptr<T>();
  T* y = ctx.out(0).ptr<T>();
  auto window = [](int64_t o, int64_t in, int64_t out) {
    return std::pair<int64_t, int64_t>{o * in / out, ((o + 1) * in + out - 1) / out};
  };
  const int64_t taps = ((s.h + s.oh - 1) / s.oh) * ((s.w + s.ow - 1) / s.ow);
  ctx.parallel_for(s.n * s.oh, s.grain(taps), [&](int64_t r0, int64_t r1) {
    std::vector<double> sum(static_cast<size_t>(s.c));
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t n = r / s.oh, oh = r % s.oh;
      const auto [h0, h1] = window(oh, s.h, s.oh);
      for (int64_t ow = 0; ow < s.ow; ++ow) {
        const auto [w0, w1] = window(ow, s.w, s.ow);
        std::fill(sum.begin(), sum.end(), 0.0);
        for (int64_t ih = h0; ih < h1; ++ih)
          for (int64_t iw = w0; iw < w1; ++iw) {
            const T* xv = x + ((n * s.h + ih) * s.w + iw) * s.c;
            for (int64_t c = 0; c < s.c; ++c) sum[c] += xv[c];
          }
        const double count = static_cast<double>((h1 - h0) * (w1 - w0));
        T* yo = y + (r * s.ow + ow) * s.c;
        for (int64_t c = 0; c < s.c; ++c) yo[c] = static_cast<T>(sum[c] / count);
      }
    }
  });
}

void adaptive_avg_pool_nhwc(KernelContext& ctx) {
  dispatch_float(ctx.in(0).dtype, ctx.op_name(),
                 [&](auto t) { adaptive_avg_pool_nhwc_typed<decltype(t)>(ctx); });
}

}  // namespace

void register_pool_nhwc_kernels() {
  register_kernel(OpId::MaxPool, Backend::cpu, Layout::channels_last,
                  {max_pool_nhwc, kNumericTypes});
  register_kernel(OpId::AdaptiveAvgPool, Backend::cpu, Layout::channels_last,
                  {adaptive_avg_pool_nhwc, kFloatTypes});
}

}  // namespace kiln::cpu
