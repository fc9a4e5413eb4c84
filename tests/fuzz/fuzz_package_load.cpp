// libFuzzer target: arbitrary bytes through Executable::load_bytes, and a package that loads run
// once on zero inputs when its values are small. Any kiln::Error is a fine answer; a crash, a
// sanitizer report or any other exception is a bug. Seeds: tests/fuzz/package_corpus (written by
// kiln_package_tests --gtest_also_run_disabled_tests --gtest_filter=PackageCorpus.*).
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

#include "kiln/executable.h"

namespace {
constexpr size_t kMaxRunBytes = size_t{1} << 20;  // run only packages this small: fuzz the loader

bool small(const std::vector<kiln::Executable::IoInfo>& values, size_t& total) {
  for (const auto& v : values) {
    const int64_t n = kiln::numel(v.shape);
    if (n < 0 || static_cast<size_t>(n) > kMaxRunBytes / 8) return false;
    total += static_cast<size_t>(n) * kiln::size_of(v.dtype);
    if (total > kMaxRunBytes) return false;
  }
  return true;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    kiln::Executable exe = kiln::Executable::load_bytes(data, size, kiln::Device::cpu());
    size_t total = exe.peak_intermediate_bytes();
    if (total > kMaxRunBytes || !small(exe.inputs(), total) || !small(exe.outputs(), total))
      return 0;
    std::map<std::string, kiln::Array> feeds;
    for (const auto& in : exe.inputs()) feeds[in.name] = kiln::Array::zeros(in.shape, in.dtype);
    exe.run(feeds);
  } catch (const kiln::Error&) {
  }
  return 0;
}
