#include "kiln/dtype.h"

#include <cmath>

#include "core/errors.h"

namespace kiln {

size_t size_of(DType t) {
  switch (t) {
    case DType::f32:
    case DType::i32:
    case DType::u32:
      return 4;
    case DType::f16:
    case DType::bf16:
    case DType::i16:
    case DType::u16:
      return 2;
    case DType::f64:
    case DType::i64:
    case DType::u64:
      return 8;
    case DType::i8: case DType::u8: case DType::boolean: return 1;
    case DType::f8e4m3fn:
    case DType::f8e4m3fnuz:
    case DType::f8e5m2:
    case DType::f8e5m2fnuz:
    case DType::f8e8m0fnu:
    case DType::f4e2m1fn:
    case DType::i4:
    case DType::u4:
    case DType::i2:
    case DType::u2:
      return 1;
  }
  KILN_ASSERT(false);
}

const char* name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::f64: return "f64";
    case DType::i8: return "i8";
    case DType::u8: return "u8";
    case DType::i16: return "i16";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::boolean: return "bool";
    case DType::f8e4m3fn:
      return "f8e4m3fn";
    case DType::f8e4m3fnuz:
      return "f8e4m3fnuz";
    case DType::f8e5m2:
      return "f8e5m2";
    case DType::f8e5m2fnuz:
      return "f8e5m2fnuz";
    case DType::u16:
      return "u16";
    case DType::u32:
      return "u32";
    case DType::u64:
      return "u64";
    case DType::f8e8m0fnu:
      return "f8e8m0fnu";
    case DType::f4e2m1fn:
      return "f4e2m1fn";
    case DType::i4:
      return "i4";
    case DType::u4:
      return "u4";
    case DType::i2:
      return "i2";
    case DType::u2:
      return "u2";
  }
  KILN_ASSERT(false);
}

DType parse_dtype(const std::string& s) {
  for (int i = 0; i < kNumDTypes; ++i)
    if (s == name(static_cast<DType>(i))) return static_cast<DType>(i);
  fail<DTypeError>(
      "[dtype] unknown dtype '{}' (expected f32 f16 bf16 f64 i8 u8 i16 u16 i32 u32 i64 u64 "
      "bool f8e4m3fn f8e4m3fnuz f8e5m2 f8e5m2fnuz f8e8m0fnu f4e2m1fn i4 u4 i2 u2)",
      s);
}

bool is_floating(DType t) {
  return t == DType::f32 || t == DType::f16 || t == DType::bf16 || t == DType::f64;
}
bool is_float8(DType t) {
  return t == DType::f8e4m3fn || t == DType::f8e4m3fnuz || t == DType::f8e5m2 ||
         t == DType::f8e5m2fnuz;
}
bool is_narrow(DType t) { return kNarrowTypes.has(t); }
bool is_integer(DType t) { return kIntTypes.has(t); }
bool is_signed(DType t) {
  return is_floating(t) || is_float8(t) || t == DType::i8 || t == DType::i16 || t == DType::i32 ||
         t == DType::i64 || t == DType::f4e2m1fn || t == DType::i4 || t == DType::i2;
}

DType promote(DType a, DType b) {
  if (a == b) return a;
  if (a == DType::boolean) return b;
  if (b == DType::boolean) return a;
  if (is_narrow(a) || is_narrow(b)) {  // (two different narrow types, or one with another type)
    return a == DType::f64 || b == DType::f64 ? DType::f64 : DType::f32;
  }
  const bool fa = is_floating(a), fb = is_floating(b);
  if (fa && fb) {
    if (a == DType::f64 || b == DType::f64) return DType::f64;
    return DType::f32;  // f16/bf16 with f32, or f16 with bf16
  }
  if (fa) return a;
  if (fb) return b;
  // both integers
  const bool sa = is_signed(a), sb = is_signed(b);
  if (sa == sb) return size_of(a) >= size_of(b) ? a : b;
  const DType s = sa ? a : b, u = sa ? b : a;
  if (size_of(s) > size_of(u)) return s;
  switch (u) {  // the next signed type, twice the unsigned one's width
    case DType::u8:
      return DType::i16;
    case DType::u16:
      return DType::i32;
    case DType::u32:
      return DType::i64;
    default:
      return DType::f64;  // (u64: no integer type holds both)
  }
}

float16_t::float16_t(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t absx = x & 0x7fffffffu;
  if (absx > 0x7f800000u) {  // NaN
    bits = static_cast<uint16_t>(sign | 0x7e00u);
    return;
  }
  if (absx >= 0x477ff000u) {  // rounds to >= 65520: inf
    bits = static_cast<uint16_t>(sign | 0x7c00u);
    return;
  }
  if (absx < 0x38800000u) {  // subnormal half (or zero)
    float af;
    std::memcpy(&af, &absx, 4);
    // scale so that the half subnormal lsb (2^-24) is 1, then round to nearest even
    float scaled = af * 16777216.0f;
    bits = static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(scaled)));
    return;
  }
  uint32_t mant = absx & 0x7fffffu;
  uint32_t exp = (absx >> 23) - 127 + 15;
  uint32_t h = (exp << 10) | (mant >> 13);
  uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  bits = static_cast<uint16_t>(sign | h);
}

float16_t::operator float() const {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  uint32_t exp = (bits >> 10) & 0x1fu;
  uint32_t mant = bits & 0x3ffu;
  uint32_t out;
  if (exp == 0) {
    if (mant == 0) {
      out = sign;
    } else {
      float f = static_cast<float>(mant) * (1.0f / 16777216.0f);
      std::memcpy(&out, &f, 4);
      out |= sign;
    }
  } else if (exp == 31) {
    out = sign | 0x7f800000u | (mant << 13);
  } else {
    out = sign | ((exp - 15 + 127) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &out, 4);
  return f;
}

}  // namespace kiln
