// The quant family's attributes (src/ops/quant.cpp documents them) decoded once into the structs
// their kernels read. (C++17: CUDA files include it.)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/errors.h"
#include "core/op_params.h"
#include "kiln/attrs.h"

namespace kiln {

/// quantize, dequantize, fake_quantize: the resolved axis (>= 0) and block size (0: one scale
/// per channel along the axis). A 0-d scale reads neither.
struct QuantizeParams : OpParams {
  int64_t axis = 0, block_size = 0;

  static QuantizeParams decode(OpId, const Attrs& a) {
    QuantizeParams p;
    p.axis = a.i("axis");
    p.block_size = a.i("block_size");
    return p;
  }
};

/// The epilogue of the fused int8 products (quantized_matmul, quantized_conv, whose params derive
/// from it): the optional inputs after the eight operands, the activation, and whether the
/// weights' zero points are a constant of zeros.
struct QuantEpilogueParams : OpParams {
  enum class Gelu : uint8_t { none, erf, tanh };
  /// A bias at input 8, then a residual of the output's shape (quantized_residual: i8/u8, its
  /// 0-d scale and zero point after it; quantized_conv only).
  bool has_bias = false, has_residual = false, quantized_residual = false;
  /// The activation after the additions: relu, or a GELU (relu wins where a node has both; the
  /// op's inference rejects that).
  bool relu = false;
  Gelu gelu = Gelu::none;
  /// w's zero points are a constant of zeros (set by fuse_quant and the channels_last pass).
  bool zero_w_zp = false;

  static QuantEpilogueParams decode(OpId, const Attrs& a) {
    QuantEpilogueParams p;
    p.decode_epilogue(a);
    return p;
  }

 protected:
  void decode_epilogue(const Attrs& a) {
    has_bias = a.b("has_bias", false);
    has_residual = a.b("has_residual", false);
    quantized_residual = a.b("quantized_residual", false);
    relu = a.b("relu", false);
    if (a.has("gelu")) gelu = a.str("gelu") == "tanh" ? Gelu::tanh : Gelu::erf;
    zero_w_zp = a.b("zero_w_zp", false);
  }
};

/// quantized_matmul: w is (N, K) with transpose_w, else (K, N).
struct QuantizedMatmulParams : QuantEpilogueParams {
  bool transpose_w = false;

  static QuantizedMatmulParams decode(OpId, const Attrs& a) {
    QuantizedMatmulParams p;
    p.decode_epilogue(a);
    p.transpose_w = a.b("transpose_w");
    return p;
  }
};

/// quantized_conv (2-D): conv's geometry and the layouts of x and w.
struct QuantizedConvParams : QuantEpilogueParams {
  /// (h, w) steps; pads are top, left, bottom, right.
  int64_t stride[2] = {1, 1}, dilation[2] = {1, 1}, pads[4] = {0, 0, 0, 0};
  int64_t groups = 1;
  /// w is (O, kh, kw, C) (groups 1; set by the channels_last pass for constant weights).
  bool weights_ohwi = false;
  /// x is f32 NCHW in every layout, read as quantize(x, x_scale, x_zp) of x_zp's dtype.
  bool quantize_x = false;

  static QuantizedConvParams decode(OpId op, const Attrs& a) {
    QuantizedConvParams p;
    p.decode_epilogue(a);
    const std::vector<int64_t>& s = a.ints("stride");
    const std::vector<int64_t>& d = a.ints("dilation");
    const std::vector<int64_t>& pad = a.ints("pads");
    if (s.size() != 2 || d.size() != 2 || pad.size() != 4)
      fail<ValueError>("[{}] needs stride and dilation of 2 values and pads of 4, got {}",
                       op_name(op), a.to_string());
    for (int i = 0; i < 2; ++i) p.stride[i] = s[i], p.dilation[i] = d[i];
    for (int i = 0; i < 4; ++i) p.pads[i] = pad[i];
    p.groups = a.i("groups");
    p.weights_ohwi = a.b("weights_ohwi", false);
    p.quantize_x = a.b("quantize_x", false);
    return p;
  }
};

/// quantized_weight_linear: a bias at input 4.
struct QuantizedWeightLinearParams : OpParams {
  bool has_bias = false;

  static QuantizedWeightLinearParams decode(OpId, const Attrs& a) {
    QuantizedWeightLinearParams p;
    p.has_bias = a.b("has_bias", false);
    return p;
  }
};

}  // namespace kiln
