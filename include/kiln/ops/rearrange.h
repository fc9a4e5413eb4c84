// Ops that move or pick elements: depth_to_space / space_to_depth (and pixel_shuffle /
// pixel_unshuffle built on them), embedding, masked_fill, roll, non_max_suppression.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "kiln/graph.h"

namespace kiln {

/// How depth_to_space splits channels into blocks (ONNX DepthToSpace `mode`). DCR: channel
/// (bh * b + bw) * C + c goes to block position (bh, bw) of output channel c; CRD: channel
/// (c * b + bh) * b + bw does (PyTorch pixel_shuffle).
enum class SpaceDepthMode { dcr, crd };
struct SpaceDepthOptions {
  SpaceDepthMode mode = SpaceDepthMode::dcr;
  /// NHWC (channels last) instead of NCHW.
  bool channels_last = false;
};
/// Moves b x b blocks of channels into space: (N, C*b*b, H, W) -> (N, C, H*b, W*b) (NCHW; the
/// same dims in NHWC order when channels_last). A permutation of x: any dtype.
Tensor depth_to_space(const Tensor& x, int64_t block_size, const SpaceDepthOptions& options = {});
/// The inverse of depth_to_space with the same options: (N, C, H*b, W*b) -> (N, C*b*b, H, W).
Tensor space_to_depth(const Tensor& x, int64_t block_size, const SpaceDepthOptions& options = {});
/// PyTorch pixel_shuffle: (*, C*r*r, H, W) -> (*, C, H*r, W*r), depth_to_space in CRD mode over
/// any number (>= 0) of leading dims (more than one needs them static).
Tensor pixel_shuffle(const Tensor& x, int64_t upscale_factor);
/// PyTorch pixel_unshuffle: (*, C, H*r, W*r) -> (*, C*r*r, H, W), the inverse of pixel_shuffle.
Tensor pixel_unshuffle(const Tensor& x, int64_t downscale_factor);

/// Rows of `weight` (num_embeddings, ...) picked by `indices` (any integer dtype, each in
/// [0, num_embeddings), else ValueError when the graph runs): shape indices.shape +
/// weight.shape[1:]. Rows at `padding_idx` (negative counts from the end) are read as stored but
/// get no gradient (PyTorch nn.Embedding). The weight gradient is embedding_grad.
Tensor embedding(const Tensor& weight, const Tensor& indices,
                 std::optional<int64_t> padding_idx = std::nullopt);
/// The weight gradient of embedding: (num_embeddings, ...) zeros with each row of `grad`
/// (indices.shape + row shape, float) added to the row its index picks, in index order
/// (deterministic on every backend); indices equal to padding_idx (-1: none) add nothing.
Tensor embedding_grad(const Tensor& indices, const Tensor& grad, int64_t num_embeddings,
                      int64_t padding_idx = -1);

/// x with `value` (cast to x's dtype as cast does) where the bool `mask` is true; mask
/// broadcasts to x's shape (PyTorch masked_fill). The gradient passes where mask is false.
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value);

/// Rotates x by shifts[k] positions along axes[k] (elements leaving one end enter at the other;
/// numpy/PyTorch roll). Empty axes: x is rolled flattened by the one shift, then reshaped back.
Tensor roll(const Tensor& x, const std::vector<int64_t>& shifts,
            const std::vector<int64_t>& axes = {});

struct NonMaxSuppressionOptions {
  /// A box is suppressed when its IoU with a selected box of the same class is above this
  /// (in [0, 1]).
  double iou_threshold = 0;
  /// Only boxes with score above this are candidates (none: every score but NaN).
  std::optional<double> score_threshold;
  /// Boxes as (x_center, y_center, width, height) instead of corners (y1, x1, y2, x2).
  bool center_point_box = false;
};
/// ONNX NonMaxSuppression: per batch and class, greedy selection in descending score order
/// (ties: lower box index first) of at most max_output_boxes_per_class boxes, each suppressing
/// later boxes whose IoU with it exceeds iou_threshold. boxes (B, N, 4) and scores (B, C, N) of a
/// float dtype (scores cast to boxes' dtype). The number of selected boxes depends on the data,
/// so the op returns a fixed-size result and a count: `selected` i64 (B * C * min(max, N), 3)
/// holds count rows (batch, class, box) in ONNX's order (batch, class, then selection order)
/// followed by rows of -1; `count` is an i64 scalar. Slice selected[:count] on the host, or feed
/// both on. Not differentiable.
std::pair<Tensor, Tensor> non_max_suppression(const Tensor& boxes, const Tensor& scores,
                                              int64_t max_output_boxes_per_class,
                                              const NonMaxSuppressionOptions& options = {});

}  // namespace kiln
