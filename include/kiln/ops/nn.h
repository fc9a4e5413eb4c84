// Matrix products, convolution and pooling (NCHW layouts).
#pragma once

#include <optional>
#include <utility>
#include <vector>

#include "kiln/graph.h"

namespace kiln {

/// numpy.matmul: batched, batch dims broadcast, 1-D operands promoted and squeezed back.
Tensor matmul(const Tensor& a, const Tensor& b);
/// x · wᵀ + b with w of shape (out_features, in_features).
Tensor linear(const Tensor& x, const Tensor& w, const std::optional<Tensor>& bias = std::nullopt);

enum class PadMode { explicit_, same_upper, same_lower, valid };

struct ConvOptions {
  std::vector<int64_t> stride;    // per spatial dim; empty: all 1
  std::vector<int64_t> padding;   // nd (symmetric) or 2*nd (begins then ends); empty: 0
  std::vector<int64_t> dilation;  // empty: all 1
  /// As ONNX auto_pad: same_* pad so that out = ceil(in / stride), the odd pixel at the end
  /// (same_upper) or the beginning (same_lower); valid: no padding.
  PadMode pad_mode = PadMode::explicit_;
  int64_t groups = 1;
};
/// Convolution (cross-correlation, as PyTorch's) over 1 spatial dim: x (N, C, W),
/// w (O, C/groups, kw), bias (O); the result is (N, O, W'). stride, padding (one per dim, or
/// begins then ends), dilation and groups as PyTorch's; pad_mode as ONNX auto_pad.
Tensor conv1d(const Tensor& x, const Tensor& w, const std::optional<Tensor>& bias = std::nullopt,
              const ConvOptions& opts = {});
/// Convolution (cross-correlation, as PyTorch's) over 2 spatial dims: x (N, C, H, W),
/// w (O, C/groups, kh, kw), bias (O); the result is (N, O, H', W'). stride, padding (one per
/// dim, or begins then ends), dilation and groups as PyTorch's; pad_mode as ONNX auto_pad.
Tensor conv2d(const Tensor& x, const Tensor& w, const std::optional<Tensor>& bias = std::nullopt,
              const ConvOptions& opts = {});
/// Convolution (cross-correlation, as PyTorch's) over 3 spatial dims: x (N, C, D, H, W),
/// w (O, C/groups, kd, kh, kw), bias (O); the result is (N, O, D', H', W'). stride, padding (one
/// per dim, or begins then ends), dilation and groups as PyTorch's; pad_mode as ONNX auto_pad.
Tensor conv3d(const Tensor& x, const Tensor& w, const std::optional<Tensor>& bias = std::nullopt,
              const ConvOptions& opts = {});

/// The gradient of a convolution's weight: dW of `weight_shape` (O, C/groups, kernel...) from
/// the conv's input x (N, C, spatial...) and its output gradient dy (N, O, out...); pad modes
/// resolve as for a conv with a weight of `weight_shape`.
Tensor conv_grad_weight(const Tensor& x, const Tensor& dy, const Shape& weight_shape,
                        const ConvOptions& opts = {});

struct ConvTransposeOptions {
  std::vector<int64_t> stride;
  std::vector<int64_t> padding;         // nd or 2*nd
  std::vector<int64_t> output_padding;  // added to the end of each spatial dim
  std::vector<int64_t> dilation;
  int64_t groups = 1;
};
/// Transposed convolution over 2 spatial dims: x (N, C, H, W), w (C, O/groups, kh, kw), bias (O),
/// as PyTorch's ConvTranspose2d.
Tensor conv_transpose2d(const Tensor& x, const Tensor& w,
                        const std::optional<Tensor>& bias = std::nullopt,
                        const ConvTransposeOptions& opts = {});
/// Transposed convolution over 1 spatial dim: x (N, C, W), w (C, O/groups, kw), bias (O), as
/// PyTorch's ConvTranspose1d.
Tensor conv_transpose1d(const Tensor& x, const Tensor& w,
                        const std::optional<Tensor>& bias = std::nullopt,
                        const ConvTransposeOptions& opts = {});
/// Transposed convolution over 3 spatial dims: x (N, C, D, H, W), w (C, O/groups, kd, kh, kw),
/// bias (O), as PyTorch's ConvTranspose3d.
Tensor conv_transpose3d(const Tensor& x, const Tensor& w,
                        const std::optional<Tensor>& bias = std::nullopt,
                        const ConvTransposeOptions& opts = {});

/// Pooling windows over x: (N, C, spatial...). Output sizes follow PyTorch; each padding side may
/// be at most half the (dilated) kernel.
struct PoolOptions {
  std::vector<int64_t> kernel;    // its length sets 1, 2 or 3 spatial dims
  std::vector<int64_t> stride;    // empty: same as kernel
  std::vector<int64_t> padding;   // nd or 2*nd
  std::vector<int64_t> dilation;  // max pooling only
  bool ceil_mode = false;          // round output sizes up (a window must start before the end pad)
  bool count_include_pad = false;  // average pooling only: divide by the window size with padding
};
/// Max pooling (numeric dtypes); padded positions never win, NaN does.
Tensor max_pool(const Tensor& x, const PoolOptions& opts);
/// Max pooling that also returns, per output, the flat index of the maximum within its
/// (n, c) plane (PyTorch's return_indices convention), as i64.
std::pair<Tensor, Tensor> max_pool_with_indices(const Tensor& x, const PoolOptions& opts);
/// Average pooling (float dtypes).
Tensor avg_pool(const Tensor& x, const PoolOptions& opts);
/// Mean over all spatial dims, keeping them as size 1.
Tensor global_avg_pool(const Tensor& x);
/// PyTorch's adaptive_avg_pool: `output_size` has one entry per spatial dim.
Tensor adaptive_avg_pool(const Tensor& x, const std::vector<int64_t>& output_size);

// Pooling gradients (what autodiff builds); `input_shape` is the forward input's: static, or a
// value (1-d integer, one entry per dim, computed from shapes with shape_of) for inputs whose
// spatial dims are known only at run time.
/// Max pooling's backward (PyTorch's): zeros of input_shape with each element of `grad` added at
/// its plane's flat position in `indices` (max_pool_with_indices' second output, i32 or i64).
/// input_shape may be a value computed from shapes (shape_of the input).
Tensor max_pool_grad(const Tensor& grad, const Tensor& indices, const Shape& input_shape);
Tensor max_pool_grad(const Tensor& grad, const Tensor& indices, const Tensor& input_shape);
/// avg_pool's backward: each element of `grad` spread evenly over its window (same opts).
/// input_shape may be a value computed from shapes (shape_of the input).
Tensor avg_pool_grad(const Tensor& grad, const Shape& input_shape, const PoolOptions& opts);
Tensor avg_pool_grad(const Tensor& grad, const Tensor& input_shape, const PoolOptions& opts);
/// adaptive_avg_pool's backward; the output size is grad's spatial dims. input_shape may be a
/// value computed from shapes (shape_of the input).
Tensor adaptive_avg_pool_grad(const Tensor& grad, const Shape& input_shape);
Tensor adaptive_avg_pool_grad(const Tensor& grad, const Tensor& input_shape);

}  // namespace kiln
