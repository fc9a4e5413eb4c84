// libFuzzer target: arbitrary bytes through the safetensors reader (include/kiln/safetensors.h):
// the header checked, then every tensor read. Any kiln::Error is a fine answer; a crash, a
// sanitizer report or any other exception is a bug. Seeds: tests/fuzz/safetensors_corpus
// (tests/fuzz/make_safetensors_corpus.py).
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "kiln/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto f = kiln::safetensors::File::from_bytes(data, size, "fuzz");
    uint64_t total = 0;
    for (const auto& e : f.tensors()) {
      total += e.end - e.begin;
      if (total > (uint64_t{1} << 24)) break;  // (a header may promise more than memory)
      const kiln::Array a = f.read(e.name);
      if (a.nbytes() != e.end - e.begin) std::abort();
    }
  } catch (const kiln::Error&) {
  }
  return 0;
}
