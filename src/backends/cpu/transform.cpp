// CPU kernels of the transform family's layout ops. They only move bytes, so they dispatch on the
// element size and take every dtype without going through f32.
#include <algorithm>

#include "backends/cpu/kernels.h"
#include "backends/cpu/transform_common.h"
#include "ops/transform_params.h"
#include "ops/transform_util.h"

namespace kiln::cpu {

namespace {
using Maps = std::vector<std::vector<int64_t>>;
constexpr int64_t kFill = std::numeric_limits<int64_t>::min();

char* bytes(const TensorView& v) { return static_cast<char*>(v.data); }

// out[i_0, ..., i_k] = in[maps[0][i_0] + ... + maps[k][i_k]], where maps[d] holds input element
// offsets along output dim d, or kFill for an element that takes `fill`. Rows of the last dim
// whose elements follow each other in the input are copied whole, and consecutive rows whose
// sources follow each other (the middle of a pad along dim k-1, a slice's rows) as one run; the
// dims before k-1 are decoded once per plane of rows, not per row.
template <typename U>
void remap_typed(const KernelContext& ctx, const U* src, U* dst, const Shape& shape,
                 const Maps& maps, U fill) {
  const int rank = static_cast<int>(shape.size());
  if (rank == 0) {
    dst[0] = src[0];
    return;
  }
  const int64_t inner = shape[rank - 1];
  if (inner == 0) return;
  const int64_t rows = numel(shape) / inner;
  if (rows == 0) return;
  const auto& last = maps[rank - 1];
  bool contiguous = last[0] != kFill;
  for (int64_t j = 1; contiguous && j < inner; ++j) contiguous = last[j] == last[0] + j;
  // rows of a plane (dim k-1; one row a plane for rank 1) and their input offsets
  const int64_t per_plane = rank >= 2 ? shape[rank - 2] : 1;
  static const std::vector<int64_t> kNoRowMap{0};
  const std::vector<int64_t>& row_map = rank >= 2 ? maps[rank - 2] : kNoRowMap;
  ctx.parallel_for(rows, std::max<int64_t>(1, 16384 / inner), [&](int64_t r0, int64_t r1) {
    int64_t plane = -1, plane_base = 0;
    bool plane_filled = false;
    for (int64_t r = r0; r < r1;) {
      if (const int64_t p = r / per_plane; p != plane) {
        plane = p;
        plane_base = 0;
        plane_filled = false;
        int64_t rem = p;
        for (int d = rank - 3; d >= 0; --d) {
          const int64_t o = maps[d][rem % shape[d]];
          rem /= shape[d];
          plane_filled = plane_filled || o == kFill;
          plane_base += o == kFill ? 0 : o;
        }
      }
      const int64_t j = r % per_plane, o = row_map[j];
      U* row = dst + r * inner;
      if (plane_filled || o == kFill) {
        std::fill(row, row + inner, fill);
        ++r;
      } else if (contiguous) {
        int64_t run = 1;  // the next rows of the plane whose sources follow this one's
        while (r + run < r1 && j + run < per_plane && row_map[j + run] == o + run * inner) ++run;
        std::memcpy(row, src + plane_base + o + last[0], run * inner * sizeof(U));
        r += run;
      } else {
        const U* in = src + plane_base + o;
        for (int64_t k = 0; k < inner; ++k) row[k] = last[k] == kFill ? fill : in[last[k]];
        ++r;
      }
    }
  });
}

// `fill` points at one element of out's dtype (or is null when no map holds kFill).
void remap(const KernelContext& ctx, const TensorView& in, const TensorView& out, const Maps& maps,
           const void* fill = nullptr) {
  dispatch_size(size_of(out.dtype), [&](auto u) {
    using U = decltype(u);
    U f{};
    if (fill) std::memcpy(&f, fill, sizeof(U));
    remap_typed<U>(ctx, in.ptr<U>(), out.ptr<U>(), out.shape, maps, f);
  });
}

// maps[d][i] = f(d, i) * (input stride of d).
template <typename F> Maps make_maps(const Shape& in, const Shape& out, F&& f) {
  const auto strides = contiguous_strides(in);
  Maps maps(out.size());
  for (size_t d = 0; d < out.size(); ++d) {
    maps[d].resize(out[d]);
    for (int64_t i = 0; i < out[d]; ++i) {
      const int64_t s = f(d, i);
      maps[d][i] = s == kFill ? kFill : s * strides[d];
    }
  }
  return maps;
}

void reshape(KernelContext& ctx) {
  const TensorView &in = ctx.in(0), &out = ctx.out(0);
  // the memory planner usually makes the output a view of the input
  if (out.data != in.data) std::memcpy(out.data, in.data, in.numel() * size_of(in.dtype));
}

// Copies count blocks of `len` bytes from src + i*src_pitch to dst + i*dst_pitch.
void copy_blocks(const KernelContext& ctx, char* dst, int64_t dst_pitch, const char* src,
                 int64_t src_pitch, int64_t count, int64_t len) {
  if (len == 0) return;
  ctx.parallel_for(count, std::max<int64_t>(1, 65536 / len), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) std::memcpy(dst + i * dst_pitch, src + i * src_pitch, len);
  });
}

void split(KernelContext& ctx) {
  const TensorView& in = ctx.in(0);
  const int axis = static_cast<int>(params_of<AxisParams>(ctx).axis);
  const AxisView v(in.shape, axis);
  const int64_t row = v.inner * static_cast<int64_t>(size_of(in.dtype));
  int64_t offset = 0;
  for (int k = 0; k < ctx.num_outputs(); ++k) {
    const int64_t len = ctx.out(k).shape[axis] * row;
    copy_blocks(ctx, bytes(ctx.out(k)), len, bytes(in) + offset, v.n * row, v.outer, len);
    offset += len;
  }
}

void concat(KernelContext& ctx) {
  const TensorView& out = ctx.out(0);
  const int axis = static_cast<int>(params_of<AxisParams>(ctx).axis);
  const AxisView v(out.shape, axis);
  const int64_t row = v.inner * static_cast<int64_t>(size_of(out.dtype));
  int64_t offset = 0;
  for (int k = 0; k < ctx.num_inputs(); ++k) {
    const int64_t len = ctx.in(k).shape[axis] * row;
    copy_blocks(ctx, bytes(out) + offset, v.n * row, bytes(ctx.in(k)), len, v.outer, len);
    offset += len;
  }
}

// ---- transpose

// Output dims with their input strides, size-1 dims dropped and dims that stay adjacent merged.
struct StridedDims {
  Shape dims;
  std::vector<int64_t> strides;
};
// (into r, whose memory is reused: a thread's transposes allocate nothing once warm)
void collapse_transpose(const Shape& in, const std::vector<int64_t>& perm, StridedDims& r) {
  r.dims.clear();
  r.strides.clear();
  for (int64_t p : perm) {
    int64_t s = 1;  // p's contiguous stride in the input
    for (size_t d = static_cast<size_t>(p) + 1; d < in.size(); ++d) s *= in[d];
    const int64_t n = in[p];
    if (n == 1) continue;
    if (!r.dims.empty() && r.strides.back() == s * n) {
      r.dims.back() *= n;
      r.strides.back() = s;
    } else {
      r.dims.push_back(n);
      r.strides.push_back(s);
    }
  }
}

// Copies in tiles of the output's last dim and the input's contiguous dim `p`, so both the reads
// and the writes of a tile stay within a few cache lines. A tile holds about T * T elements: where
// one of the two dims is short (an image's 3 channels to or from NHWC) it is long along the other,
// and a short output dim is copied column by column (reads contiguous).
template <typename U>
void transpose_tiled(const KernelContext& ctx, const U* src, U* dst, const StridedDims& sd, int p) {
  constexpr int64_t T = 32;
  const int rank = static_cast<int>(sd.dims.size()), q = rank - 1;
  const auto out_strides = contiguous_strides(sd.dims);
  std::vector<int> outer;
  for (int d = 0; d < q; ++d)
    if (d != p) outer.push_back(d);
  const int64_t np = sd.dims[p], nq = sd.dims[q];
  const int64_t TP = nq < T ? T * T / nq : T, TQ = np < T ? T * T / np : T;
  const int64_t tp = (np + TP - 1) / TP, tq = (nq + TQ - 1) / TQ;
  const int64_t tasks = numel(sd.dims) / (np * nq) * tp * tq;
  const int64_t out_p = out_strides[p], in_q = sd.strides[q];
  // (parts of at least 16K elements: a thread's start costs more than copying fewer)
  const int64_t per_task = std::min(TP, np) * std::min(TQ, nq);
  ctx.parallel_for(tasks, std::max<int64_t>(16, 16384 / per_task), [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      int64_t rem = t / (tp * tq), in_base = 0, out_base = 0;
      for (auto it = outer.rbegin(); it != outer.rend(); ++it) {
        const int64_t i = rem % sd.dims[*it];
        rem /= sd.dims[*it];
        in_base += i * sd.strides[*it];
        out_base += i * out_strides[*it];
      }
      const int64_t p0 = (t % (tp * tq)) / tq * TP, q0 = t % tq * TQ;
      const int64_t p1 = std::min(p0 + TP, np), q1 = std::min(q0 + TQ, nq);
      if (nq < 8) {
        for (int64_t iq = q0; iq < q1; ++iq) {
          U* o = dst + out_base + iq;
          const U* s = src + in_base + iq * in_q;
          for (int64_t ip = p0; ip < p1; ++ip) o[ip * out_p] = s[ip];
        }
        continue;
      }
      for (int64_t ip = p0; ip < p1; ++ip) {
        U* o = dst + out_base + ip * out_p;
        const U* s = src + in_base + ip;
        for (int64_t iq = q0; iq < q1; ++iq) o[iq] = s[iq * in_q];
      }
    }
  });
}

// out[i_0, ..., i_k] = in[base + i_0 * strides[0] + ... + i_k * strides[k]] over `dims` (out's
// shape, or its dims collapsed) where the last dim is contiguous in the input (stride 1, or size
// 1): rows copied whole while an odometer walks the outer dims (no maps built, no division per
// row). False, with nothing done, where it does not apply.
bool copy_rows(const KernelContext& ctx, const TensorView& in, const TensorView& out,
               const Shape& dims, const std::vector<int64_t>& strides, int64_t base) {
  constexpr int kMaxWalk = 16;
  const int rank = static_cast<int>(dims.size());
  if (rank > kMaxWalk || (rank && dims.back() != 1 && strides.back() != 1)) return false;
  const size_t es = size_of(in.dtype);
  const int64_t inner = rank ? dims.back() : 1, rows = inner ? out.numel() / inner : 0;
  const char* src = static_cast<const char*>(in.data);
  char* dst = static_cast<char*>(out.data);
  ctx.parallel_for(rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, inner)),
                   [&](int64_t r0, int64_t r1) {
                     int64_t idx[kMaxWalk] = {}, off = base, rem = r0;
                     for (int d = rank - 2; d >= 0; --d) {
                       idx[d] = rem % dims[d];
                       rem /= dims[d];
                       off += idx[d] * strides[d];
                     }
                     for (int64_t r = r0; r < r1; ++r) {
                       std::memcpy(dst + r * inner * es, src + off * es, inner * es);
                       for (int d = rank - 2; d >= 0; --d) {
                         off += strides[d];
                         if (++idx[d] < dims[d]) break;
                         off -= dims[d] * strides[d];
                         idx[d] = 0;
                       }
                     }
                   });
  return true;
}

void transpose(KernelContext& ctx) {
  const TensorView &in = ctx.in(0), &out = ctx.out(0);
  TransposeParams spare;
  const std::vector<int64_t>& perm = params_of(ctx, spare).perm;
  thread_local StridedDims mine;
  StridedDims& sd = mine;  // (read by the workers through this reference)
  collapse_transpose(in.shape, perm, sd);
  const int rank = static_cast<int>(sd.dims.size());
  const auto p = std::find(sd.strides.begin(), sd.strides.end(), 1) - sd.strides.begin();
  if (rank >= 2 && p < rank - 1) {
    dispatch_size(size_of(in.dtype), [&](auto u) {
      using U = decltype(u);
      transpose_tiled<U>(ctx, in.ptr<U>(), out.ptr<U>(), sd, static_cast<int>(p));
    });
    return;
  }
  // the output's last dim is contiguous in the input: whole rows copy
  if (copy_rows(ctx, in, out, sd.dims, sd.strides, 0)) return;
  const auto in_strides = contiguous_strides(in.shape);
  Maps maps(out.shape.size());
  for (size_t d = 0; d < maps.size(); ++d)
    for (int64_t i = 0; i < out.shape[d]; ++i) maps[d].push_back(i * in_strides[perm[d]]);
  remap(ctx, in, out, maps);
}

// ---- slice, pad, tile, broadcast_to, flip

void slice(KernelContext& ctx) {
  const TensorView &in = ctx.in(0), &out = ctx.out(0);
  SliceParams spare;
  const SliceParams& p = params_of(ctx, spare);
  const auto &starts = p.starts, &stops = p.stops, &steps = p.steps;
  std::vector<int64_t> first;
  for (size_t d = 0; d < in.shape.size(); ++d)
    first.push_back(transform::slice_dim(in.shape[d], starts[d], stops[d], steps[d]).start);
  {  // rows of the last dim at step 1 copy whole
    const auto in_strides = contiguous_strides(in.shape);
    std::vector<int64_t> strides(in.shape.size());
    int64_t base = 0;
    for (size_t d = 0; d < in.shape.size(); ++d) {
      strides[d] = in_strides[d] * steps[d];
      base += first[d] * in_strides[d];
    }
    if (copy_rows(ctx, in, out, out.shape, strides, base)) return;
  }
  remap(ctx, in, out, make_maps(in.shape, out.shape, [&](size_t d, int64_t i) {
          return first[d] + i * steps[d];
        }));
}

// Input index of output index i along a dim of size n padded by b in front, or kFill.
int64_t pad_source(PadParams::Mode mode, int64_t i, int64_t n, int64_t b) {
  const int64_t s = i - b;
  if (s >= 0 && s < n) return s;
  if (mode == PadParams::Mode::constant) return kFill;
  if (mode == PadParams::Mode::edge) return std::clamp<int64_t>(s, 0, n - 1);
  return s < 0 ? -s : 2 * (n - 1) - s;  // reflect (pads < n, checked by inference)
}

void pad(KernelContext& ctx) {
  const TensorView &in = ctx.in(0), &out = ctx.out(0);
  PadParams spare;
  const PadParams& p = params_of(ctx, spare);
  uint64_t fill = 0;
  convert(&p.value, f64, &fill, out.dtype, 1);
  remap(ctx, in, out,
        make_maps(
            in.shape, out.shape,
            [&](size_t d, int64_t i) { return pad_source(p.mode, i, in.shape[d], p.pads[2 * d]); }),
        &fill);
}

void tile(KernelContext& ctx) {
  const TensorView &in = ctx.in(0), &out = ctx.out(0);
  remap(ctx, in, out,
        make_maps(in.shape, out.shape, [&](size_t d, int64_t i) { return i % in.shape[d]; }));
}

void broadcast_to(KernelContext& ctx) {
  const TensorView &in = ctx.in(0), &out = ctx.out(0);
  const size_t lead = out.shape.size() - in.shape.size();
  const auto strides = contiguous_strides(in.shape);
  {  // rows of a last dim that is not broadcast copy whole
    std::vector<int64_t> walk(out.shape.size(), 0);
    for (size_t d = lead; d < out.shape.size(); ++d)
      if (in.shape[d - lead] != 1) walk[d] = strides[d - lead];
    if (copy_rows(ctx, in, out, out.shape, walk, 0)) return;
  }
  Maps maps(out.shape.size());
  for (size_t d = 0; d < maps.size(); ++d) {
    const bool same = d >= lead && in.shape[d - lead] != 1;
    for (int64_t i = 0; i < out.shape[d]; ++i) maps[d].push_back(same ? i * strides[d - lead] : 0);
  }
  remap(ctx, in, out, maps);
}

void flip(KernelContext& ctx) {
  const TensorView &in = ctx.in(0), &out = ctx.out(0);
  std::vector<char> flipped(in.shape.size(), 0);
  FlipParams spare;
  for (int64_t a : params_of(ctx, spare).axes) flipped[a] = 1;
  remap(ctx, in, out, make_maps(in.shape, out.shape, [&](size_t d, int64_t i) {
          return flipped[d] ? in.shape[d] - 1 - i : i;
        }));
}
}  // namespace

void register_transform_kernels() {
  // (they move bytes, so the narrow types too)
  auto reg = [](OpId op, KernelFn fn) {
    register_kernel(op, Backend::cpu, {fn, kAllTypes | kNarrowTypes, 0, /*half_via_f32=*/false});
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
  register_transform_nd_kernels();
  register_resize_kernels();
}

}  // namespace kiln::cpu
