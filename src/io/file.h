// A regular file read with pread, never mapped: a file that shrinks or changes while kiln reads it
// gives a short read (the caller's IoError), never SIGBUS. Shared by the npy, package and ONNX
// external-data readers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace kiln::io {

class RegularFile {
 public:
  /// Opens `path` read-only. Throws IoError "<prefix> cannot open <label>: <reason>", or
  /// "<prefix> <label> is not a regular file" for a directory, FIFO or device (which a reader
  /// would wait on or read forever).
  RegularFile(const std::string& path, const std::string& prefix, const std::string& label);
  ~RegularFile();
  RegularFile(const RegularFile&) = delete;
  RegularFile& operator=(const RegularFile&) = delete;

  /// The size when it was opened.
  uint64_t size() const { return size_; }
  /// Reads up to `n` bytes at `offset`; fewer only when the file ends first or reading fails
  /// (errno then tells which: 0 for the end).
  size_t read_at(void* dst, size_t n, uint64_t offset) const;

 private:
  int fd_ = -1;
  uint64_t size_ = 0;
};

}  // namespace kiln::io
