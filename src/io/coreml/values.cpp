// MIL types and values as kiln's: dtypes, shapes, immediate tensors, and the weight file's blobs
// (src/io/coreml/mil.h).
#include <cstring>
#include <limits>

#include "io/coreml/mil.h"
#include "io/file.h"
#include "runtime/log.h"

namespace kiln::coreml::detail {

DType dtype_of(mil::DataType t, const std::string& where) {
  switch (t) {
    case mil::BOOL:
      return boolean;
    case mil::FLOAT16:
      return f16;
    case mil::FLOAT32:
      return f32;
    case mil::FLOAT64:
      return f64;
    case mil::BFLOAT16:
      return bf16;
    case mil::INT8:
      return i8;
    case mil::INT16:
      return i16;
    case mil::INT32:
      return i32;
    case mil::INT64:
      return i64;
    case mil::UINT8:
      return u8;
    case mil::UINT16:
      return i32;
    case mil::UINT32:
      return i64;
    // sub-byte storage types (palettized indices, quantized weights) are unpacked to a byte
    case mil::INT4:
      return i8;
    case mil::UINT1:
    case mil::UINT2:
    case mil::UINT3:
    case mil::UINT4:
    case mil::UINT6:
      return u8;
    default:
      fail<UnsupportedError>("[coreml] {}: values of MIL type {} are not supported", where,
                             mil::DataType_Name(t));
  }
}

Shape shape_of(const mil::TensorType& t, const std::string& where) {
  Shape s;
  for (const auto& d : t.dimensions()) {
    if (d.has_constant()) s.push_back(static_cast<int64_t>(d.constant().size()));
    else if (d.has_unknown() && d.unknown().variadic())
      fail<UnsupportedError>("[coreml] {}: a tensor of variadic rank is not supported", where);
    else s.push_back(-1);
  }
  if (static_cast<int64_t>(s.size()) != t.rank())
    fail<FormatError>("[coreml] {}: a tensor type of rank {} lists {} dims", where, t.rank(),
                      s.size());
  return s;
}

namespace {

int64_t count_of(const Shape& s, const std::string& where) {
  int64_t n = 1;
  for (int64_t d : s) {
    if (d < 0) fail<FormatError>("[coreml] {}: a known value has an unknown dim", where);
    if (d && n > std::numeric_limits<int64_t>::max() / d)
      fail<FormatError>("[coreml] {}: a value of shape {} is too large", where, str(s));
    n *= d;
  }
  return n;
}

template <typename T, typename List>
Array from_list(const List& values, const Shape& shape, DType dtype, const std::string& where) {
  const int64_t n = count_of(shape, where);
  std::vector<T> v(values.begin(), values.end());
  if (static_cast<int64_t>(v.size()) == 1 && n != 1) v.assign(static_cast<size_t>(n), v[0]);
  if (static_cast<int64_t>(v.size()) != n)
    fail<FormatError>("[coreml] {}: a value of shape {} has {} elements", where, str(shape),
                      v.size());
  return Array::from_vector(v, shape).astype(dtype);
}

// Unpacks `n` values of `bits` bits each (LSB first, as MIL packs sub-byte types).
std::vector<uint8_t> unpack_bits(const uint8_t* p, size_t bytes, int64_t n, int bits,
                                 const std::string& where) {
  if (static_cast<uint64_t>(n) * bits > bytes * 8ull)
    fail<FormatError>("[coreml] {}: {} values of {} bits need more than {} bytes", where, n, bits,
                      bytes);
  std::vector<uint8_t> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    uint32_t v = 0;
    for (int b = 0; b < bits; ++b) {
      const uint64_t bit = static_cast<uint64_t>(i) * bits + b;
      v |= ((p[bit / 8] >> (bit % 8)) & 1u) << b;
    }
    out[static_cast<size_t>(i)] = static_cast<uint8_t>(v);
  }
  return out;
}

int sub_byte_bits(mil::DataType t) {
  switch (t) {
    case mil::INT4:
    case mil::UINT4:
      return 4;
    case mil::UINT1:
      return 1;
    case mil::UINT2:
      return 2;
    case mil::UINT3:
      return 3;
    case mil::UINT6:
      return 6;
    default:
      return 0;
  }
}

// Raw little-endian bytes of MIL type `t` as an array of dtype_of(t).
Array from_bytes(const uint8_t* p, size_t bytes, mil::DataType t, const Shape& shape,
                 const std::string& where) {
  const int64_t n = count_of(shape, where);
  const DType dt = dtype_of(t, where);
  if (const int bits = sub_byte_bits(t)) {
    std::vector<uint8_t> v = unpack_bits(p, bytes, n, bits, where);
    Array a = Array::from_data(v.data(), shape, u8);
    if (t != mil::INT4) return a;
    std::vector<int8_t> s(v.size());
    for (size_t i = 0; i < v.size(); ++i) s[i] = static_cast<int8_t>(v[i] >= 8 ? v[i] - 16 : v[i]);
    return Array::from_data(s.data(), shape, i8);
  }
  size_t stored = size_of(dt);
  if (t == mil::UINT16) stored = 2;
  if (t == mil::UINT32) stored = 4;
  if (bytes < static_cast<size_t>(n) * stored)
    fail<FormatError>("[coreml] {}: {} values of {} bytes need more than the {} bytes stored",
                      where, n, stored, bytes);
  if (t == mil::UINT16 || t == mil::UINT32) {
    std::vector<int64_t> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      if (t == mil::UINT16) {
        uint16_t x;
        std::memcpy(&x, p + i * 2, 2);
        v[static_cast<size_t>(i)] = x;
      } else {
        uint32_t x;
        std::memcpy(&x, p + i * 4, 4);
        v[static_cast<size_t>(i)] = x;
      }
    }
    return Array::from_vector(v, shape).astype(dt);
  }
  if (dt == boolean) {  // any nonzero byte is true (a bool holds only 0 or 1)
    std::vector<uint8_t> b(p, p + n);
    for (uint8_t& v : b) v = v != 0;
    return Array::from_data(b.data(), shape, boolean);
  }
  return Array::from_data(p, shape, dt);
}

}  // namespace

Array array_of(const mil::TensorValue& v, const mil::ValueType& type, const std::string& where) {
  if (!type.has_tensortype())
    fail<UnsupportedError>("[coreml] {}: only tensor values are supported", where);
  const mil::TensorType& tt = type.tensortype();
  const Shape shape = shape_of(tt, where);
  const DType dt = dtype_of(tt.datatype(), where);
  switch (v.value_case()) {
    case mil::TensorValue::kFloats:
      return from_list<float>(v.floats().values(), shape, dt, where);
    case mil::TensorValue::kInts:
      return from_list<int32_t>(v.ints().values(), shape, dt, where);
    case mil::TensorValue::kLongInts:
      return from_list<int64_t>(v.longints().values(), shape, dt, where);
    case mil::TensorValue::kDoubles:
      return from_list<double>(v.doubles().values(), shape, dt, where);
    case mil::TensorValue::kBools: {
      std::vector<uint8_t> b(v.bools().values().begin(), v.bools().values().end());
      return from_list<uint8_t>(b, shape, u8, where).astype(dt);
    }
    case mil::TensorValue::kBytes: {
      const std::string& s = v.bytes().values();
      return from_bytes(reinterpret_cast<const uint8_t*>(s.data()), s.size(), tt.datatype(), shape,
                        where);
    }
    case mil::TensorValue::kStrings:
      fail<UnsupportedError>("[coreml] {}: a string tensor is not supported here", where);
    default:
      fail<FormatError>("[coreml] {}: a tensor value without data", where);
  }
}

// ---- weight files ----

namespace {
// The weight file's layout (MIL blob storage, version 2): a 64-byte header (count and version as
// uint32), then per blob a 64-byte metadata record at the offset the program names (sentinel,
// storage type, size in bytes, data offset) and the data, 64-byte aligned.
constexpr uint32_t kSentinel = 0xDEADBEEF;
struct BlobMetadata {
  uint32_t sentinel;
  uint32_t dtype;
  uint64_t size;
  uint64_t offset;
  uint64_t padding_bits;
  uint64_t reserved[4];
};
static_assert(sizeof(BlobMetadata) == 64);

// The storage type codes of the metadata record, as MIL types.
mil::DataType blob_type(uint32_t code) {
  switch (code) {
    case 1:
      return mil::FLOAT16;
    case 2:
      return mil::FLOAT32;
    case 3:
      return mil::UINT8;
    case 4:
      return mil::INT8;
    case 5:
      return mil::BFLOAT16;
    case 6:
      return mil::INT16;
    case 7:
      return mil::UINT16;
    case 8:
      return mil::INT4;
    case 9:
      return mil::UINT1;
    case 10:
      return mil::UINT2;
    case 11:
      return mil::UINT4;
    case 12:
      return mil::UINT3;
    case 13:
      return mil::UINT6;
    case 14:
      return mil::INT32;
    case 15:
      return mil::UINT32;
    default:
      return mil::UNUSED_TYPE;
  }
}
}  // namespace

Weights::Weights(std::string dir) : dir_(std::move(dir)) {}
Weights::~Weights() = default;

const io::RegularFile& Weights::open(const std::string& file) {
  if (auto it = files_.find(file); it != files_.end()) return *it->second;
  constexpr const char* kPrefix = "@model_path/";
  std::string rel = file;
  if (rel.rfind(kPrefix, 0) == 0) rel = rel.substr(std::strlen(kPrefix));
  else fail<IoError>("[coreml] weight file '{}' is not inside the model (@model_path/...)", file);
  if (rel.empty() || rel[0] == '/' || rel.find("..") != std::string::npos)
    fail<IoError>("[coreml] weight file '{}' points outside the model", file);
  if (dir_.empty())
    fail<IoError>("[coreml] the model reads weight file '{}', and no weights directory was given",
                  file);
  auto f =
      std::make_unique<io::RegularFile>(dir_ + "/" + rel, "[coreml]", "weight file '" + file + "'");
  return *files_.emplace(file, std::move(f)).first->second;
}

Array Weights::read(const std::string& file, uint64_t offset, mil::DataType dtype,
                    const Shape& shape) {
  const io::RegularFile& f = open(file);
  const uint64_t size = f.size();
  const std::string where = fmt::format("weight file '{}' at offset {}", file, offset);
  BlobMetadata m{};
  if (offset > size || size - offset < sizeof m)
    fail<FormatError>("[coreml] {}: past the end of the file ({} bytes)", where, size);
  if (f.read_at(&m, sizeof m, offset) != sizeof m)
    fail<IoError>("[coreml] {}: short read of the blob's record", where);
  if (m.sentinel != kSentinel)
    fail<FormatError>("[coreml] {}: no blob starts there (sentinel {:#x})", where, m.sentinel);
  if (blob_type(m.dtype) != dtype)
    fail<FormatError>("[coreml] {}: the blob holds storage type {}, the program reads {}", where,
                      m.dtype, mil::DataType_Name(dtype));
  if (m.offset > size || size - m.offset < m.size)
    fail<FormatError>("[coreml] {}: its {} bytes at {} pass the end of the file", where, m.size,
                      m.offset);
  std::vector<uint8_t> data(static_cast<size_t>(m.size));
  if (f.read_at(data.data(), data.size(), m.offset) != data.size())
    fail<IoError>("[coreml] {}: short read of the blob's {} bytes", where, m.size);
  return from_bytes(data.data(), data.size(), dtype, shape, where);
}

void warn(const std::string& message) { log::warn("{}", message); }

int64_t axis_of(const OpContext& c, int64_t axis, int64_t rank) {
  const int64_t a = axis < 0 ? axis + rank : axis;
  if (a < 0 || a >= rank) c.fail("axis {} is out of range for rank {}", axis, rank);
  return a;
}

}  // namespace kiln::coreml::detail
