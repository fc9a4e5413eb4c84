// CPU kernel of quantized_conv (src/ops/quant.cpp): the exact i32 sum of (x - x_zp)(w - w_zp)
// over each window (plus an i32 bias), then the epilogue of quantized_matmul
// (backends/quant_math.h): scale, f32 bias, residual, relu or GELU, requantize once. Padded
// positions hold the real value 0, i.e. x_zp. Products: oneDNN's int8 convolution where it is exact
// (VNNI) and the weights are i8 with zero points 0, on NHWC data (padded with x_zp here when x has
// a zero point, so that every window is full and sum (x - x_zp) w = sum x w - x_zp sum w).
// Elsewhere direct loops over int16 differences.
//   NCHW (layout plain: quantized_conv): x is copied to NHWC, oneDNN writes the i32 sums, and
//   kiln's epilogue (double precision, bit for bit the CUDA kernel's) writes the NCHW output.
//   NHWC (layout channels_last, which the channels_last pass gives int8 pipelines:
//   quantized_conv_channels_last): no copies;
//   oneDNN runs the whole epilogue as its output scales, bias and post-ops (residual add, relu
//   or GELU, 1/y_scale and y_zp) in f32 and writes the int8 output, within 1 LSB of the exact
//   epilogue.
//   quantize_x: f32 NCHW x is quantized into an int8 copy first.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "backends/cpu/cpu_common.h"
#include "backends/cpu/dnnl_util.h"
#include "backends/cpu/kernels.h"
#include "backends/cpu/quant_kernels.h"
#include "backends/quant_dispatch.h"
#include "backends/quant_math.h"

namespace kiln::cpu {

namespace {

namespace du = dnnl_util;

struct Geom {
  int64_t N, C, H, W, O, KH, KW, OH, OW, G;
  int64_t sh, sw, dh, dw, pt, pl, pb, pr;
  bool cl;            // layout channels_last: x, residual and output NHWC
  bool ohwi = false;  // weights_ohwi: w is (O, kh, kw, C) (groups 1)
  int64_t cg() const { return C / G; }
  int64_t og() const { return O / G; }
  int64_t window() const { return cg() * KH * KW; }
  int64_t x_at(int64_t n, int64_t c, int64_t h, int64_t w) const {
    return cl ? ((n * H + h) * W + w) * C + c : ((n * C + c) * H + h) * W + w;
  }
  int64_t y_at(int64_t n, int64_t o, int64_t h, int64_t w) const {
    return cl ? ((n * OH + h) * OW + w) * O + o : ((n * O + o) * OH + h) * OW + w;
  }
};

Geom geometry(const KernelContext& ctx, const QuantizedConvParams& prm, bool cl) {
  const Shape &x = ctx.in(0).shape, &w = ctx.in(3).shape, &y = ctx.out(0).shape;
  const int64_t *s = prm.stride, *d = prm.dilation, *p = prm.pads;
  // weights_ohwi: w is (O, kh, kw, C)
  const bool ohwi = prm.weights_ohwi;
  Geom g{x[0],
         cl ? x[3] : x[1],
         cl ? x[1] : x[2],
         cl ? x[2] : x[3],
         w[0],
         w[ohwi ? 1 : 2],
         w[ohwi ? 2 : 3],
         cl ? y[1] : y[2],
         cl ? y[2] : y[3],
         prm.groups,
         s[0],
         s[1],
         d[0],
         d[1],
         p[0],
         p[1],
         p[2],
         p[3],
         cl};
  g.ohwi = ohwi;
  return g;
}

// The epilogue's inputs, read once.
template <typename Y>
struct Epilogue {
  std::vector<double> mult;  // x_scale * w_scale per output channel
  const float* bias = nullptr;
  const int32_t* ibias = nullptr;  // an i32 bias adds to the integer sum
  quant_math::Residual res;       // f32, or i8/u8 dequantized on the way
  int act = quant_math::kNone;  // quant_math::Activation
  double sy = 1;
  int32_t zy = 0;
  Y* out = nullptr;
  // Output element t (flat, in the output's layout) of channel o from its exact sum.
  void operator()(int64_t t, int64_t o, int32_t acc) const {
    if (ibias) acc += ibias[o];
    out[t] = quant_math::requantize<Y>(acc, mult[o], bias ? bias[o] : 0.0, res.at(t), act, sy,
                                       zy);
  }
};

template <typename Y>
Epilogue<Y> epilogue(KernelContext& ctx, const QuantizedConvParams& p, int64_t O) {
  Epilogue<Y> e;
  const double sa = *ctx.in(1).ptr<float>();
  const float* sw = ctx.in(4).ptr<float>();
  const bool per_channel = ctx.in(4).numel() != 1;
  e.mult.resize(static_cast<size_t>(O));
  for (int64_t o = 0; o < O; ++o) e.mult[o] = sa * static_cast<double>(sw[per_channel ? o : 0]);
  int next = 8;
  if (p.has_bias) {
    const TensorView& b = ctx.in(next++);
    if (b.dtype == DType::i32)
      e.ibias = b.ptr<int32_t>();
    else
      e.bias = b.ptr<float>();
  }
  e.res = residual_input(ctx, next, p);
  e.act = epilogue_activation(p);
  e.sy = *ctx.in(6).ptr<float>();
  e.zy = *ctx.in(7).ptr<Y>();
  e.out = ctx.out(0).ptr<Y>();
  return e;
}

template <typename W>
int32_t w_zero(const KernelContext& ctx, int64_t o) {
  const W* zw = ctx.in(5).ptr<W>();
  return ctx.in(5).numel() == 1 ? int32_t{zw[0]} : int32_t{zw[o]};
}

// Direct loops, exact on every CPU (the path where oneDNN's int8 convolutions are not exact):
// per task (n, group, output row), the row's windows gathered once as int16 x - zx (0 where a
// window passes the border: padding holds zx), then each output channel's int16 w - zw dotted
// with each window, summed in i32 (|(x - zx)(w - zw)| <= 255², so pairs of products fit), which
// the compiler vectorizes (vpmaddwd on x86).
template <typename A, typename W, typename Y>
void conv_loops(KernelContext& ctx, const Geom& g, const Epilogue<Y>& fin) {
  const A* X = ctx.in(0).ptr<A>();
  const W* Wt = ctx.in(3).ptr<W>();
  const int32_t zx = *ctx.in(2).ptr<A>();
  const int64_t win = g.window(), cg = g.cg(), og = g.og(), groups = g.G;
  std::vector<int16_t> wd(static_cast<size_t>(g.O * win));
  for (int64_t o = 0; o < g.O; ++o) {
    const int32_t z = w_zero<W>(ctx, o);
    for (int64_t i = 0; i < win; ++i) {
      // window index i = (c kh + kh) kw + kw; (O, kh, kw, C) weights hold it at (kh kw + kw) C + c
      const int64_t c = i / (g.KH * g.KW), k = i % (g.KH * g.KW);
      const int64_t at = g.ohwi ? k * cg + c : i;
      wd[o * win + i] = static_cast<int16_t>(int32_t{Wt[o * win + at]} - z);
    }
  }
  const int64_t xh = g.x_at(0, 0, 1, 0), xw = g.x_at(0, 0, 0, 1);  // x's strides along h and w
  const int64_t row_work = std::max<int64_t>(g.OW * win * og, 1);
  ctx.parallel_for(
      g.N * groups * g.OH, std::max<int64_t>(1, 65536 / row_work), [&](int64_t t0, int64_t t1) {
        std::vector<int16_t> cols(static_cast<size_t>(g.OW * win));
        for (int64_t t = t0; t < t1; ++t) {
          const int64_t oh = t % g.OH, grp = (t / g.OH) % groups, n = t / (g.OH * groups);
          for (int64_t ow = 0; ow < g.OW; ++ow)
            for (int64_t c = 0; c < cg; ++c) {
              const A* x = X + g.x_at(n, grp * cg + c, 0, 0);
              for (int64_t kh = 0; kh < g.KH; ++kh) {
                const int64_t ih = oh * g.sh - g.pt + kh * g.dh;
                int16_t* dst = cols.data() + ow * win + (c * g.KH + kh) * g.KW;
                for (int64_t kw = 0; kw < g.KW; ++kw) {
                  const int64_t iw = ow * g.sw - g.pl + kw * g.dw;
                  const bool inside = ih >= 0 && ih < g.H && iw >= 0 && iw < g.W;
                  dst[kw] = inside ? static_cast<int16_t>(int32_t{x[ih * xh + iw * xw]} - zx) : 0;
                }
              }
            }
          for (int64_t o = grp * og; o < (grp + 1) * og; ++o) {
            const int16_t* w = wd.data() + o * win;
            for (int64_t ow = 0; ow < g.OW; ++ow) {
              const int16_t* col = cols.data() + ow * win;
              int32_t acc = 0;
              for (int64_t i = 0; i < win; ++i) acc += int32_t{col[i]} * int32_t{w[i]};
              fin(g.y_at(n, o, oh, ow), o, acc);
            }
          }
        }
      });
}

// raw (N, OH, OW, O) = sum x w (no zero points) through oneDNN on src (N, hin, win, C), both
// NHWC (the layout its int8 convolutions run on: no reorders), with the given pads.
template <typename A>
void raw_conv_dnnl(KernelContext& ctx, const Geom& g, const void* src, int64_t hin, int64_t win,
                   const du::Dims& pad_l, const du::Dims& pad_r, int32_t* raw) {
  using dt = dnnl::memory::data_type;
  using tag = dnnl::memory::format_tag;
  const dt at = std::is_same_v<A, uint8_t> ? dt::u8 : dt::s8;
  const du::Dims key{static_cast<int64_t>(ctx.op()),
                     g.N,
                     g.C,
                     hin,
                     win,
                     g.O,
                     g.KH,
                     g.KW,
                     g.G * 2 + g.ohwi,
                     g.sh,
                     g.sw,
                     g.dh,
                     g.dw,
                     pad_l[0],
                     pad_l[1],
                     pad_r[0],
                     pad_r[1],
                     static_cast<int64_t>(at)};
  auto p = du::cached(ctx.op_name(), key, [&] {
    const du::Dims src_dims{g.N, g.C, hin, win}, dst_dims{g.N, g.O, g.OH, g.OW};
    const du::Dims wei_dims =
        g.G > 1 ? du::Dims{g.G, g.og(), g.cg(), g.KH, g.KW} : du::Dims{g.O, g.C, g.KH, g.KW};
    const dnnl::memory::desc src_md(src_dims, at, tag::nhwc),
        wei_user(wei_dims, dt::s8, g.G > 1 ? tag::goihw : g.ohwi ? tag::ohwi : tag::oihw),
        dst_md(dst_dims, dt::s32, tag::nhwc), wei_any(wei_dims, dt::s8, tag::any);
    dnnl::convolution_forward::desc d(dnnl::prop_kind::forward_inference,
                                      dnnl::algorithm::convolution_direct, src_md, wei_any,
                                      dnnl::memory::desc(), dst_md, du::Dims{g.sh, g.sw},
                                      du::Dims{g.dh - 1, g.dw - 1}, pad_l, pad_r);
    dnnl::convolution_forward::primitive_desc pd(d, du::attr(), du::engine());
    return du::CachedPrimitive{dnnl::convolution_forward(pd),
                               {du::make_arg(DNNL_ARG_SRC, src_md, pd.src_desc()),
                                du::make_arg(DNNL_ARG_WEIGHTS, wei_user, pd.weights_desc()),
                                du::make_arg(DNNL_ARG_DST, dst_md, pd.dst_desc(), true)},
                               pd.scratchpad_desc()};
  });
  du::execute(ctx.op_name(), *p, {const_cast<void*>(src), ctx.in(3).data, raw});
}

// x as NHWC for oneDNN: x itself when it is NHWC and needs no padding here, else a copy (with
// the pads filled with x_zp: oneDNN pads with 0, so with a zero point every window is made full).
template <typename A>
struct NhwcSource {
  const A* data;
  int64_t hin, win;
  du::Dims pad_l, pad_r;
};

template <typename A>
NhwcSource<A> nhwc_source(KernelContext& ctx, const Geom& g) {
  const A* X = ctx.in(0).ptr<A>();
  const A zx = *ctx.in(2).ptr<A>();
  const bool pad_here = (g.pt || g.pl || g.pb || g.pr) && zx != 0;
  if (g.cl && !pad_here) return {X, g.H, g.W, {g.pt, g.pl}, {g.pb, g.pr}};
  const int64_t top = pad_here ? g.pt : 0, left = pad_here ? g.pl : 0;
  const int64_t hin = pad_here ? g.H + g.pt + g.pb : g.H, win = pad_here ? g.W + g.pl + g.pr : g.W;
  A* P = static_cast<A*>(ctx.scratch(static_cast<size_t>(g.N * hin * win * g.C) * sizeof(A)));
  const int64_t xc = g.x_at(0, 1, 0, 0);
  ctx.parallel_for(g.N * hin, std::max<int64_t>(1, 16384 / std::max<int64_t>(win * g.C, 1)),
                   [&](int64_t r0, int64_t r1) {
                     for (int64_t r = r0; r < r1; ++r) {
                       const int64_t n = r / hin, ih = r % hin - top;
                       A* row = P + r * win * g.C;
                       for (int64_t w = 0; w < win; ++w) {
                         const int64_t iw = w - left;
                         A* px = row + w * g.C;
                         if (ih < 0 || ih >= g.H || iw < 0 || iw >= g.W) {
                           std::fill(px, px + g.C, zx);
                           continue;
                         }
                         const A* xs = X + g.x_at(n, 0, ih, iw);
                         if (g.cl)
                           std::copy(xs, xs + g.C, px);
                         else
                           for (int64_t c = 0; c < g.C; ++c) px[c] = xs[c * xc];
                       }
                     }
                   });
  if (pad_here) return {P, hin, win, {0, 0}, {0, 0}};
  return {P, hin, win, {g.pt, g.pl}, {g.pb, g.pr}};
}

// x_zp * sum of each output channel's weights: what sum x w exceeds sum (x - x_zp) w by over a
// full window.
std::vector<int32_t> zero_point_correction(KernelContext& ctx, const Geom& g, int32_t zx) {
  std::vector<int32_t> corr(static_cast<size_t>(g.O), 0);
  if (zx == 0) return corr;
  const int8_t* Wt = ctx.in(3).ptr<int8_t>();
  const int64_t wn = g.window();
  for (int64_t o = 0; o < g.O; ++o) {
    int32_t s = 0;
    for (int64_t i = 0; i < wn; ++i) s += Wt[o * wn + i];
    corr[o] = zx * s;
  }
  return corr;
}

// The i32 sums from oneDNN, then kiln's exact epilogue into the output's layout.
template <typename A, typename Y>
void conv_dnnl(KernelContext& ctx, const Geom& g, const Epilogue<Y>& fin) {
  const NhwcSource<A> src = nhwc_source<A>(ctx, g);
  const int64_t plane = g.OH * g.OW, total = g.N * g.O * plane;
  int32_t* raw = static_cast<int32_t*>(ctx.scratch(static_cast<size_t>(total) * 4));
  raw_conv_dnnl<A>(ctx, g, src.data, src.hin, src.win, src.pad_l, src.pad_r, raw);
  const std::vector<int32_t> corr = zero_point_correction(ctx, g, *ctx.in(2).ptr<A>());
  // raw is NHWC: one output row (n, oh) per task
  ctx.parallel_for(g.N * g.OH, std::max<int64_t>(1, 16384 / std::max<int64_t>(g.OW * g.O, 1)),
                   [&](int64_t r0, int64_t r1) {
                     for (int64_t r = r0; r < r1; ++r) {
                       const int64_t n = r / g.OH, oh = r % g.OH;
                       for (int64_t ow = 0; ow < g.OW; ++ow) {
                         const int32_t* px = raw + (r * g.OW + ow) * g.O;
                         for (int64_t o = 0; o < g.O; ++o)
                           fin(g.y_at(n, o, oh, ow), o, px[o] - corr[o]);
                       }
                     }
                   });
}

// NHWC in and out, the epilogue inside oneDNN's convolution (f32):
//   y = (act(mult (acc + b') [+ residual]) / y_scale + y_zp), rounded half to even, saturated,
// (a quantized residual r with scale sr and zero point zr as sr (v/sr - zr + r): output scales
// mult / sr, zr in the bias, the raw integers added by the binary post-op, then sr / y_scale; a
// GELU takes the real values: mult as the output scales, then GELU, then 1 / y_scale; relu
// commutes with the positive scales)
// with b' = bias / mult (or the i32 bias) - x_zp sum w. The scales are part of the primitive (its
// cache key holds their bits). False where oneDNN cannot take the scales (a zero mult).
template <typename A, typename Y>
bool conv_dnnl_fused(KernelContext& ctx, const Geom& g, const Epilogue<Y>& fin) {
  using dt = dnnl::memory::data_type;
  using tag = dnnl::memory::format_tag;
  if (!(fin.sy > 0)) return false;
  for (double m : fin.mult)
    if (!(m != 0 && std::isfinite(m))) return false;
  using R = quant_math::Residual;
  const bool res = fin.res.kind != R::kNone, qres = res && fin.res.kind != R::kF32;
  const float sr = qres ? *fin.res.scale : 1.0f;
  const float zr = !qres                      ? 0.0f
                   : fin.res.kind == R::kU8 ? *static_cast<const uint8_t*>(fin.res.zp)
                                              : *static_cast<const int8_t*>(fin.res.zp);
  if (qres && !(sr > 0 && std::isfinite(sr))) return false;
  // a GELU after a quantized residual takes the exact epilogue (oneDNN 2.6 wrote zeros for
  // binary add, a linear back to real values, then gelu)
  const bool gelu = quant_math::is_gelu(fin.act);
  if (gelu && qres) return false;
  // the output scales: mult, or mult / y_scale where nothing is added after them and no GELU
  // wants the real values
  std::vector<float> oscale(fin.mult.size());
  for (size_t o = 0; o < oscale.size(); ++o)
    oscale[o] = static_cast<float>(qres           ? fin.mult[o] / sr
                                   : res || gelu ? fin.mult[o]
                                                 : fin.mult[o] / fin.sy);
  const float post_scale = gelu   ? static_cast<float>(1.0 / fin.sy)
                           : res ? static_cast<float>(qres ? sr / fin.sy : 1.0 / fin.sy)
                                 : 1.0f;
  const NhwcSource<A> src = nhwc_source<A>(ctx, g);
  const dt at = std::is_same_v<A, uint8_t> ? dt::u8 : dt::s8;
  const dt yt = std::is_same_v<Y, uint8_t> ? dt::u8 : dt::s8;
  du::Dims key{static_cast<int64_t>(ctx.op()), 1, g.N, g.C, src.hin, src.win, g.O, g.KH, g.KW,
               g.G * 2 + g.ohwi, g.sh, g.sw, g.dh, g.dw, src.pad_l[0], src.pad_l[1], src.pad_r[0],
               src.pad_r[1], static_cast<int64_t>(at), static_cast<int64_t>(yt),
               static_cast<int64_t>(fin.res.kind), fin.act, fin.zy};
  uint32_t bits = 0;
  for (float f : oscale) {
    std::memcpy(&bits, &f, 4);
    key.push_back(bits);
  }
  for (float f : {post_scale, sr, zr}) {
    std::memcpy(&bits, &f, 4);
    key.push_back(bits);
  }
  auto p = du::cached(ctx.op_name(), key, [&] {
    const du::Dims src_dims{g.N, g.C, src.hin, src.win}, dst_dims{g.N, g.O, g.OH, g.OW};
    const du::Dims wei_dims =
        g.G > 1 ? du::Dims{g.G, g.og(), g.cg(), g.KH, g.KW} : du::Dims{g.O, g.C, g.KH, g.KW};
    const dnnl::memory::desc src_md(src_dims, at, tag::nhwc),
        wei_user(wei_dims, dt::s8, g.G > 1 ? tag::goihw : g.ohwi ? tag::ohwi : tag::oihw),
        wei_any(wei_dims, dt::s8, tag::any), bias_md({g.O}, dt::f32, tag::a),
        dst_md(dst_dims, yt, tag::nhwc),
        res_md(dst_dims,
               !qres ? dt::f32 : fin.res.kind == quant_math::Residual::kU8 ? dt::u8 : dt::s8,
               tag::nhwc);
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    attr.set_output_scales(1 << 1, oscale);
    dnnl::post_ops ops;
    if (res) ops.append_binary(dnnl::algorithm::binary_add, res_md);
    append_activation(ops, fin.act);
    if (post_scale != 1.0f || fin.zy != 0)
      ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_linear, post_scale,
                         static_cast<float>(fin.zy));
    attr.set_post_ops(ops);
    dnnl::convolution_forward::desc d(
        dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct, src_md, wei_any,
        bias_md, dst_md, du::Dims{g.sh, g.sw}, du::Dims{g.dh - 1, g.dw - 1}, src.pad_l, src.pad_r);
    dnnl::convolution_forward::primitive_desc pd(d, attr, du::engine());
    std::vector<du::Arg> args{du::make_arg(DNNL_ARG_SRC, src_md, pd.src_desc()),
                              du::make_arg(DNNL_ARG_WEIGHTS, wei_user, pd.weights_desc()),
                              du::make_arg(DNNL_ARG_BIAS, bias_md, pd.bias_desc()),
                              du::make_arg(DNNL_ARG_DST, dst_md, pd.dst_desc(), true)};
    if (res)
      args.push_back(
          du::make_arg(DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1, res_md, res_md));
    return du::CachedPrimitive{dnnl::convolution_forward(pd), std::move(args),
                               pd.scratchpad_desc()};
  });
  // b' in the integer sum's units
  const std::vector<int32_t> corr = zero_point_correction(ctx, g, *ctx.in(2).ptr<A>());
  auto* bias = static_cast<float*>(ctx.scratch(static_cast<size_t>(g.O) * sizeof(float)));
  for (int64_t o = 0; o < g.O; ++o) {
    const double b = fin.ibias ? fin.ibias[o] : fin.bias ? fin.bias[o] / fin.mult[o] : 0.0;
    // (a quantized residual's zero point, in the same units: the add then takes raw integers)
    const double zr_units = qres ? static_cast<double>(zr) * sr / fin.mult[o] : 0.0;
    bias[o] = static_cast<float>(b - corr[o] - zr_units);
  }
  std::vector<void*> buffers{const_cast<A*>(src.data), ctx.in(3).data, bias, fin.out};
  if (res) buffers.push_back(const_cast<void*>(fin.res.data));
  du::execute(ctx.op_name(), *p, buffers);
  return true;
}

template <typename A, typename W, typename Y>
void quantized_conv_impl(KernelContext& ctx, const QuantizedConvParams& p, bool nhwc) {
  const Geom g = geometry(ctx, p, nhwc);
  if (ctx.out(0).numel() == 0) return;
  const Epilogue<Y> fin = epilogue<Y>(ctx, p, g.O);
  if constexpr (std::is_same_v<W, int8_t>) {
    bool zero_w = true;
    for (int64_t i = 0; i < ctx.in(5).numel(); ++i) zero_w = zero_w && ctx.in(5).ptr<W>()[i] == 0;
    const int64_t macs = ctx.out(0).numel() * g.window();
    if (zero_w && g.window() > 0 && dnnl_int8_exact() && macs >= (1 << 15)) {
      if (!(g.cl && conv_dnnl_fused<A, Y>(ctx, g, fin))) conv_dnnl<A, Y>(ctx, g, fin);
      return;
    }
  }
  conv_loops<A, W, Y>(ctx, g, fin);
}

// quantize_x: f32 NCHW x quantized per tensor as quantize does, into an int8 copy (NHWC in layout
// channels_last), then `kernel`, the op's kernel for the layout, on it without quantize_x.
template <typename A>
void conv_of_float(KernelContext& ctx, bool cl, void (*kernel)(KernelContext&)) {
  const TensorView& x = ctx.in(0);
  const Shape& s = x.shape;
  const int64_t N = s[0], C = s[1], HW = s[2] * s[3];
  auto* q = static_cast<A*>(ctx.scratch(static_cast<size_t>(x.numel())));
  const float* xf = x.ptr<float>();
  const float sx = ctx.in(1).ptr<float>()[0];
  const A zx = ctx.in(2).ptr<A>()[0];
  ctx.parallel_for(N * C, 1, [&](int64_t b, int64_t e) {
    for (int64_t nc = b; nc < e; ++nc) {
      const int64_t n = nc / C, c = nc % C;
      const float* src = xf + nc * HW;
      A* dst = cl ? q + n * HW * C + c : q + nc * HW;
      const int64_t step = cl ? C : 1;
      for (int64_t i = 0; i < HW; ++i) dst[i * step] = quant_math::quantize_one(src[i], sx, zx);
    }
  });
  conv_on_quantized_x(ctx, q, cl, kernel);
}

// The kernel of layout plain (NHWC false) or channels_last (NHWC true).
template <bool NHWC> void quantized_conv_in(KernelContext& ctx) {
  const QuantizedConvParams p = params_of<QuantizedConvParams>(ctx);
  // (with quantize_x, x is f32 and its zero point has the data's dtype)
  const DType data = p.quantize_x ? ctx.in(2).dtype : ctx.in(0).dtype;
  with_int8_types(ctx, data, "cpu", [&](auto a, auto w, auto y) {
    if (p.quantize_x) conv_of_float<decltype(a)>(ctx, NHWC, quantized_conv_in<NHWC>);
    else quantized_conv_impl<decltype(a), decltype(w), decltype(y)>(ctx, p, NHWC);
  });
}

}  // namespace

void quantized_conv(KernelContext& ctx) { quantized_conv_in<false>(ctx); }
void quantized_conv_channels_last(KernelContext& ctx) { quantized_conv_in<true>(ctx); }

}  // namespace kiln::cpu
