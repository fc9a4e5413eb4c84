// libFuzzer target: arbitrary bytes through Executable::load_bytes, and a package that loads run
// once on zero inputs when its values are small and it has no control op (a loop's trip count is
// data, and a mutated one runs for as long as it says; a cond's body may hold a loop; unit tests
// run them). Any kiln::Error is a fine answer; a crash, a sanitizer report or any other exception
// is a bug. Seeds: tests/fuzz/package_corpus (written by kiln_package_tests
// --gtest_also_run_disabled_tests --gtest_filter=PackageCorpus.*).
//
// Mutated bytes rarely keep a 64-bit checksum valid, so half the inputs (odd last byte) get their
// header and manifest checksums recomputed and load without weight checksums: those reach the
// verifier and every check behind it.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "io/package/format.h"
#include "kiln/executable.h"

namespace {
constexpr size_t kMaxRunBytes = size_t{1} << 20;  // run only packages this small: fuzz the loader

bool has_control(const kiln::Executable& exe) {
  for (const auto& step : exe.placement())
    if (step.op == "cond" || step.op == "for_loop" || step.op == "while_loop") return true;
  return false;
}

bool small(const std::vector<kiln::Executable::IoInfo>& values, size_t& total) {
  for (const auto& v : values) {
    const int64_t n = kiln::numel(v.shape);
    if (n < 0 || static_cast<size_t>(n) > kMaxRunBytes / 8) return false;
    total += static_cast<size_t>(n) * kiln::size_of(v.dtype);
    if (total > kMaxRunBytes) return false;
  }
  return true;
}

uint64_t get64(const std::vector<uint8_t>& b, size_t off) {
  uint64_t v;
  std::memcpy(&v, b.data() + off, 8);
  return v;
}

void fix_checksums(std::vector<uint8_t>& b) {
  namespace h = kiln::package::header;
  if (b.size() < kiln::package::kHeaderBytes) return;
  const uint64_t off = get64(b, h::manifest_offset), size = get64(b, h::manifest_size);
  if (off <= b.size() && size <= b.size() - off) {
    const uint64_t sum = kiln::package::xxh3(b.data() + off, size);
    std::memcpy(b.data() + h::manifest_xxh3, &sum, 8);
  }
  const uint64_t sum = kiln::package::xxh3(b.data(), h::header_xxh3);
  std::memcpy(b.data() + h::header_xxh3, &sum, 8);
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<uint8_t> bytes(data, data + size);
  kiln::LoadOptions options;
  if (size > 0 && (data[size - 1] & 1)) {
    fix_checksums(bytes);
    options.verify_weights = false;
  }
  try {
    kiln::Executable exe =
        kiln::Executable::load_bytes(bytes.data(), bytes.size(), kiln::Device::cpu(), options);
    size_t total = exe.peak_intermediate_bytes();
    if (total > kMaxRunBytes || !small(exe.inputs(), total) || !small(exe.outputs(), total) ||
        has_control(exe))
      return 0;
    std::map<std::string, kiln::Array> feeds;
    for (const auto& in : exe.inputs()) feeds[in.name] = kiln::Array::zeros(in.shape, in.dtype);
    exe.run(feeds);
  } catch (const kiln::Error&) {
  }
  return 0;
}
