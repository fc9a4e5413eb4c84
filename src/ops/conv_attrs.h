// conv's geometry attributes, shared by the conv family and quantized_conv (src/ops/quant.cpp).
#pragma once

#include "kiln/ops/nn.h"
#include "ops/common.h"

namespace kiln::ops {

/// conv's options as node attributes (stride, pads as 2*nd begins then ends, dilation, groups)
/// for input shape x and weight shape w; pad modes resolve to explicit pads. "same" padding over
/// spatial dims that are dynamic when built (with a stride above 1, where the pads depend on the
/// size) keeps attribute auto_pad ("same_upper" or "same_lower", zero pads) until shapes are
/// specialized (resolve_same_pads). Errors name `op`.
Attrs conv_attrs(const char* op, const Shape& x, const Shape& w, const ConvOptions& o);
/// The pads of auto_pad for static x and w (weight shape), written into `a` (auto_pad then "").
void resolve_same_pads(Attrs& a, const Shape& x, const Shape& w);
/// A node's "same" padding still waits for static spatial dims.
inline bool same_pads_pending(const Attrs& a) { return !a.str("auto_pad", "").empty(); }

}  // namespace kiln::ops
