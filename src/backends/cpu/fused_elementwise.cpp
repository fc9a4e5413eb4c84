// CPU kernel of fused_elementwise: interprets the program (src/ops/fused_elementwise.h) over
// chunks of the output, in parallel over chunks. Each instruction runs the unfused op's own CPU
// kernel on the chunk (one tight loop), so results equal the unfused graph's exactly; values stay
// in cache between instructions. f16/bf16 values live as f32 and are rounded to their dtype after
// every instruction, as the unfused kernels round their outputs.
#include "ops/fused_elementwise.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "backends/cpu/cpu_common.h"
#include "backends/cpu/kernels.h"
#include "core/op_params.h"
#include "runtime/kernel_views.h"

namespace kiln::cpu {

namespace {
constexpr int64_t kChunk = 8192;

bool is_half(DType t) { return t == f16 || t == bf16; }
// The dtype a value is computed and held in.
DType compute_type(DType t) { return is_half(t) ? f32 : t; }

// Rounds n f32 values to `t` (f16/bf16) and back, in place.
void round_half(float* v, DType t, int64_t n) {
  uint16_t tmp[kChunk];
  convert(v, f32, tmp, t, n);
  convert(tmp, t, v, f32, n);
}

// Copies elements [s, s + len) of `in` broadcast to `out` (strides from broadcast_strides) into
// `dst`, a run of the last dim at a time (a copy where the input is contiguous there, a fill
// where it broadcasts).
template <typename E>
void gather(const E* src, const Shape& out, const std::vector<int64_t>& strides, int64_t s,
            int64_t len, E* dst) {
  const int rank = static_cast<int>(out.size());
  thread_local std::vector<int64_t> index;  // (no allocation per call)
  index.assign(rank, 0);
  int64_t* idx = index.data();
  int64_t off = 0, rem = s;
  for (int d = rank - 1; d >= 0; --d) {
    idx[d] = rem % out[d];
    rem /= out[d];
    off += idx[d] * strides[d];
  }
  const int64_t inner = out[rank - 1], st = strides[rank - 1];
  for (int64_t j = 0; j < len;) {
    const int64_t run = std::min(inner - idx[rank - 1], len - j);
    if (st == 1) std::memcpy(dst + j, src + off, static_cast<size_t>(run) * sizeof(E));
    else if (st == 0) std::fill_n(dst + j, run, src[off]);
    else
      for (int64_t r = 0; r < run; ++r) dst[j + r] = src[off + r * st];
    j += run;
    if (j == len) break;
    // the last dim wraps; carry into the dims before it
    off -= idx[rank - 1] * st;
    idx[rank - 1] = 0;
    for (int d = rank - 2; d >= 0; --d) {
      off += strides[d];
      if (++idx[d] < out[d]) break;
      off -= strides[d] * out[d];
      idx[d] = 0;
    }
  }
}
void gather_bytes(const void* src, size_t esize, const Shape& out,
                  const std::vector<int64_t>& strides, int64_t s, int64_t len, void* dst) {
  switch (esize) {
    case 1:
      gather(static_cast<const uint8_t*>(src), out, strides, s, len, static_cast<uint8_t*>(dst));
      return;
    case 2:
      gather(static_cast<const uint16_t*>(src), out, strides, s, len, static_cast<uint16_t*>(dst));
      return;
    case 4:
      gather(static_cast<const uint32_t*>(src), out, strides, s, len, static_cast<uint32_t*>(dst));
      return;
    default:
      gather(static_cast<const uint64_t*>(src), out, strides, s, len, static_cast<uint64_t*>(dst));
      return;
  }
}

enum class Kind { dense, scalar, bcast };
// What a call lists, per input and per value, and each chunk's buffers and views: kept per thread.
struct Scratch {
  std::vector<DType> types;
  std::vector<const KernelEntry*> kernels;
  std::vector<Kind> kind;
  std::vector<std::vector<int64_t>> strides;
};
struct Chunks {
  std::vector<size_t> offset;
  std::vector<char*> ptr;
  std::vector<char> raw;
  std::vector<TensorView> ins, outs;
};

// One program (`count` instructions and their op attributes) over the views `inputs` into `o`.
void run_program(KernelContext& ctx, const fused::Instr* instrs, const Attrs* attrs, size_t count,
                 const std::vector<const TensorView*>& inputs, const TensorView& o) {
  const int n_in = static_cast<int>(inputs.size());
  auto input = [&](int i) -> const TensorView& { return *inputs[i]; };
  // (the per-call lists live in this thread's memory, kept from call to call: a small node's run
  // costs little more than its arithmetic; the workers read them through these references)
  thread_local Scratch mine;
  Scratch& sc = mine;
  std::vector<DType>& types = sc.types;
  types.clear();
  for (int i = 0; i < n_in; ++i) types.push_back(input(i).dtype);
  for (size_t k = 0; k < count; ++k) types.push_back(instrs[k].dtype);
  const int n_values = static_cast<int>(types.size());
  const int64_t total = o.numel();
  if (total == 0) return;

  std::vector<const KernelEntry*>& kernels = sc.kernels;
  kernels.clear();
  for (size_t j = 0; j < count; ++j) {
    const KernelEntry* k = find_kernel(instrs[j].op, Backend::cpu);
    if (!k)
      fail<UnsupportedError>("[fused_elementwise] no cpu kernel for {}", op_name(instrs[j].op));
    kernels.push_back(k);
  }
  // inputs: dense of the output's numel (read in place when held in their own dtype), a single
  // value, or broadcast through strides
  std::vector<Kind>& kind = sc.kind;
  std::vector<std::vector<int64_t>>& strides = sc.strides;
  kind.assign(n_in, Kind::dense);
  if (strides.size() < static_cast<size_t>(n_in)) strides.resize(n_in);
  for (int i = 0; i < n_in; ++i) {
    const int64_t m = input(i).numel();
    kind[i] = m == total ? Kind::dense : m == 1 ? Kind::scalar : Kind::bcast;
    if (kind[i] == Kind::bcast) broadcast_strides(input(i).shape, o.shape, strides[i]);
  }
  const int last = n_values - 1;
  const bool out_direct = !is_half(o.dtype);

  // chunks of kChunk elements, smaller (down to 4096) where that gives every thread one: a
  // program of several instructions over 4096 elements costs more than a thread's start
  constexpr int64_t kMinChunk = 4096;
  const int64_t per_thread = (total + ctx.threads() - 1) / std::max(1, ctx.threads());
  const int64_t chunk = total < 2 * kMinChunk
                            ? kChunk
                            : std::clamp<int64_t>((per_thread + 63) / 64 * 64, kMinChunk, kChunk);
  const int64_t chunks = (total + chunk - 1) / chunk;
  ctx.parallel_for(chunks, 1, [&](int64_t c0, int64_t c1) {
    // one buffer per value that is not read or written in place (this thread's lists)
    thread_local Chunks lists;
    std::vector<size_t>& offset = lists.offset;
    offset.assign(n_values, SIZE_MAX);
    size_t bytes = 0;
    for (int v = 0; v < n_values; ++v) {
      const bool in_place =
          (v < n_in && kind[v] == Kind::dense && !is_half(types[v])) || (v == last && out_direct);
      if (in_place) continue;
      offset[v] = bytes;
      bytes += (kChunk * size_of(compute_type(types[v])) + 63) / 64 * 64;
    }
    // each thread's buffer is kept from call to call (a small node costs little more than its
    // arithmetic)
    thread_local std::vector<char> buf;
    if (buf.size() < bytes + 64) buf.resize(bytes + 64);
    char* base = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(buf.data()) + 63) / 64 * 64);
    std::vector<char*>& ptr = lists.ptr;
    ptr.assign(n_values, nullptr);
    for (int v = 0; v < n_values; ++v)
      if (offset[v] != SIZE_MAX) ptr[v] = base + offset[v];
    // single values are filled once, as far as a chunk reaches, in doubling copies (one
    // memcpy per element cost a small kernel most of its time)
    const int64_t reach = std::min(chunk, total);
    for (int i = 0; i < n_in; ++i)
      if (kind[i] == Kind::scalar) {
        const size_t es = size_of(compute_type(types[i]));
        convert(input(i).data, types[i], ptr[i], compute_type(types[i]), 1);
        for (int64_t have = 1; have < reach; have *= 2)
          std::memcpy(ptr[i] + have * es, ptr[i], std::min(have, reach - have) * es);
      }
    std::vector<char>& raw = lists.raw;
    std::vector<TensorView>&ins = lists.ins, &outs = lists.outs;  // (lent to each instruction)
    outs.resize(1);
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t s = c * chunk, len = std::min(chunk, total - s);
      for (int i = 0; i < n_in; ++i) {
        const TensorView& in = input(i);
        const size_t es = size_of(in.dtype);
        const char* src = static_cast<const char*>(in.data);
        if (kind[i] == Kind::dense) {
          if (is_half(in.dtype))
            convert(src + s * es, in.dtype, ptr[i], f32, len);
          else
            ptr[i] = const_cast<char*>(src) + s * es;
        } else if (kind[i] == Kind::bcast) {
          if (is_half(in.dtype)) {
            raw.resize(kChunk * es);
            gather_bytes(src, es, o.shape, strides[i], s, len, raw.data());
            convert(raw.data(), in.dtype, ptr[i], f32, len);
          } else {
            gather_bytes(src, es, o.shape, strides[i], s, len, ptr[i]);
          }
        }
      }
      if (out_direct) ptr[last] = static_cast<char*>(o.data) + s * size_of(o.dtype);
      for (size_t k = 0; k < count; ++k) {
        const fused::Instr& in = instrs[k];
        const int v = n_in + static_cast<int>(k);
        const DType t = types[v];
        float* res = reinterpret_cast<float*>(ptr[v]);
        if (in.op == OpId::Cast && is_half(t)) {
          // straight to the half type, as the unfused cast converts
          uint16_t tmp[kChunk];
          convert(ptr[in.a], compute_type(types[in.a]), tmp, t, len);
          convert(tmp, t, res, f32, len);
          continue;
        }
        auto set = [&](TensorView& view, int32_t u) {
          view.data = ptr[u];
          view.shape.assign(1, len);
          view.dtype = compute_type(types[u]);
        };
        ins.resize(fused::arity(in.op));
        for (size_t j = 0; j < ins.size(); ++j) set(ins[j], in.operand(static_cast<int>(j)));
        set(outs[0], v);
        KernelContextViews lent(in.op, attrs[k], ins, outs, nullptr, nullptr, nullptr);
        kernels[k]->fn(lent.ctx);
        if (is_half(t) && v != last) round_half(res, t, len);
      }
      if (!out_direct)
        convert(ptr[last], f32, static_cast<char*>(o.data) + s * size_of(o.dtype), o.dtype, len);
    }
  });
}

// The node's program, or a group's parts one after another (each its own output).
void fused_elementwise(KernelContext& ctx) {
  // the program as the node's params decoded it once (per call only where a context carries none)
  fused::Decoded spare;
  const fused::Decoded& prog = params_of<fused::Decoded>(ctx, spare);
  thread_local std::vector<const TensorView*> inputs;
  for (size_t k = 0; k < prog.parts.size(); ++k) {
    const fused::Decoded::Range& r = prog.parts[k];
    inputs.clear();
    if (r.inputs.empty())
      for (int i = 0; i < ctx.num_inputs(); ++i) inputs.push_back(&ctx.in(i));
    else
      for (int32_t i : r.inputs) inputs.push_back(&ctx.in(i));
    run_program(ctx, &prog.instrs[r.first], &prog.attrs[r.first], r.count, inputs,
                ctx.out(static_cast<int>(k)));
  }
}
}  // namespace

void register_fused_elementwise_kernels() {
  // f16/bf16 handled here (rounded per instruction), not through the f32 wrapper
  register_kernel(OpId::FusedElementwise, Backend::cpu, {fused_elementwise, kAllTypes, -1, false});
}

}  // namespace kiln::cpu
