// CUDA kernel of quantized_conv: one thread per output element, the exact i32 sum of
// (x - x_zp)(w - w_zp) over its window (padded positions hold x_zp, i.e. the real value 0) plus
// an i32 bias, then the epilogue the CPU kernel runs (backends/quant_math.h), so results agree
// bit for bit.
#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/kernels.h"
#include "backends/quant_math.h"

namespace kiln::cuda {

namespace {

struct QConvArgs {
  int64_t N, C, H, W, O, KH, KW, OH, OW, G;
  int64_t sh, sw, dh, dw, pt, pl;
  bool relu, per_channel_scale, per_channel_zp;
};

template <typename A, typename W, typename Y>
__global__ void quantized_conv_kernel(const A* __restrict__ x, const float* __restrict__ sx,
                                      const A* __restrict__ zx, const W* __restrict__ w,
                                      const float* __restrict__ sw, const W* __restrict__ zw,
                                      const float* __restrict__ sy, const Y* __restrict__ zy,
                                      const float* __restrict__ bias,
                                      const int32_t* __restrict__ ibias,
                                      const float* __restrict__ res, Y* __restrict__ out,
                                      QConvArgs g) {
  const int64_t total = g.N * g.O * g.OH * g.OW;
  const int64_t cg = g.C / g.G, og = g.O / g.G;
  for (int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; t < total;
       t += int64_t{blockDim.x} * gridDim.x) {
    const int64_t ow = t % g.OW, oh = (t / g.OW) % g.OH, o = (t / (g.OW * g.OH)) % g.O,
                  n = t / (g.OW * g.OH * g.O);
    const int64_t c0 = (o / og) * cg;
    const int32_t x0 = zx[0], w0 = zw[g.per_channel_zp ? o : 0];
    int32_t acc = 0;
    for (int64_t c = 0; c < cg; ++c) {
      const A* xc = x + (n * g.C + c0 + c) * g.H * g.W;
      const W* wc = w + (o * cg + c) * g.KH * g.KW;
      for (int64_t kh = 0; kh < g.KH; ++kh) {
        const int64_t ih = oh * g.sh - g.pt + kh * g.dh;
        if (ih < 0 || ih >= g.H) continue;
        for (int64_t kw = 0; kw < g.KW; ++kw) {
          const int64_t iw = ow * g.sw - g.pl + kw * g.dw;
          if (iw < 0 || iw >= g.W) continue;
          acc += (int32_t{xc[ih * g.W + iw]} - x0) * (int32_t{wc[kh * g.KW + kw]} - w0);
        }
      }
    }
    if (ibias) acc += ibias[o];
    const double mult =
        static_cast<double>(sx[0]) * static_cast<double>(sw[g.per_channel_scale ? o : 0]);
    out[t] = quant_math::requantize<Y>(acc, mult, bias ? bias[o] : 0.0, res ? res[t] : 0.0,
                                       g.relu, static_cast<double>(sy[0]), zy[0]);
  }
}

}  // namespace

void quantized_conv(KernelContext& ctx) {
  const TensorView &tx = ctx.in(0), &tw = ctx.in(3), &ty = ctx.out(0);
  if (ty.numel() == 0) return;
  const auto &s = ctx.attrs().ints("stride"), &d = ctx.attrs().ints("dilation"),
             &p = ctx.attrs().ints("pads");
  QConvArgs g{tx.shape[0], tx.shape[1], tx.shape[2], tx.shape[3], tw.shape[0],
              tw.shape[2], tw.shape[3], ty.shape[2], ty.shape[3], ctx.attrs().i("groups"),
              s[0],        s[1],        d[0],        d[1],        p[0],
              p[1],        ctx.attrs().b("relu"),    ctx.in(4).numel() != 1,
              ctx.in(5).numel() != 1};
  int next = 8;
  const float* bias = nullptr;
  const int32_t* ibias = nullptr;  // adds to the integer sum
  if (ctx.attrs().b("has_bias", false)) {
    const TensorView& b = ctx.in(next++);
    if (b.dtype == DType::i32)
      ibias = b.ptr<int32_t>();
    else
      bias = b.ptr<float>();
  }
  const float* res = ctx.attrs().b("has_residual", false) ? ctx.in(next).ptr<float>() : nullptr;
  auto q8 = [&](DType t, auto&& f) {
    if (t == DType::i8)
      f(int8_t{});
    else if (t == DType::u8)
      f(uint8_t{});
    else
      fail<UnsupportedError>("[{}] cuda kernel got {}", ctx.op_name(), name(t));
  };
  q8(tx.dtype, [&](auto at) {
    q8(tw.dtype, [&](auto wt) {
      q8(ctx.in(7).dtype, [&](auto yt) {
        using A = decltype(at);
        using W = decltype(wt);
        using Y = decltype(yt);
        quantized_conv_kernel<A, W, Y><<<blocks_for(ty.numel()), kThreads, 0, stream_of(ctx)>>>(
            tx.ptr<A>(), ctx.in(1).ptr<float>(), ctx.in(2).ptr<A>(), tw.ptr<W>(),
            ctx.in(4).ptr<float>(), ctx.in(5).ptr<W>(), ctx.in(6).ptr<float>(), ctx.in(7).ptr<Y>(),
            bias, ibias, res, ty.ptr<Y>(), g);
        check_launch(ctx.op_name());
      });
    });
  });
}

}  // namespace kiln::cuda
