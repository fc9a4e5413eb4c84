// ONNX signal ops: windows, DFT, STFT, mel filter banks.
#include "io/onnx/map_util.h"

namespace kiln::onnx::detail {

void add_signal_ops(std::vector<OpEntry>& t) {}

}  // namespace kiln::onnx::detail
