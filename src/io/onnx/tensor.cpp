// TensorProto -> Array, including external data confined to the model's directory. External data
// is read (pread) into the tensor's own memory, never mapped: a file that shrinks while it is read
// gives an IoError, and the imported model never reads it again.

#include <onnx/onnx_pb.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "core/errors.h"
#include "io/file.h"
#include "io/onnx/importer.h"
#include "io/onnx/op_table.h"

namespace kiln::onnx::detail {

namespace {

std::string tensor_name(const ::onnx::TensorProto& t) {
  return t.name().empty() ? std::string("<unnamed>") : t.name();
}

int64_t checked_numel(const ::onnx::TensorProto& t, Shape& shape) {
  int64_t n = 1;
  for (int64_t d : t.dims()) {
    if (d < 0) fail<FormatError>("[onnx] tensor '{}' has a negative dim {}", tensor_name(t), d);
    if (d != 0 && n > (int64_t{1} << 50) / d)
      fail<FormatError>("[onnx] tensor '{}' is too large ({} dims)", tensor_name(t), t.dims_size());
    n *= d;
    shape.push_back(d);
  }
  return n;
}

uint64_t parse_u64(const std::string& s, const ::onnx::TensorProto& t, const char* key) {
  if (s.empty() || s.size() > 19 || s.find_first_not_of("0123456789") != std::string::npos)
    fail<IoError>("[onnx] tensor '{}': external data {} '{}' is not a number", tensor_name(t),
                  key, s);
  return std::strtoull(s.c_str(), nullptr, 10);
}

// Reads `bytes` of external data for `t`, refusing anything outside `dir`.
std::string read_external(const ::onnx::TensorProto& t, const std::string& dir, size_t bytes) {
  std::string location;
  uint64_t offset = 0, length = UINT64_MAX;
  for (const auto& kv : t.external_data()) {
    if (kv.key() == "location") location = kv.value();
    else if (kv.key() == "offset") offset = parse_u64(kv.value(), t, "offset");
    else if (kv.key() == "length") length = parse_u64(kv.value(), t, "length");
  }
  const std::string name = tensor_name(t);
  if (dir.empty())
    fail<IoError>("[onnx] tensor '{}' keeps its data in an external file, and a model read from "
                  "bytes has no directory to read it from (set ImportOptions::external_data_dir)",
                  name);
  if (location.empty()) fail<IoError>("[onnx] tensor '{}': external data has no location", name);
  namespace fs = std::filesystem;
  const fs::path rel(location);
  if (rel.is_absolute() || location.find('\\') != std::string::npos ||
      location.find('\0') != std::string::npos)
    fail<IoError>("[onnx] tensor '{}': external data location '{}' must be a relative path "
                  "inside the model's directory",
                  name, location);
  for (const auto& part : rel)
    if (part == "..")
      fail<IoError>("[onnx] tensor '{}': external data location '{}' leaves the model's directory",
                    name, location);
  std::error_code ec;
  const fs::path root = fs::canonical(dir, ec);
  if (ec) fail<IoError>("[onnx] cannot open the model directory '{}': {}", dir, ec.message());
  const fs::path file = fs::canonical(root / rel, ec);
  if (ec)
    fail<IoError>("[onnx] tensor '{}': cannot open external data file '{}': {}", name, location,
                  ec.message());
  const std::string root_s = root.string() + "/", file_s = file.string();
  if (file_s.compare(0, root_s.size(), root_s) != 0)
    fail<IoError>("[onnx] tensor '{}': external data file '{}' resolves outside the model's "
                  "directory",
                  name, location);
  const io::RegularFile f(file_s, fmt::format("[onnx] tensor '{}':", name),
                          fmt::format("external data file '{}'", location));
  const uint64_t size = f.size();
  if (length == UINT64_MAX) length = offset <= size ? size - offset : 0;
  if (offset > size || length > size - offset)
    fail<IoError>("[onnx] tensor '{}': external data range [{}, +{}) is past the end of '{}' "
                  "({} bytes)",
                  name, offset, length, location, size);
  if (length != bytes)
    fail<IoError>("[onnx] tensor '{}': external data holds {} bytes, its shape needs {}", name,
                  length, bytes);
  std::string data(bytes, '\0');
  if (const size_t got = f.read_at(data.data(), bytes, offset); got < bytes)
    fail<IoError>("[onnx] tensor '{}': reading external data '{}' failed at offset {}: {}", name,
                  location, offset + got,
                  errno ? std::strerror(errno) : "the file ended (did it shrink?)");
  return data;
}

template <typename Src, typename Dst>
void copy_field(const google::protobuf::RepeatedField<Src>& f, int64_t n, void* out,
                const ::onnx::TensorProto& t) {
  if (f.size() != n)
    fail<FormatError>("[onnx] tensor '{}' has {} values, its shape needs {}", tensor_name(t),
                      f.size(), n);
  Dst* o = static_cast<Dst*>(out);
  for (int64_t i = 0; i < n; ++i) o[i] = static_cast<Dst>(f.Get(static_cast<int>(i)));
}

// The typed field that holds `dtype`'s values must hold exactly n of them.
void check_count(const ::onnx::TensorProto& t, DType dtype, int64_t n) {
  int64_t have = 0;
  switch (dtype) {
    case DType::f32: have = t.float_data_size(); break;
    case DType::f64: have = t.double_data_size(); break;
    case DType::i64: have = t.int64_data_size(); break;
    case DType::u32:
    case DType::u64:
      have = t.uint64_data_size();
      break;
    default: have = t.int32_data_size(); break;
  }
  if (have != n)
    fail<FormatError>("[onnx] tensor '{}' has {} values, its shape needs {}", tensor_name(t), have,
                      n);
}

// ONNX packs the 4- and 2-bit types, the first element in a byte's low bits (raw_data, external
// data, and int32_data with one packed byte a value); kiln holds one a byte.
size_t packed_bytes(int64_t n, int bits) { return static_cast<size_t>((n * bits + 7) / 8); }

// Reads a packed tensor's bytes from raw_data, external data or int32_data, and unpacks them.
Array read_packed(const ::onnx::TensorProto& t, const std::string& external_dir, const Shape& shape,
                  DType dtype, int64_t n, int bits) {
  const size_t bytes = packed_bytes(n, bits);
  std::string data;
  if (t.data_location() == ::onnx::TensorProto::EXTERNAL) {
    data = read_external(t, external_dir, bytes);
  } else if (t.has_raw_data()) {
    if (t.raw_data().size() != bytes)
      fail<FormatError>(
          "[onnx] tensor '{}' has {} bytes of raw data, its shape {} of {} packed "
          "{} to a byte needs {}",
          tensor_name(t), t.raw_data().size(), str(shape), name(dtype), 8 / bits, bytes);
    data = t.raw_data();
  } else {
    if (static_cast<size_t>(t.int32_data_size()) != bytes)
      fail<FormatError>(
          "[onnx] tensor '{}' has {} values in int32_data, its shape {} of {} "
          "packed {} to a byte needs {}",
          tensor_name(t), t.int32_data_size(), str(shape), name(dtype), 8 / bits, bytes);
    data.resize(bytes);
    for (size_t i = 0; i < bytes; ++i)
      data[i] = static_cast<char>(t.int32_data(static_cast<int>(i)) & 0xff);
  }
  Array a = Array::empty(shape, dtype);
  auto* out = static_cast<uint8_t*>(a.data());
  const int per_byte = 8 / bits, mask = (1 << bits) - 1;
  for (int64_t i = 0; i < n; ++i) {
    const auto byte = static_cast<uint8_t>(data[static_cast<size_t>(i / per_byte)]);
    out[i] = static_cast<uint8_t>((byte >> (i % per_byte * bits)) & mask);
  }
  return a;
}

}  // namespace

Array read_tensor(const ::onnx::TensorProto& t, const std::string& external_dir) {
  const auto dtype = from_onnx_dtype(t.data_type());
  if (!dtype)
    fail<UnsupportedError>("[onnx] tensor '{}' has element type {}, which kiln does not have",
                           tensor_name(t), onnx_dtype_name(t.data_type()));
  Shape shape;
  const int64_t n = checked_numel(t, shape);
  if (const int bits = onnx_bits(*dtype); bits < 8)
    return read_packed(t, external_dir, shape, *dtype, n, bits);
  const size_t bytes = static_cast<size_t>(n) * size_of(*dtype);
  // the data is checked against the shape before anything is allocated
  if (t.data_location() == ::onnx::TensorProto::EXTERNAL) {
    const std::string data = read_external(t, external_dir, bytes);
    Array a = Array::from_data(data.data(), shape, *dtype);
    return *dtype == DType::boolean ? a.astype(u8).astype(boolean) : a;
  }
  if (t.has_raw_data() && t.raw_data().size() != bytes)
    fail<FormatError>("[onnx] tensor '{}' has {} bytes of raw data, its shape {} of {} needs {}",
                      tensor_name(t), t.raw_data().size(), str(shape), name(*dtype), bytes);
  if (!t.has_raw_data()) check_count(t, *dtype, n);
  Array a = Array::empty(shape, *dtype);
  if (t.has_raw_data()) {
    if (bytes) std::memcpy(a.data(), t.raw_data().data(), bytes);
  } else {
    void* out = a.data();
    switch (*dtype) {
      case DType::f32: copy_field<float, float>(t.float_data(), n, out, t); break;
      case DType::f64: copy_field<double, double>(t.double_data(), n, out, t); break;
      case DType::i64: copy_field<int64_t, int64_t>(t.int64_data(), n, out, t); break;
      case DType::i32: copy_field<int32_t, int32_t>(t.int32_data(), n, out, t); break;
      case DType::i16: copy_field<int32_t, int16_t>(t.int32_data(), n, out, t); break;
      case DType::i8: copy_field<int32_t, int8_t>(t.int32_data(), n, out, t); break;
      case DType::u16:
        copy_field<int32_t, uint16_t>(t.int32_data(), n, out, t);
        break;
      case DType::u32:
        copy_field<uint64_t, uint32_t>(t.uint64_data(), n, out, t);
        break;
      case DType::u64:
        copy_field<uint64_t, uint64_t>(t.uint64_data(), n, out, t);
        break;
      // f16 and bf16 travel as their bit patterns in int32_data
      case DType::f16:
      case DType::bf16: copy_field<int32_t, uint16_t>(t.int32_data(), n, out, t); break;
      default:  // u8, bool and the 8-bit floats (their codes) in int32_data
        copy_field<int32_t, uint8_t>(t.int32_data(), n, out, t);
    }
  }
  if (*dtype == DType::boolean) {  // any nonzero byte is true
    auto* b = static_cast<uint8_t*>(a.data());
    for (int64_t i = 0; i < n; ++i) b[i] = b[i] != 0;
  }
  return a;
}

}  // namespace kiln::onnx::detail
