// libFuzzer target: arbitrary bytes through the ONNX importer, and a model that imports through
// compilation for the CPU (one that names a node sized by data, or of strings, through a
// session's split). Any kiln::Error is a fine answer; a crash, a sanitizer report or any
// other exception is a bug.
#include <cstddef>
#include <cstdint>

#include "kiln/executable.h"
#include "kiln/onnx.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    kiln::onnx::ImportOptions options;
    options.default_dim = 1;  // fuzzed dim_params: small, so compiling stays cheap
    kiln::onnx::Model model = kiln::onnx::import_bytes(data, size, options);
    for (const auto& in : model.inputs)
      if (kiln::numel(in.shape) > (1 << 20)) return 0;  // do not plan huge buffers
    model.graph.compile(kiln::Device::cpu(), model.feed_shapes(), model.output_tensors());
  } catch (const kiln::onnx::InputValuesNeeded& e) {
    // a node sized by run-time data, or one of strings: a session splits the model there
    if (e.node.empty()) return 0;
    try {
      kiln::onnx::SessionOptions options;
      options.import.default_dim = 1;
      kiln::onnx::Session::from_bytes(data, size, kiln::Device::cpu(), options);
    } catch (const kiln::Error&) {
    }
  } catch (const kiln::Error&) {
  }
  return 0;
}
