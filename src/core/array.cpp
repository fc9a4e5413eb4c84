#include "kiln/array.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define KILN_F16C 1
#endif

#include "core/device_backend.h"
#include "core/element_limit.h"
#include "core/errors.h"
#include "core/host_allocator.h"
#include "core/int_cast.h"
#include "kiln/narrow.h"

namespace kiln {

Storage::~Storage() {
  if (deleter && data) deleter(data);
}

namespace {
std::shared_ptr<Storage> host_alloc(size_t bytes) {
  auto s = std::make_shared<Storage>();
  s->data = host::allocate(bytes);
  s->bytes = bytes;
  s->device = Device::cpu();
  s->deleter = [bytes](void* p) { host::release(p, bytes); };
  return s;
}

template <typename T> double to_double(T v) {
  if constexpr (std::is_same_v<T, float16_t> || std::is_same_v<T, bfloat16_t>)
    return static_cast<double>(static_cast<float>(v));
  else return static_cast<double>(v);
}
template <typename T> T from_double(double v) {
  if constexpr (std::is_same_v<T, float16_t> || std::is_same_v<T, bfloat16_t>)
    return T(static_cast<float>(v));
  else if constexpr (std::is_same_v<T, bool>) return v != 0;
  else if constexpr (std::is_integral_v<T>) {
    // float to integer truncates toward zero and saturates; NaN gives 0 (as CUDA's conversions)
    if (!(v == v)) return T(0);
    if (v <= static_cast<double>(std::numeric_limits<T>::min())) return std::numeric_limits<T>::min();
    if (v >= static_cast<double>(std::numeric_limits<T>::max())) return std::numeric_limits<T>::max();
    return static_cast<T>(v);
  } else return static_cast<T>(v);
}

#ifdef KILN_F16C
// f16 <-> f32 eight values at a time with the CPU's conversion instructions (F16C, every x86-64
// CPU since 2012), where it has them: the same values as float16_t's conversions (IEEE round to
// nearest even, subnormals kept), and a group of eight holding a NaN goes through float16_t, so
// that NaNs come out as they do there. Returns how many values it converted.
bool has_f16c() {
  // (every x86-64 CPU with AVX2 has F16C; clang's builtin knows no "f16c")
  static const bool yes = __builtin_cpu_supports("avx2");
  return yes;
}
__attribute__((target("avx,f16c"))) int64_t f16_to_f32(const uint16_t* in, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i)));
    if (_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)) != 0) {
      for (int j = 0; j < 8; ++j) {
        float16_t h;
        h.bits = in[i + j];
        out[i + j] = static_cast<float>(h);
      }
      continue;
    }
    _mm256_storeu_ps(out + i, v);
  }
  return i;
}
__attribute__((target("avx,f16c"))) int64_t f32_to_f16(const float* in, uint16_t* out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(in + i);
    if (_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)) != 0) {
      for (int j = 0; j < 8; ++j) out[i + j] = float16_t(in[i + j]).bits;
      continue;
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  return i;
}

// bf16 <-> f32 sixteen values at a time (AVX-512F), where the CPU has it: the same bits as
// bfloat16_t's conversions (round to nearest even; a NaN keeps its sign and upper payload and is
// made quiet), as integer arithmetic on the bit patterns. Returns how many values it converted.
// (the all-lanes masked forms: GCC 12's unmasked ones warn of an undefined register)
constexpr __mmask16 kAll = 0xffff;
bool has_avx512f() {
  static const bool yes = __builtin_cpu_supports("avx512f");
  return yes;
}
__attribute__((target("avx512f"))) int64_t bf16_to_f32(const uint16_t* in, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i w = _mm512_maskz_cvtepu16_epi32(
        kAll, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i)));
    _mm512_storeu_si512(out + i, _mm512_maskz_slli_epi32(kAll, w, 16));
  }
  return i;
}
__attribute__((target("avx512f"))) int64_t f32_to_bf16(const float* in, uint16_t* out, int64_t n) {
  const __m512i magnitude = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
  const __m512i half = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1);
  const __m512i quiet = _mm512_set1_epi32(0x40);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i u = _mm512_loadu_si512(in + i);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, magnitude), inf);
    const __m512i high = _mm512_maskz_srli_epi32(kAll, u, 16);
    const __m512i rounded = _mm512_maskz_srli_epi32(
        kAll, _mm512_add_epi32(u, _mm512_add_epi32(half, _mm512_and_si512(high, one))), 16);
    const __m512i r = _mm512_mask_blend_epi32(nan, rounded, _mm512_or_si512(high, quiet));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm512_maskz_cvtepi32_epi16(kAll, r));
  }
  return i;
}

// f32 <-> i32/i8/u8 sixteen values at a time (AVX-512F), the same values as from_double's: to an
// integer, truncation toward zero, saturation at the type's bounds and 0 for NaN; from one, the
// nearest f32 (exact for i8 and u8, nearest-even for i32 as the double's rounding gives).
// Returns how many values it converted.
__attribute__((target("avx512f"))) int64_t f32_to_int(const float* in, void* out, DType dt,
                                                      int64_t n) {
  const __m512 lo = _mm512_set1_ps(dt == DType::u8 ? 0.f : dt == DType::i8 ? -128.f : 0.f);
  const __m512 hi = _mm512_set1_ps(dt == DType::u8 ? 255.f : 127.f);
  const __m512 two31 = _mm512_set1_ps(2147483648.f);
  const __m512i int_max = _mm512_set1_epi32(std::numeric_limits<int32_t>::max());
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 x = _mm512_loadu_ps(in + i);
    const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    if (dt == DType::i32) {
      // (out-of-range and NaN lanes truncate to INT_MIN: the top ones saturate, NaNs give 0)
      __m512i r = _mm512_maskz_cvttps_epi32(kAll, x);
      r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(x, two31, _CMP_GE_OQ), int_max);
      r = _mm512_maskz_mov_epi32(static_cast<__mmask16>(~nan), r);
      _mm512_storeu_si512(static_cast<int32_t*>(out) + i, r);
    } else {
      const __m512 c = _mm512_maskz_min_ps(kAll, _mm512_maskz_max_ps(kAll, x, lo), hi);
      const __m512i r = _mm512_maskz_cvttps_epi32(static_cast<__mmask16>(~nan), c);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<char*>(out) + i),
                       _mm512_maskz_cvtepi32_epi8(kAll, r));
    }
  }
  return i;
}
__attribute__((target("avx512f"))) int64_t int_to_f32(const void* in, DType st, float* out,
                                                      int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512i w;
    if (st == DType::i32) {
      w = _mm512_loadu_si512(static_cast<const int32_t*>(in) + i);
    } else {
      const __m128i b =
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const char*>(in) + i));
      w = st == DType::u8 ? _mm512_maskz_cvtepu8_epi32(kAll, b)
                          : _mm512_maskz_cvtepi8_epi32(kAll, b);
    }
    _mm512_storeu_ps(out + i, _mm512_maskz_cvtepi32_ps(kAll, w));
  }
  return i;
}
#endif

template <typename F> void visit(DType t, F&& f) {
  switch (t) {
    case DType::f32: return f(float{});
    case DType::f16: return f(float16_t{});
    case DType::bf16: return f(bfloat16_t{});
    case DType::f64: return f(double{});
    case DType::i8: return f(int8_t{});
    case DType::u8: return f(uint8_t{});
    case DType::i16: return f(int16_t{});
    case DType::i32: return f(int32_t{});
    case DType::i64: return f(int64_t{});
    case DType::boolean: return f(bool{});
    case DType::u16:
      return f(uint16_t{});
    case DType::u32:
      return f(uint32_t{});
    case DType::u64:
      return f(uint64_t{});
    default:
      KILN_ASSERT(false);  // (the narrow types go through convert_narrow)
  }
}
}  // namespace

namespace {
// Conversions from or to a narrow type (kiln/narrow.h), through f32 in blocks (f64 rounds to one
// directly: f32 first could round twice).
void convert_narrow(const void* src, DType st, void* dst, DType dt, int64_t n,
                    const narrow::Rules& rules) {
  constexpr int64_t kBlock = 256;
  float buf[kBlock];
  const auto* in = static_cast<const char*>(src);
  auto* out = static_cast<char*>(dst);
  const size_t ss = size_of(st), ds = size_of(dt);
  if (st == DType::f64 && is_narrow(dt)) {  // (rounded once, from double)
    const narrow::Codec c = narrow::codec(dt);
    const auto* x = static_cast<const double*>(src);
    auto* codes = static_cast<uint8_t*>(dst);
    for (int64_t i = 0; i < n; ++i) codes[i] = narrow::encode(x[i], c, rules);
    return;
  }
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t k = std::min(kBlock, n - b);
    const char* from = in + b * static_cast<int64_t>(ss);
    char* to = out + b * static_cast<int64_t>(ds);
    if (is_narrow(st)) {
      const narrow::Codec c = narrow::codec(st);
      const auto* codes = reinterpret_cast<const uint8_t*>(from);
      for (int64_t i = 0; i < k; ++i) buf[i] = narrow::decode(codes[i], c);
    } else {
      convert(from, st, buf, DType::f32, k);
    }
    if (is_narrow(dt)) {
      const narrow::Codec c = narrow::codec(dt);
      auto* codes = reinterpret_cast<uint8_t*>(to);
      for (int64_t i = 0; i < k; ++i) codes[i] = narrow::encode(buf[i], c, rules);
    } else {
      convert(buf, DType::f32, to, dt, k);
    }
  }
}
}  // namespace

void convert(const void* src, DType st, void* dst, DType dt, int64_t n, bool saturate,
             narrow::Round round) {
  if (n <= 0) return;  // empty views may carry null pointers
  if (st == dt) {
    std::memcpy(dst, src, static_cast<size_t>(n) * size_of(st));
    return;
  }
  if (is_narrow(st) || is_narrow(dt)) {
    convert_narrow(src, st, dst, dt, n, {saturate, round});
    return;
  }
#ifdef KILN_F16C
  // (the half types' conversions with the CPU's vector instructions, the rest as below)
  const bool f16_f32 = has_f16c() && ((st == DType::f16 && dt == DType::f32) ||
                                      (st == DType::f32 && dt == DType::f16));
  const bool bf16_f32 = has_avx512f() && ((st == DType::bf16 && dt == DType::f32) ||
                                          (st == DType::f32 && dt == DType::bf16));
  if (f16_f32 || bf16_f32) {
    const auto* in16 = static_cast<const uint16_t*>(src);
    auto* out16 = static_cast<uint16_t*>(dst);
    const auto* in32 = static_cast<const float*>(src);
    auto* out32 = static_cast<float*>(dst);
    const int64_t done =
        f16_f32 ? (st == DType::f16 ? f16_to_f32(in16, out32, n) : f32_to_f16(in32, out16, n))
                : (st == DType::bf16 ? bf16_to_f32(in16, out32, n) : f32_to_bf16(in32, out16, n));
    if (done == n) return;
    src = static_cast<const char*>(src) + done * static_cast<int64_t>(size_of(st));
    dst = static_cast<char*>(dst) + done * static_cast<int64_t>(size_of(dt));
    n -= done;
  }
  const auto small_int = [](DType t) {
    return t == DType::i32 || t == DType::i8 || t == DType::u8;
  };
  if (has_avx512f() &&
      ((st == DType::f32 && small_int(dt)) || (small_int(st) && dt == DType::f32))) {
    const int64_t done = st == DType::f32 ? f32_to_int(static_cast<const float*>(src), dst, dt, n)
                                          : int_to_f32(src, st, static_cast<float*>(dst), n);
    if (done == n) return;
    src = static_cast<const char*>(src) + done * static_cast<int64_t>(size_of(st));
    dst = static_cast<char*>(dst) + done * static_cast<int64_t>(size_of(dt));
    n -= done;
  }
#endif
  visit(st, [&](auto s) {
    using S = decltype(s);
    visit(dt, [&](auto d) {
      using D = decltype(d);
      const S* in = static_cast<const S*>(src);
      D* out = static_cast<D*>(dst);
      constexpr bool half_s = std::is_same_v<S, float16_t> || std::is_same_v<S, bfloat16_t>;
      constexpr bool half_d = std::is_same_v<D, float16_t> || std::is_same_v<D, bfloat16_t>;
      constexpr bool ints = std::is_integral_v<S> && std::is_integral_v<D> &&
                            !std::is_same_v<S, bool> && !std::is_same_v<D, bool>;
      if constexpr (std::is_same_v<S, int64_t> && std::is_same_v<D, int32_t>) {
        for (int64_t i = 0; i < n; ++i) out[i] = static_cast<D>(in[i]);
      } else if constexpr (ints) {
        for (int64_t i = 0; i < n; ++i) out[i] = saturate_int<D>(in[i]);
      } else if constexpr (half_s && std::is_same_v<D, float>) {
        for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(in[i]);  // the autocast path
      } else if constexpr (std::is_same_v<S, float> && half_d) {
        for (int64_t i = 0; i < n; ++i) out[i] = D(in[i]);
      } else {
        for (int64_t i = 0; i < n; ++i) out[i] = from_double<D>(to_double(in[i]));
      }
    });
  });
}

Array Array::empty(const Shape& shape, DType dtype, Device device) {
  if (!is_static(shape)) fail<ShapeError>("[Array] cannot allocate dynamic shape {}", str(shape));
  if (!within_element_limit(shape))
    fail<ShapeError>("[Array] shape {} has more than 2^59 elements", str(shape));
  Array a;
  a.shape_ = shape;
  a.dtype_ = dtype;
  if (device.kind == Device::Kind::cpu) {
    a.storage_ = host_alloc(a.nbytes());
    return a;
  }
  DeviceBackend* b = backend_of(device);
  auto s = std::make_shared<Storage>();
  s->data = b->allocate(device.index, a.nbytes(), nullptr);
  s->bytes = a.nbytes();
  s->device = device;
  s->deleter = [b, i = device.index](void* p) { b->release(i, p); };
  a.storage_ = std::move(s);
  return a;
}

void move_storage(Storage& s, Device device) {
  static std::mutex mu;
  std::lock_guard<std::mutex> l(mu);
  if (s.device == device) return;
  Array src = Array::wrap(s.data, {static_cast<int64_t>(s.bytes)}, u8, nullptr);
  src.storage()->device = s.device;
  Array dst = src.to(device);
  // take over dst's block and hand the old one to its deleter
  if (s.deleter && s.data) s.deleter(s.data);
  s.data = dst.storage()->data;
  s.deleter = std::move(dst.storage()->deleter);
  s.device = device;
  dst.storage()->data = nullptr;
  dst.storage()->deleter = nullptr;
}

Array Array::adopt(std::shared_ptr<Storage> storage, const Shape& shape, DType dtype) {
  Array a;
  a.shape_ = shape;
  a.dtype_ = dtype;
  KILN_ASSERT(!storage || storage->bytes >= a.nbytes());
  a.storage_ = std::move(storage);
  return a;
}

Array Array::to(Device device) const {
  const Device from = this->device();
  if (from == device) return *this;
  Array out = empty(shape_, dtype_, device);
  if (nbytes() == 0) return out;
  const Device gpu = from.kind == Device::Kind::cpu ? device : from;
  DeviceBackend* b = backend_of(gpu);
  b->copy_async(gpu.index, out.data(), device.kind == Device::Kind::cpu, data(),
                from.kind == Device::Kind::cpu, nbytes(), nullptr);
  b->synchronize(gpu.index, nullptr);
  return out;
}

Array Array::zeros(const Shape& shape, DType dtype) {
  Array a = empty(shape, dtype);
  std::memset(a.data(), 0, a.nbytes());
  return a;
}

Array Array::from_data(const void* data, const Shape& shape, DType dtype) {
  Array a = empty(shape, dtype);
  if (a.nbytes()) std::memcpy(a.data(), data, a.nbytes());
  return a;
}

Array Array::wrap(void* data, const Shape& shape, DType dtype, std::shared_ptr<void> owner) {
  Array a;
  a.shape_ = shape;
  a.dtype_ = dtype;
  auto s = std::make_shared<Storage>();
  s->data = data;
  s->bytes = a.nbytes();
  s->device = Device::cpu();
  s->deleter = [owner](void*) mutable { owner.reset(); };
  a.storage_ = std::move(s);
  return a;
}

Device Array::device() const { return storage_ ? storage_->device : Device::cpu(); }
void* Array::data() { return storage_ ? static_cast<char*>(storage_->data) + offset_ : nullptr; }
const void* Array::data() const {
  return storage_ ? static_cast<const char*>(storage_->data) + offset_ : nullptr;
}

void Array::check_type(DType t) const {
  if (device().kind != Device::Kind::cpu)
    fail<UnsupportedError>("[Array] typed host access to an array on {}; copy it with "
                           "to(Device::cpu()) first", device().str());
  if (t != dtype_)
    fail<DTypeError>("[Array] data<{}>() on an array of dtype {}", name(t), name(dtype_));
}

template <typename T> std::vector<T> Array::to_vector() const {
  if (device().kind != Device::Kind::cpu) return to(Device::cpu()).to_vector<T>();
  std::vector<T> out(static_cast<size_t>(numel()));
  if (!out.empty()) convert(data(), dtype_, out.data(), dtype_of<T>(), numel());
  return out;
}
template std::vector<float> Array::to_vector<float>() const;
template std::vector<double> Array::to_vector<double>() const;
template std::vector<float16_t> Array::to_vector<float16_t>() const;
template std::vector<bfloat16_t> Array::to_vector<bfloat16_t>() const;
template std::vector<int8_t> Array::to_vector<int8_t>() const;
template std::vector<uint8_t> Array::to_vector<uint8_t>() const;
template std::vector<int16_t> Array::to_vector<int16_t>() const;
template std::vector<int32_t> Array::to_vector<int32_t>() const;
template std::vector<int64_t> Array::to_vector<int64_t>() const;
template std::vector<uint16_t> Array::to_vector<uint16_t>() const;
template std::vector<uint32_t> Array::to_vector<uint32_t>() const;
template std::vector<uint64_t> Array::to_vector<uint64_t>() const;

Array Array::astype(DType t) const {
  if (device().kind != Device::Kind::cpu) return to(Device::cpu()).astype(t).to(device());
  Array a = empty(shape_, t);
  if (numel()) convert(data(), dtype_, a.data(), t, numel());
  return a;
}

Array Array::reshape(const Shape& shape) const {
  if (kiln::numel(shape) != numel())
    fail<ShapeError>("[Array] cannot reshape {} to {}", str(shape_), str(shape));
  Array a = *this;
  a.shape_ = shape;
  return a;
}

Array Array::first_rows(int64_t n) const {
  if (shape_.empty() || n < 0 || n > shape_[0])
    fail<ShapeError>("[Array] no first {} rows in shape {}", n, str(shape_));
  Array a = *this;
  a.shape_[0] = n;
  return a;
}

Array Array::padded(const Shape& shape) const {
  const size_t r = shape_.size();
  bool ok = shape.size() == r;
  size_t last = 0;  // the last dim that grows
  for (size_t d = 0; ok && d < r; ++d) {
    ok = shape[d] >= shape_[d];
    if (shape[d] > shape_[d]) last = d;
  }
  if (!ok) fail<ShapeError>("[Array] cannot pad shape {} to {}", str(shape_), str(shape));
  const bool host = device().kind == Device::Kind::cpu;
  Array out = host ? zeros(shape, dtype_) : empty(shape, dtype_, device());
  if (numel() == 0 || shape == shape_) {
    if (!host && out.nbytes()) {
      DeviceBackend* b = backend_of(device());
      b->memset_async(device().index, out.data(), 0, out.nbytes(), nullptr);
      if (numel())
        b->copy_async(device().index, out.data(), false, data(), false, nbytes(), nullptr);
      b->synchronize(device().index, nullptr);
    }
    return out;
  }
  // runs: contiguous blocks of dims last.. of this array, one per index of the dims before
  const size_t es = size_of(dtype_);
  int64_t run = 1, runs = 1;
  for (size_t d = last; d < r; ++d) run *= shape_[d];  // (no dim after `last` grows)
  for (size_t d = 0; d < last; ++d) runs *= shape_[d];
  DeviceBackend* b = host ? nullptr : backend_of(device());
  if (b) b->memset_async(device().index, out.data(), 0, out.nbytes(), nullptr);
  const auto* src = static_cast<const char*>(data());
  auto* dst = static_cast<char*>(out.data());
  const int64_t dst_run = run / shape_[last] * shape[last];
  for (int64_t i = 0; i < runs; ++i) {
    int64_t at = 0, rest = i, step = 1;  // the run's place in the padded shape
    for (size_t d = last; d-- > 0;) {
      at += rest % shape_[d] * step;
      rest /= shape_[d];
      step *= shape[d];
    }
    char* to = dst + static_cast<size_t>(at * dst_run) * es;
    const char* from = src + static_cast<size_t>(i * run) * es;
    if (b)
      b->copy_async(device().index, to, false, from, false, static_cast<size_t>(run) * es, nullptr);
    else std::memcpy(to, from, static_cast<size_t>(run) * es);
  }
  if (b) b->synchronize(device().index, nullptr);
  return out;
}

Array Array::copy() const {
  if (device().kind == Device::Kind::cpu) return from_data(data(), shape_, dtype_);
  Array out = empty(shape_, dtype_, device());
  DeviceBackend* b = backend_of(device());
  b->copy_async(device().index, out.data(), false, data(), false, nbytes(), nullptr);
  b->synchronize(device().index, nullptr);
  return out;
}

Array Array::take_rows(const std::vector<int64_t>& rows) const {
  if (shape_.empty()) fail<ShapeError>("[Array] take_rows needs rank >= 1, got a scalar");
  if (device().kind != Device::Kind::cpu) return to(Device::cpu()).take_rows(rows).to(device());
  Shape s = shape_;
  s[0] = static_cast<int64_t>(rows.size());
  Array out = empty(s, dtype_);
  const size_t row = shape_[0] ? nbytes() / static_cast<size_t>(shape_[0]) : 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] < 0 || rows[i] >= shape_[0])
      fail<ValueError>("[Array] row {} out of range for shape {}", rows[i], str(shape_));
    std::memcpy(static_cast<char*>(out.data()) + i * row,
                static_cast<const char*>(data()) + rows[i] * row, row);
  }
  return out;
}

}  // namespace kiln
