// CUDA kernels of the transform family's layout ops (reshape ... flip); gather, gather_elements,
// one_hot, coordinate_along_axis and hamming_distance are in transform_index.cu, the sorting ops
// and scatter_elements in transform_sort.cu. Layout ops only move bytes: they become one strided
// copy, dispatched on the element size or on a wider unit (up to 16 bytes) where rows allow it.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/kernels.h"
#include "backends/cuda/transform_internal.h"
#include "kiln/array.h"
#include "ops/transform_params.h"
#include "ops/transform_util.h"

namespace kiln::cuda {

// Shared with transform_sort.cu.
void register_transform_sort_kernels();

namespace transform_detail {

int64_t addr(const void* p) { return static_cast<int64_t>(reinterpret_cast<uintptr_t>(p)); }

RowGrid row_grid(int64_t rows, int64_t inner) {
  const int bx = static_cast<int>(std::clamp<int64_t>(inner, 1, kThreads));
  const int by = std::max(1, kThreads / bx);
  const int64_t gy = std::clamp<int64_t>((rows + by - 1) / by, 1, 65535);
  const int64_t gx = std::clamp<int64_t>((inner + bx - 1) / bx, 1, std::max<int64_t>(1, (1 << 20) / gy));
  return {dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy)), dim3(bx, by)};
}

}  // namespace transform_detail

namespace {

using namespace transform_detail;

// ---- strided copy: dst[dbase + sum i_d dmul_d] = src[sbase + sum i_d smul_d] over dims n

constexpr int kMaxCopyDims = 16;  // tile splits each of up to kMaxRank dims in two

struct CopyPlan {
  int rank = 0;
  int64_t n[kMaxCopyDims] = {}, smul[kMaxCopyDims] = {}, dmul[kMaxCopyDims] = {};
  int64_t sbase = 0, dbase = 0;
};

template <typename U, typename Idx>
__global__ void copy_kernel(const U* __restrict__ src, U* __restrict__ dst, CopyPlan p, Idx rows,
                            Idx inner) {
  const int last = p.rank - 1;
  const int64_t sl = p.smul[last], dl = p.dmul[last];
  for (Idx r = blockIdx.y * blockDim.y + threadIdx.y; r < rows; r += gridDim.y * blockDim.y) {
    int64_t so = p.sbase, dof = p.dbase;
    Idx rem = r;
    for (int d = last - 1; d >= 0; --d) {
      const Idx nd = static_cast<Idx>(p.n[d]), q = rem / nd;
      const int64_t i = static_cast<int64_t>(rem - q * nd);
      so += i * p.smul[d];
      dof += i * p.dmul[d];
      rem = q;
    }
    for (Idx j = blockIdx.x * blockDim.x + threadIdx.x; j < inner; j += gridDim.x * blockDim.x)
      dst[dof + static_cast<int64_t>(j) * dl] = src[so + static_cast<int64_t>(j) * sl];
  }
}

/// Dims of a strided copy, in element units; launch() drops size-1 dims, merges dims that stay
/// adjacent on both sides and widens the unit where the last dim is contiguous on both sides.
struct StridedCopy {
  std::vector<int64_t> n, s, d;
  int64_t sbase = 0, dbase = 0;
  void add(int64_t size, int64_t smul, int64_t dmul) {
    n.push_back(size);
    s.push_back(smul);
    d.push_back(dmul);
  }
  // A dense destination: dmul are the contiguous strides of the dims added so far.
  void dense_destination() {
    int64_t stride = 1;
    for (size_t k = n.size(); k-- > 0;) {
      d[k] = stride;
      stride *= n[k];
    }
  }
  void launch(cudaStream_t stream, const void* src, void* dst, size_t esize, const char* op) const;
};

void StridedCopy::launch(cudaStream_t stream, const void* src, void* dst, size_t esize,
                         const char* op) const {
  CopyPlan p;
  p.sbase = sbase;
  p.dbase = dbase;
  std::vector<int64_t> cn, cs, cd;
  for (size_t k = 0; k < n.size(); ++k) {
    if (n[k] == 0) return;
    if (n[k] == 1) continue;
    if (!cn.empty() && cs.back() == s[k] * n[k] && cd.back() == d[k] * n[k]) {
      cn.back() *= n[k];
      cs.back() = s[k];
      cd.back() = d[k];
    } else {
      cn.push_back(n[k]);
      cs.push_back(s[k]);
      cd.push_back(d[k]);
    }
  }
  if (cn.empty()) {
    cn = {1};
    cs = {1};
    cd = {1};
  }
  if (cn.size() > kMaxCopyDims)
    fail<UnsupportedError>("[{}] cuda kernel takes at most {} non-mergeable dims, got {}", op,
                           kMaxCopyDims, cn.size());
  const size_t last = cn.size() - 1;
  size_t unit = esize;
  if (cs[last] == 1 && cd[last] == 1) {
    const int64_t e = static_cast<int64_t>(esize);
    std::vector<int64_t> counts = {cn[last] * e, sbase * e, dbase * e, addr(src), addr(dst)};
    for (size_t k = 0; k < last; ++k) {
      counts.push_back(cs[k] * e);
      counts.push_back(cd[k] * e);
    }
    for (size_t w = 16; w > esize; w /= 2) {
      bool ok = true;
      for (int64_t c : counts) ok = ok && c % static_cast<int64_t>(w) == 0;
      if (ok) {
        unit = w;
        break;
      }
    }
  }
  const int64_t k = static_cast<int64_t>(unit / esize);
  p.rank = static_cast<int>(cn.size());
  for (size_t i = 0; i < cn.size(); ++i) {
    const bool l = i == last;
    p.n[i] = l ? cn[i] / k : cn[i];
    p.smul[i] = l ? cs[i] : cs[i] / k;
    p.dmul[i] = l ? cd[i] : cd[i] / k;
  }
  p.sbase /= k;
  p.dbase /= k;
  const int64_t inner = p.n[last];
  int64_t rows = 1;
  for (size_t i = 0; i < last; ++i) rows *= p.n[i];
  const RowGrid g = row_grid(rows, inner);
  constexpr int64_t kSmall = int64_t{1} << 31;
  dispatch_unit(unit, [&](auto u) {
    using U = decltype(u);
    if (rows < kSmall && inner < kSmall)
      copy_kernel<U, uint32_t><<<g.grid, g.block, 0, stream>>>(
          static_cast<const U*>(src), static_cast<U*>(dst), p, static_cast<uint32_t>(rows),
          static_cast<uint32_t>(inner));
    else
      copy_kernel<U, int64_t><<<g.grid, g.block, 0, stream>>>(
          static_cast<const U*>(src), static_cast<U*>(dst), p, rows, inner);
  });
  check_launch(op);
}

void copy_bytes(KernelContext& ctx, void* dst, const void* src, size_t bytes) {
  if (bytes == 0 || dst == src) return;
  KILN_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_of(ctx)));
}

void reshape(KernelContext& ctx) {
  const TensorView &in = ctx.in(0), &out = ctx.out(0);
  // the memory planner usually makes the output a view of the input
  copy_bytes(ctx, out.data, in.data, static_cast<size_t>(in.numel()) * size_of(in.dtype));
}

void split(KernelContext& ctx) {
  const TensorView& in = ctx.in(0);
  const int axis = static_cast<int>(params_of<AxisParams>(ctx).axis);
  const AxisSplit v = split_at(in.shape, axis);
  int64_t offset = 0;
  for (int k = 0; k < ctx.num_outputs(); ++k) {
    const int64_t len = ctx.out(k).shape[axis] * v.inner;
    StridedCopy c;
    c.add(v.outer, v.len * v.inner, len);
    c.add(len, 1, 1);
    c.sbase = offset;
    c.launch(stream_of(ctx), in.data, ctx.out(k).data, size_of(in.dtype), "split");
    offset += len;
  }
}

void concat(KernelContext& ctx) {
  const TensorView& out = ctx.out(0);
  const int axis = static_cast<int>(params_of<AxisParams>(ctx).axis);
  const AxisSplit v = split_at(out.shape, axis);
  int64_t offset = 0;
  for (int k = 0; k < ctx.num_inputs(); ++k) {
    const int64_t len = ctx.in(k).shape[axis] * v.inner;
    StridedCopy c;
    c.add(v.outer, len, v.len * v.inner);
    c.add(len, 1, 1);
    c.dbase = offset;
    c.launch(stream_of(ctx), ctx.in(k).data, out.data, size_of(out.dtype), "concat");
    offset += len;
  }
}

// ---- transpose

// A 32x32 tile goes through shared memory: reads run along the input's contiguous dim p, writes
// along the output's last dim q. Other dims are batch dims.
constexpr int kTile = 32, kTileRows = 8;

struct TransposePlan {
  int nb = 0;
  int64_t bdims[kMaxRank] = {}, bin[kMaxRank] = {}, bout[kMaxRank] = {};
  int64_t np = 1, nq = 1, in_q = 1, out_p = 1, tiles_p = 1, tiles_q = 1;
};

// The input and output offsets of batch index b (over the plan's batch dims).
__device__ inline void batch_offsets(const TransposePlan& p, int64_t b, int64_t& ib, int64_t& ob) {
  for (int d = p.nb - 1; d >= 0; --d) {
    const int64_t i = b % p.bdims[d];
    b /= p.bdims[d];
    ib += i * p.bin[d];
    ob += i * p.bout[d];
  }
}

template <typename U>
__global__ void transpose_tiled_kernel(const U* __restrict__ src, U* __restrict__ dst,
                                       TransposePlan p, int64_t tasks) {
  __shared__ U tile[kTile][kTile + 1];
  const int64_t per_batch = p.tiles_p * p.tiles_q;
  for (int64_t t = blockIdx.x; t < tasks; t += gridDim.x) {
    int64_t b = t / per_batch;
    const int64_t rest = t - b * per_batch;
    const int64_t p0 = rest / p.tiles_q * kTile, q0 = rest % p.tiles_q * kTile;
    int64_t ib = 0, ob = 0;
    batch_offsets(p, b, ib, ob);
    for (int r = threadIdx.y; r < kTile; r += kTileRows) {
      const int64_t ip = p0 + threadIdx.x, iq = q0 + r;
      if (ip < p.np && iq < p.nq) tile[r][threadIdx.x] = src[ib + ip + iq * p.in_q];
    }
    __syncthreads();
    for (int r = threadIdx.y; r < kTile; r += kTileRows) {
      const int64_t ip = p0 + r, iq = q0 + threadIdx.x;
      if (ip < p.np && iq < p.nq) dst[ob + ip * p.out_p + iq] = tile[threadIdx.x][r];
    }
    __syncthreads();
  }
}

// The same when the output's last dim q is short (an image's channels moving last, NCHW ->
// NHWC): a thread per position along p reads its nq values (each read coalesced across the
// threads' consecutive positions) and writes them together; 32x32 tiles would leave most
// threads idle.
template <typename U>
__global__ void transpose_short_q_kernel(const U* __restrict__ src, U* __restrict__ dst,
                                         TransposePlan p, int64_t rows) {
  for (int64_t r = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; r < rows;
       r += int64_t{gridDim.x} * blockDim.x) {
    int64_t b = r / p.np;
    const int64_t ip = r - b * p.np;
    int64_t ib = 0, ob = 0;
    batch_offsets(p, b, ib, ob);
    const U* s = src + ib + ip;
    U* o = dst + ob + ip * p.out_p;
    for (int64_t iq = 0; iq < p.nq; ++iq) o[iq] = s[iq * p.in_q];
  }
}

// 1-byte elements whose output puts q right after p (NCHW -> NHWC of u8 images), 4 | np, the
// q planes and batch offsets 4-byte aligned: a thread takes 4 consecutive positions along p,
// reading one 32-bit word per q plane (coalesced) and writing its 4 * NQ output bytes as NQ
// words. Offsets fit 32 bits.
template <int NQ>
__global__ void transpose_short_q_x4_kernel(const uint8_t* __restrict__ src,
                                            uint32_t* __restrict__ dst, TransposePlan p,
                                            int groups) {
  const int gp = static_cast<int>(p.np / 4), in_q = static_cast<int>(p.in_q);
  for (int t = blockIdx.x * blockDim.x + threadIdx.x; t < groups; t += gridDim.x * blockDim.x) {
    int b = t / gp, ib = 0;
    const int ip = (t - b * gp) * 4;
    for (int d = p.nb - 1; d >= 0; --d) {
      const int n = static_cast<int>(p.bdims[d]), q = b / n;
      ib += (b - q * n) * static_cast<int>(p.bin[d]);
      b = q;
    }
    uint32_t w[NQ];
#pragma unroll
    for (int iq = 0; iq < NQ; ++iq) {
      w[iq] = *reinterpret_cast<const uint32_t*>(src + ib + ip + iq * in_q);
    }
    // output byte j of the thread's 4 * NQ is byte j / NQ (the position) of word j % NQ
#pragma unroll
    for (int k = 0; k < NQ; ++k) {
      uint32_t o = 0;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int at = 4 * k + j;
        o |= ((w[at % NQ] >> (8 * (at / NQ))) & 0xffu) << (8 * j);
      }
      dst[int64_t{t} * NQ + k] = o;
    }
  }
}

// Whether transpose_short_q_x4_kernel takes the plan (1-byte elements, q short).
bool takes_short_q_x4(const TransposePlan& p, int64_t total, const void* src, const void* dst) {
  bool ok = p.out_p == p.nq && p.np % 4 == 0 && p.in_q % 4 == 0 && total < (int64_t{1} << 31) &&
            addr(src) % 4 == 0 && addr(dst) % 4 == 0;
  for (int d = 0; d < p.nb; ++d) ok = ok && p.bin[d] % 4 == 0;
  return ok;
}

// Launches transpose_short_q_x4_kernel<NQ> for the plan's nq (2 ... 8).
template <int NQ = 2>
void launch_short_q_x4(cudaStream_t stream, const void* src, void* dst, const TransposePlan& p,
                       int groups) {
  if constexpr (NQ <= 8) {
    if (p.nq != NQ) return launch_short_q_x4<NQ + 1>(stream, src, dst, p, groups);
    transpose_short_q_x4_kernel<NQ><<<blocks_for(groups), kThreads, 0, stream>>>(
        static_cast<const uint8_t*>(src), static_cast<uint32_t*>(dst), p, groups);
  }
}

constexpr int64_t kShortQ = 8;

void transpose(KernelContext& ctx) {
  const TensorView &in = ctx.in(0), &out = ctx.out(0);
  if (out.numel() == 0) return;
  TransposeParams spare;
  const std::vector<int64_t>& perm = params_of(ctx, spare).perm;
  const auto in_strides = contiguous_strides(in.shape);
  // output dims with their input strides, size-1 dims dropped, adjacent dims merged
  Shape dims;
  std::vector<int64_t> strides;
  for (int64_t a : perm) {
    const int64_t n = in.shape[a], s = in_strides[a];
    if (n == 1) continue;
    if (!dims.empty() && strides.back() == s * n) {
      dims.back() *= n;
      strides.back() = s;
    } else {
      dims.push_back(n);
      strides.push_back(s);
    }
  }
  const int rank = static_cast<int>(dims.size());
  const int p = static_cast<int>(std::find(strides.begin(), strides.end(), 1) - strides.begin());
  const size_t esize = size_of(in.dtype);
  if (rank < 2 || p >= rank - 1) {  // the output's last dim is contiguous in the input
    StridedCopy c;
    for (int d = 0; d < rank; ++d) c.add(dims[d], strides[d], 0);
    c.dense_destination();
    c.launch(stream_of(ctx), in.data, out.data, esize, "transpose");
    return;
  }
  if (rank > kMaxRank + 2)
    fail<UnsupportedError>("[transpose] cuda kernel takes rank <= {}, got {}", kMaxRank, rank);
  const int q = rank - 1;
  const auto out_strides = contiguous_strides(dims);
  TransposePlan tp;
  for (int d = 0; d < q; ++d) {
    if (d == p) continue;
    tp.bdims[tp.nb] = dims[d];
    tp.bin[tp.nb] = strides[d];
    tp.bout[tp.nb] = out_strides[d];
    ++tp.nb;
  }
  tp.np = dims[p];
  tp.nq = dims[q];
  tp.in_q = strides[q];
  tp.out_p = out_strides[p];
  tp.tiles_p = (tp.np + kTile - 1) / kTile;
  tp.tiles_q = (tp.nq + kTile - 1) / kTile;
  if (tp.nq <= kShortQ) {
    const int64_t rows = numel(dims) / tp.nq;
    if (esize == 1 && takes_short_q_x4(tp, numel(dims), in.data, out.data)) {
      launch_short_q_x4(stream_of(ctx), in.data, out.data, tp, static_cast<int>(rows / 4));
      check_launch("transpose");
      return;
    }
    dispatch_elem(esize, [&](auto u) {
      using U = decltype(u);
      transpose_short_q_kernel<U><<<blocks_for(rows), kThreads, 0, stream_of(ctx)>>>(
          in.ptr<U>(), out.ptr<U>(), tp, rows);
    });
    check_launch("transpose");
    return;
  }
  const int64_t tasks = numel(dims) / (tp.np * tp.nq) * tp.tiles_p * tp.tiles_q;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(tasks, 65535 * 32));
  dispatch_elem(esize, [&](auto u) {
    using U = decltype(u);
    transpose_tiled_kernel<U><<<blocks, dim3(kTile, kTileRows), 0, stream_of(ctx)>>>(
        in.ptr<U>(), out.ptr<U>(), tp, tasks);
  });
  check_launch("transpose");
}

// ---- slice, tile, broadcast_to, flip: strided copies into a dense output

void slice(KernelContext& ctx) {
  const TensorView &in = ctx.in(0), &out = ctx.out(0);
  SliceParams spare;
  const SliceParams& p = params_of(ctx, spare);
  const auto &starts = p.starts, &stops = p.stops, &steps = p.steps;
  const auto strides = contiguous_strides(in.shape);
  StridedCopy c;
  for (size_t d = 0; d < in.shape.size(); ++d) {
    c.sbase += transform::slice_dim(in.shape[d], starts[d], stops[d], steps[d]).start * strides[d];
    c.add(out.shape[d], steps[d] * strides[d], 0);
  }
  c.dense_destination();
  c.launch(stream_of(ctx), in.data, out.data, size_of(in.dtype), "slice");
}

void tile(KernelContext& ctx) {
  const TensorView &in = ctx.in(0), &out = ctx.out(0);
  const auto strides = contiguous_strides(in.shape), out_strides = contiguous_strides(out.shape);
  StridedCopy c;
  for (size_t d = 0; d < in.shape.size(); ++d) {
    // output dim d seen as (reps, n): the repeat index reads the same input
    const int64_t n = in.shape[d], reps = n == 0 ? 0 : out.shape[d] / n;
    c.add(reps, 0, n * out_strides[d]);
    c.add(n, strides[d], out_strides[d]);
  }
  c.launch(stream_of(ctx), in.data, out.data, size_of(in.dtype), "tile");
}

void broadcast_to(KernelContext& ctx) {
  const TensorView &in = ctx.in(0), &out = ctx.out(0);
  const size_t lead = out.shape.size() - in.shape.size();
  const auto strides = contiguous_strides(in.shape);
  StridedCopy c;
  for (size_t d = 0; d < out.shape.size(); ++d) {
    const bool same = d >= lead && in.shape[d - lead] != 1;
    c.add(out.shape[d], same ? strides[d - lead] : 0, 0);
  }
  c.dense_destination();
  c.launch(stream_of(ctx), in.data, out.data, size_of(in.dtype), "broadcast_to");
}

void flip(KernelContext& ctx) {
  const TensorView &in = ctx.in(0), &out = ctx.out(0);
  std::vector<char> flipped(in.shape.size(), 0);
  FlipParams spare;
  for (int64_t a : params_of(ctx, spare).axes) flipped[a] = 1;
  const auto strides = contiguous_strides(in.shape);
  StridedCopy c;
  for (size_t d = 0; d < in.shape.size(); ++d) {
    if (flipped[d] && in.shape[d] > 0) c.sbase += (in.shape[d] - 1) * strides[d];
    c.add(in.shape[d], flipped[d] ? -strides[d] : strides[d], 0);
  }
  c.dense_destination();
  c.launch(stream_of(ctx), in.data, out.data, size_of(in.dtype), "flip");
}

// ---- pad

using PadMode = PadParams::Mode;

struct PadPlan {
  int rank = 0;
  int64_t on[kMaxRank] = {}, in_n[kMaxRank] = {}, before[kMaxRank] = {}, stride[kMaxRank] = {};
};

// Input index of output index i along a dim of size n padded by b in front, or -1 (fill).
template <PadMode M> __device__ inline int64_t pad_source(int64_t i, int64_t n, int64_t b) {
  const int64_t s = i - b;
  if (s >= 0 && s < n) return s;
  if constexpr (M == PadMode::constant) return -1;
  else if constexpr (M == PadMode::edge) return s < 0 ? 0 : n - 1;
  else return s < 0 ? -s : 2 * (n - 1) - s;  // reflect (pads < n, checked by inference)
}

template <typename U, PadMode M>
__global__ void pad_kernel(const U* __restrict__ src, U* __restrict__ dst, PadPlan p,
                           int64_t rows, U fill) {
  const int last = p.rank - 1;
  const int64_t inner = p.on[last];
  for (int64_t r = blockIdx.y * blockDim.y + threadIdx.y; r < rows;
       r += int64_t{gridDim.y} * blockDim.y) {
    int64_t base = 0, rem = r;
    bool filled = false;
    for (int d = last - 1; d >= 0; --d) {
      const int64_t s = pad_source<M>(rem % p.on[d], p.in_n[d], p.before[d]);
      rem /= p.on[d];
      filled = filled || s < 0;
      base += s * p.stride[d];
    }
    U* row = dst + r * inner;
    for (int64_t j = blockIdx.x * blockDim.x + threadIdx.x; j < inner;
         j += int64_t{gridDim.x} * blockDim.x) {
      const int64_t s = pad_source<M>(j, p.in_n[last], p.before[last]);
      row[j] = filled || s < 0 ? fill : src[base + s];
    }
  }
}

void pad(KernelContext& ctx) {
  const TensorView &in = ctx.in(0), &out = ctx.out(0);
  if (out.numel() == 0) return;
  const size_t esize = size_of(in.dtype);
  if (out.rank() == 0) {
    copy_bytes(ctx, out.data, in.data, esize);
    return;
  }
  if (out.rank() > kMaxRank)
    fail<UnsupportedError>("[pad] cuda kernel takes rank <= {}, got {}", kMaxRank, out.rank());
  PadParams spare;
  const PadParams& prm = params_of(ctx, spare);
  const std::vector<int64_t>& pads = prm.pads;
  uint64_t fill_bits = 0;
  convert(&prm.value, f64, &fill_bits, out.dtype, 1);
  const auto strides = contiguous_strides(in.shape);
  PadPlan p;
  p.rank = out.rank();
  for (int d = 0; d < p.rank; ++d) {
    p.on[d] = out.shape[d];
    p.in_n[d] = in.shape[d];
    p.before[d] = pads[2 * d];
    p.stride[d] = strides[d];
  }
  const int64_t inner = out.shape.back(), rows = out.numel() / inner;
  const RowGrid g = row_grid(rows, inner);
  dispatch_elem(esize, [&](auto u) {
    using U = decltype(u);
    U fill{};
    std::memcpy(&fill, &fill_bits, sizeof(U));
    auto run = [&](auto kernel) {
      kernel<<<g.grid, g.block, 0, stream_of(ctx)>>>(in.ptr<U>(), out.ptr<U>(), p, rows, fill);
    };
    if (prm.mode == PadMode::edge) run(pad_kernel<U, PadMode::edge>);
    else if (prm.mode == PadMode::reflect) run(pad_kernel<U, PadMode::reflect>);
    else run(pad_kernel<U, PadMode::constant>);
  });
  check_launch("pad");
}

}  // namespace

void register_transform_kernels() {
  // (they move bytes, so the narrow types too)
  auto reg = [](OpId op, KernelFn fn, DTypeSet types = kAllTypes | kNarrowTypes,
                int dtype_input = 0) {
    register_kernel(op, Backend::cuda, {fn, types, dtype_input, /*half_via_f32=*/false});
  };
  reg(OpId::Reshape, reshape);
  // (bitcast: the same bytes under another dtype of the same size, a view or reshape's byte copy)
  reg(OpId::Bitcast, reshape);
  reg(OpId::Transpose, transpose);
  reg(OpId::Split, split);
  reg(OpId::Concat, concat);
  reg(OpId::Slice, slice);
  reg(OpId::Pad, pad);
  reg(OpId::Tile, tile);
  reg(OpId::BroadcastTo, broadcast_to);
  reg(OpId::Flip, flip);
  register_transform_index_kernels();
  register_transform_sort_kernels();
}

}  // namespace kiln::cuda
