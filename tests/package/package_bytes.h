// A package file's bytes in memory, for tests that edit them: the manifest (a mutable FlatBuffer
// inside the bytes) and the checksums to recompute after an edit.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "io/package/format.h"
#include "io/package/manifest_generated.h"
#include "kiln/kiln.h"

namespace kiln::test {

using Bytes = std::vector<uint8_t>;

template <typename T> T get(const Bytes& b, size_t off) {
  T v;
  std::memcpy(&v, b.data() + off, sizeof v);
  return v;
}
template <typename T> void put(Bytes& b, size_t off, T v) {
  std::memcpy(b.data() + off, &v, sizeof v);
}

inline uint64_t manifest_offset(const Bytes& b) {
  return get<uint64_t>(b, package::header::manifest_offset);
}

inline package::fb::Manifest* manifest(Bytes& b) {
  return package::fb::GetMutableManifest(b.data() + manifest_offset(b));
}

/// Recomputes the manifest's and the header's checksums after an edit.
inline void fix_checksums(Bytes& b) {
  const uint64_t off = manifest_offset(b), size = get<uint64_t>(b, package::header::manifest_size);
  if (off <= b.size() && size <= b.size() - off)
    put<uint64_t>(b, package::header::manifest_xxh3, package::xxh3(b.data() + off, size));
  put<uint64_t>(b, package::header::header_xxh3,
                package::xxh3(b.data(), package::header::header_xxh3));
}

/// The bytes of `exe` saved to a temporary file named after `name`.
inline Bytes saved_bytes(const Executable& exe, const std::string& name,
                         const PackageOptions& options = {}) {
  const std::string path =
      testing::TempDir() + "kiln_pkg_" + name + "_" + std::to_string(::getpid()) + ".kiln";
  exe.save(path, options);
  std::ifstream in(path, std::ios::binary);
  Bytes r{std::istreambuf_iterator<char>(in), {}};
  std::filesystem::remove(path);
  return r;
}

}  // namespace kiln::test
