// CPU kernels of the norm family. Statistics of a row accumulate in double; rows run in parallel.
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "backends/cpu/cpu_common.h"
#include "backends/cpu/kernels.h"
#include "backends/cpu/layout.h"
#include "ops/norm_params.h"

namespace kiln::cpu {

namespace {

// ---- softmax / log_softmax ----

// Lanes of `inner` processed together, so a softmax over a non-last axis reads whole cache lines.
constexpr int64_t kLanes = 64;

// Softmax (or log-softmax) of `lanes` interleaved rows of length len with stride `inner`.
template <typename T, bool kLog>
void softmax_lanes(const T* x, T* y, int64_t len, int64_t inner, int64_t lanes) {
  T mx[kLanes];
  double sum[kLanes];
  for (int64_t l = 0; l < lanes; ++l) {
    mx[l] = -std::numeric_limits<T>::infinity();
    sum[l] = 0;
  }
  for (int64_t k = 0; k < len; ++k)
    for (int64_t l = 0; l < lanes; ++l) mx[l] = std::max(mx[l], x[k * inner + l]);
  for (int64_t k = 0; k < len; ++k) {
    for (int64_t l = 0; l < lanes; ++l) {
      const T e = std::exp(x[k * inner + l] - mx[l]);
      if constexpr (!kLog) y[k * inner + l] = e;
      sum[l] += e;
    }
  }
  // log-softmax subtracts max + log(sum); softmax scales by 1 / sum
  T f[kLanes];
  for (int64_t l = 0; l < lanes; ++l)
    f[l] = static_cast<T>(kLog ? mx[l] + std::log(sum[l]) : 1.0 / sum[l]);
  for (int64_t k = 0; k < len; ++k) {
    for (int64_t l = 0; l < lanes; ++l) {
      const int64_t i = k * inner + l;
      y[i] = kLog ? x[i] - f[l] : y[i] * f[l];
    }
  }
}

template <bool kLog> void softmax_impl(KernelContext& ctx) {
  const TensorView &x = ctx.in(0), &y = ctx.out(0);
  const AxisSplit s = split_at(x.shape, params_of<SoftmaxParams>(ctx).axis);
  const int64_t blocks = (s.inner + kLanes - 1) / kLanes;
  const int64_t grain =
      std::max<int64_t>(1, 16384 / std::max<int64_t>(1, s.len * std::min(s.inner, kLanes)));
  dispatch_float(x.dtype, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    const T* px = x.ptr<T>();
    T* py = y.ptr<T>();
    ctx.parallel_for(s.outer * blocks, grain, [&](int64_t b, int64_t e) {
      for (int64_t task = b; task < e; ++task) {
        const int64_t o = task / blocks, j = (task % blocks) * kLanes;
        const int64_t off = o * s.len * s.inner + j;
        softmax_lanes<T, kLog>(px + off, py + off, s.len, s.inner, std::min(kLanes, s.inner - j));
      }
    });
  });
}

void softmax(KernelContext& ctx) { softmax_impl<false>(ctx); }
void log_softmax(KernelContext& ctx) { softmax_impl<true>(ctx); }

// ---- normalization over contiguous rows ----

struct RowStats {
  double mean = 0, rstd = 1;
};

// Mean and 1/sqrt(var + eps) of a row, two passes for accuracy, each summing in double into
// eight partial sums side by side (one chain of dependent additions per row was the layer norm's
// whole cost), added up at the end. RMS norm uses mean 0 and the mean square in place of the
// variance.
template <typename T>
inline __attribute__((always_inline)) RowStats row_stats(const T* x, int64_t n, double eps,
                                                         bool rms) {
  constexpr int64_t kP = 8;
  const int64_t nb = n / kP * kP;
  auto sum_of = [&](auto&& term) {
    double part[kP] = {};
    for (int64_t i = 0; i < nb; i += kP)
      for (int64_t u = 0; u < kP; ++u) part[u] += term(x[i + u]);
    double s = 0;
    for (int64_t u = 0; u < kP; ++u) s += part[u];
    for (int64_t i = nb; i < n; ++i) s += term(x[i]);
    return s;
  };
  RowStats r;
  if (!rms) r.mean = sum_of([](T v) { return static_cast<double>(v); }) / static_cast<double>(n);
  const double mean = r.mean;
  const double ss = sum_of([mean](T v) {
    const double d = static_cast<double>(v) - mean;
    return d * d;
  });
  r.rstd = 1.0 / std::sqrt(ss / static_cast<double>(n) + eps);
  return r;
}

// The optional weight and bias inputs after `first`, as recorded by has_weight / has_bias.
template <typename T> struct Affine {
  const T* w = nullptr;
  const T* b = nullptr;
  Affine(const KernelContext& ctx, const NormParams& p, int first) {
    int i = first;
    if (p.has_weight) w = ctx.in(i++).template ptr<T>();
    if (p.has_bias) b = ctx.in(i).template ptr<T>();
  }
  double weight(int64_t c) const { return w ? static_cast<double>(w[c]) : 1.0; }
  double bias(int64_t c) const { return b ? static_cast<double>(b[c]) : 0.0; }
};

// Runs body(row) for each of `rows` rows of `row_len` elements in parallel.
template <typename F>
void for_rows(const KernelContext& ctx, int64_t rows, int64_t row_len, F&& body) {
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, row_len));
  ctx.parallel_for(rows, grain, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) body(r);
  });
}

// Rows [r0, r1) of a layer (or RMS) norm over rows of n elements, the weight and bias (either
// may be null) per position; one loop for each combination, so that each vectorizes.
template <typename T>
inline __attribute__((always_inline)) void norm_rows(const T* x, T* y, int64_t r0, int64_t r1,
                                                     int64_t n, double eps, bool rms, const T* w,
                                                     const T* b) {
  for (int64_t r = r0; r < r1; ++r) {
    const T* px = x + r * n;
    T* py = y + r * n;
    const RowStats st = row_stats(px, n, eps, rms);
    const double mean = st.mean, rstd = st.rstd;
    auto norm = [&](int64_t i) { return (static_cast<double>(px[i]) - mean) * rstd; };
    if (w && b)
      for (int64_t i = 0; i < n; ++i)
        py[i] = static_cast<T>(norm(i) * static_cast<double>(w[i]) + static_cast<double>(b[i]));
    else if (w)
      for (int64_t i = 0; i < n; ++i) py[i] = static_cast<T>(norm(i) * static_cast<double>(w[i]));
    else if (b)
      for (int64_t i = 0; i < n; ++i) py[i] = static_cast<T>(norm(i) + static_cast<double>(b[i]));
    else
      for (int64_t i = 0; i < n; ++i) py[i] = static_cast<T>(norm(i));
  }
}

// f32 rows compiled for the baseline and for AVX-512 (KILN_AVX512_TARGET), picked by cpu_isa;
// the double sums run eight to a vector there.
#define KILN_NORM_ROWS_ARGS                                                          \
  const float *x, float *y, int64_t r0, int64_t r1, int64_t n, double eps, bool rms, \
      const float *w, const float *b
void norm_rows_baseline(KILN_NORM_ROWS_ARGS) { norm_rows(x, y, r0, r1, n, eps, rms, w, b); }
#ifdef KILN_AVX512_TARGET
KILN_AVX512_TARGET void norm_rows_avx512(KILN_NORM_ROWS_ARGS) {
  norm_rows(x, y, r0, r1, n, eps, rms, w, b);
}
#endif
#undef KILN_NORM_ROWS_ARGS

// Layer and RMS norm: rows are the trailing dims from begin_axis; weight/bias per position.
void layer_norm_impl(KernelContext& ctx, bool rms) {
  const TensorView &x = ctx.in(0), &y = ctx.out(0);
  const NormParams p = params_of<NormParams>(ctx);
  const int64_t n = numel(Shape(x.shape.begin() + p.begin_axis, x.shape.end()));
  const double eps = p.eps;
  const int64_t rows = x.numel() / std::max<int64_t>(n, 1);
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, n));
  dispatch_float(x.dtype, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    const Affine<T> aff(ctx, p, 1);
    const T* px = x.ptr<T>();
    T* py = y.ptr<T>();
    ctx.parallel_for(rows, grain, [&](int64_t r0, int64_t r1) {
      if constexpr (std::is_same_v<T, float>) {
#ifdef KILN_AVX512_TARGET
        if (cpu_isa() == CpuIsa::avx512)
          return norm_rows_avx512(px, py, r0, r1, n, eps, rms, aff.w, aff.b);
#endif
        return norm_rows_baseline(px, py, r0, r1, n, eps, rms, aff.w, aff.b);
      }
      norm_rows(px, py, r0, r1, n, eps, rms, aff.w, aff.b);
    });
  });
}
void layer_norm(KernelContext& ctx) { layer_norm_impl(ctx, false); }
void rms_norm(KernelContext& ctx) { layer_norm_impl(ctx, true); }

// Instance and group norm: a row is one (n, group) block of `channels` channels of `spatial`
// elements each; weight/bias per channel, folded into one scale and shift per channel.
void channel_group_norm(KernelContext& ctx, const NormParams& p, int64_t groups) {
  const TensorView &x = ctx.in(0), &y = ctx.out(0);
  const int64_t c = x.shape[1], spatial = numel(Shape(x.shape.begin() + 2, x.shape.end()));
  const int64_t channels = c / groups, n = channels * spatial;
  const double eps = p.eps;
  dispatch_float(x.dtype, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    const Affine<T> aff(ctx, p, 1);
    for_rows(ctx, x.numel() / n, n, [&](int64_t r) {
      const T* px = x.ptr<T>() + r * n;
      T* py = y.ptr<T>() + r * n;
      const RowStats st = row_stats(px, n, eps, false);
      for (int64_t k = 0; k < channels; ++k) {
        const int64_t ch = (r % groups) * channels + k;
        const double scale = st.rstd * aff.weight(ch), shift = aff.bias(ch) - st.mean * scale;
        for (int64_t i = k * spatial; i < (k + 1) * spatial; ++i)
          py[i] = static_cast<T>(px[i] * scale + shift);
      }
    });
  });
}
void instance_norm(KernelContext& ctx) {
  channel_group_norm(ctx, params_of<NormParams>(ctx), ctx.in(0).shape[1]);
}

// Instance norm of NHWC data (the channels_last pass, between NHWC convolutions), in parallel
// over images, blocks of channels and chunks of positions: the statistics in double as row_stats
// takes them (the mean, then the squared deviations from it), each chunk's partial sums added in
// chunk order (chunks of a fixed size: the same bits for any thread count), the loops running
// along a block's contiguous channels.
void instance_norm_nhwc(KernelContext& ctx) {
  const TensorView &x = ctx.in(0), &y = ctx.out(0);
  const NormParams p = params_of<NormParams>(ctx);
  const int64_t n = x.shape[0], c = x.shape[3], spatial = x.shape[1] * x.shape[2];
  if (x.numel() == 0) return;
  constexpr int64_t kBlock = 64, kChunk = 256;
  const int64_t blocks = (c + kBlock - 1) / kBlock, chunks = (spatial + kChunk - 1) / kChunk;
  const int64_t tasks = n * blocks * chunks;
  // each task's partial sums (kBlock a task), then per image and channel: the mean, then the
  // scale and shift
  double* part = static_cast<double*>(
      ctx.scratch(static_cast<size_t>(tasks * kBlock + 2 * n * c) * sizeof(double)));
  double* mean = part + tasks * kBlock;
  double* scale = mean;  // (the mean is read last where the shift is made)
  double* shift = mean + n * c;
  const double eps = p.eps;
  dispatch_float(x.dtype, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    const Affine<T> aff(ctx, p, 1);
    // task -> image, first channel, block width and its positions [s0, s1)
    auto geometry = [&](int64_t task, int64_t& img, int64_t& c0, int64_t& w, int64_t& s0,
                        int64_t& s1) {
      img = task / (blocks * chunks);
      c0 = (task / chunks % blocks) * kBlock;
      w = std::min(kBlock, c - c0);
      s0 = (task % chunks) * kChunk;
      s1 = std::min(spatial, s0 + kChunk);
    };
    // part[task] = the sums over the task's positions of x (squares = false) or of (x - mean)²
    auto partial_sums = [&](bool squares) {
      ctx.parallel_for(tasks, 1, [&](int64_t b, int64_t e) {
        for (int64_t task = b; task < e; ++task) {
          int64_t img, c0, w, s0, s1;
          geometry(task, img, c0, w, s0, s1);
          const T* px = x.ptr<T>() + img * spatial * c + c0;
          const double* m = mean + img * c + c0;
          double sum[kBlock] = {};
          for (int64_t s = s0; s < s1; ++s)
            for (int64_t k = 0; k < w; ++k) {
              const double v = static_cast<double>(px[s * c + k]);
              sum[k] += squares ? (v - m[k]) * (v - m[k]) : v;
            }
          std::copy(sum, sum + w, part + task * kBlock);
        }
      });
    };
    // total[img c + ch] = the chunks' partial sums of each channel, in chunk order
    auto add_chunks = [&](double* total) {
      for (int64_t img = 0; img < n; ++img)
        for (int64_t ch = 0; ch < c; ++ch) {
          const int64_t first = (img * blocks + ch / kBlock) * chunks;
          double sum = 0;
          for (int64_t k = 0; k < chunks; ++k) sum += part[(first + k) * kBlock + ch % kBlock];
          total[img * c + ch] = sum;
        }
    };
    partial_sums(false);
    add_chunks(mean);
    for (int64_t i = 0; i < n * c; ++i) mean[i] /= static_cast<double>(spatial);
    partial_sums(true);
    add_chunks(shift);  // (the squared deviations, for now)
    for (int64_t i = 0; i < n * c; ++i) {
      const int64_t ch = i % c;
      const double rstd = 1.0 / std::sqrt(shift[i] / static_cast<double>(spatial) + eps);
      const double mu = mean[i];
      scale[i] = rstd * aff.weight(ch);
      shift[i] = aff.bias(ch) - mu * scale[i];
    }
    const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, c));
    ctx.parallel_for(n * spatial, grain, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        const double* sc = scale + (r / spatial) * c;
        const double* sh = shift + (r / spatial) * c;
        const T* px = x.ptr<T>() + r * c;
        T* py = y.ptr<T>() + r * c;
        for (int64_t k = 0; k < c; ++k) py[k] = static_cast<T>(px[k] * sc[k] + sh[k]);
      }
    });
  });
}
void group_norm(KernelContext& ctx) {
  const NormParams p = params_of<NormParams>(ctx);
  channel_group_norm(ctx, p, p.groups);
}

// Inference batch norm: y = (x - mean[c]) / sqrt(var[c] + eps) * w[c] + b[c], as one scale and
// shift per channel.
void batch_norm(KernelContext& ctx) {
  const TensorView &x = ctx.in(0), &y = ctx.out(0);
  const int64_t c = x.shape[1], spatial = numel(Shape(x.shape.begin() + 2, x.shape.end()));
  const NormParams p = params_of<NormParams>(ctx);
  const double eps = p.eps;
  dispatch_float(x.dtype, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    const T *mean = ctx.in(1).ptr<T>(), *var = ctx.in(2).ptr<T>();
    const Affine<T> aff(ctx, p, 3);
    std::vector<double> scale(c), shift(c);
    for (int64_t k = 0; k < c; ++k) {
      scale[k] = aff.weight(k) / std::sqrt(static_cast<double>(var[k]) + eps);
      shift[k] = aff.bias(k) - mean[k] * scale[k];
    }
    for_rows(ctx, x.numel() / spatial, spatial, [&](int64_t r) {
      const T* px = x.ptr<T>() + r * spatial;
      T* py = y.ptr<T>() + r * spatial;
      const double a = scale[r % c], s = shift[r % c];
      for (int64_t i = 0; i < spatial; ++i) py[i] = static_cast<T>(px[i] * a + s);
    });
  });
}

// ---- training batch norm ----

// x as (N, C, S): channel c's values are N runs of S elements, run n at (n * C + c) * S.
struct ChannelRuns {
  int64_t n, c, s;
  explicit ChannelRuns(const Shape& x)
      : n(x[0]), c(x[1]), s(numel(Shape(x.begin() + 2, x.end()))) {}
  int64_t per_channel() const { return n * s; }
  // Calls f(i) for every element offset of channel ch.
  template <typename F> void each(int64_t ch, F&& f) const {
    for (int64_t k = 0; k < n; ++k)
      for (int64_t i = (k * c + ch) * s, e = i + s; i < e; ++i) f(i);
  }
};

// Channels in parallel: each reads its values twice (statistics, then the output).
template <typename F> void for_channels(const KernelContext& ctx, const ChannelRuns& r, F&& body) {
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, r.per_channel()));
  ctx.parallel_for(r.c, grain, [&](int64_t b, int64_t e) {
    for (int64_t ch = b; ch < e; ++ch) body(ch);
  });
}

// Forward: mean and biased var per channel from sums shifted by the channel's first value (one
// pass, accurate while the values sit near it), then y = (x - mean) * rstd * w + b.
void batch_norm_train(KernelContext& ctx) {
  const TensorView& x = ctx.in(0);
  const ChannelRuns r(x.shape);
  const NormParams p = params_of<NormParams>(ctx);
  const double eps = p.eps, m = static_cast<double>(r.per_channel());
  dispatch_float(x.dtype, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    const Affine<T> aff(ctx, p, 1);
    const T* px = x.ptr<T>();
    T *py = ctx.out(0).ptr<T>(), *pm = ctx.out(1).ptr<T>(), *pv = ctx.out(2).ptr<T>();
    for_channels(ctx, r, [&](int64_t ch) {
      const double x0 = px[ch * r.s];
      double s1 = 0, s2 = 0;
      r.each(ch, [&](int64_t i) {
        const double d = static_cast<double>(px[i]) - x0;
        s1 += d;
        s2 += d * d;
      });
      const double dm = s1 / m, mean = x0 + dm, var = std::max(0.0, s2 / m - dm * dm);
      const double scale = aff.weight(ch) / std::sqrt(var + eps), b = aff.bias(ch);
      pm[ch] = static_cast<T>(mean);
      pv[ch] = static_cast<T>(var);
      r.each(ch, [&](int64_t i) { py[i] = static_cast<T>((px[i] - mean) * scale + b); });
    });
  });
}

// Backward: with xhat = (x - mean) * rstd, dbias = sum(dy), dweight = sum(dy * xhat) and
// dx = w * rstd * (dy - dbias / M - xhat * dweight / M).
void batch_norm_train_grad(KernelContext& ctx) {
  const TensorView &dy = ctx.in(0), &x = ctx.in(1);
  const ChannelRuns r(x.shape);
  const NormParams p = params_of<NormParams>(ctx);
  const double eps = p.eps, m = static_cast<double>(r.per_channel());
  const bool hw = p.has_weight;
  dispatch_float(x.dtype, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    const T *pdy = dy.ptr<T>(), *px = x.ptr<T>(), *pm = ctx.in(2).ptr<T>(),
            *pv = ctx.in(3).ptr<T>(), *pw = hw ? ctx.in(4).ptr<T>() : nullptr;
    T *pdx = ctx.out(0).ptr<T>(), *pdw = ctx.out(1).ptr<T>(), *pdb = ctx.out(2).ptr<T>();
    for_channels(ctx, r, [&](int64_t ch) {
      const double mean = pm[ch], rstd = 1.0 / std::sqrt(static_cast<double>(pv[ch]) + eps);
      double sdy = 0, sdyx = 0;
      r.each(ch, [&](int64_t i) {
        const double g = pdy[i];
        sdy += g;
        sdyx += g * (px[i] - mean);
      });
      const double dweight = sdyx * rstd, w = pw ? static_cast<double>(pw[ch]) : 1.0;
      const double k = w * rstd, a = sdy / m, b = dweight / m * rstd;
      pdw[ch] = static_cast<T>(dweight);
      pdb[ch] = static_cast<T>(sdy);
      r.each(ch,
             [&](int64_t i) { pdx[i] = static_cast<T>(k * (pdy[i] - a - (px[i] - mean) * b)); });
    });
  });
}

// channels_last nodes (which the channels_last pass gives CUDA training programs) run through
// NCHW copies.
void batch_norm_train_channels_last(KernelContext& ctx) { run_via_nchw(ctx, batch_norm_train); }
void batch_norm_train_grad_channels_last(KernelContext& ctx) {
  run_via_nchw(ctx, batch_norm_train_grad);
}

// ---- dropout ----

uint64_t splitmix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Element i is dropped when hash(seed, i) < p * 2^64: a counter-based draw, so the mask depends
// only on the seed and the element index, never on the thread count.
void dropout(KernelContext& ctx) {
  const TensorView &x = ctx.in(0), &y = ctx.out(0);
  const DropoutParams d = params_of<DropoutParams>(ctx);
  const double p = d.p;
  const uint64_t key = splitmix64(d.seed);
  const auto threshold = static_cast<uint64_t>(std::ldexp(p, 64));
  dispatch_float(x.dtype, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    const T keep = static_cast<T>(1 - p);
    const T* px = x.ptr<T>();
    T* py = y.ptr<T>();
    ctx.parallel_for(x.numel(), 16384, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i)
        py[i] = splitmix64(key + static_cast<uint64_t>(i)) < threshold ? T(0) : px[i] / keep;
    });
  });
}

}  // namespace

void register_norm_kernels() {
  const DTypeSet floats{f32, f64, f16, bf16};
  register_kernel(OpId::Softmax, Backend::cpu, {softmax, floats});
  register_kernel(OpId::LogSoftmax, Backend::cpu, {log_softmax, floats});
  register_kernel(OpId::LayerNorm, Backend::cpu, {layer_norm, floats});
  register_kernel(OpId::RmsNorm, Backend::cpu, {rms_norm, floats});
  register_kernel(OpId::BatchNorm, Backend::cpu, {batch_norm, floats});
  register_kernel(OpId::InstanceNorm, Backend::cpu, {instance_norm, floats});
  register_kernel(OpId::InstanceNorm, Backend::cpu, Layout::channels_last,
                  {instance_norm_nhwc, floats});
  register_kernel(OpId::GroupNorm, Backend::cpu, {group_norm, floats});
  register_kernel(OpId::Dropout, Backend::cpu, {dropout, floats});
  register_kernel(OpId::BatchNormTrain, Backend::cpu, {batch_norm_train, floats});
  register_kernel(OpId::BatchNormTrainGrad, Backend::cpu, {batch_norm_train_grad, floats, 1});
  register_kernel(OpId::BatchNormTrain, Backend::cpu, Layout::channels_last,
                  {batch_norm_train_channels_last, floats});
  register_kernel(OpId::BatchNormTrainGrad, Backend::cpu, Layout::channels_last,
                  {batch_norm_train_grad_channels_last, floats, 1});
}

}  // namespace kiln::cpu
