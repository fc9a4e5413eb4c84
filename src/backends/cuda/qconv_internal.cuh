// Pieces of the CUDA quantized_conv kernels shared by quant_conv.cu (the exact kernel and the
// cuBLASLt path) and qconv_igemm.cu (the implicit GEMM): the arguments, the weights as NHWC rows
// and the implicit GEMM's entry. Included by .cu files only.
#pragma once

#include <cstdint>

#include "backends/cuda/cuda_common.cuh"
#include "backends/quant_math.h"

namespace kiln::cuda::qconv_detail {

struct QConvArgs {
  int64_t N, C, H, W, O, KH, KW, OH, OW, G;
  int64_t sh, sw, dh, dw, pt, pl;
  bool relu, per_channel_scale, per_channel_zp;
  bool cl;            // channels_last: x, residual and output NHWC
  bool ohwi;          // weights_ohwi: w is (O, kh, kw, C) (groups 1)
  int act = 0;        // quant_math::Activation after the additions (relu's too)
  bool gemm = false;  // quantized_matmul's product: a 1x1 conv over the rows of a (H = W = 1)
  int64_t kp = 0;     // NHWC im2col row length: C kh kw, padded with zeros to a multiple of 16
                      // where it is not a multiple of 4 (cuBLASLt's int8 rule)
  // the implicit GEMM's rows mode: x copied with pc channels a pixel (C padded), ph x pw pixels
  // an image (the padding and what the last window rows read past it added, holding x's zero
  // point)
  int64_t pc = 0, ph = 0, pw = 0;
  // w[o, c, kh, kw] in the weights' layout (c within the group)
  __host__ __device__ int64_t w_at(int64_t o, int64_t c, int64_t kh, int64_t kw) const {
    return ohwi ? ((o * KH + kh) * KW + kw) * (C / G) + c : ((o * (C / G) + c) * KH + kh) * KW + kw;
  }
  __device__ int64_t x_at(int64_t n, int64_t c, int64_t h, int64_t w) const {
    return cl ? ((n * H + h) * W + w) * C + c : ((n * C + c) * H + h) * W + w;
  }
  // output element t's (n, o, pixel of the plane)
  __device__ void decode(int64_t t, int64_t& n, int64_t& o, int64_t& p) const {
    const int64_t plane = OH * OW;
    if (cl) {
      o = t % O;
      p = (t / O) % plane;
      n = t / (O * plane);
    } else {
      p = t % plane;
      o = (t / plane) % O;
      n = t / (plane * O);
    }
  }
};

// w (O, C, kh, kw) -> (O, kh, kw, C) i8 (u8 shifted), the order of NHWC im2col rows, each row
// padded with zeros to g.kp.
template <typename W> __global__ void weights_khwc_i8(const W* __restrict__ w,
                                                      int8_t* __restrict__ out, QConvArgs g,
                                                      int32_t shift) {
  const int64_t k = g.C * g.KH * g.KW, total = g.O * g.kp;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{blockDim.x} * gridDim.x) {
    const int64_t j = i % g.kp, o = i / g.kp;
    const int64_t c = j % g.C, kw = (j / g.C) % g.KW, kh = j / (g.C * g.KW);
    out[i] = j < k ? static_cast<int8_t>(int32_t{w[g.w_at(o, c, kh, kw)]} - shift) : int8_t{0};
  }
}

// qconv_igemm.cu: the conv on the implicit GEMM, where it takes it (false where it does not).
template <typename A, typename W, typename Y>
bool conv_igemm(KernelContext& ctx, QConvArgs g, const float* bias, const int32_t* ibias,
                const quant_math::Residual& res, const float* xf = nullptr,
                const int8_t* w_oc = nullptr);

}  // namespace kiln::cuda::qconv_detail
