// CUDA kernels of depth_to_space, space_to_depth, embedding, embedding_grad, masked_fill, roll and
// non_max_suppression. The moves are one thread per output element (coalesced writes).
// embedding_grad is deterministic: the indices are radix-sorted stably and one thread per (row,
// element) adds that row's gradients in index order. non_max_suppression sorts each (batch,
// class)'s scores (two stable radix sorts: scores descending, then segments), selects greedily
// with one block per (batch, class), and packs the selections in ONNX order.
#include <algorithm>
#include <climits>
#include <cub/device/device_radix_sort.cuh>

#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/kernels.h"
#include "kiln/array.h"
#include "ops/rearrange_params.h"
#include "ops/rearrange_util.h"

namespace kiln::cuda {

// Defined in transform_index.cu.
const int64_t* indices_as_i64(KernelContext& ctx, const TensorView& idx);

namespace {

#define KILN_GRID_LOOP(i, n)                                                \
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < (n); \
       i += int64_t{gridDim.x} * blockDim.x)

/// Calls f(U{}) with an unsigned type of one element of `bytes` bytes.
template <typename F> void dispatch_elem(size_t bytes, const char* op, F&& f) {
  switch (bytes) {
    case 1:
      f(uint8_t{});
      return;
    case 2:
      f(uint16_t{});
      return;
    case 4:
      f(uint32_t{});
      return;
    case 8:
      f(uint64_t{});
      return;
    default:
      fail<UnsupportedError>("[{}] cuda kernel got element size {}", op, bytes);
  }
}

int bits_for(uint64_t v) {
  int b = 0;
  while (b < 64 && (v >> b) != 0) ++b;
  return b;
}

// ---- depth_to_space, space_to_depth

template <typename U, bool kToSpace>
__global__ void space_depth_kernel(const U* __restrict__ x, U* __restrict__ out,
                                   xform_math::SpaceDepth g, int64_t total) {
  KILN_GRID_LOOP(o, total) { out[o] = x[kToSpace ? g.d2s_source(o) : g.s2d_source(o)]; }
}

template <bool kToSpace> void space_depth(KernelContext& ctx) {
  const TensorView &x = ctx.in(0), &out = ctx.out(0);
  const int64_t total = out.numel();
  if (total == 0) return;
  const Shape& depth = kToSpace ? x.shape : out.shape;
  const SpaceDepthParams p = params_of<SpaceDepthParams>(ctx);
  const bool nhwc = p.channels_last;
  xform_math::SpaceDepth g;
  g.b = p.block_size;
  g.n = depth[0];
  g.c = depth[nhwc ? 3 : 1] / (g.b * g.b);
  g.h = depth[nhwc ? 1 : 2];
  g.w = depth[nhwc ? 2 : 3];
  g.crd = p.crd;
  g.nhwc = nhwc;
  dispatch_elem(size_of(x.dtype), ctx.op_name(), [&](auto u) {
    using U = decltype(u);
    space_depth_kernel<U, kToSpace>
        <<<blocks_for(total), kThreads, 0, stream_of(ctx)>>>(x.ptr<U>(), out.ptr<U>(), g, total);
  });
  check_launch(ctx.op_name());
}

// ---- embedding, embedding_grad

template <typename U> __global__ void embedding_kernel(const U* __restrict__ w,
                                                       const int64_t* __restrict__ ids,
                                                       U* __restrict__ out, int64_t rows, int64_t d,
                                                       int64_t total, int64_t* err) {
  KILN_GRID_LOOP(i, total) {
    const int64_t r = i / d, j = i - r * d, k = ids[r];
    if (k < 0 || k >= rows) {
      if (j == 0) report_bad_value(err, r, k);
      out[i] = U{};
    } else {
      out[i] = w[k * d + j];
    }
  }
}

void embedding(KernelContext& ctx) {
  const TensorView &w = ctx.in(0), &idx = ctx.in(1), &out = ctx.out(0);
  const int64_t total = out.numel(), rows = w.shape[0];
  if (total == 0) return;
  const int64_t d = total / idx.numel();
  const int64_t* ids = indices_as_i64(ctx, idx);
  describe_errors(ctx, ErrorKind::index_on_axis, 0, rows);
  dispatch_elem(size_of(w.dtype), "embedding", [&](auto u) {
    using U = decltype(u);
    embedding_kernel<U><<<blocks_for(total), kThreads, 0, stream_of(ctx)>>>(
        w.ptr<U>(), ids, out.ptr<U>(), rows, d, total, ctx.error_slot());
  });
  check_launch("embedding");
}

// Sort keys of the indices: the row, or `rows` (sorts last, skipped) for a bad index.
__global__ void embedding_keys_kernel(const int64_t* __restrict__ ids, uint64_t* __restrict__ keys,
                                      int64_t* __restrict__ values, int64_t m, int64_t rows,
                                      int64_t* err) {
  KILN_GRID_LOOP(r, m) {
    const int64_t k = ids[r];
    const bool ok = k >= 0 && k < rows;
    if (!ok) report_bad_value(err, r, k);
    keys[r] = static_cast<uint64_t>(ok ? k : rows);
    values[r] = r;
  }
}

// One thread per (sorted position, row element); the first position of each run of equal rows
// adds the run's gradients in index order.
template <typename T>
__global__ void embedding_grad_kernel(const uint64_t* __restrict__ keys,
                                      const int64_t* __restrict__ order, const T* __restrict__ g,
                                      T* __restrict__ out, int64_t m, int64_t d, uint64_t none,
                                      uint64_t pad) {
  KILN_GRID_LOOP(i, m * d) {
    const int64_t r = i / d, j = i - r * d;
    const uint64_t key = keys[r];
    if (key == none || key == pad || (r > 0 && keys[r - 1] == key)) continue;
    acc_t<T> acc = 0;
    for (int64_t e = r; e < m && keys[e] == key; ++e) acc += to_acc(g[order[e] * d + j]);
    out[static_cast<int64_t>(key) * d + j] = from_acc<T>(acc);
  }
}

void embedding_grad(KernelContext& ctx) {
  const TensorView &idx = ctx.in(0), &grad = ctx.in(1), &out = ctx.out(0);
  const cudaStream_t s = stream_of(ctx);
  const int64_t rows = out.shape[0], m = idx.numel();
  const int64_t pad = params_of<EmbeddingGradParams>(ctx).padding_idx;
  const size_t bytes = static_cast<size_t>(out.numel()) * size_of(out.dtype);
  if (bytes > 0) KILN_CUDA_CHECK(cudaMemsetAsync(out.data, 0, bytes, s));
  if (m == 0 || rows == 0) {
    if (m > 0) {  // every index is out of range: report the first
      const int64_t* ids = indices_as_i64(ctx, idx);
      describe_errors(ctx, ErrorKind::index_on_axis, 0, rows);
      auto* k = static_cast<uint64_t*>(ctx.scratch(static_cast<size_t>(m) * sizeof(uint64_t)));
      auto* v = static_cast<int64_t*>(ctx.scratch(static_cast<size_t>(m) * sizeof(int64_t)));
      embedding_keys_kernel<<<blocks_for(m), kThreads, 0, s>>>(ids, k, v, m, rows,
                                                               ctx.error_slot());
      check_launch("embedding_grad");
    }
    return;
  }
  const int64_t d = out.numel() / rows;
  const int64_t* ids = indices_as_i64(ctx, idx);
  describe_errors(ctx, ErrorKind::index_on_axis, 0, rows);
  auto* k = static_cast<uint64_t*>(ctx.scratch(2 * static_cast<size_t>(m) * sizeof(uint64_t)));
  auto* v = static_cast<int64_t*>(ctx.scratch(2 * static_cast<size_t>(m) * sizeof(int64_t)));
  cub::DoubleBuffer<uint64_t> keys(k, k + m);
  cub::DoubleBuffer<int64_t> values(v, v + m);
  embedding_keys_kernel<<<blocks_for(m), kThreads, 0, s>>>(ids, keys.Current(), values.Current(), m,
                                                           rows, ctx.error_slot());
  check_launch("embedding_grad");
  const int end_bit = bits_for(static_cast<uint64_t>(rows));
  if (m > 1 && end_bit > 0) {
    size_t temp_bytes = 0;
    KILN_CUDA_CHECK(
        cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys, values, m, 0, end_bit, s));
    void* temp = ctx.scratch(std::max<size_t>(temp_bytes, 1));
    KILN_CUDA_CHECK(
        cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys, values, m, 0, end_bit, s));
  }
  if (d == 0) return;
  dispatch_float(out.dtype, "embedding_grad", [&](auto t) {
    using T = decltype(t);
    embedding_grad_kernel<T><<<blocks_for(m * d), kThreads, 0, s>>>(
        keys.Current(), values.Current(), grad.ptr<T>(), out.ptr<T>(), m, d,
        static_cast<uint64_t>(rows), pad < 0 ? ~uint64_t{0} : static_cast<uint64_t>(pad));
  });
  check_launch("embedding_grad");
}

// ---- masked_fill

template <typename U>
__global__ void masked_fill_kernel(const U* __restrict__ x, const bool* __restrict__ mask,
                                   U* __restrict__ out, U fill, BroadcastIndex mi, bool dense,
                                   int64_t total) {
  KILN_GRID_LOOP(i, total) { out[i] = mask[dense ? i : mi.offset(i)] ? fill : x[i]; }
}

void masked_fill(KernelContext& ctx) {
  const TensorView &x = ctx.in(0), &mask = ctx.in(1), &out = ctx.out(0);
  const int64_t total = out.numel();
  if (total == 0) return;
  const bool dense = mask.shape == x.shape;
  const BroadcastIndex mi =
      dense ? BroadcastIndex{} : make_broadcast_index(mask.shape, x.shape, "masked_fill");
  const double value = params_of<MaskedFillParams>(ctx).value;
  dispatch_elem(size_of(x.dtype), "masked_fill", [&](auto u) {
    using U = decltype(u);
    U fill{};
    convert(&value, f64, &fill, x.dtype, 1);
    masked_fill_kernel<U><<<blocks_for(total), kThreads, 0, stream_of(ctx)>>>(
        x.ptr<U>(), mask.ptr<bool>(), out.ptr<U>(), fill, mi, dense, total);
  });
  check_launch("masked_fill");
}

// ---- roll

struct RollGeometry {
  int rank = 0;
  int64_t dims[kMaxRank] = {}, shifts[kMaxRank] = {};  // shifts in [0, dim)
  __device__ int64_t source(int64_t o) const {
    int64_t off = 0, stride = 1;
    for (int d = rank - 1; d >= 0; --d) {
      const int64_t n = dims[d], i = o % n;
      o /= n;
      const int64_t j = i >= shifts[d] ? i - shifts[d] : i - shifts[d] + n;
      off += j * stride;
      stride *= n;
    }
    return off;
  }
};

template <typename U> __global__ void roll_kernel(const U* __restrict__ x, U* __restrict__ out,
                                                  RollGeometry g, int64_t total) {
  KILN_GRID_LOOP(o, total) { out[o] = x[g.source(o)]; }
}

void roll(KernelContext& ctx) {
  const TensorView &x = ctx.in(0), &out = ctx.out(0);
  const int64_t total = out.numel();
  if (total == 0) return;
  RollParams spare;
  const RollParams& p = params_of(ctx, spare);
  const auto &shifts = p.shifts, &axes = p.axes;
  const Shape s = axes.empty() ? Shape{total} : x.shape;
  if (s.size() > static_cast<size_t>(kMaxRank))
    fail<UnsupportedError>("[roll] cuda kernel takes rank <= {}, got shape {}", kMaxRank,
                           str(x.shape));
  RollGeometry g;
  g.rank = static_cast<int>(s.size());
  for (int d = 0; d < g.rank; ++d) g.dims[d] = s[d];
  for (size_t k = 0; k < shifts.size(); ++k) {
    const int a = axes.empty() ? 0 : static_cast<int>(axes[k]);
    g.shifts[a] = ((shifts[k] % s[a]) + s[a]) % s[a];
  }
  dispatch_elem(size_of(x.dtype), "roll", [&](auto u) {
    using U = decltype(u);
    roll_kernel<U>
        <<<blocks_for(total), kThreads, 0, stream_of(ctx)>>>(x.ptr<U>(), out.ptr<U>(), g, total);
  });
  check_launch("roll");
}

// ---- non_max_suppression

// Sort keys: candidate scores (-0 as +0), else -inf; values: flat positions.
template <typename T>
__global__ void nms_keys_kernel(const T* __restrict__ scores, T* __restrict__ keys,
                                int64_t* __restrict__ values, int64_t total, bool has_thr, T thr) {
  KILN_GRID_LOOP(p, total) {
    const T v = scores[p];
    keys[p] = xform_math::nms_candidate(v, has_thr, thr) ? v + T(0) : -INFINITY;
    values[p] = p;
  }
}

// The segment (batch * C + class) of each position, as the key of the second sort.
__global__ void nms_segment_kernel(const int64_t* __restrict__ pos, uint64_t* __restrict__ seg,
                                   int64_t total, int64_t n) {
  KILN_GRID_LOOP(i, total) { seg[i] = static_cast<uint64_t>(pos[i] / n); }
}

// One block per segment: candidates in order; each is kept unless a kept box suppresses it (the
// block's threads test the kept boxes in parallel).
template <typename T>
__global__ void nms_select_kernel(const T* __restrict__ boxes, const T* __restrict__ scores,
                                  const int64_t* __restrict__ order, int64_t n, int64_t nc,
                                  int64_t m, bool center, T iou, bool has_thr, T thr,
                                  int64_t* __restrict__ picked, int64_t* __restrict__ counts) {
  const int64_t seg = blockIdx.x;
  const T* bx = boxes + seg / nc * n * 4;
  const int64_t* ord = order + seg * n;
  int64_t* sel = picked + seg * m;
  __shared__ int64_t count;
  if (threadIdx.x == 0) count = 0;
  __syncthreads();
  for (int64_t c = 0; c < n; ++c) {
    const int64_t k = count;
    if (k >= m) break;
    const int64_t p = ord[c];
    if (!xform_math::nms_candidate(scores[p], has_thr, thr)) continue;
    const int64_t box = p - seg * n;
    int hit = 0;
    for (int64_t j = threadIdx.x; j < k && !hit; j += blockDim.x)
      hit = xform_math::suppresses(bx + box * 4, bx + sel[j] * 4, center, iou);
    if (!__syncthreads_or(hit) && threadIdx.x == 0) {
      sel[k] = box;
      count = k + 1;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) counts[seg] = count;
}

// Each segment's first row in the packed result, and the total (one thread: segments are few).
__global__ void nms_offsets_kernel(const int64_t* __restrict__ counts, int64_t* __restrict__ first,
                                   int64_t segments, int64_t* __restrict__ total) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  int64_t sum = 0;
  for (int64_t s = 0; s < segments; ++s) {
    first[s] = sum;
    sum += counts[s];
  }
  *total = sum;
}

__global__ void nms_pack_kernel(const int64_t* __restrict__ picked,
                                const int64_t* __restrict__ counts,
                                const int64_t* __restrict__ first, int64_t* __restrict__ out,
                                int64_t segments, int64_t m, int64_t nc) {
  KILN_GRID_LOOP(i, segments * m) {
    const int64_t seg = i / m, k = i - seg * m;
    if (k >= counts[seg]) continue;
    int64_t* row = out + (first[seg] + k) * 3;
    row[0] = seg / nc;
    row[1] = seg % nc;
    row[2] = picked[i];
  }
}

template <typename T> void nms_typed(KernelContext& ctx) {
  const TensorView &boxes = ctx.in(0), &scores = ctx.in(1), &sel = ctx.out(0);
  const cudaStream_t s = stream_of(ctx);
  const NonMaxSuppressionParams a = params_of<NonMaxSuppressionParams>(ctx);
  const int64_t nb = scores.shape[0], nc = scores.shape[1], n = scores.shape[2];
  const int64_t segments = nb * nc, total = segments * n;
  const int64_t m = std::min(a.max_output_boxes_per_class, n);
  const bool center = a.center_point_box, has_thr = a.has_score_threshold;
  const T iou = static_cast<T>(a.iou_threshold), thr = static_cast<T>(a.score_threshold);
  auto* count_out = ctx.out(1).ptr<int64_t>();
  if (sel.numel() > 0)
    KILN_CUDA_CHECK(cudaMemsetAsync(sel.data, 0xff, sel.numel() * sizeof(int64_t), s));  // -1
  if (m <= 0 || segments == 0) {
    KILN_CUDA_CHECK(cudaMemsetAsync(count_out, 0, sizeof(int64_t), s));
    return;
  }
  if (total > INT_MAX || segments > INT_MAX)
    fail<UnsupportedError>(
        "[non_max_suppression] cuda kernel takes at most {} scores, got shape "
        "{}",
        INT_MAX, str(scores.shape));
  // sort 1: scores descending (stable: equal scores keep box order)
  auto* kb = static_cast<T*>(ctx.scratch(2 * static_cast<size_t>(total) * sizeof(T)));
  auto* vb = static_cast<int64_t*>(ctx.scratch(2 * static_cast<size_t>(total) * sizeof(int64_t)));
  cub::DoubleBuffer<T> keys(kb, kb + total);
  cub::DoubleBuffer<int64_t> values(vb, vb + total);
  nms_keys_kernel<T><<<blocks_for(total), kThreads, 0, s>>>(scores.ptr<T>(), keys.Current(),
                                                            values.Current(), total, has_thr, thr);
  check_launch("non_max_suppression");
  const int items = static_cast<int>(total);
  size_t temp_bytes = 0;
  KILN_CUDA_CHECK(cub::DeviceRadixSort::SortPairsDescending(
      nullptr, temp_bytes, keys, values, items, 0, static_cast<int>(sizeof(T) * 8), s));
  void* temp = ctx.scratch(std::max<size_t>(temp_bytes, 1));
  KILN_CUDA_CHECK(cub::DeviceRadixSort::SortPairsDescending(temp, temp_bytes, keys, values, items,
                                                            0, static_cast<int>(sizeof(T) * 8), s));
  // sort 2: by segment (stable: each segment keeps the score order)
  const int seg_bits = bits_for(static_cast<uint64_t>(segments));
  if (segments > 1) {
    auto* sb =
        static_cast<uint64_t*>(ctx.scratch(2 * static_cast<size_t>(total) * sizeof(uint64_t)));
    cub::DoubleBuffer<uint64_t> seg_keys(sb, sb + total);
    nms_segment_kernel<<<blocks_for(total), kThreads, 0, s>>>(values.Current(), seg_keys.Current(),
                                                              total, n);
    check_launch("non_max_suppression");
    size_t temp2 = 0;
    KILN_CUDA_CHECK(
        cub::DeviceRadixSort::SortPairs(nullptr, temp2, seg_keys, values, items, 0, seg_bits, s));
    void* t2 = ctx.scratch(std::max<size_t>(temp2, 1));
    KILN_CUDA_CHECK(
        cub::DeviceRadixSort::SortPairs(t2, temp2, seg_keys, values, items, 0, seg_bits, s));
  }
  auto* picked = static_cast<int64_t*>(ctx.scratch(static_cast<size_t>(segments * m) * 8));
  auto* counts = static_cast<int64_t*>(ctx.scratch(static_cast<size_t>(segments) * 8));
  auto* first = static_cast<int64_t*>(ctx.scratch(static_cast<size_t>(segments) * 8));
  nms_select_kernel<T><<<static_cast<unsigned>(segments), kThreads, 0, s>>>(
      boxes.ptr<T>(), scores.ptr<T>(), values.Current(), n, nc, m, center, iou, has_thr, thr,
      picked, counts);
  check_launch("non_max_suppression");
  nms_offsets_kernel<<<1, 1, 0, s>>>(counts, first, segments, count_out);
  check_launch("non_max_suppression");
  nms_pack_kernel<<<blocks_for(segments * m), kThreads, 0, s>>>(
      picked, counts, first, sel.ptr<int64_t>(), segments, m, nc);
  check_launch("non_max_suppression");
}

void non_max_suppression(KernelContext& ctx) {
  const DType t = ctx.in(0).dtype;
  if (t == DType::f32) nms_typed<float>(ctx);
  else if (t == DType::f64) nms_typed<double>(ctx);
  else fail<UnsupportedError>("[non_max_suppression] cuda kernel got dtype {}", name(t));
}
}  // namespace
#undef KILN_GRID_LOOP

void register_rearrange_kernels() {
  register_kernel(OpId::DepthToSpace, Backend::cuda, {space_depth<true>, kAllTypes, 0, false});
  register_kernel(OpId::SpaceToDepth, Backend::cuda, {space_depth<false>, kAllTypes, 0, false});
  // embedding and embedding_grad report indices out of range (KernelContext::error_slot)
  register_kernel(OpId::Embedding, Backend::cuda,
                  {embedding, kAllTypes, 0, /*half_via_f32=*/false, /*reports_errors=*/true});
  register_kernel(OpId::EmbeddingGrad, Backend::cuda,
                  {embedding_grad, kFloatTypes, 1, /*half_via_f32=*/false,
                   /*reports_errors=*/true});
  register_kernel(OpId::MaskedFill, Backend::cuda, {masked_fill, kAllTypes, 0, false});
  register_kernel(OpId::Roll, Backend::cuda, {roll, kAllTypes, 0, false});
  register_kernel(OpId::NonMaxSuppression, Backend::cuda, {non_max_suppression, kFloatTypes, 0});
}

}  // namespace kiln::cuda
