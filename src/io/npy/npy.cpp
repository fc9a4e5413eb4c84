// NumPy .npy reader and writer (format and checks: npy.h).
#include "io/npy/npy.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>

#include "core/errors.h"
#include "io/file.h"

namespace kiln {

namespace {
const char* descr_of(DType t) {
  switch (t) {
    case DType::f32: return "<f4";
    case DType::f16: return "<f2";
    case DType::f64: return "<f8";
    case DType::i8: return "|i1";
    case DType::u8: return "|u1";
    case DType::i16: return "<i2";
    case DType::i32: return "<i4";
    case DType::i64: return "<i8";
    case DType::u16:
      return "<u2";
    case DType::u32:
      return "<u4";
    case DType::u64:
      return "<u8";
    case DType::boolean: return "|b1";
    case DType::bf16: return "<V2";  // numpy has no bf16; ml_dtypes names it "bfloat16"
    // nor the narrow types: ml_dtypes' names, which np.dtype knows once ml_dtypes is imported
    case DType::f8e4m3fn:
      return "float8_e4m3fn";
    case DType::f8e4m3fnuz:
      return "float8_e4m3fnuz";
    case DType::f8e5m2:
      return "float8_e5m2";
    case DType::f8e5m2fnuz:
      return "float8_e5m2fnuz";
    // (the other narrow types: one element a byte, as ml_dtypes holds them)
    case DType::f8e8m0fnu:
      return "float8_e8m0fnu";
    case DType::f4e2m1fn:
      return "float4_e2m1fn";
    case DType::i4:
      return "int4";
    case DType::u4:
      return "uint4";
    case DType::i2:
      return "int2";
    case DType::u2:
      return "uint2";
  }
  return "";
}

DType dtype_of_descr(const std::string& d, const std::string& path) {
  std::string t = d;
  if (!t.empty() && (t[0] == '<' || t[0] == '|' || t[0] == '=')) t = t.substr(1);
  if (t == "f4") return f32;
  if (t == "f2") return f16;
  if (t == "f8") return f64;
  if (t == "i1") return i8;
  if (t == "u1") return u8;
  if (t == "i2") return i16;
  if (t == "i4") return i32;
  if (t == "i8") return i64;
  if (t == "u2") return u16;
  if (t == "u4") return u32;
  if (t == "u8") return u64;
  if (t == "b1") return boolean;
  if (t == "V2" || d == "bfloat16") return bf16;
  for (int i = 0; i < kNumDTypes; ++i)  // (the narrow types by ml_dtypes' names)
    if (is_narrow(static_cast<DType>(i)) && d == descr_of(static_cast<DType>(i)))
      return static_cast<DType>(i);
  fail<FormatError>("[npy] {}: unsupported dtype descr '{}' (big-endian or exotic types)", path, d);
}

// Value of `key` in the header dict: the text after "'key':" up to the next top-level ','.
std::string dict_value(const std::string& h, const std::string& key, const std::string& path) {
  size_t k = h.find("'" + key + "'");
  if (k == std::string::npos) fail<FormatError>("[npy] {}: header lacks '{}'", path, key);
  size_t c = h.find(':', k);
  if (c == std::string::npos) fail<FormatError>("[npy] {}: malformed header", path);
  size_t i = c + 1;
  while (i < h.size() && h[i] == ' ') ++i;
  int depth = 0;
  size_t j = i;
  for (; j < h.size(); ++j) {
    char ch = h[j];
    if (ch == '(' || ch == '[') ++depth;
    else if (ch == ')' || ch == ']') --depth;
    else if ((ch == ',' || ch == '}') && depth == 0) break;
  }
  return h.substr(i, j - i);
}
}  // namespace

namespace npy {

uint64_t header_end(const uint8_t* p, size_t size, uint64_t file_size, const std::string& path) {
  if (size < 10 || std::memcmp(p, "\x93NUMPY", 6) != 0)
    fail<FormatError>("[npy] {}: not a .npy file (bad magic; {} bytes)", path, file_size);
  const int major = p[6];
  uint64_t hlen = 0, prefix = 0;
  if (major == 1) {
    hlen = p[8] | (p[9] << 8);
    prefix = 10;
  } else if (major == 2 || major == 3) {
    if (size < 12)
      fail<FormatError>("[npy] {}: the file ends inside the header length ({} bytes)", path,
                        file_size);
    hlen = p[8] | (p[9] << 8) | (p[10] << 16) | (static_cast<uint64_t>(p[11]) << 24);
    prefix = 12;
  } else {
    fail<FormatError>("[npy] {}: unsupported format version {}", path, major);
  }
  if (prefix + hlen > file_size)
    fail<FormatError>("[npy] {}: header length {} runs past the end of the file ({} bytes)", path,
                      hlen, file_size);
  return prefix + hlen;
}

Header parse_header(const uint8_t* data, size_t size, uint64_t file_size, const std::string& path) {
  const uint64_t end = header_end(data, std::min<size_t>(size, kPrefixMax), file_size, path);
  if (end > size) fail<FormatError>("[npy] {}: header of {} bytes, {} given", path, end, size);
  const size_t prefix = data[6] == 1 ? 10 : 12;
  const std::string header(reinterpret_cast<const char*>(data) + prefix, end - prefix);
  std::string descr = dict_value(header, "descr", path);
  if (descr.size() < 2) fail<FormatError>("[npy] {}: bad descr", path);
  descr = descr.substr(1, descr.size() - 2);
  if (dict_value(header, "fortran_order", path).rfind("False", 0) != 0)
    fail<FormatError>("[npy] {}: Fortran-order arrays are not supported", path);
  const std::string shp = dict_value(header, "shape", path);
  Header h;
  {
    size_t i = shp.find('(');
    size_t e = shp.find(')');
    if (i == std::string::npos || e == std::string::npos || e < i)
      fail<FormatError>("[npy] {}: malformed shape '{}'", path, shp);
    std::string inner = shp.substr(i + 1, e - i - 1);
    size_t p = 0;
    while (p < inner.size()) {
      while (p < inner.size() && (inner[p] == ' ' || inner[p] == ',')) ++p;
      if (p >= inner.size()) break;
      size_t q = p;
      while (q < inner.size() && inner[q] >= '0' && inner[q] <= '9') ++q;
      if (q == p || q - p > 15) fail<FormatError>("[npy] {}: malformed shape '{}'", path, shp);
      h.shape.push_back(std::stoll(inner.substr(p, q - p)));
      p = q;
    }
  }
  h.dtype = dtype_of_descr(descr, path);
  // Overflow-safe: every product of dims (zeros skipped: strides multiply the others) must fit,
  // and the data must be in the file.
  constexpr uint64_t kMax = uint64_t{1} << 62;
  uint64_t n = 1, nonzero = 1;
  for (int64_t d : h.shape) {
    const auto u = static_cast<uint64_t>(d);
    if (d != 0 && nonzero > kMax / 16 / u)
      fail<FormatError>("[npy] {}: shape {} is too large", path, str(h.shape));
    if (d != 0) nonzero *= u;
    n *= u;
  }
  h.data_offset = end;
  h.data_bytes = n * size_of(h.dtype);
  if (h.data_bytes > file_size - end)
    fail<FormatError>("[npy] {}: data of shape {} {} needs {} bytes but the file has {}", path,
                      str(h.shape), name(h.dtype), h.data_bytes, file_size - end);
  return h;
}

Array read(const void* data, size_t size, const std::string& what) {
  const auto* p = static_cast<const uint8_t*>(data);
  const Header h = parse_header(p, size, size, what);
  Array a = Array::empty(h.shape, h.dtype);
  if (h.data_bytes) std::memcpy(a.data(), p + h.data_offset, h.data_bytes);
  return a;
}

}  // namespace npy

Array Array::load_npy(const std::string& path) {
  const io::RegularFile f(path, "[npy]", "'" + path + "'");
  const uint64_t file_size = f.size();
  // reads exactly n bytes at `offset`, or fails naming a file that shrank
  auto read_exactly = [&](void* dst, size_t n, uint64_t offset) {
    if (f.read_at(dst, n, offset) < n)
      fail<IoError>("[npy] {}: read failed (did the file shrink?)", path);
  };
  uint8_t prefix[npy::kPrefixMax];
  const size_t have = static_cast<size_t>(std::min<uint64_t>(file_size, npy::kPrefixMax));
  read_exactly(prefix, have, 0);
  std::string header(npy::header_end(prefix, have, file_size, path), '\0');
  read_exactly(header.data(), header.size(), 0);
  const npy::Header h = npy::parse_header(reinterpret_cast<const uint8_t*>(header.data()),
                                          header.size(), file_size, path);
  Array a = Array::empty(h.shape, h.dtype);
  read_exactly(a.data(), h.data_bytes, h.data_offset);
  return a;
}

void Array::save_npy(const std::string& path) const {
  if (device().kind != Device::Kind::cpu) return to(Device::cpu()).save_npy(path);
  std::string shp = "(";
  for (size_t i = 0; i < shape_.size(); ++i) shp += std::to_string(shape_[i]) + ", ";
  if (shape_.size() > 1) shp.resize(shp.size() - 2);
  else if (shape_.size() == 1) shp.resize(shp.size() - 1);
  shp += ")";
  std::string header = std::string("{'descr': '") + descr_of(dtype_) +
                       "', 'fortran_order': False, 'shape': " + shp + ", }";
  size_t total = 10 + header.size() + 1;
  size_t padded = (total + 63) / 64 * 64;
  header.append(padded - total, ' ');
  header.push_back('\n');
  std::ofstream f(path, std::ios::binary);
  if (!f) fail<IoError>("[npy] cannot open '{}' for writing", path);
  const uint16_t hl = static_cast<uint16_t>(header.size());
  f.write("\x93NUMPY\x01\x00", 8);
  const char lb[2] = {static_cast<char>(hl & 0xff), static_cast<char>(hl >> 8)};
  f.write(lb, 2);
  f.write(header.data(), static_cast<std::streamsize>(header.size()));
  if (nbytes()) f.write(static_cast<const char*>(data()), static_cast<std::streamsize>(nbytes()));
  if (!f) fail<IoError>("[npy] write to '{}' failed", path);
}

}  // namespace kiln
