// ONNX recurrent layers (RNN, GRU, LSTM) unrolled over a static sequence length.
#include "io/onnx/map_util.h"

namespace kiln::onnx::detail {

void add_rnn_ops(std::vector<OpEntry>& t) {}

}  // namespace kiln::onnx::detail
