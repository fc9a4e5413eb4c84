// The resampling family's attributes (resize, grid_sample; src/ops/resize.cpp documents them)
// decoded once into the structs their kernels and resize's gradient read. The names are checked
// by shape inference. (C++17: CUDA files include it.)
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "core/op_id.h"
#include "core/op_params.h"
#include "kiln/attrs.h"
#include "kiln/shape.h"
#include "ops/grid_sample_util.h"
#include "ops/resize_util.h"

namespace kiln {

/// resize.
struct ResizeParams : OpParams {
  /// mode, coordinate_transformation_mode, nearest_mode, cubic_coeff_a, exclude_outside,
  /// antialias and extrapolation_value, as the coordinate and weight math takes them.
  resize_math::Params math;
  /// One scale per dim, or empty (each dim's scale is then out / in).
  std::vector<double> scales;
  /// The region of interest: every dim's start, then every dim's end; or empty (all of the input).
  std::vector<double> roi;

  /// Dim d of a resize from `in` to `out`: the scale is the given one, or out / in.
  resize_math::Dim dim(const Shape& in, const Shape& out, size_t d) const {
    resize_math::Dim r;
    r.in = in[d];
    r.out = out[d];
    r.scale = scales.empty() ? static_cast<double>(r.out) / static_cast<double>(r.in) : scales[d];
    if (!roi.empty()) {
      r.roi_start = roi[d];
      r.roi_end = roi[d + in.size()];
    }
    return r;
  }

  static ResizeParams decode(OpId, const Attrs& a) {
    ResizeParams p;
    resize_math::Params& m = p.math;
    m.mode = static_cast<resize_math::Mode>(resize_math::mode_from(a.str("mode")));
    m.coord = static_cast<resize_math::Coord>(
        resize_math::coord_from(a.str("coordinate_transformation_mode")));
    m.nearest = static_cast<resize_math::Nearest>(resize_math::nearest_from(a.str("nearest_mode")));
    m.cubic_a = a.f("cubic_coeff_a");
    m.exclude_outside = a.b("exclude_outside");
    m.antialias = a.b("antialias");
    m.extrapolation = a.f("extrapolation_value");
    p.scales = a.floats("scales");
    p.roi = a.floats("roi");
    return p;
  }
};

/// grid_sample.
struct GridSampleParams : OpParams {
  /// mode: "linear", "nearest" or "cubic".
  grid_math::Mode mode = grid_math::Mode::linear;
  /// padding_mode: "zeros", "border" or "reflection".
  grid_math::Padding padding = grid_math::Padding::zeros;
  bool align_corners = false;

  /// The sampling math's params for an x of `spatial` spatial dims.
  grid_math::Params math(int spatial) const {
    grid_math::Params p;
    p.mode = mode;
    p.padding = padding;
    p.align_corners = align_corners;
    p.spatial = spatial;
    return p;
  }

  static GridSampleParams decode(OpId, const Attrs& a) {
    GridSampleParams p;
    const std::string &m = a.str("mode"), &pad = a.str("padding_mode");
    p.mode = m == "nearest" ? grid_math::Mode::nearest
             : m == "cubic" ? grid_math::Mode::cubic
                            : grid_math::Mode::linear;
    p.padding = pad == "border"       ? grid_math::Padding::border
                : pad == "reflection" ? grid_math::Padding::reflection
                                      : grid_math::Padding::zeros;
    p.align_corners = a.b("align_corners");
    return p;
  }
};

}  // namespace kiln
