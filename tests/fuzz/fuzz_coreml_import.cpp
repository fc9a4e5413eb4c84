// libFuzzer target: arbitrary bytes through the Core ML importer, its specification parser and
// its weight-file reader, and a model that imports through compilation for the CPU. The input is
// a 4-byte little-endian length L, then L bytes of the specification (a Core ML Model message),
// then the weight file's bytes, written for each input as weights/weight.bin in a directory of
// this process (where `@model_path/weights/weight.bin` points). Any kiln::Error is a fine answer;
// a crash, a sanitizer report or any other exception is a bug.
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>

#include "kiln/coreml.h"
#include "kiln/executable.h"

namespace {
// The process's weights directory, removed at exit.
struct WeightsDir {
  std::string dir;
  WeightsDir() {
    char tmpl[] = "/tmp/kiln-fuzz-coreml-XXXXXX";
    const char* d = mkdtemp(tmpl);
    if (!d || mkdir((std::string(d) + "/weights").c_str(), 0700) != 0) abort();
    dir = d;
  }
  ~WeightsDir() {
    unlink((dir + "/weights/weight.bin").c_str());
    rmdir((dir + "/weights").c_str());
    rmdir(dir.c_str());
  }
};
const std::string& weights_dir() {
  static const WeightsDir w;
  return w.dir;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  uint32_t n = 0;
  std::memcpy(&n, data, 4);
  if (n > size - 4) n = static_cast<uint32_t>(size - 4);
  {
    std::ofstream f(weights_dir() + "/weights/weight.bin", std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(data + 4 + n),
            static_cast<std::streamsize>(size - 4 - n));
  }
  try {
    kiln::coreml::ImportOptions options;
    options.weights_dir = weights_dir();
    kiln::coreml::Model model = kiln::coreml::import_bytes(data + 4, n, options);
    for (const auto& in : model.inputs)
      if (kiln::numel(in.shape) > (1 << 20) || kiln::numel(in.shape) < 0) return 0;
    model.graph.compile(kiln::Device::cpu(), model.feed_shapes(), model.output_tensors());
  } catch (const kiln::Error&) {
  }
  return 0;
}
