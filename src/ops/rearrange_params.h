// The rearrange family's attributes (src/ops/rearrange.cpp documents them) decoded once into the
// structs its kernels read. embedding's kernels read no attributes. (C++17: CUDA files include it.)
#pragma once

#include <cstdint>
#include <vector>

#include "core/op_id.h"
#include "core/op_params.h"

namespace kiln {

/// depth_to_space, space_to_depth.
struct SpaceDepthParams : OpParams {
  int64_t block_size = 1;
  /// mode "CRD" (any other mode reads as "DCR").
  bool crd = false;
  /// x and the output are NHWC.
  bool channels_last = false;

  static SpaceDepthParams decode(OpId, const Attrs& a) {
    SpaceDepthParams p;
    p.block_size = a.i("block_size");
    p.crd = a.str("mode") == "CRD";
    p.channels_last = a.b("channels_last");
    return p;
  }
};

/// embedding_grad: the row whose gradient stays zero, or -1 for none.
struct EmbeddingGradParams : OpParams {
  int64_t padding_idx = -1;

  static EmbeddingGradParams decode(OpId, const Attrs& a) {
    EmbeddingGradParams p;
    p.padding_idx = a.i("padding_idx");
    return p;
  }
};

/// masked_fill: the value written where the mask is true (converted to x's dtype).
struct MaskedFillParams : OpParams {
  double value = 0;

  static MaskedFillParams decode(OpId, const Attrs& a) {
    MaskedFillParams p;
    p.value = a.f("value");
    return p;
  }
};

/// roll: one shift per (resolved, distinct) axis, or one shift and no axes (x flattened).
struct RollParams : OpParams {
  std::vector<int64_t> shifts, axes;

  static RollParams decode(OpId, const Attrs& a) {
    RollParams p;
    p.shifts = a.ints("shifts");
    p.axes = a.ints("axes");
    return p;
  }
};

/// non_max_suppression.
struct NonMaxSuppressionParams : OpParams {
  int64_t max_output_boxes_per_class = 0;
  double iou_threshold = 0;
  /// Scores at or below score_threshold are no candidates (only with has_score_threshold).
  bool has_score_threshold = false;
  double score_threshold = 0;
  /// Boxes are (x_center, y_center, width, height), else corners (y1, x1, y2, x2).
  bool center_point_box = false;

  static NonMaxSuppressionParams decode(OpId, const Attrs& a) {
    NonMaxSuppressionParams p;
    p.max_output_boxes_per_class = a.i("max_output_boxes_per_class");
    p.iou_threshold = a.f("iou_threshold");
    p.has_score_threshold = a.b("has_score_threshold");
    p.score_threshold = a.f("score_threshold");
    p.center_point_box = a.b("center_point_box");
    return p;
  }
};

}  // namespace kiln
