// The attributes of the elementwise ops that are not records (src/ops/elementwise.cpp documents
// them) decoded once into the structs their kernels read; the records' float attributes and
// clip's bounds are math::RecordParams and math::ClipParams (ops/elementwise_records.h).
// (C++17: CUDA files include it.)
#pragma once

#include "core/op_id.h"
#include "core/op_params.h"
#include "kiln/narrow.h"

namespace kiln {

/// gelu: the tanh approximation (approximate "tanh"), else the erf form.
struct GeluParams : OpParams {
  bool tanh = false;

  static GeluParams decode(OpId, const Attrs& a) {
    GeluParams p;
    p.tanh = a.str("approximate") == "tanh";
    return p;
  }
};

/// cast: to a narrow target (kiln/narrow.h), whether values beyond its largest finite one become
/// that one (`saturate`, the default) or infinity / NaN, and how f8e8m0fnu rounds (`round`: "up",
/// the default, "down" or "nearest"); other targets ignore both.
struct CastParams : OpParams {
  narrow::Rules rules;

  static CastParams decode(OpId, const Attrs& a) {
    CastParams p;
    p.rules.saturate = a.b("saturate", true);
    const std::string r = a.str("round", "up");
    p.rules.round = r == "down"      ? narrow::Round::down
                    : r == "nearest" ? narrow::Round::nearest
                                     : narrow::Round::up;
    return p;
  }
};

/// bit_shift: shift left, else right.
struct BitShiftParams : OpParams {
  bool left = false;

  static BitShiftParams decode(OpId, const Attrs& a) {
    BitShiftParams p;
    p.left = a.b("left");
    return p;
  }
};

}  // namespace kiln
