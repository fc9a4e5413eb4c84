// Tuning decisions of a backend (which library algorithm runs a problem, its math type and
// workspace), as records a package can store, and the blob they are stored as.
//
// BLOB, version 1. Every integer is little endian.
//   0   u8[4]  magic "KTUN"
//   4   u32    version (1)
//   8   u32    record count (at most kMaxTuningRecords)
//   12  u32    reserved, 0
//   16  records, each: u16 kind, u16 key count (at most 64), u16 value count (at most 16),
//       u16 reserved 0, then the key's and the value's i64s; nothing after the last record.
// The backend gives kinds, keys and values their meaning (the CUDA backend: src/backends/cuda/
// tuning.h). A blob of another version is not an error: the reader that does not know it ignores
// it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kiln {

inline constexpr uint32_t kTuningVersion = 1;
inline constexpr uint32_t kMaxTuningRecords = 1u << 16;
inline constexpr uint16_t kMaxTuningKey = 64, kMaxTuningValue = 16;

/// What tuning decisions hold for: they are reused only where all three are equal.
struct TuningIdentity {
  std::string device;                               // e.g. "NVIDIA H200"
  std::string arch;                                 // e.g. "sm_90"
  std::string library;                              // e.g. "cudnn 90100"
  bool operator==(const TuningIdentity& o) const {  // (C++17: the CUDA sources include this)
    return device == o.device && arch == o.arch && library == o.library;
  }
  std::string str() const;
};

/// One decision: `kind` names the problem family (e.g. a convolution pass), `key` the problem,
/// `value` the choice.
struct TuningRecord {
  uint16_t kind = 0;
  std::vector<int64_t> key;
  std::vector<int64_t> value;
  bool operator==(const TuningRecord& o) const {
    return kind == o.kind && key == o.key && value == o.value;
  }
};

/// The blob of `records` (ValueError when a record has more key or value entries than allowed).
std::vector<uint8_t> write_tuning(const std::vector<TuningRecord>& records);

/// A parsed blob: the records, or why the bytes are malformed and where (bytes from the start).
struct TuningParse {
  uint32_t version = 0;  // another version than kTuningVersion: records empty, no error
  std::vector<TuningRecord> records;
  std::string error;  // empty when the blob is sound
  size_t error_offset = 0;
};
/// Reads untrusted bytes: every count and length is checked against the bytes there are.
TuningParse parse_tuning(const uint8_t* data, size_t size);

}  // namespace kiln
