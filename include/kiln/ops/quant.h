// Integer quantization: quantize, dequantize and fake_quantize (docs/quantization.md).
//
// A scale (and its zero point, of the same shape) applies
//   per tensor   when it is 0-d (or 1-D of one value),
//   per channel  when it is 1-D with x.shape[axis] values (block_size 0),
//   per group    when block_size > 0: it has x's rank and shape except along `axis`, where it
//                has ceil(x.shape[axis] / block_size) values, one per block of block_size.
// Results follow numpy (and ONNX's reference) bit for bit: x / scale divides in x's float type
// (f16/bf16 in f32), rounds half to even, adds the zero point and saturates to the integer
// type's range (NaN saturates low); dequantize computes (float32(q) - float32(zp)) * scale
// (f64 for i32 data).
#pragma once

#include <optional>

#include "kiln/graph.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/nn.h"

namespace kiln {

struct QuantizeOptions {
  /// The axis a 1-D scale runs along, or the blocks run along (negative counts from the end).
  int64_t axis = 1;
  /// Values per block along `axis` for per-group scales (0: per tensor or per channel).
  int64_t block_size = 0;
};

/// saturate(round_half_even(x / scale) + zero_point) in zero_point's dtype (i8, u8, i16, u16).
/// x is a float tensor; scale is cast to x's dtype.
Tensor quantize(const Tensor& x, const Tensor& scale, const Tensor& zero_point,
                const QuantizeOptions& options = {});
/// Symmetric: zero point 0, result of `dtype` (i8, u8, i16 or u16).
Tensor quantize(const Tensor& x, const Tensor& scale, DType dtype = DType::i8,
                const QuantizeOptions& options = {});

/// (q - zero_point) * scale in scale's float dtype; q is i8, u8, i16, u16 or i32 and zero_point has
/// q's dtype. Differentiable in scale.
Tensor dequantize(const Tensor& q, const Tensor& scale, const Tensor& zero_point,
                  const QuantizeOptions& options = {});
/// Symmetric: zero point 0.
Tensor dequantize(const Tensor& q, const Tensor& scale, const QuantizeOptions& options = {});

/// dequantize(quantize(x, ...), ...) in one op, in x's dtype, for quantization-aware training.
/// Its gradient is straight-through, masked to the representable range: the cotangent passes
/// where (qmin - zp) * scale <= x <= (qmax - zp) * scale and is zero elsewhere (scale and zero
/// point get none).
Tensor fake_quantize(const Tensor& x, const Tensor& scale, const Tensor& zero_point,
                     const QuantizeOptions& options = {});
/// Symmetric: zero point 0 of `dtype`.
Tensor fake_quantize(const Tensor& x, const Tensor& scale, DType dtype = DType::i8,
                     const QuantizeOptions& options = {});

/// Integer data with its scale and zero point (as dequantize takes them).
struct QTensor {
  Tensor q, scale, zero_point;
};

struct QuantizedMatmulOptions {
  /// w is (N, K), as linear takes it (else (K, N), as matmul takes it).
  bool transpose_w = false;
  /// Float (N) added to every row of the product.
  std::optional<Tensor> bias;
  /// Float tensor of the output's shape added after the bias.
  std::optional<Tensor> residual;
  /// max(0, .) after the additions.
  bool relu = false;
  /// gelu(., approximate) after the additions instead (not with relu).
  std::optional<GeluApprox> gelu;
};

/// The int8 product the fuse_quant pass builds:
///   quantize(act(dequantize(a) @ dequantize(w) + bias + residual), y_scale, y_zero_point)
/// with act relu, gelu or none
/// computed with exact integer accumulation: a (..., K) is i8/u8 with a 0-d f32 scale and zero
/// point; w is i8/u8 with a 0-d or per-output-channel (N) f32 scale and zero point; y_scale and
/// y_zero_point are 0-d, and y_zero_point's dtype (i8 or u8) is the result's. Within 1 LSB of
/// the unfused graph. Not differentiable.
Tensor quantized_matmul(const QTensor& a, const QTensor& w, const Tensor& y_scale,
                        const Tensor& y_zero_point, const QuantizedMatmulOptions& options = {});

struct QuantizedConvOptions {
  /// conv2d's geometry: stride, padding (incl. asymmetric and same/valid), dilation, groups.
  ConvOptions conv;
  /// (O) added to every output channel: f32 after scaling, or i32 to the integer sum before
  /// scaling (ONNX QLinearConv's bias, in units of x_scale * w_scale).
  std::optional<Tensor> bias;
  /// Float tensor of the output's shape added after the bias.
  std::optional<Tensor> residual;
  /// max(0, .) after the additions.
  bool relu = false;
  /// gelu(., approximate) after the additions instead (not with relu).
  std::optional<GeluApprox> gelu;
};

/// The int8 convolution the fuse_quant pass builds:
///   quantize(act(conv2d(dequantize(x), dequantize(w), bias) + residual), y_scale, y_zero_point)
/// with act relu, gelu or none
/// computed with exact integer accumulation: x (N, C, H, W) is i8/u8 with a 0-d f32 scale and
/// zero point; w (O, C/groups, kh, kw) is i8 with a 0-d or per-output-channel (O) f32 scale and
/// an i8 zero point of the scale's shape; y_scale and y_zero_point are 0-d, and y_zero_point's
/// dtype (i8 or u8) is the result's. Within 1 LSB of the unfused graph. Not differentiable.
Tensor quantized_conv(const QTensor& x, const QTensor& w, const Tensor& y_scale,
                      const Tensor& y_zero_point, const QuantizedConvOptions& options = {});

/// linear(x, dequantize(w), bias) with the weights kept int8: x (..., K) f32, w (N, K) i8/u8 with
/// a 0-d or per-output-channel (N) f32 scale and a zero point of w's dtype and the scale's shape,
/// bias (N) f32; the result (..., N) is f32. Each weight is dequantized as dequantize does,
/// (f32(w) - f32(zp)) * scale, on the way into the product: the result equals the unfused graph's
/// up to the order of the sums (for a few rows, CUDA reads a quarter of the weight bytes and no
/// f32 copy is made). The fuse_quant pass builds it from linear(x, dequantize(w)) (post-training
/// quantization's float classifier). Not differentiable.
Tensor quantized_weight_linear(const Tensor& x, const QTensor& w,
                               const std::optional<Tensor>& bias = std::nullopt);

/// adaptive_avg_pool(dequantize(q, scale, zero_point), output_size) in one op: q (N, C, H, W) i8/u8
/// with a 0-d f32 scale and a zero point of q's dtype, output_size (oh, ow); the result
/// (N, C, oh, ow) is f32. Each element is dequantized as dequantize does and the window's values
/// are summed in f32 (window order) and divided by their count, so the result equals the
/// unfused graph's up to the order of the sums; the f32 copy of q is never written. The
/// fuse_quant pass builds it from adaptive_avg_pool(dequantize(q)) (a quantized CNN's global
/// average pool before its float classifier). Not differentiable.
Tensor dequantize_adaptive_avg_pool(const QTensor& q, const std::vector<int64_t>& output_size);

}  // namespace kiln
