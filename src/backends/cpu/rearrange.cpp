// CPU kernels of depth_to_space, space_to_depth, embedding, embedding_grad, masked_fill, roll and
// non_max_suppression. The permutations move elements of any dtype by size; embedding_grad adds
// each row's gradients in index order (a counting sort of the indices), so it is deterministic.
#include <algorithm>
#include <numeric>

#include "backends/cpu/kernels.h"
#include "backends/cpu/transform_common.h"
#include "ops/rearrange_params.h"
#include "ops/rearrange_util.h"

namespace kiln::cpu {

namespace {

xform_math::SpaceDepth space_depth_of(const KernelContext& ctx, const Shape& depth_in) {
  // depth_in: the depth tensor's shape (the input of depth_to_space, the output of
  // space_to_depth)
  const SpaceDepthParams p = params_of<SpaceDepthParams>(ctx);
  const bool nhwc = p.channels_last;
  const int64_t b = p.block_size;
  xform_math::SpaceDepth g;
  g.n = depth_in[0];
  g.c = depth_in[nhwc ? 3 : 1] / (b * b);
  g.h = depth_in[nhwc ? 1 : 2];
  g.w = depth_in[nhwc ? 2 : 3];
  g.b = b;
  g.crd = p.crd;
  g.nhwc = nhwc;
  return g;
}

template <bool kToSpace> void space_depth(KernelContext& ctx) {
  const TensorView &x = ctx.in(0), &out = ctx.out(0);
  const auto g = space_depth_of(ctx, kToSpace ? x.shape : out.shape);
  dispatch_size(size_of(x.dtype), [&](auto u) {
    using U = decltype(u);
    const U* src = x.ptr<U>();
    U* dst = out.ptr<U>();
    ctx.parallel_for(out.numel(), 16384, [&](int64_t b, int64_t e) {
      for (int64_t o = b; o < e; ++o) dst[o] = src[kToSpace ? g.d2s_source(o) : g.s2d_source(o)];
    });
  });
}

std::vector<int64_t> load_indices(const TensorView& idx) {
  std::vector<int64_t> r(static_cast<size_t>(idx.numel()));
  convert(idx.data, idx.dtype, r.data(), i64, idx.numel());
  return r;
}

[[noreturn]] void fail_row(const KernelContext& ctx, const TensorView& idx, int64_t pos,
                           int64_t value, int64_t rows) {
  // worded as the CUDA kernels' reports (runtime check_error_slots)
  fail<ValueError>(
      "[{}] index {} out of range for axis 0 of size {} (position {} of indices "
      "shape {})",
      ctx.op_name(), value, rows, pos, str(idx.shape));
}

void embedding(KernelContext& ctx) {
  const TensorView &w = ctx.in(0), &idx = ctx.in(1), &out = ctx.out(0);
  const int64_t rows = w.shape[0], m = idx.numel();
  const int64_t row = rows > 0 ? w.numel() / rows * static_cast<int64_t>(size_of(w.dtype)) : 0;
  const auto ids = load_indices(idx);
  FirstBadIndex bad;
  const auto* src = static_cast<const char*>(w.data);
  auto* dst = static_cast<char*>(out.data);
  ctx.parallel_for(m, std::max<int64_t>(1, 65536 / std::max<int64_t>(row, 1)),
                   [&](int64_t b, int64_t e) {
                     for (int64_t r = b; r < e; ++r) {
                       const int64_t k = ids[r];
                       if (k < 0 || k >= rows) {
                         bad.record(r);
                         std::memset(dst + r * row, 0, row);
                       } else {
                         std::memcpy(dst + r * row, src + k * row, row);
                       }
                     }
                   });
  if (bad.any()) fail_row(ctx, idx, bad.pos(), ids[bad.pos()], rows);
}

void embedding_grad(KernelContext& ctx) {
  const TensorView &idx = ctx.in(0), &grad = ctx.in(1), &out = ctx.out(0);
  const int64_t rows = out.shape[0], m = idx.numel();
  const int64_t pad = params_of<EmbeddingGradParams>(ctx).padding_idx;
  const int64_t d = rows > 0 ? out.numel() / rows : 0;
  const auto ids = load_indices(idx);
  for (int64_t r = 0; r < m; ++r)
    if (ids[r] < 0 || ids[r] >= rows) fail_row(ctx, idx, r, ids[r], rows);
  // counting sort: the positions reading each row, in index order
  std::vector<int64_t> start(static_cast<size_t>(rows) + 1, 0), order(static_cast<size_t>(m));
  for (int64_t r = 0; r < m; ++r) ++start[ids[r] + 1];
  std::partial_sum(start.begin(), start.end(), start.begin());
  std::vector<int64_t> next(start.begin(), start.end() - 1);
  for (int64_t r = 0; r < m; ++r) order[next[ids[r]]++] = r;
  dispatch_float(out.dtype, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    const T* g = grad.ptr<T>();
    T* o = out.ptr<T>();
    ctx.parallel_for(rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(d, 1)),
                     [&](int64_t b, int64_t e) {
                       for (int64_t v = b; v < e; ++v) {
                         T* dst = o + v * d;
                         std::fill(dst, dst + d, T(0));
                         if (v == pad) continue;
                         for (int64_t k = start[v]; k < start[v + 1]; ++k) {
                           const T* src = g + order[k] * d;
                           for (int64_t j = 0; j < d; ++j) dst[j] += src[j];
                         }
                       }
                     });
  });
}

void masked_fill(KernelContext& ctx) {
  const TensorView &x = ctx.in(0), &mask = ctx.in(1), &out = ctx.out(0);
  const double value = params_of<MaskedFillParams>(ctx).value;
  const auto* m = mask.ptr<const bool>();
  dispatch_size(size_of(x.dtype), [&](auto u) {
    using U = decltype(u);
    U fill{};
    convert(&value, f64, &fill, x.dtype, 1);
    const U* src = x.ptr<U>();
    U* dst = out.ptr<U>();
    if (mask.shape == x.shape) {
      ctx.parallel_for(out.numel(), 16384, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) dst[i] = m[i] ? fill : src[i];
      });
      return;
    }
    for_each_broadcast<1>(
        ctx, out.shape, {&mask.shape},
        [&](int64_t i, const std::array<int64_t, 1>& off) { dst[i] = m[off[0]] ? fill : src[i]; });
  });
}

// x seen as rows of its last dim (or flattened when axes is empty): each output row copies from
// one input row, in at most two pieces when the last dim rolls.
void roll(KernelContext& ctx) {
  const TensorView &x = ctx.in(0), &out = ctx.out(0);
  RollParams spare;
  const RollParams& p = params_of(ctx, spare);
  const auto &shifts = p.shifts, &axes = p.axes;
  const Shape s = axes.empty() ? Shape{x.numel()} : x.shape;
  const int r = static_cast<int>(s.size());
  if (x.numel() == 0) return;
  std::vector<int64_t> shift(static_cast<size_t>(r), 0);
  for (size_t k = 0; k < shifts.size(); ++k) {
    const int a = axes.empty() ? 0 : static_cast<int>(axes[k]);
    shift[a] = ((shifts[k] % s[a]) + s[a]) % s[a];
  }
  const int64_t n = s[r - 1], es = static_cast<int64_t>(size_of(x.dtype));
  const int64_t rows = x.numel() / n, sh = shift[r - 1];
  const auto* src = static_cast<const char*>(x.data);
  auto* dst = static_cast<char*>(out.data);
  ctx.parallel_for(rows, std::max<int64_t>(1, 65536 / (n * es)), [&](int64_t b, int64_t e) {
    for (int64_t row = b; row < e; ++row) {
      int64_t rem = row, from = 0, stride = 1;
      for (int d = r - 2; d >= 0; --d) {
        const int64_t i = rem % s[d];
        rem /= s[d];
        from += ((i - shift[d] + s[d]) % s[d]) * stride;
        stride *= s[d];
      }
      const char* in_row = src + from * n * es;
      char* out_row = dst + row * n * es;
      // out[j] = in[j - sh]: the last sh inputs first, then the rest
      std::memcpy(out_row, in_row + (n - sh) * es, sh * es);
      std::memcpy(out_row + sh * es, in_row, (n - sh) * es);
    }
  });
}

template <typename T> void nms_typed(KernelContext& ctx) {
  const TensorView &boxes = ctx.in(0), &scores = ctx.in(1);
  const NonMaxSuppressionParams a = params_of<NonMaxSuppressionParams>(ctx);
  const int64_t nb = scores.shape[0], nc = scores.shape[1], n = scores.shape[2];
  const int64_t m = std::min(a.max_output_boxes_per_class, n);
  const bool center = a.center_point_box, has_thr = a.has_score_threshold;
  const T iou = static_cast<T>(a.iou_threshold), thr = static_cast<T>(a.score_threshold);
  const T* bp = boxes.ptr<T>();
  const T* sp = scores.ptr<T>();
  std::vector<int64_t> picked(static_cast<size_t>(nb * nc * m)), count(nb * nc, 0);
  ctx.parallel_for(nb * nc, 1, [&](int64_t b, int64_t e) {
    std::vector<int64_t> cand;
    for (int64_t seg = b; seg < e; ++seg) {
      const T* sc = sp + seg * n;
      const T* bx = bp + seg / nc * n * 4;
      cand.clear();
      for (int64_t i = 0; i < n; ++i)
        if (xform_math::nms_candidate(sc[i], has_thr, thr)) cand.push_back(i);
      std::stable_sort(cand.begin(), cand.end(),
                       [&](int64_t p, int64_t q) { return sc[p] > sc[q]; });
      int64_t* sel = picked.data() + seg * m;
      int64_t k = 0;
      for (size_t c = 0; c < cand.size() && k < m; ++c) {
        bool keep = true;
        for (int64_t j = 0; j < k && keep; ++j)
          keep = !xform_math::suppresses(bx + cand[c] * 4, bx + sel[j] * 4, center, iou);
        if (keep) sel[k++] = cand[c];
      }
      count[seg] = k;
    }
  });
  auto* out = ctx.out(0).ptr<int64_t>();
  std::fill(out, out + ctx.out(0).numel(), int64_t{-1});
  int64_t row = 0;
  for (int64_t seg = 0; seg < nb * nc; ++seg)
    for (int64_t k = 0; k < count[seg]; ++k, ++row) {
      out[row * 3] = seg / nc;
      out[row * 3 + 1] = seg % nc;
      out[row * 3 + 2] = picked[seg * m + k];
    }
  *ctx.out(1).ptr<int64_t>() = row;
}

void non_max_suppression(KernelContext& ctx) {
  dispatch_float(ctx.in(0).dtype, ctx.op_name(), [&](auto t) { nms_typed<decltype(t)>(ctx); });
}
}  // namespace

void register_rearrange_kernels() {
  register_kernel(OpId::DepthToSpace, Backend::cpu, {space_depth<true>, kAllTypes, 0, false});
  register_kernel(OpId::SpaceToDepth, Backend::cpu, {space_depth<false>, kAllTypes, 0, false});
  register_kernel(OpId::Embedding, Backend::cpu, {embedding, kAllTypes, 0, false});
  register_kernel(OpId::EmbeddingGrad, Backend::cpu, {embedding_grad, kFloatTypes, 1});
  register_kernel(OpId::MaskedFill, Backend::cpu, {masked_fill, kAllTypes, 0, false});
  register_kernel(OpId::Roll, Backend::cpu, {roll, kAllTypes, 0, false});
  register_kernel(OpId::NonMaxSuppression, Backend::cpu, {non_max_suppression, kFloatTypes, 0});
}

}  // namespace kiln::cpu
