// Hugging Face safetensors files (.safetensors): the names, dtypes and shapes of their tensors
// from the header, and each tensor's bytes read when asked for.
//
// FORMAT. An 8-byte little-endian unsigned header length N, then N bytes of UTF-8 JSON, then the
// data section (every byte up to the end of the file). The JSON is an object: each key names a
// tensor and maps to {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, a byte
// range of the data section; the optional key "__metadata__" maps strings to strings.
//
// CHECKS, before any tensor is read: N at most 100 MiB and within the file; the JSON an object,
// without duplicate keys; every entry with exactly those three fields, a dtype kiln holds
// (F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL; the others, such as F8_E4M3 or U32, are an
// UnsupportedError naming the tensor), dims that are integers in [0, 2^40], and a range whose
// length is the shape's bytes; the ranges, in order, tile the data section exactly (no gap, no
// overlap, nothing past the end). A bool tensor's bytes are checked to be 0 or 1 when it is read.
// A header that breaks any of these is a FormatError naming the file, the tensor and the field.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kiln/array.h"
#include "kiln/device.h"

namespace kiln::safetensors {

/// One tensor of a file: its dtype and shape, and its byte range in the data section.
struct Entry {
  std::string name;
  DType dtype = f32;
  Shape shape;
  uint64_t begin = 0, end = 0;
};

class File {
 public:
  /// Opens `path` and checks its header (see CHECKS above); reads no tensor yet. Throws IoError
  /// when it cannot be read, FormatError or UnsupportedError as above.
  static File open(const std::string& path);
  /// The same over bytes in memory (copied), named `label` in errors.
  static File from_bytes(const void* data, size_t size, const std::string& label = "<memory>");

  /// The tensors in the order of their data.
  const std::vector<Entry>& tensors() const;
  /// The header's "__metadata__" (empty when it has none).
  const std::map<std::string, std::string>& metadata() const;
  bool contains(const std::string& name) const;
  /// The entry of `name`; throws ValueError naming the file and the tensor when it has none.
  const Entry& entry(const std::string& name) const;
  /// Reads tensor `name` into a new array on `device` (through host memory). Throws IoError when
  /// the file has changed since it was opened (a short read).
  Array read(const std::string& name, Device device = Device::cpu()) const;
  /// Every tensor, by name.
  std::map<std::string, Array> read_all(Device device = Device::cpu()) const;

  struct Impl;

 private:
  std::shared_ptr<const Impl> impl_;
};

/// The weights of a Hugging Face checkpoint directory: `model.safetensors`, or the shards that
/// `model.safetensors.index.json` names in its "weight_map" (tensor name -> file name). Every
/// shard is opened and its header checked when the checkpoint is opened; tensors are read when
/// asked for.
class Checkpoint {
 public:
  /// Opens the checkpoint in `dir`. Throws IoError when the directory holds neither file or a
  /// shard cannot be read, FormatError for an index that is not a JSON object with a weight_map
  /// of strings, a shard name that is not a plain file name of the directory (no '/', no ".."),
  /// or a tensor the index places in a shard that lacks it (naming both), and the errors of
  /// File::open for each shard.
  static Checkpoint open(const std::string& dir);

  /// Every tensor's name, sorted.
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const;
  /// The entry of `name`, and the shard file that holds it; ValueError naming the checkpoint and
  /// the tensor when none does.
  const Entry& entry(const std::string& name) const;
  const std::string& shard_of(const std::string& name) const;
  /// Reads tensor `name` onto `device`.
  Array read(const std::string& name, Device device = Device::cpu()) const;
  /// The shard files, in the order the index first names them.
  std::vector<std::string> shards() const;

  struct Impl;

 private:
  std::shared_ptr<const Impl> impl_;
};

}  // namespace kiln::safetensors
