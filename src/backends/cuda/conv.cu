// CUDA kernels of the conv family through cuDNN's convolution API: Conv is
// cudnnConvolutionForward, ConvTranspose is the backward-data pass of the conv it transposes, and
// ConvGradWeight is the backward-filter pass; FusedConv is Conv, then its residual and relu in one
// pass (in channels_last, inside the cuDNN graph plan where one fuses them: conv_nhwc.cu). 1-D
// convolutions run as 2-D ones of height 1.
// With channels_last (2-D), all three take NHWC data and (O, kh, kw, C/G) weights (cuDNN's NHWC
// filter format), the layout of its bf16/f16/TF32 tensor-core kernels.
// cuDNN pads symmetrically and wants the output size that follows from the input size; other
// geometries (asymmetric pads, output_padding) go through a zero-padded or cropped copy made by
// window_copy. f32 and f64 use exactly summing algorithms only (no TF32, FFT or Winograd), so
// results match the CPU, except f32 problems with attr tf32 (CompileOptions::allow_tf32), whose
// math type lets cuDNN use TF32 tensor cores; f16/bf16 compute in f32 and may use any algorithm.
// Deterministic executables (KernelContext::deterministic) take cuDNN's heuristics' first
// deterministic algorithm (no timing, no package seeds, no graph-API plans), or throw.
// The cuDNN problem and its algorithms are in conv_algo.cu, the channels_last kernels in
// conv_nhwc.cu, the tuning records (tuning.h) in conv_tuning.cu.
#include <algorithm>
#include <array>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "backends/cuda/conv_internal.h"
#include "backends/cuda/kernels.h"

namespace kiln::cuda {

namespace {

using namespace conv_detail;

// ---- small kernels ----

struct Dims3 {
  int64_t v[3] = {1, 1, 1};
};

// dst (rows, ds) = src (rows, ss) moved by `shift` per spatial dim (dst[p] = src[p - shift],
// zero outside src), plus bias[row % channels] when bias is given.
template <typename T>
__global__ void window_copy(const T* src, T* dst, int64_t total, Dims3 ss, Dims3 ds, Dims3 shift,
                            const T* bias, int64_t channels) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    int64_t r = i;
    const int64_t p2 = r % ds.v[2];
    r /= ds.v[2];
    const int64_t p1 = r % ds.v[1];
    r /= ds.v[1];
    const int64_t p0 = r % ds.v[0];
    const int64_t row = r / ds.v[0];
    const int64_t s0 = p0 - shift.v[0], s1 = p1 - shift.v[1], s2 = p2 - shift.v[2];
    acc_t<T> v = 0;
    if (s0 >= 0 && s0 < ss.v[0] && s1 >= 0 && s1 < ss.v[1] && s2 >= 0 && s2 < ss.v[2])
      v = to_acc(src[((row * ss.v[0] + s0) * ss.v[1] + s1) * ss.v[2] + s2]);
    if (bias) v += to_acc(bias[row % channels]);
    dst[i] = from_acc<T>(v);
  }
}

// y (N, O, S): y = bias[o] (+ y when accumulate); bias may be null (then y = 0 unless accumulate).
// V elements of one channel per thread (16-byte accesses when S allows), and 32-bit index math
// when the sizes fit (I): a bandwidth-bound pass.
template <typename T, int V, typename I>
__global__ void channel_bias(T* y, const T* bias, I packs, I S_packs, I O, bool accumulate) {
  for (I i = blockIdx.x * I(blockDim.x) + threadIdx.x; i < packs; i += I(gridDim.x) * blockDim.x) {
    const acc_t<T> b = bias ? to_acc(bias[(i / S_packs) % O]) : acc_t<T>(0);
    auto* p = reinterpret_cast<Pack<T, V>*>(y) + i;
    Pack<T, V> out;
    if (accumulate) out = *p;
#pragma unroll
    for (int u = 0; u < V; ++u)
      out.v[u] = from_acc<T>(accumulate ? b + to_acc(out.v[u]) : b);
    *p = out;
  }
}

void launch_channel_bias(KernelContext& ctx, const TensorView& y, const void* bias,
                         bool accumulate) {
  const int64_t total = y.numel(), O = y.shape[1];
  if (total == 0) return;
  const int64_t S = total / (y.shape[0] * O);
  dispatch_float(y.dtype, ctx.op_name(), [&](auto v) {
    using T = decltype(v);
    constexpr int kV = 16 / sizeof(T) > 0 ? static_cast<int>(16 / sizeof(T)) : 1;
    const bool wide = S % kV == 0 && reinterpret_cast<uintptr_t>(y.data) % 16 == 0;
    auto run = [&](auto width, auto index) {
      constexpr int W = decltype(width)::value;
      using I = decltype(index);
      const int64_t packs = total / W;
      channel_bias<T, W, I><<<blocks_for(packs), kThreads, 0, stream_of(ctx)>>>(
          y.ptr<T>(), static_cast<const T*>(bias), static_cast<I>(packs), static_cast<I>(S / W),
          static_cast<I>(O), accumulate);
    };
    const bool small = total < (int64_t{1} << 31);
    using W1 = std::integral_constant<int, 1>;
    using WV = std::integral_constant<int, kV>;
    if (wide && small) run(WV{}, int32_t{});
    else if (wide) run(WV{}, int64_t{});
    else if (small) run(W1{}, int32_t{});
    else run(W1{}, int64_t{});
    check_launch(ctx.op_name());
  });
}

// ---- geometry ----

Geometry geometry(const ConvParams& a, const Shape& x, const Shape& w, const Shape& y) {
  Geometry g;
  g.nd = static_cast<int>(x.size()) - 2;
  g.N = x[0];
  g.C = x[1];
  g.O = y[1];
  g.G = a.groups;
  g.in.assign(x.begin() + 2, x.end());
  g.k.assign(w.begin() + 2, w.end());
  g.out.assign(y.begin() + 2, y.end());
  g.stride = a.stride;
  g.dil = a.dilation;
  const auto& p = a.pads;
  g.pb.assign(p.begin(), p.begin() + g.nd);
  g.pe.assign(p.begin() + g.nd, p.end());
  return g;
}

int64_t extent(const Geometry& g, int i) { return (g.k[i] - 1) * g.dil[i] + 1; }

// Whether cuDNN, padding `pad` on both sides of `in`, gives `out` positions along dim i.
bool cudnn_fits(const Geometry& g, int i, int64_t in, int64_t pad, int64_t out) {
  const int64_t span = in + 2 * pad - extent(g, i);
  return span >= 0 && span / g.stride[i] + 1 == out;
}

// kiln's spatial values (nd of them) right-aligned in three, others left at `fill`.
std::array<int64_t, 3> place(const int64_t* v, int nd, int64_t fill) {
  std::array<int64_t, 3> r{fill, fill, fill};
  for (int i = 0; i < nd; ++i) r[3 - nd + i] = v[i];
  return r;
}

// The cuDNN problem with input sizes `in` and symmetric pads `pad` (kiln order, nd values).
Problem problem(const Geometry& g, const std::vector<int64_t>& in,
                const std::vector<int64_t>& pad) {
  Problem p;
  p.nd = std::max(2, g.nd);
  p.N = g.N, p.C = g.C, p.O = g.O, p.G = g.G;
  p.in = place(in.data(), g.nd, 1);
  p.k = place(g.k.data(), g.nd, 1);
  p.out = place(g.out.data(), g.nd, 1);
  p.pad = place(pad.data(), g.nd, 0);
  p.stride = place(g.stride.data(), g.nd, 1);
  p.dil = place(g.dil.data(), g.nd, 1);
  return p;
}

Dims3 dims3(const std::vector<int64_t>& v, int64_t fill) {
  Dims3 d;
  const int nd = static_cast<int>(v.size());
  for (int i = 0; i < 3; ++i) d.v[i] = fill;
  for (int i = 0; i < nd; ++i) d.v[3 - nd + i] = v[i];
  return d;
}

// dst (rows, ds) from src (rows, ss) moved by shift, plus a per-channel bias (see window_copy).
void launch_window_copy(KernelContext& ctx, DType t, const void* src, void* dst, int64_t rows,
                        const std::vector<int64_t>& ss, const std::vector<int64_t>& ds,
                        const std::vector<int64_t>& shift, const void* bias, int64_t channels) {
  const Dims3 s3 = dims3(ss, 1), d3 = dims3(ds, 1), sh3 = dims3(shift, 0);
  const int64_t total = rows * d3.v[0] * d3.v[1] * d3.v[2];
  if (total == 0) return;
  dispatch_float(t, ctx.op_name(), [&](auto v) {
    using T = decltype(v);
    window_copy<T><<<blocks_for(total), kThreads, 0, stream_of(ctx)>>>(
        static_cast<const T*>(src), static_cast<T*>(dst), total, s3, d3, sh3,
        static_cast<const T*>(bias), channels);
    check_launch(ctx.op_name());
  });
}

int64_t prod(const std::vector<int64_t>& v) {
  int64_t r = 1;
  for (int64_t e : v) r *= e;
  return r;
}

}  // namespace

namespace conv_detail {

void refuse_cpu_only(const KernelContext& ctx, const ConvParams& a) {
  if (a.nchw_x || a.act != ConvParams::Act::none)
    fail<UnsupportedError>(
        "[{}] was made for the CPU ({}); CUDA has no such kernel: compile the model for CUDA",
        ctx.op_name(),
        a.nchw_x ? "an NCHW image read into NHWC: nchw_x" : "an activation other than relu");
}

const void* bias_of(const KernelContext& ctx, const ConvParams& a) {
  return a.has_bias ? ctx.in(2).data : nullptr;
}

// in0, in1, out0: the op's first two inputs and its output (x, w, y; for conv_grad_weight x, dy,
// dw). Shared by the kernels and by export_conv_tuning, so both name the same problems.
ConvCall conv_call(OpId op, const ConvParams& a, const Shape& in0, const Shape& in1,
                   const Shape& out0) {
  ConvCall c;
  Geometry& g = c.g;
  switch (op) {
    case OpId::ConvTranspose:  // as the transposed conv: input y (N, O, ...), output x (N, C, ...)
      c.pass = Pass::backward_data;
      g = geometry(a, out0, in1, in0);
      break;
    case OpId::ConvGradWeight:
      c.pass = Pass::backward_filter;
      g = geometry(a, in0, out0, in1);
      break;
    default:
      c.pass = Pass::forward;
      g = geometry(a, in0, in1, out0);
  }
  for (int i = 0; i < g.nd; ++i)
    c.direct = c.direct && cudnn_fits(g, i, g.in[i], g.pb[i], g.out[i]);
  const bool tf32 = a.tf32;
  if (c.direct) {
    c.p = problem(g, g.in, g.pb);
    c.p.tf32 = tf32;
    return c;
  }
  std::vector<int64_t> pad(g.nd, 0);
  c.window.resize(g.nd);
  c.shift.resize(g.nd);
  for (int i = 0; i < g.nd; ++i) {
    if (c.pass == Pass::forward) {  // pad the input by what the symmetric pads lack
      pad[i] = std::min(g.pb[i], g.pe[i]);
      c.shift[i] = g.pb[i] - pad[i];
      c.window[i] = g.in[i] + g.pb[i] + g.pe[i] - 2 * pad[i];
    } else {  // the full extent the outputs touch, begin pads included, no pads left for cuDNN
      c.window[i] = (g.out[i] - 1) * g.stride[i] + extent(g, i);
      c.shift[i] = c.pass == Pass::backward_data ? -g.pb[i] : g.pb[i];
    }
  }
  c.p = problem(g, c.window, pad);
  c.p.tf32 = tf32;
  return c;
}

}  // namespace conv_detail

namespace {

// ---- the kernels ----

void conv(KernelContext& ctx) {
  ConvParams spare;
  const ConvParams& a = params_of(ctx, spare);
  const TensorView &x = ctx.in(0), &w = ctx.in(1), &y = ctx.out(0);
  if (y.numel() == 0) return;
  const void* bias = bias_of(ctx, a);
  if (x.numel() == 0 || w.numel() == 0) return launch_channel_bias(ctx, y, bias, false);
  const ConvCall c = conv_call(OpId::Conv, a, x.shape, w.shape, y.shape);
  const Geometry& g = c.g;
  if (c.direct) {
    run_pass(ctx, Pass::forward, c.p, x.dtype, x.data, w.data, nullptr, y.data);
  } else {
    void* xp = ctx.scratch(static_cast<size_t>(g.N * g.C * prod(c.window)) * size_of(x.dtype));
    launch_window_copy(ctx, x.dtype, x.data, xp, g.N * g.C, g.in, c.window, c.shift, nullptr, 1);
    run_pass(ctx, Pass::forward, c.p, x.dtype, xp, w.data, nullptr, y.data);
  }
  if (bias) launch_channel_bias(ctx, y, bias, true);
}

// fused_conv: conv (its bias included; the residual is the last input), then + residual and relu
// in one pass over the output.
void fused_conv(KernelContext& ctx) {
  conv(ctx);
  ConvParams spare;
  const ConvParams& a = params_of(ctx, spare);
  refuse_cpu_only(ctx, a);
  const TensorView& y = ctx.out(0);
  if (y.numel() == 0) return;
  add_residual_relu(ctx, y, a.has_residual ? ctx.in(ctx.num_inputs() - 1).data : nullptr, a.relu);
}

// conv_transpose(x, w) is the backward-data pass of the conv from its output y to its input x.
void conv_transpose(KernelContext& ctx) {
  ConvParams spare;
  const ConvParams& a = params_of(ctx, spare);
  const TensorView &x = ctx.in(0), &w = ctx.in(1), &y = ctx.out(0);
  if (y.numel() == 0) return;
  const void* bias = bias_of(ctx, a);
  if (x.numel() == 0 || w.numel() == 0) return launch_channel_bias(ctx, y, bias, false);
  const ConvCall c = conv_call(OpId::ConvTranspose, a, x.shape, w.shape, y.shape);
  const Geometry& g = c.g;
  if (c.direct) {
    run_pass(ctx, Pass::backward_data, c.p, x.dtype, nullptr, w.data, x.data, y.data);
    if (bias) launch_channel_bias(ctx, y, bias, true);
    return;
  }
  // the unpadded ("full") result, cropped by the begin pads; output_padding beyond it is zero
  void* yf = ctx.scratch(static_cast<size_t>(g.N * g.C * prod(c.window)) * size_of(x.dtype));
  run_pass(ctx, Pass::backward_data, c.p, x.dtype, nullptr, w.data, x.data, yf);
  launch_window_copy(ctx, x.dtype, yf, y.data, g.N * g.C, c.window, g.in, c.shift, bias, g.C);
}

// dW of the conv from x (N, C, in) to dy (N, O, out): the backward-filter pass.
void conv_grad_weight(KernelContext& ctx) {
  ConvParams spare;
  const ConvParams& a = params_of(ctx, spare);
  const TensorView &x = ctx.in(0), &dy = ctx.in(1), &dw = ctx.out(0);
  if (dw.numel() == 0) return;
  if (x.numel() == 0 || dy.numel() == 0) {
    KILN_CUDA_CHECK(cudaMemsetAsync(dw.data, 0, dw.numel() * size_of(dw.dtype), stream_of(ctx)));
    return;
  }
  const ConvCall c = conv_call(OpId::ConvGradWeight, a, x.shape, dy.shape, dw.shape);
  const Geometry& g = c.g;
  if (c.direct) {
    run_pass(ctx, Pass::backward_filter, c.p, x.dtype, x.data, nullptr, dy.data, dw.data);
    return;
  }
  void* xp = ctx.scratch(static_cast<size_t>(g.N * g.C * prod(c.window)) * size_of(x.dtype));
  launch_window_copy(ctx, x.dtype, x.data, xp, g.N * g.C, g.in, c.window, c.shift, nullptr, 1);
  run_pass(ctx, Pass::backward_filter, c.p, x.dtype, xp, nullptr, dy.data, dw.data);
}

}  // namespace

void register_conv_kernels() {
  constexpr DTypeSet kTypes{f32, f64, f16, bf16};
  register_kernel(OpId::Conv, Backend::cuda, {conv, kTypes, 0, false});
  register_kernel(OpId::ConvTranspose, Backend::cuda, {conv_transpose, kTypes, 0, false});
  register_kernel(OpId::ConvGradWeight, Backend::cuda, {conv_grad_weight, kTypes, 0, false});
  register_kernel(OpId::FusedConv, Backend::cuda, {fused_conv, kTypes, 0, false});
  register_kernel(OpId::Conv, Backend::cuda, Layout::channels_last, {conv_nhwc, kTypes, 0, false});
  register_kernel(OpId::FusedConv, Backend::cuda, Layout::channels_last,
                  {conv_nhwc, kTypes, 0, false});
  register_kernel(OpId::ConvTranspose, Backend::cuda, Layout::channels_last,
                  {conv_transpose_nhwc, kTypes, 0, false});
  register_kernel(OpId::ConvGradWeight, Backend::cuda, Layout::channels_last,
                  {conv_grad_weight_nhwc, kTypes, 0, false});
}

}  // namespace kiln::cuda
