// Helpers of the CPU kernels: dtype dispatch and broadcast iteration.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "core/errors.h"
#include "core/op_id.h"
#include "kiln/array.h"
#include "kiln/kernel.h"

namespace kiln::cpu {

/// y (M, N) = x (M, K) · wᵀ (+ bias (N)) in f32 through oneDNN, w (N, K) row-major, K > 0
/// (linalg.cpp; linear and quantized_weight_linear).
void linear_f32(KernelContext& ctx, const void* x, const void* w, const void* bias, void* y,
                int64_t M, int64_t K, int64_t N);

/// Runs `kernel` on f32 copies for a bf16 call: the inputs copied to f32 in scratch (bf16 ones
/// widened, others as they are), the kernel given a context on them with an f32 output, its
/// result rounded into ctx.out(0) (the kernels that take bf16 themselves, KernelEntry::half_native,
/// where their native path does not apply).
template <typename F> void via_f32_copies(KernelContext& ctx, F&& kernel) {
  std::vector<TensorView> in;
  for (int i = 0; i < ctx.num_inputs(); ++i) {
    const TensorView& v = ctx.in(i);
    if (v.dtype != DType::bf16) {
      in.push_back(v);
      continue;
    }
    auto* f = static_cast<float*>(ctx.scratch(sizeof(float) * std::max<int64_t>(v.numel(), 1)));
    convert(v.data, v.dtype, f, DType::f32, v.numel());
    in.push_back(TensorView{f, v.shape, DType::f32});
  }
  const TensorView& o = ctx.out(0);
  auto* y = static_cast<float*>(ctx.scratch(sizeof(float) * std::max<int64_t>(o.numel(), 1)));
  {
    KernelContext inner(ctx, ctx.attrs(), std::move(in), {TensorView{y, o.shape, DType::f32}});
    kernel(inner);
  }
  convert(y, DType::f32, o.data, o.dtype, o.numel());
}

/// The widest x86-64 vector instruction set the CPU kernels' hand-vectorized loops may use: the
/// CPU's (AVX-512 with F, DQ, BW and VL; AVX2 with FMA; SSE2), capped by KILN_CPU_ISA=avx512,
/// avx2 or baseline (read once; to test the narrower variants, or to run the kernels another
/// machine runs: the cap applies to oneDNN's kernels too, dnnl_util.cpp). Baseline elsewhere than
/// x86-64.
enum class CpuIsa { baseline, avx2, avx512 };
CpuIsa cpu_isa();

/// Whether bf16 products (linear, matmul, conv) run natively through oneDNN's bf16 kernels (bf16
/// operands, f32 accumulation): oneDNN has them on this CPU (AVX-512 BF16) and KILN_CPU_ISA
/// leaves AVX-512 on. Elsewhere they run on f32 copies (via_f32_copies).
bool native_bf16();

/// Calls f(T{}) with the C++ type of `t` (f16/bf16 never reach kernels: they run as f32).
template <typename F> void dispatch(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::f32: f(float{}); return;
    case DType::f64: f(double{}); return;
    case DType::i8: f(int8_t{}); return;
    case DType::u8: f(uint8_t{}); return;
    case DType::i16: f(int16_t{}); return;
    case DType::i32: f(int32_t{}); return;
    case DType::i64: f(int64_t{}); return;
    case DType::boolean: f(bool{}); return;
    case DType::u16:
      f(uint16_t{});
      return;
    case DType::u32:
      f(uint32_t{});
      return;
    case DType::u64:
      f(uint64_t{});
      return;
    default: fail<UnsupportedError>("[{}] cpu kernel got dtype {}", op, name(t));
  }
}
/// Same, restricted to float types.
template <typename F> void dispatch_float(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::f32: f(float{}); return;
    case DType::f64: f(double{}); return;
    default: fail<UnsupportedError>("[{}] cpu kernel got dtype {}", op, name(t));
  }
}
/// Index types (i32, i64).
template <typename F> void dispatch_index(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::i32: f(int32_t{}); return;
    case DType::i64: f(int64_t{}); return;
    default: fail<UnsupportedError>("[{}] indices must be i32 or i64, got {}", op, name(t));
  }
}

/// A dense tensor viewed as (outer, len, inner) around one axis; element (o, i, j) is at
/// (o * len + i) * inner + j, and position p = o * inner + j starts its row at base(p).
struct AxisSplit {
  int64_t outer = 1, len = 1, inner = 1;
  int64_t base(int64_t p) const { return (p / inner) * len * inner + p % inner; }
};
AxisSplit split_at(const Shape& s, int64_t axis);

/// Strides (in elements) of `in` broadcast to `out`: 0 along broadcast dims.
std::vector<int64_t> broadcast_strides(const Shape& in, const Shape& out);
/// The same into `s`, whose memory is reused.
void broadcast_strides(const Shape& in, const Shape& out, std::vector<int64_t>& s);

/// Output shape and per-input strides with mergeable dims collapsed, for fast N-ary loops.
template <int N> struct BroadcastPlan {
  Shape shape;                                   // collapsed output shape (at least 1 dim)
  std::array<std::vector<int64_t>, N> strides;  // per input
};
/// (into `p`, whose vectors' memory is reused)
template <int N>
void plan_broadcast(const Shape& out, const std::array<const Shape*, N>& ins, BroadcastPlan<N>& p);

/// Runs f(out_index, in_offsets) for every output element in parallel, where in_offsets are the
/// element offsets of each input. The innermost loop is tight for contiguous inputs.
template <int N, typename F>
void for_each_broadcast(const KernelContext& ctx, const Shape& out,
                        const std::array<const Shape*, N>& ins, F&& f) {
  const int64_t total = numel(out);
  if (total <= 0) return;
  // (this thread's plan, its memory kept from call to call; workers read it by reference)
  thread_local BroadcastPlan<N> mine;
  BroadcastPlan<N>& p = mine;
  plan_broadcast<N>(out, ins, p);
  const int rank = static_cast<int>(p.shape.size());
  const int64_t inner = p.shape[rank - 1];
  const int64_t rows = total / inner;
  std::array<int64_t, N> inner_stride;
  for (int k = 0; k < N; ++k) inner_stride[k] = p.strides[k][rank - 1];
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(inner, 1));
  ctx.parallel_for(rows, grain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      std::array<int64_t, N> off{};
      int64_t rem = r;
      for (int d = rank - 2; d >= 0; --d) {
        const int64_t i = rem % p.shape[d];
        rem /= p.shape[d];
        for (int k = 0; k < N; ++k) off[k] += i * p.strides[k][d];
      }
      const int64_t base = r * inner;
      for (int64_t j = 0; j < inner; ++j) {
        std::array<int64_t, N> o;
        for (int k = 0; k < N; ++k) o[k] = off[k] + j * inner_stride[k];
        f(base + j, o);
      }
    }
  });
}

/// body(i) for i in [b, e), for elementwise loops whose output and inputs are disjoint or the very
/// same buffer (in-place): no iteration depends on another. Constant-length blocks plus ivdep let
/// GCC's -O2 cost model vectorize without runtime alias checks or a vector epilogue.
template <typename B>
inline __attribute__((always_inline)) void elementwise_blocks(int64_t b, int64_t e, B& body) {
  constexpr int64_t kBlock = 16;
  int64_t i = b;
  for (; i + kBlock <= e; i += kBlock) {
#pragma GCC ivdep
    for (int64_t j = 0; j < kBlock; ++j) body(i + j);
  }
  for (; i < e; ++i) body(i);
}
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
/// Functions compiled for AVX-512 besides the baseline, called where cpu_isa() is avx512 (GCC on
/// x86-64; not target_clones: see attention.cpp). The always_inline code they call is compiled
/// for AVX-512 with them.
#define KILN_AVX512_TARGET __attribute__((target("avx512f,avx512dq,avx512bw,avx512vl")))
/// The same loop compiled for AVX-512 (16 floats a vector, where the baseline's SSE2 has 4): the
/// body, compiled for the baseline, is inlined here and vectorized again.
template <typename B>
KILN_AVX512_TARGET void elementwise_loop_avx512(int64_t b, int64_t e, B& body) {
  elementwise_blocks(b, e, body);
}
#endif
/// (Every range of every elementwise loop takes the same instruction set, whatever its length:
/// a fused kernel's chunks give the bits of the unfused op's whole range.)
template <typename B> inline void elementwise_loop(int64_t b, int64_t e, B&& body) {
#ifdef KILN_AVX512_TARGET
  if (cpu_isa() == CpuIsa::avx512) return elementwise_loop_avx512(b, e, body);
#endif
  elementwise_blocks(b, e, body);
}

/// The element types whose elementwise maps get every fast path (in place, one value or one row
/// broadcast, the AVX-512 copy): f32, f64, i32, i64 and bool. The others (8- and 16-bit integers,
/// u32, u64), rarely computed in bulk, run one vector loop over same-shaped data and the general
/// broadcast loop otherwise, which keeps the many kernels instantiated for them (every record of
/// op_list.inc for every type) small and quick to compile. Integer results do not depend on the
/// path, so only speed differs.
template <typename T> constexpr bool kHotElementType =
    std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, int32_t> ||
    std::is_same_v<T, int64_t> || std::is_same_v<T, bool>;

/// Elementwise map out[i] = f(in[i]) over contiguous data, in parallel. (In place, the loop reads
/// through the output's pointer: GCC's -O3 vectorizes the whole loop behind a check that the
/// buffers do not overlap, and runs it scalar, a compare and branch per element, when they are
/// one.)
template <typename TI, typename TO, typename F>
void unary_map(const KernelContext& ctx, const TI* in, TO* out, int64_t n, F&& f) {
  ctx.parallel_for(n, 16384, [&](int64_t b, int64_t e) {
    if constexpr (!kHotElementType<TI> || !kHotElementType<TO>) {
      auto body = [&](int64_t i) { out[i] = f(in[i]); };
      elementwise_blocks(b, e, body);
    } else {
      if constexpr (std::is_same_v<TI, TO>)
        if (in == out) return elementwise_loop(b, e, [&](int64_t i) { out[i] = f(out[i]); });
      elementwise_loop(b, e, [&](int64_t i) { out[i] = f(in[i]); });
    }
  });
}

/// Where `in` broadcast to `out` is one row repeated (its dims, leading 1s dropped, are out's last
/// dims, and out has more elements): that row's length; 0 otherwise.
inline int64_t repeated_row(const Shape& in, const Shape& out) {
  size_t lead = 0;
  while (lead < in.size() && in[lead] == 1) ++lead;
  const size_t k = in.size() - lead;
  if (k == 0 || k > out.size()) return 0;
  int64_t row = 1;
  for (size_t i = 0; i < k; ++i) {
    if (in[lead + i] != out[out.size() - k + i]) return 0;
    row *= in[lead + i];
  }
  return row < numel(out) ? row : 0;
}

/// po[i] = g(full[i], rw[i % row]) over n elements, row by row, each a vector loop (in place,
/// where po is full, reads go through po: see unary_map).
template <typename TF, typename TR, typename TO, typename G>
void rows_map(const KernelContext& ctx, const TF* full, const TR* rw, TO* po, int64_t n,
              int64_t row, G&& g) {
  const bool in_place = static_cast<const void*>(full) == static_cast<const void*>(po);
  ctx.parallel_for(n / row, std::max<int64_t>(1, 16384 / row), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      TO* orow = po + r * row;
      if constexpr (std::is_same_v<TF, TO>)
        if (in_place) {
          elementwise_loop(0, row, [&](int64_t i) { orow[i] = g(orow[i], rw[i]); });
          continue;
        }
      const TF* frow = full + r * row;
      elementwise_loop(0, row, [&](int64_t i) { orow[i] = g(frow[i], rw[i]); });
    }
  });
}

/// Binary op with broadcasting; for kHotElementType types, fast paths when both inputs have the
/// output's shape, when one is a single value, and when one is a row repeated along the output's
/// leading dims.
template <typename TA, typename TB, typename TO, typename F>
void binary_map(const KernelContext& ctx, const TensorView& a, const TensorView& b,
                const TensorView& o, F&& f) {
  const TA* pa = a.ptr<TA>();
  const TB* pb = b.ptr<TB>();
  TO* po = o.ptr<TO>();
  const int64_t n = o.numel();
  // (in place, reads go through po: see unary_map)
  const void* out = po;
  if constexpr (!kHotElementType<TA> || !kHotElementType<TB> || !kHotElementType<TO>) {
    if (a.shape == o.shape && b.shape == o.shape) {
      ctx.parallel_for(n, 16384, [&](int64_t s, int64_t e) {
        auto body = [&](int64_t i) { po[i] = f(pa[i], pb[i]); };
        elementwise_blocks(s, e, body);
      });
    } else {
      for_each_broadcast<2>(
          ctx, o.shape, {&a.shape, &b.shape},
          [&](int64_t i, const std::array<int64_t, 2>& off) { po[i] = f(pa[off[0]], pb[off[1]]); });
    }
    return;
  }
  if (a.shape == o.shape && b.shape == o.shape) {
    ctx.parallel_for(n, 16384, [&](int64_t s, int64_t e) {
      if constexpr (std::is_same_v<TA, TO>)
        if (out == pa) return elementwise_loop(s, e, [&](int64_t i) { po[i] = f(po[i], pb[i]); });
      if constexpr (std::is_same_v<TB, TO>)
        if (out == pb) return elementwise_loop(s, e, [&](int64_t i) { po[i] = f(pa[i], po[i]); });
      elementwise_loop(s, e, [&](int64_t i) { po[i] = f(pa[i], pb[i]); });
    });
  } else if (a.shape == o.shape && b.numel() == 1) {
    const TB bv = pb[0];
    ctx.parallel_for(n, 16384, [&](int64_t s, int64_t e) {
      if constexpr (std::is_same_v<TA, TO>)
        if (out == pa) return elementwise_loop(s, e, [&](int64_t i) { po[i] = f(po[i], bv); });
      elementwise_loop(s, e, [&](int64_t i) { po[i] = f(pa[i], bv); });
    });
  } else if (b.shape == o.shape && a.numel() == 1) {
    const TA av = pa[0];
    ctx.parallel_for(n, 16384, [&](int64_t s, int64_t e) {
      if constexpr (std::is_same_v<TB, TO>)
        if (out == pb) return elementwise_loop(s, e, [&](int64_t i) { po[i] = f(av, po[i]); });
      elementwise_loop(s, e, [&](int64_t i) { po[i] = f(av, pb[i]); });
    });
  } else if (const int64_t row = repeated_row(b.shape, o.shape); a.shape == o.shape && row > 1) {
    rows_map(ctx, pa, pb, po, n, row, [&](TA x, TB r) { return f(x, r); });
  } else if (const int64_t row = repeated_row(a.shape, o.shape); b.shape == o.shape && row > 1) {
    rows_map(ctx, pb, pa, po, n, row, [&](TB x, TA r) { return f(r, x); });
  } else {
    for_each_broadcast<2>(ctx, o.shape, {&a.shape, &b.shape},
                          [&](int64_t i, const std::array<int64_t, 2>& off) {
                            po[i] = f(pa[off[0]], pb[off[1]]);
                          });
  }
}

}  // namespace kiln::cpu
