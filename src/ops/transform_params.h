// The transform family's attributes (src/ops/transform.cpp, transform_index.cpp and
// transform_nd.cpp document them) decoded once into the structs its kernels read. reshape, tile,
// broadcast_to and hamming_distance have none: their kernels read only shapes and dtypes.
// (C++17: CUDA files include it.)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/errors.h"
#include "core/op_id.h"
#include "core/op_params.h"
#include "kiln/attrs.h"

namespace kiln {

/// split, concat, gather, gather_elements, coordinate_along_axis: the resolved axis.
struct AxisParams : OpParams {
  int64_t axis = 0;

  static AxisParams decode(OpId, const Attrs& a) {
    AxisParams p;
    p.axis = a.i("axis");
    return p;
  }
};

/// transpose: output dim d is input dim perm[d] (resolved).
struct TransposeParams : OpParams {
  std::vector<int64_t> perm;

  static TransposeParams decode(OpId, const Attrs& a) {
    TransposeParams p;
    p.perm = a.ints("perm");
    return p;
  }
};

/// slice: a start, stop and step per dim, Python semantics, resolved against the concrete shape
/// by transform::slice_dim.
struct SliceParams : OpParams {
  std::vector<int64_t> starts, stops, steps;

  static SliceParams decode(OpId, const Attrs& a) {
    SliceParams p;
    p.starts = a.ints("starts");
    p.stops = a.ints("stops");
    p.steps = a.ints("steps");
    return p;
  }
};

/// pad: the begin and end pads of each dim (a negative pad crops), the mode and the value
/// constant mode fills with.
struct PadParams : OpParams {
  enum class Mode : uint8_t { constant, reflect, edge };
  std::vector<int64_t> pads;
  Mode mode = Mode::constant;
  double value = 0;

  static PadParams decode(OpId, const Attrs& a) {
    PadParams p;
    p.pads = a.ints("pads");
    const std::string& m = a.str("mode");
    if (m == "constant") p.mode = Mode::constant;
    else if (m == "reflect") p.mode = Mode::reflect;
    else if (m == "edge") p.mode = Mode::edge;
    else fail<ValueError>("[pad] unknown mode '{}'", m);
    p.value = a.f("value");
    return p;
  }
};

/// flip: the dims reversed (resolved).
struct FlipParams : OpParams {
  std::vector<int64_t> axes;

  static FlipParams decode(OpId, const Attrs& a) {
    FlipParams p;
    p.axes = a.ints("axes");
    return p;
  }
};

/// one_hot: the axis of the result the depth dim sits at (resolved) and the values written.
struct OneHotParams : OpParams {
  int64_t axis = 0;
  double on_value = 0, off_value = 0;

  static OneHotParams decode(OpId, const Attrs& a) {
    OneHotParams p;
    p.axis = a.i("axis");
    p.on_value = a.f("on_value");
    p.off_value = a.f("off_value");
    return p;
  }
};

/// sort, argsort and topk: the (resolved) axis the lines run along and their order: sort's and
/// argsort's descending, topk's largest (the k largest, largest first).
struct SortParams : OpParams {
  int64_t axis = 0;
  bool descending = false;
  /// topk's k (0 for sort and argsort, which order whole lines).
  int64_t k = 0;

  static SortParams decode(OpId op, const Attrs& a) {
    SortParams p;
    p.axis = a.i("axis");
    if (op == OpId::Topk) {
      p.k = a.i("k");
      p.descending = a.b("largest");
    } else {
      p.descending = a.b("descending");
    }
    return p;
  }
};

/// scatter_elements and scatter_nd: how an update combines with its target (none: replaces it).
struct ScatterParams : OpParams {
  enum class Reduction : uint8_t { none, add, mul, max, min };
  Reduction reduction = Reduction::none;
  /// scatter_elements' resolved axis (0 for scatter_nd).
  int64_t axis = 0;

  static ScatterParams decode(OpId op, const Attrs& a) {
    ScatterParams p;
    if (op == OpId::ScatterElements) p.axis = a.i("axis");
    const std::string& r = a.str("reduction");
    if (r == "none") p.reduction = Reduction::none;
    else if (r == "add") p.reduction = Reduction::add;
    else if (r == "mul") p.reduction = Reduction::mul;
    else if (r == "max") p.reduction = Reduction::max;
    else if (r == "min") p.reduction = Reduction::min;
    else fail<ValueError>("[{}] unknown reduction '{}'", op_name(op), r);
    return p;
  }
};

/// gather_nd: the leading dims x and indices share.
struct GatherNdParams : OpParams {
  int64_t batch_dims = 0;

  static GatherNdParams decode(OpId, const Attrs& a) {
    GatherNdParams p;
    p.batch_dims = a.i("batch_dims");
    return p;
  }
};

}  // namespace kiln
