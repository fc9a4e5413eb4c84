// conv's geometry attributes, shared by the conv family and quantized_conv (src/ops/quant.cpp).
#pragma once

#include "kiln/ops/nn.h"
#include "ops/common.h"

namespace kiln::ops {

/// conv's options as node attributes (stride, pads as 2*nd begins then ends, dilation, groups)
/// for input shape x and weight shape w; pad modes resolve to explicit pads. Errors name `op`.
Attrs conv_attrs(const char* op, const Shape& x, const Shape& w, const ConvOptions& o);

}  // namespace kiln::ops
