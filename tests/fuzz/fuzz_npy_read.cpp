// libFuzzer target: arbitrary bytes through the .npy reader (src/io/npy/npy.h), and an array that
// reads written back and read again, which must give the same dtype, shape and bytes. Any
// kiln::Error is a fine answer; a crash, a sanitizer report or any other exception is a bug.
// Seeds: tests/fuzz/npy_corpus (tests/fuzz/make_npy_corpus.py).
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "io/npy/npy.h"
#include "kiln/array.h"

namespace {
constexpr size_t kMaxRoundTripBytes = size_t{1} << 16;

// The bytes save_npy writes for `a` (through a file: the writer takes a path).
std::vector<uint8_t> written(const kiln::Array& a) {
  static const std::string path = [] {
    const char* dir = std::getenv("TMPDIR");
    return std::string(dir && *dir ? dir : "/tmp") + "/kiln_fuzz_npy_" +
           std::to_string(static_cast<long>(::getpid())) + ".npy";
  }();
  a.save_npy(path);
  std::vector<uint8_t> bytes;
  if (FILE* f = std::fopen(path.c_str(), "rb")) {
    uint8_t buf[4096];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;)
      bytes.insert(bytes.end(), buf, buf + n);
    std::fclose(f);
  }
  std::remove(path.c_str());
  return bytes;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kiln::Array a;
  try {
    a = kiln::npy::read(data, size);
  } catch (const kiln::Error&) {
    return 0;
  }
  if (a.nbytes() > kMaxRoundTripBytes) return 0;
  const std::vector<uint8_t> bytes = written(a);
  const kiln::Array b = kiln::npy::read(bytes.data(), bytes.size());  // must not throw
  if (b.dtype() != a.dtype() || b.shape() != a.shape() ||
      (a.nbytes() && std::memcmp(a.data(), b.data(), a.nbytes()) != 0))
    std::abort();
  return 0;
}
