// CPU kernels of the conv family: f32, and bf16 where oneDNN runs it natively (native_bf16; else
// through f32 copies), through oneDNN (cached primitives that pick their own blocked layouts;
// kiln's NCHW buffers are reordered around them), f64 and degenerate shapes
// (no input channels, output padding >= stride) through direct loops. ConvGradWeight (conv's
// weight gradient) likewise: oneDNN's backward-weights primitive for f32, loops otherwise.
#include <algorithm>
#include <array>
#include <cstring>
#include <optional>

#include "backends/cpu/cpu_common.h"
#include "backends/cpu/dnnl_util.h"
#include "backends/cpu/kernels.h"
#include "backends/cpu/layout.h"
#include "ops/conv_params.h"
#include "ops/elementwise_math.h"
#include "runtime/thread_pool.h"

namespace kiln::cpu {

namespace {
namespace du = dnnl_util;
using Dims3 = std::array<int64_t, 3>;

// Sizes of a convolution; spatial arrays are padded in front to 3 dims (size 1, no padding).
struct ConvGeom {
  int nd = 0;
  bool transpose = false;
  int64_t N = 0, C = 0, O = 0, G = 1;
  Dims3 in{1, 1, 1}, k{1, 1, 1}, out{1, 1, 1}, stride{1, 1, 1}, dil{1, 1, 1}, pad{0, 0, 0};
  int64_t in_size() const { return in[0] * in[1] * in[2]; }
  int64_t k_size() const { return k[0] * k[1] * k[2]; }
  int64_t out_size() const { return out[0] * out[1] * out[2]; }
  /// The node's attributes (geometry in kiln's order, bias).
  const ConvParams* a = nullptr;
  /// Layout channels_last: x and y are (N, H, W, C), w (O, kh, kw, C/G) (conv only); the sizes
  /// above are the logical NCHW ones. nchw_x: x stays (N, C, H, W).
  bool nhwc = false, nchw_x = false;
};

using dnnl_dt = dnnl::memory::data_type;
using du::data_type;

// x: the conv's input, w: its weight, y: its output (for conv_transpose, the transposed one's).
// (S: a Shape, or the std::array of nchw4: no allocation)
template <class S> ConvGeom geometry_of(const KernelContext& ctx, const ConvParams& a, const S& x,
                                        const S& w, const S& y) {
  ConvGeom g;
  g.a = &a;
  g.transpose = ctx.op() == OpId::ConvTranspose;
  g.nd = static_cast<int>(x.size()) - 2;
  g.N = x[0];
  g.C = x[1];
  g.O = y[1];
  g.G = a.groups;
  const auto &s = a.stride, &d = a.dilation, &p = a.pads;
  for (int i = 0; i < g.nd; ++i) {
    const int j = 3 - g.nd + i;
    g.in[j] = x[2 + i];
    g.k[j] = w[2 + i];
    g.out[j] = y[2 + i];
    g.stride[j] = s[i];
    g.dil[j] = d[i];
    g.pad[j] = p[i];
  }
  return g;
}

ConvGeom geometry(const KernelContext& ctx, const ConvParams& a) {
  return geometry_of(ctx, a, ctx.in(0).shape, ctx.in(1).shape, ctx.out(0).shape);
}

const void* bias_data(const KernelContext& ctx, const ConvGeom& g) {
  return g.a->has_bias ? ctx.in(2).data : nullptr;
}

// y[n, o] = bias[o] + sum over the group's channels and the kernel window, one (n, o) per task.
template <typename T>
void conv_loops(KernelContext& ctx, const ConvGeom& g) {
  const T* X = ctx.in(0).ptr<T>();
  const T* W = ctx.in(1).ptr<T>();
  const T* B = static_cast<const T*>(bias_data(ctx, g));
  T* Y = ctx.out(0).ptr<T>();
  const int64_t Cg = g.C / g.G, Og = g.O / g.G;
  ctx.parallel_for(g.N * g.O, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t n = t / g.O, o = t % g.O, c0 = (o / Og) * Cg;
      T* y = Y + t * g.out_size();
      for (int64_t od = 0; od < g.out[0]; ++od)
        for (int64_t oh = 0; oh < g.out[1]; ++oh)
          for (int64_t ow = 0; ow < g.out[2]; ++ow) {
            T acc = B ? B[o] : T(0);
            for (int64_t c = 0; c < Cg; ++c) {
              const T* x = X + (n * g.C + c0 + c) * g.in_size();
              const T* w = W + (o * Cg + c) * g.k_size();
              for (int64_t kd = 0; kd < g.k[0]; ++kd) {
                const int64_t id = od * g.stride[0] - g.pad[0] + kd * g.dil[0];
                if (id < 0 || id >= g.in[0]) continue;
                for (int64_t kh = 0; kh < g.k[1]; ++kh) {
                  const int64_t ih = oh * g.stride[1] - g.pad[1] + kh * g.dil[1];
                  if (ih < 0 || ih >= g.in[1]) continue;
                  for (int64_t kw = 0; kw < g.k[2]; ++kw) {
                    const int64_t iw = ow * g.stride[2] - g.pad[2] + kw * g.dil[2];
                    if (iw < 0 || iw >= g.in[2]) continue;
                    acc +=
                        x[(id * g.in[1] + ih) * g.in[2] + iw] * w[(kd * g.k[1] + kh) * g.k[2] + kw];
                  }
                }
              }
            }
            *y++ = acc;
          }
    }
  });
}

// Scatter form: each input pixel adds its weighted kernel window to the output plane of the
// task's (n, o), so tasks never write the same memory.
template <typename T>
void conv_transpose_loops(KernelContext& ctx, const ConvGeom& g) {
  const T* X = ctx.in(0).ptr<T>();
  const T* W = ctx.in(1).ptr<T>();
  const T* B = static_cast<const T*>(bias_data(ctx, g));
  T* Y = ctx.out(0).ptr<T>();
  const int64_t Cg = g.C / g.G, Og = g.O / g.G;
  ctx.parallel_for(g.N * g.O, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t n = t / g.O, o = t % g.O, c0 = (o / Og) * Cg, ol = o % Og;
      T* y = Y + t * g.out_size();
      std::fill(y, y + g.out_size(), B ? B[o] : T(0));
      for (int64_t c = c0; c < c0 + Cg; ++c) {
        const T* x = X + (n * g.C + c) * g.in_size();
        const T* w = W + (c * Og + ol) * g.k_size();
        for (int64_t id = 0; id < g.in[0]; ++id)
          for (int64_t ih = 0; ih < g.in[1]; ++ih)
            for (int64_t iw = 0; iw < g.in[2]; ++iw) {
              const T xv = x[(id * g.in[1] + ih) * g.in[2] + iw];
              for (int64_t kd = 0; kd < g.k[0]; ++kd) {
                const int64_t od = id * g.stride[0] - g.pad[0] + kd * g.dil[0];
                if (od < 0 || od >= g.out[0]) continue;
                for (int64_t kh = 0; kh < g.k[1]; ++kh) {
                  const int64_t oh = ih * g.stride[1] - g.pad[1] + kh * g.dil[1];
                  if (oh < 0 || oh >= g.out[1]) continue;
                  for (int64_t kw = 0; kw < g.k[2]; ++kw) {
                    const int64_t ow = iw * g.stride[2] - g.pad[2] + kw * g.dil[2];
                    if (ow < 0 || ow >= g.out[2]) continue;
                    y[(od * g.out[1] + oh) * g.out[2] + ow] +=
                        xv * w[(kd * g.k[1] + kh) * g.k[2] + kw];
                  }
                }
              }
            }
      }
    }
  });
}

// oneDNN's weights: (O, I, k...) or (G, O/G, I/G, k...), with strides matching kiln's buffer:
// (O, C/G, k...) for conv, (C, O/G, k...) for conv_transpose, (O, k..., C/G) for an NHWC conv,
// (C, k..., O/G) for an NHWC conv_transpose.
dnnl::memory::desc user_weights_md(const ConvGeom& g, const du::Dims& kernel, dnnl_dt t) {
  const int64_t K = g.k_size(), Cg = g.C / g.G, Og = g.O / g.G;
  const bool nhwc_t = g.nhwc && g.transpose;
  const int64_t tap = g.nhwc ? (g.transpose ? Og : Cg) : 1;  // between kernel taps
  du::Dims dims, strides;
  if (g.G > 1) {
    dims = {g.G, Og, Cg};
    strides = nhwc_t ? du::Dims{Cg * K * Og, 1, K * Og}
                     : du::Dims{Og * Cg * K, g.transpose ? K : Cg * K,
                                g.nhwc ? 1 : (g.transpose ? Og * K : K)};
  } else {
    dims = {g.O, g.C};
    strides = nhwc_t
                  ? du::Dims{1, K * g.O}
                  : du::Dims{g.transpose ? K : g.C * K, g.nhwc ? 1 : (g.transpose ? g.O * K : K)};
  }
  int64_t inner = K;
  for (int64_t e : kernel) {
    inner /= std::max<int64_t>(e, 1);
    dims.push_back(e);
    strides.push_back(inner * tap);
  }
  return du::strided_md(dims, strides, t);
}

// kiln's buffer of an activation of logical NCHW `dims`: row-major, or NHWC.
dnnl::memory::desc data_md(const du::Dims& dims, dnnl_dt t, bool nhwc) {
  if (!nhwc) return du::plain_md(dims, t);
  const int64_t c = dims[1], h = dims[2], w = dims[3];
  return du::strided_md(dims, {h * w * c, 1, w * c, c}, t);
}

// Whether the conv applies fused_conv's epilogue (a residual added, relu) itself: as post-ops of
// its oneDNN primitive. (A plain conv run for a fused_conv, as conv_channels_last does, does not.)
bool with_epilogue(const KernelContext& ctx, const ConvGeom& g) {
  return ctx.op() == OpId::FusedConv &&
         (g.a->has_residual || g.a->relu || g.a->act != ConvParams::Act::none);
}

// The epilogue a primitive applies: the residual, then relu or another activation.
struct Epilogue {
  bool residual = false, relu = false;
  ConvParams::Act act = ConvParams::Act::none;
  float lo = 0, hi = 0;  // clip's bounds
};

// kiln's attributes (user scratchpad) with the epilogue's post-ops: the residual through a sum
// (the destination starts as the residual), then the activation.
dnnl::primitive_attr conv_attr(const Epilogue& e) {
  dnnl::primitive_attr r;
  r.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  dnnl::post_ops ops;
  if (e.residual) ops.append_sum(1.f);
  using Act = ConvParams::Act;
  using alg = dnnl::algorithm;
  if (e.relu) ops.append_eltwise(1.f, alg::eltwise_relu, 0.f, 0.f);
  if (e.act == Act::clip) ops.append_eltwise(1.f, alg::eltwise_clip, e.lo, e.hi);
  if (e.act == Act::hardswish) ops.append_eltwise(1.f, alg::eltwise_hardswish, 0.f, 0.f);
  if (e.act == Act::sigmoid) ops.append_eltwise(1.f, alg::eltwise_logistic, 0.f, 0.f);
  if (e.act == Act::silu) ops.append_eltwise(1.f, alg::eltwise_swish, 1.f, 0.f);
  r.set_post_ops(ops);
  return r;
}

// (t: the data's and weights' type, f32 or bf16; bias_t the bias's; residual, relu: the epilogue)
du::CachedPrimitive make_conv_primitive(const ConvGeom& g, const du::Dims& src,
                                        const du::Dims& kernel, const du::Dims& dst,
                                        const du::Dims& stride, const du::Dims& dil,
                                        const du::Dims& pad_l, const du::Dims& pad_r, bool has_bias,
                                        dnnl_dt t, dnnl_dt bias_t, const Epilogue& epilogue) {
  const dnnl::primitive_attr attr = conv_attr(epilogue);
  const auto wei = user_weights_md(g, kernel, t);
  const auto bias = has_bias ? du::plain_md({g.O}, bias_t) : dnnl::memory::desc();
  auto any = [&](const du::Dims& d) {
    return dnnl::memory::desc(d, t, dnnl::memory::format_tag::any);
  };
  const auto src_any = any(src), dst_any = any(dst), wei_any = any(wei.dims());
  dnnl::primitive prim;
  dnnl::memory::desc src_md, wei_md, dst_md, scratch_md, dst_user = data_md(dst, t, g.nhwc);
  if (g.transpose) {
    dnnl::deconvolution_forward::desc d(dnnl::prop_kind::forward_inference,
                                        dnnl::algorithm::deconvolution_direct, src_any, wei_any,
                                        bias, dst_any, stride, dil, pad_l, pad_r);
    dnnl::deconvolution_forward::primitive_desc pd(d, attr, du::engine());
    prim = dnnl::deconvolution_forward(pd);
    src_md = pd.src_desc(), wei_md = pd.weights_desc(), dst_md = pd.dst_desc();
    scratch_md = pd.scratchpad_desc();
  } else {
    auto pd_of = [&](const dnnl::memory::desc& src_md) {
      const dnnl::convolution_forward::desc d(dnnl::prop_kind::forward_inference,
                                              dnnl::algorithm::convolution_direct, src_md, wei_any,
                                              bias, dst_any, stride, dil, pad_l, pad_r);
      return dnnl::convolution_forward::primitive_desc(d, attr, du::engine());
    };
    // An NHWC output of an input left NCHW (a network's first convolution, of few channels):
    // oneDNN's direct kernel reads NCHW itself and writes blocks of the vector width's channels,
    // which are NHWC where the output is one block (8 or 16 channels); then neither side is
    // reordered (2x3x64x64 -> 16, 7x7 / 2: 32.7 -> 22.8 us on two Zen 5 threads). Wider outputs
    // take oneDNN's choice and an NHWC copy of the input: reordering its blocked output back
    // measured slower.
    std::optional<dnnl::convolution_forward::primitive_desc> stem;
    if (g.nchw_x && g.nhwc && g.G == 1 && (g.O == 8 || g.O == 16) && src.size() == 4) {
      using tag = dnnl::memory::format_tag;
      try {
        stem = pd_of(du::plain_md(src, t));
        if (stem->dst_desc() != dnnl::memory::desc(dst, t, g.O == 16 ? tag::nChw16c : tag::nChw8c))
          stem.reset();
      } catch (const dnnl::error&) {
        stem.reset();
      }
    }
    const auto pd = stem ? *stem : pd_of(src_any);
    prim = dnnl::convolution_forward(pd);
    src_md = pd.src_desc(), wei_md = pd.weights_desc(), dst_md = pd.dst_desc();
    scratch_md = pd.scratchpad_desc();
    if (stem) dst_user = dst_md;  // the same bytes as NHWC
  }
  du::CachedPrimitive c{prim,
                        {du::make_arg(DNNL_ARG_SRC, data_md(src, t, g.nhwc && !g.nchw_x), src_md),
                         du::make_arg(DNNL_ARG_WEIGHTS, wei, wei_md)},
                        scratch_md};
  if (has_bias) c.args.push_back(du::make_arg(DNNL_ARG_BIAS, bias, bias));
  c.args.push_back(du::make_arg(DNNL_ARG_DST, dst_user, dst_md, true, epilogue.residual));
  return c;
}

// oneDNN counts the gaps between kernel taps.
du::Dims dnnl_dilation(const std::vector<int64_t>& dilation) {
  du::Dims r;
  for (int64_t d : dilation) r.push_back(d - 1);
  return r;
}

// `s` in logical NCHW order (from NHWC where `nhwc`), appended to `to`.
void append_nchw(du::Dims& to, const Shape& s, bool nhwc) {
  if (!nhwc) {
    to.insert(to.end(), s.begin(), s.end());
    return;
  }
  for (int d : kNhwcToNchw) to.push_back(s[static_cast<size_t>(d)]);
}

void conv_dnnl(KernelContext& ctx, const ConvGeom& g) {
  const TensorView &x = ctx.in(0), &w = ctx.in(1), &y = ctx.out(0);
  const int nd = g.nd;
  const auto& p = g.a->pads;
  const du::Dims& stride = g.a->stride;
  const bool has_bias = g.a->has_bias;
  Epilogue e;
  if (with_epilogue(ctx, g))
    e = {g.a->has_residual, g.a->relu, g.a->act, static_cast<float>(g.a->act_min),
         static_cast<float>(g.a->act_max)};
  int64_t bounds = 0;  // (clip's two f32 bounds, bit for bit)
  std::memcpy(&bounds, &e.lo, sizeof(float));
  std::memcpy(reinterpret_cast<char*>(&bounds) + sizeof(float), &e.hi, sizeof(float));

  const DType bias_t = has_bias ? ctx.in(2).dtype : DType::f32;
  // (the key in memory of this thread's, kept from call to call: no allocation per call; the
  // shapes logical NCHW, an NHWC node's buffers described by data_md and user_weights_md)
  thread_local du::Dims key;
  key = {static_cast<int64_t>(g.transpose ? OpId::ConvTranspose : OpId::Conv),
         nd,
         g.G,
         has_bias,
         static_cast<int64_t>(x.dtype),
         static_cast<int64_t>(bias_t),
         e.residual,
         e.relu,
         static_cast<int64_t>(e.act),
         bounds,
         g.nhwc,
         g.nchw_x};
  append_nchw(key, x.shape, g.nhwc && !g.nchw_x);
  append_nchw(key, w.shape, g.nhwc);
  append_nchw(key, y.shape, g.nhwc);
  key.insert(key.end(), stride.begin(), stride.end());
  for (int64_t d : g.a->dilation) key.push_back(d);
  key.insert(key.end(), p.begin(), p.end());
  auto prim = du::cached(ctx.op_name(), key, [&] {
    du::Dims xs, ws, ys;
    append_nchw(xs, x.shape, g.nhwc && !g.nchw_x);
    append_nchw(ws, w.shape, g.nhwc);
    append_nchw(ys, y.shape, g.nhwc);
    const du::Dims kernel(ws.begin() + 2, ws.end());
    const du::Dims pad_l(p.begin(), p.begin() + nd), pad_r(p.begin() + nd, p.end());
    return make_conv_primitive(g, xs, kernel, ys, stride, dnnl_dilation(g.a->dilation), pad_l,
                               pad_r, has_bias, data_type(x.dtype), data_type(bias_t), e);
  });
  std::vector<void*> buffers{x.data, w.data};
  // constant weights are laid out for the primitive once, on the first run (kept with the node)
  std::shared_ptr<const void> packed;
  const du::Arg& wa = prim->args[1];
  if (g.a->const_weight && wa.reorder) {
    packed = du::packed_weight(ctx.op_name(), wa, w.data, *g.a->state);
    buffers[1] = const_cast<void*>(packed.get());
  }
  if (has_bias) buffers.push_back(ctx.in(2).data);
  buffers.push_back(y.data);
  du::execute(ctx.op_name(), *prim, buffers,
              e.residual ? ctx.in(ctx.num_inputs() - 1).data : nullptr, packed ? 1 : -1);
}

// oneDNN has no output_padding: it reads it from the output size, which works while it is
// smaller than the stride.
bool dnnl_handles(const KernelContext& ctx, const ConvGeom& g) {
  const DType t = ctx.in(0).dtype;
  if (!(t == f32 || (t == bf16 && native_bf16())) || ctx.in(0).numel() == 0 ||
      ctx.in(1).numel() == 0)
    return false;
  if (!g.transpose) return true;
  const auto &op = g.a->output_padding, &s = g.a->stride;
  for (int i = 0; i < g.nd; ++i)
    if (op[i] >= s[i]) return false;
  return true;
}

void convolve(KernelContext& ctx) {
  ConvParams spare;
  const ConvGeom g = geometry(ctx, params_of(ctx, spare));
  if (dnnl_handles(ctx, g)) return conv_dnnl(ctx, g);
  if (ctx.in(0).dtype == bf16) return via_f32_copies(ctx, convolve);
  dispatch_float(ctx.in(0).dtype, ctx.op_name(), [&](auto v) {
    using T = decltype(v);
    if (g.transpose)
      conv_transpose_loops<T>(ctx, g);
    else
      conv_loops<T>(ctx, g);
  });
}

// The geometry of a conv in layout channels_last, from its NHWC buffers.
ConvGeom nhwc_geometry(const KernelContext& ctx, const ConvParams& a) {
  const Shape& x = ctx.in(0).shape;
  ConvGeom g = geometry_of(ctx, a, a.nchw_x ? nchw4(x, false) : nchw4(x, true),
                           nchw4(ctx.in(1).shape, true), nchw4(ctx.out(0).shape, true));
  g.nhwc = true;
  g.nchw_x = a.nchw_x;
  return g;
}

// conv in layout channels_last (x (N, H, W, C), w (O, kh, kw, C/G)), which the channels_last pass
// gives the CPU's f32 convolutions (oneDNN reads and writes NHWC as it is) and GPU convolutions
// (a package made for a GPU runs here; f64 through NCHW copies, bf16 through f32 copies:
// KernelEntry::half_via_f32). Through the copies, its output only: fused_conv adds its epilogue.
void conv_channels_last(KernelContext& ctx) {
  const TensorView &x = ctx.in(0), &w = ctx.in(1), &y = ctx.out(0);
  ConvParams spare;
  const ConvParams& a = params_of(ctx, spare);
  if (const ConvGeom g = nhwc_geometry(ctx, a); dnnl_handles(ctx, g)) return conv_dnnl(ctx, g);
  dispatch_float(x.dtype, ctx.op_name(), [&](auto v) {
    using T = decltype(v);
    auto scratch = [&](const Shape& s) {
      return TensorView{ctx.scratch(static_cast<size_t>(numel(s)) * sizeof(T)), s, x.dtype};
    };
    std::vector<TensorView> in{a.nchw_x ? x : scratch(nchw_of(x.shape)), scratch(nchw_of(w.shape))};
    if (!a.nchw_x) permute4<T>(ctx, x.ptr<T>(), x.shape, in[0].ptr<T>(), kNhwcToNchw);
    permute4<T>(ctx, w.ptr<T>(), w.shape, in[1].ptr<T>(), kNhwcToNchw);
    if (a.has_bias) in.push_back(ctx.in(2));
    const TensorView out = scratch(nchw_of(y.shape));
    {
      KernelContext inner(OpId::Conv, ctx.attrs(), in, {out}, &ThreadPool::global());
      convolve(inner);
    }
    permute4<T>(ctx, out.ptr<T>(), out.shape, y.ptr<T>(), kNchwToNhwc);
  });
}

// fused_conv's epilogue over its output, in place: + the residual (its last input), then relu or
// the other activation (the ops' own math).
void residual_relu(KernelContext& ctx, const ConvParams& a) {
  using Act = ConvParams::Act;
  if (!a.has_residual && !a.relu && a.act == Act::none) return;
  const TensorView& y = ctx.out(0);
  dispatch_float(y.dtype, ctx.op_name(), [&](auto v) {
    using T = decltype(v);
    T* Y = y.ptr<T>();
    const T* R = a.has_residual ? ctx.in(ctx.num_inputs() - 1).ptr<T>() : nullptr;
    const math::Clip<T> clip{static_cast<T>(a.act_min), static_cast<T>(a.act_max)};
    ctx.parallel_for(y.numel(), 16384, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        T r = R ? static_cast<T>(Y[i] + R[i]) : Y[i];
        if (a.relu) r = math::Relu<T>{}(r);
        if (a.act == Act::clip) r = clip(r);
        if (a.act == Act::hardswish) r = math::Hardswish<T>{}(r);
        if (a.act == Act::sigmoid) r = math::Sigmoid<T>{}(r);
        if (a.act == Act::silu) r = math::Silu<T>{}(r);
        Y[i] = r;
      }
    });
  });
}

// The conv, then the epilogue over its output. The CPU's memory plan may give the output the
// residual's buffer (MemoryPlanOptions::residual_in_place): the conv would write over the residual
// before the epilogue reads it, so it reads a copy then.
void conv_then_epilogue(KernelContext& ctx, const ConvParams& a, KernelFn conv) {
  const TensorView& r = ctx.in(ctx.num_inputs() - 1);
  if (!a.has_residual || r.data != ctx.out(0).data) {
    conv(ctx);
    return residual_relu(ctx, a);
  }
  std::vector<TensorView> in;
  for (int i = 0; i < ctx.num_inputs(); ++i) in.push_back(ctx.in(i));
  const size_t bytes = static_cast<size_t>(r.numel()) * size_of(r.dtype);
  in.back().data = ctx.scratch(bytes);
  std::memcpy(in.back().data, r.data, bytes);
  KernelContext copy(ctx, ctx.attrs(), std::move(in));
  conv(copy);
  residual_relu(copy, a);
}

// fused_conv: the conv of its layout (conv reads x, w and the bias; the residual input is last)
// with the epilogue as post-ops of its oneDNN primitive (the residual may be the output's own
// buffer: the sum post-op's starting value), or the loops' conv then the epilogue.
// (f32 and f64: bf16 and f16 come as f32 copies, rounded once at the end.)
void fused_conv(KernelContext& ctx) {
  ConvParams spare;
  const ConvParams& a = params_of(ctx, spare);
  const ConvGeom g = geometry(ctx, a);
  if (dnnl_handles(ctx, g)) return conv_dnnl(ctx, g);
  conv_then_epilogue(ctx, a, convolve);
}
void fused_conv_channels_last(KernelContext& ctx) {
  ConvParams spare;
  const ConvParams& a = params_of(ctx, spare);
  if (const ConvGeom g = nhwc_geometry(ctx, a); dnnl_handles(ctx, g)) return conv_dnnl(ctx, g);
  conv_then_epilogue(ctx, a, conv_channels_last);
}

// conv_transpose in layout channels_last (x (N, H, W, C), w (C, kh, kw, O/G)): the CPU's f32
// inference deconvolutions, which oneDNN reads and writes as NHWC; others (from GPU training
// programs) through NCHW copies. conv_grad_weight in layout channels_last through NCHW copies.
void conv_transpose_channels_last(KernelContext& ctx) {
  ConvParams spare;
  const ConvParams& a = params_of(ctx, spare);
  if (const ConvGeom g = nhwc_geometry(ctx, a); dnnl_handles(ctx, g)) return conv_dnnl(ctx, g);
  run_via_nchw(ctx, convolve);
}

// ---- ConvGradWeight: inputs x (conv input) and dy (conv output gradient), output dw ----

// dw[o, c, k] = sum over n and output positions p of dy[n, o, p] x[n, c, p*s - pad + k*d],
// one (o, c) per task.
template <typename T>
void conv_grad_weight_loops(KernelContext& ctx, const ConvGeom& g) {
  const T* X = ctx.in(0).ptr<T>();
  const T* DY = ctx.in(1).ptr<T>();
  T* DW = ctx.out(0).ptr<T>();
  const int64_t Cg = g.C / g.G, Og = g.O / g.G;
  ctx.parallel_for(g.O * Cg, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t o = t / Cg, c = (o / Og) * Cg + t % Cg;
      T* dw = DW + t * g.k_size();
      for (int64_t kd = 0; kd < g.k[0]; ++kd)
        for (int64_t kh = 0; kh < g.k[1]; ++kh)
          for (int64_t kw = 0; kw < g.k[2]; ++kw) {
            T acc = 0;
            for (int64_t n = 0; n < g.N; ++n) {
              const T* x = X + (n * g.C + c) * g.in_size();
              const T* dy = DY + (n * g.O + o) * g.out_size();
              for (int64_t od = 0; od < g.out[0]; ++od) {
                const int64_t id = od * g.stride[0] - g.pad[0] + kd * g.dil[0];
                if (id < 0 || id >= g.in[0]) continue;
                for (int64_t oh = 0; oh < g.out[1]; ++oh) {
                  const int64_t ih = oh * g.stride[1] - g.pad[1] + kh * g.dil[1];
                  if (ih < 0 || ih >= g.in[1]) continue;
                  for (int64_t ow = 0; ow < g.out[2]; ++ow) {
                    const int64_t iw = ow * g.stride[2] - g.pad[2] + kw * g.dil[2];
                    if (iw < 0 || iw >= g.in[2]) continue;
                    acc += dy[(od * g.out[1] + oh) * g.out[2] + ow] *
                           x[(id * g.in[1] + ih) * g.in[2] + iw];
                  }
                }
              }
            }
            *dw++ = acc;
          }
    }
  });
}

// oneDNN's backward-weights primitive needs a forward primitive_desc as a hint.
du::CachedPrimitive make_grad_weight_primitive(const ConvGeom& g, const du::Dims& src,
                                               const du::Dims& kernel, const du::Dims& dst,
                                               const du::Dims& stride, const du::Dims& dil,
                                               const du::Dims& pad_l, const du::Dims& pad_r) {
  const auto wei = user_weights_md(g, kernel, dnnl_dt::f32);
  const auto src_any = du::any_md(src), dst_any = du::any_md(dst), wei_any = du::any_md(wei.dims());
  dnnl::convolution_forward::desc fd(dnnl::prop_kind::forward_training,
                                     dnnl::algorithm::convolution_direct, src_any, wei_any,
                                     dnnl::memory::desc(), dst_any, stride, dil, pad_l, pad_r);
  dnnl::convolution_forward::primitive_desc hint(fd, du::attr(), du::engine());
  dnnl::convolution_backward_weights::desc d(dnnl::algorithm::convolution_direct, src_any, wei_any,
                                             dst_any, stride, dil, pad_l, pad_r);
  dnnl::convolution_backward_weights::primitive_desc pd(d, du::attr(), du::engine(), hint);
  return {dnnl::convolution_backward_weights(pd),
          {du::make_arg(DNNL_ARG_SRC, du::plain_md(src), pd.src_desc()),
           du::make_arg(DNNL_ARG_DIFF_DST, du::plain_md(dst), pd.diff_dst_desc()),
           du::make_arg(DNNL_ARG_DIFF_WEIGHTS, wei, pd.diff_weights_desc(), true)},
          pd.scratchpad_desc()};
}

void conv_grad_weight_dnnl(KernelContext& ctx, const ConvGeom& g) {
  const TensorView &x = ctx.in(0), &dy = ctx.in(1), &dw = ctx.out(0);
  const int nd = g.nd;
  const auto& p = g.a->pads;
  const du::Dims kernel(dw.shape.begin() + 2, dw.shape.end());
  const du::Dims& stride = g.a->stride;
  const du::Dims dil = dnnl_dilation(g.a->dilation);
  const du::Dims pad_l(p.begin(), p.begin() + nd), pad_r(p.begin() + nd, p.end());
  du::Dims key{static_cast<int64_t>(ctx.op()), nd, g.G};
  for (const Shape* s : {&x.shape, &dy.shape, &dw.shape})
    key.insert(key.end(), s->begin(), s->end());
  for (const du::Dims* v : {&stride, &dil, &p}) key.insert(key.end(), v->begin(), v->end());
  auto prim = du::cached(ctx.op_name(), key, [&] {
    return make_grad_weight_primitive(g, x.shape, kernel, dy.shape, stride, dil, pad_l, pad_r);
  });
  du::execute(ctx.op_name(), *prim, {x.data, dy.data, dw.data});
}

// oneDNN wants dy's size to follow from x's exactly; a conv_transpose's weight gradient with
// output_padding >= stride (allowed below the dilation) breaks that, and loops take it.
bool dnnl_handles_grad_weight(const KernelContext& ctx, const ConvGeom& g) {
  if (ctx.in(0).dtype != f32 || ctx.in(0).numel() == 0 || ctx.in(1).numel() == 0 ||
      ctx.out(0).numel() == 0)
    return false;
  const auto& p = g.a->pads;
  for (int i = 0; i < g.nd; ++i) {
    const int j = 3 - g.nd + i;
    const int64_t span = g.in[j] + p[i] + p[g.nd + i] - (g.k[j] - 1) * g.dil[j] - 1;
    if (span < 0 || span / g.stride[j] + 1 != g.out[j]) return false;
  }
  return true;
}

void conv_grad_weight(KernelContext& ctx) {
  ConvParams spare;
  const ConvGeom g =
      geometry_of(ctx, params_of(ctx, spare), ctx.in(0).shape, ctx.out(0).shape, ctx.in(1).shape);
  if (dnnl_handles_grad_weight(ctx, g)) return conv_grad_weight_dnnl(ctx, g);
  dispatch_float(ctx.in(0).dtype, ctx.op_name(),
                 [&](auto v) { conv_grad_weight_loops<decltype(v)>(ctx, g); });
}
void conv_grad_weight_channels_last(KernelContext& ctx) { run_via_nchw(ctx, conv_grad_weight); }
}  // namespace

void register_conv_kernels() {
  // (bf16 reaches conv and conv_transpose as it is: native_bf16, or their own f32 copies)
  register_kernel(OpId::Conv, Backend::cpu, {convolve, DTypeSet{f32, f64}, 0, true, false, {bf16}});
  register_kernel(OpId::ConvTranspose, Backend::cpu,
                  {convolve, DTypeSet{f32, f64}, 0, true, false, {bf16}});
  register_kernel(OpId::ConvGradWeight, Backend::cpu, {conv_grad_weight, DTypeSet{f32, f64}});
  // (from packages made for a GPU; bf16 through f32 copies)
  register_kernel(OpId::Conv, Backend::cpu, Layout::channels_last,
                  {conv_channels_last, DTypeSet{f32, f64}});
  register_kernel(OpId::FusedConv, Backend::cpu, {fused_conv, DTypeSet{f32, f64}});
  register_kernel(OpId::FusedConv, Backend::cpu, Layout::channels_last,
                  {fused_conv_channels_last, DTypeSet{f32, f64}});
  register_kernel(OpId::ConvTranspose, Backend::cpu, Layout::channels_last,
                  {conv_transpose_channels_last, DTypeSet{f32, f64}});
  register_kernel(OpId::ConvGradWeight, Backend::cpu, Layout::channels_last,
                  {conv_grad_weight_channels_last, DTypeSet{f32, f64}});
}

}  // namespace kiln::cpu
