// NumPy .npy reader and writer (format versions 1.0, 2.0 and 3.0; C order; little endian).
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>

#include "core/errors.h"
#include "kiln/array.h"

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
    case DType::boolean: return "|b1";
    case DType::bf16: return "<V2";  // numpy has no bf16; ml_dtypes names it "bfloat16"
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
  if (t == "b1") return boolean;
  if (t == "V2" || d == "bfloat16") return bf16;
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

Array Array::load_npy(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail<IoError>("[npy] cannot open '{}'", path);
  f.seekg(0, std::ios::end);
  const auto file_size = static_cast<uint64_t>(f.tellg());
  f.seekg(0);
  char magic[8];
  if (file_size < 10 || !f.read(magic, 8) || std::memcmp(magic, "\x93NUMPY", 6) != 0)
    fail<FormatError>("[npy] {}: not a .npy file (bad magic)", path);
  const int major = static_cast<unsigned char>(magic[6]);
  uint64_t hlen = 0;
  size_t prefix = 0;
  if (major == 1) {
    unsigned char b[2];
    f.read(reinterpret_cast<char*>(b), 2);
    hlen = b[0] | (b[1] << 8);
    prefix = 10;
  } else if (major == 2 || major == 3) {
    unsigned char b[4];
    f.read(reinterpret_cast<char*>(b), 4);
    hlen = b[0] | (b[1] << 8) | (b[2] << 16) | (static_cast<uint64_t>(b[3]) << 24);
    prefix = 12;
  } else {
    fail<FormatError>("[npy] {}: unsupported format version {}", path, major);
  }
  if (!f || prefix + hlen > file_size)
    fail<FormatError>("[npy] {}: header length {} runs past the end of the file ({} bytes)", path,
                      hlen, file_size);
  std::string header(hlen, '\0');
  f.read(header.data(), static_cast<std::streamsize>(hlen));
  std::string descr = dict_value(header, "descr", path);
  if (descr.size() < 2) fail<FormatError>("[npy] {}: bad descr", path);
  descr = descr.substr(1, descr.size() - 2);
  if (dict_value(header, "fortran_order", path).rfind("False", 0) != 0)
    fail<FormatError>("[npy] {}: Fortran-order arrays are not supported", path);
  std::string shp = dict_value(header, "shape", path);
  Shape shape;
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
      shape.push_back(std::stoll(inner.substr(p, q - p)));
      p = q;
    }
  }
  const DType dt = dtype_of_descr(descr, path);
  // overflow-safe size check
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (d != 0 && n > (UINT64_MAX / 16) / static_cast<uint64_t>(d))
      fail<FormatError>("[npy] {}: shape {} is too large", path, str(shape));
    n *= static_cast<uint64_t>(d);
  }
  const uint64_t need = n * size_of(dt);
  if (prefix + hlen + need > file_size)
    fail<FormatError>("[npy] {}: data of shape {} {} needs {} bytes but the file has {}", path,
                      str(shape), name(dt), need, file_size - prefix - hlen);
  Array a = Array::empty(shape, dt);
  if (need) f.read(static_cast<char*>(a.data()), static_cast<std::streamsize>(need));
  if (!f) fail<IoError>("[npy] {}: read failed", path);
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
