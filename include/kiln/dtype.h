// kiln element types and the promotion rules between them.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

namespace kiln {

/// (The narrow types are storage types: the 8-bit floats, f8e8m0fnu (a power of two, the OCP MX
/// formats' scale), f4e2m1fn and the 4- and 2-bit integers i4 u4 i2 u2. Cast, bitcast, the ops that
/// only move elements and (de)quantization take them; arithmetic runs after a cast to a wider
/// type. Their names follow the OCP formats and ml_dtypes: e4m3fn and e5m2, the fnuz variants with
/// one NaN and no -0 (kiln/float8.h). Each takes one byte an element, its code in the byte's low
/// bits (ml_dtypes' layout; ONNX tensors pack the 4- and 2-bit ones; kiln/narrow.h).)
enum class DType : uint8_t {
  f32,
  f16,
  bf16,
  f64,
  i8,
  u8,
  i16,
  i32,
  i64,
  boolean,
  f8e4m3fn,
  f8e4m3fnuz,
  f8e5m2,
  f8e5m2fnuz,
  u16,
  u32,
  u64,
  f8e8m0fnu,
  f4e2m1fn,
  i4,
  u4,
  i2,
  u2
};

inline constexpr DType f32 = DType::f32;
inline constexpr DType f16 = DType::f16;
inline constexpr DType bf16 = DType::bf16;
inline constexpr DType f64 = DType::f64;
inline constexpr DType i8 = DType::i8;
inline constexpr DType u8 = DType::u8;
inline constexpr DType i16 = DType::i16;
inline constexpr DType i32 = DType::i32;
inline constexpr DType i64 = DType::i64;
inline constexpr DType boolean = DType::boolean;
inline constexpr DType f8e4m3fn = DType::f8e4m3fn;
inline constexpr DType f8e4m3fnuz = DType::f8e4m3fnuz;
inline constexpr DType f8e5m2 = DType::f8e5m2;
inline constexpr DType f8e5m2fnuz = DType::f8e5m2fnuz;
inline constexpr DType u16 = DType::u16;
inline constexpr DType u32 = DType::u32;
inline constexpr DType u64 = DType::u64;
inline constexpr DType f8e8m0fnu = DType::f8e8m0fnu;
inline constexpr DType f4e2m1fn = DType::f4e2m1fn;
inline constexpr DType i4 = DType::i4;
inline constexpr DType u4 = DType::u4;
inline constexpr DType i2 = DType::i2;
inline constexpr DType u2 = DType::u2;
inline constexpr int kNumDTypes = 23;

/// Bytes per element.
size_t size_of(DType t);
/// Short name: "f32", "bf16", "bool", ...
const char* name(DType t);
/// Parses a short name; throws DTypeError on an unknown one.
DType parse_dtype(const std::string& s);
bool is_floating(DType t);  // f16 bf16 f32 f64 (the 8-bit floats are not: is_float8)
bool is_float8(DType t);    // f8e4m3fn f8e4m3fnuz f8e5m2 f8e5m2fnuz
/// The storage types cast converts through kiln/narrow.h: the 8-bit floats, f8e8m0fnu, f4e2m1fn,
/// i4 u4 i2 u2 (one byte an element each; is_integer and is_floating are false for all of them).
bool is_narrow(DType t);
bool is_integer(DType t);  // i8 u8 i16 u16 i32 u32 i64 u64 (not bool)
bool is_signed(DType t);
/// Result type of a binary op on a and b: bool < integers < floats; among floats the wider wins
/// (f16 with bf16 gives f32, a narrow type with any other type f32 or f64); an unsigned and a
/// signed integer give the signed type when it is wider, else the next signed type that holds both
/// (u64 with a signed integer gives f64, as in numpy: no integer type holds both).
DType promote(DType a, DType b);

/// A set of dtypes as a bit mask, for kernel tables.
struct DTypeSet {
  uint32_t bits = 0;
  constexpr DTypeSet() = default;
  constexpr DTypeSet(std::initializer_list<DType> ts) {
    for (DType t : ts) bits |= 1u << static_cast<int>(t);
  }
  constexpr bool has(DType t) const { return bits & (1u << static_cast<int>(t)); }
  constexpr DTypeSet operator|(DTypeSet o) const {
    DTypeSet r;
    r.bits = bits | o.bits;
    return r;
  }
  constexpr bool empty() const { return bits == 0; }
};
inline constexpr DTypeSet kFloatTypes{f32, f64, f16, bf16};
inline constexpr DTypeSet kIntTypes{i8, u8, i16, u16, i32, u32, i64, u64};
inline constexpr DTypeSet kSignedTypes{f32, f64, f16, bf16, i8, i16, i32, i64};
inline constexpr DTypeSet kNumericTypes = kFloatTypes | kIntTypes;
inline constexpr DTypeSet kAllTypes = kNumericTypes | DTypeSet{boolean};
inline constexpr DTypeSet kFloat8Types{f8e4m3fn, f8e4m3fnuz, f8e5m2, f8e5m2fnuz};
inline constexpr DTypeSet kNarrowTypes =
    kFloat8Types | DTypeSet{f8e8m0fnu, f4e2m1fn, i4, u4, i2, u2};

/// IEEE half precision storage type; arithmetic goes through float.
struct float16_t {
  uint16_t bits = 0;
  float16_t() = default;
  explicit float16_t(float f);
  explicit operator float() const;
};
/// bfloat16 storage type (round to nearest even on conversion).
struct bfloat16_t {
  uint16_t bits = 0;
  bfloat16_t() = default;
  explicit bfloat16_t(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
      bits = static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
    } else {
      u += 0x7fffu + ((u >> 16) & 1u);
      bits = static_cast<uint16_t>(u >> 16);
    }
  }
  explicit operator float() const {
    uint32_t u = static_cast<uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};

/// The C++ type of each dtype, and back.
template <DType T> struct dtype_traits;
template <> struct dtype_traits<DType::f32> { using type = float; };
template <> struct dtype_traits<DType::f16> { using type = float16_t; };
template <> struct dtype_traits<DType::bf16> { using type = bfloat16_t; };
template <> struct dtype_traits<DType::f64> { using type = double; };
template <> struct dtype_traits<DType::i8> { using type = int8_t; };
template <> struct dtype_traits<DType::u8> { using type = uint8_t; };
template <> struct dtype_traits<DType::i16> { using type = int16_t; };
template <> struct dtype_traits<DType::i32> { using type = int32_t; };
template <> struct dtype_traits<DType::i64> { using type = int64_t; };
template <> struct dtype_traits<DType::boolean> { using type = bool; };
template <> struct dtype_traits<DType::u16> { using type = uint16_t; };
template <> struct dtype_traits<DType::u32> { using type = uint32_t; };
template <> struct dtype_traits<DType::u64> { using type = uint64_t; };

template <typename T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return f32; }
template <> constexpr DType dtype_of<float16_t>() { return f16; }
template <> constexpr DType dtype_of<bfloat16_t>() { return bf16; }
template <> constexpr DType dtype_of<double>() { return f64; }
template <> constexpr DType dtype_of<int8_t>() { return i8; }
template <> constexpr DType dtype_of<uint8_t>() { return u8; }
template <> constexpr DType dtype_of<int16_t>() { return i16; }
template <> constexpr DType dtype_of<int32_t>() { return i32; }
template <> constexpr DType dtype_of<int64_t>() { return i64; }
template <> constexpr DType dtype_of<bool>() { return boolean; }
template <> constexpr DType dtype_of<uint16_t>() { return u16; }
template <> constexpr DType dtype_of<uint32_t>() { return u32; }
template <> constexpr DType dtype_of<uint64_t>() { return u64; }

}  // namespace kiln
