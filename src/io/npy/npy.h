// NumPy .npy files: the reader behind Array::load_npy, split so that bytes in memory (the fuzzer)
// and files take the same checked path.
//
// FORMAT (numpy.lib.format): magic "\x93NUMPY", u8 major, u8 minor, then the header length (u16
// for version 1, u32 for versions 2 and 3), the header (a Python dict literal with 'descr',
// 'fortran_order' and 'shape', padded with spaces and a newline), then the data: C order, little
// endian. kiln reads versions 1.0-3.0, dtypes f2 f4 f8 i1 u1 i2 i4 i8 b1 and bf16 (V2 or
// "bfloat16"), C order only. Every length and dim is checked against the file's size before
// anything is allocated: a malformed file is a FormatError naming the file, never a crash.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "kiln/array.h"

namespace kiln::npy {

/// What a header says, checked against the size of the file.
struct Header {
  DType dtype = DType::f32;
  Shape shape;
  uint64_t data_offset = 0;  // where the data starts
  uint64_t data_bytes = 0;   // numel(shape) * size_of(dtype)
};

/// Bytes of magic, version and header length (the prefix that says how long the header is).
inline constexpr size_t kPrefixMax = 12;
/// The header's end (= data_offset) from the first min(file_size, kPrefixMax) bytes of a file
/// of `file_size` bytes. Throws FormatError.
uint64_t header_end(const uint8_t* prefix, size_t size, uint64_t file_size,
                    const std::string& what);
/// Parses the first `header_end` bytes of a file of `file_size` bytes. Throws FormatError.
Header parse_header(const uint8_t* data, size_t size, uint64_t file_size, const std::string& what);
/// The array held by the bytes of a whole .npy file (`what` names it in messages).
Array read(const void* data, size_t size, const std::string& what = "<memory>");

}  // namespace kiln::npy
