#include "core/tuning.h"

#include <bit>
#include <cstring>

#include "core/errors.h"

namespace kiln {

namespace {
static_assert(std::endian::native == std::endian::little, "tuning blobs are little endian");
constexpr char kTuningMagic[4] = {'K', 'T', 'U', 'N'};
constexpr size_t kBlobHeader = 16, kRecordHeader = 8;

template <typename T>
void append(std::vector<uint8_t>& out, T v) {
  const size_t at = out.size();
  out.resize(at + sizeof v);
  std::memcpy(out.data() + at, &v, sizeof v);
}
template <typename T>
T get(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
}  // namespace

std::string TuningIdentity::str() const { return device + ", " + arch + ", " + library; }

std::vector<uint8_t> write_tuning(const std::vector<TuningRecord>& records) {
  if (records.size() > kMaxTuningRecords)
    fail<ValueError>("[tuning] {} records; a blob holds at most {}", records.size(),
                     kMaxTuningRecords);
  std::vector<uint8_t> out(kTuningMagic, kTuningMagic + 4);
  append<uint32_t>(out, kTuningVersion);
  append<uint32_t>(out, static_cast<uint32_t>(records.size()));
  append<uint32_t>(out, 0);
  for (const TuningRecord& r : records) {
    if (r.key.size() > kMaxTuningKey || r.value.size() > kMaxTuningValue)
      fail<ValueError>(
          "[tuning] a record of kind {} has {} key and {} value entries (at most {}, {})", r.kind,
          r.key.size(), r.value.size(), kMaxTuningKey, kMaxTuningValue);
    append<uint16_t>(out, r.kind);
    append<uint16_t>(out, static_cast<uint16_t>(r.key.size()));
    append<uint16_t>(out, static_cast<uint16_t>(r.value.size()));
    append<uint16_t>(out, 0);
    for (int64_t v : r.key) append<int64_t>(out, v);
    for (int64_t v : r.value) append<int64_t>(out, v);
  }
  return out;
}

TuningParse parse_tuning(const uint8_t* data, size_t size) {
  TuningParse r;
  auto bad = [&](size_t offset, std::string what) {
    r.records.clear();
    r.error = std::move(what);
    r.error_offset = offset;
    return r;
  };
  if (size < kBlobHeader)
    return bad(0, fmt::format("{} bytes; a tuning blob has at least {}", size, kBlobHeader));
  if (std::memcmp(data, kTuningMagic, 4) != 0) return bad(0, "not a tuning blob (bad magic)");
  r.version = get<uint32_t>(data + 4);
  if (r.version != kTuningVersion) return r;  // a version this reader does not know: ignored
  const uint32_t count = get<uint32_t>(data + 8);
  if (get<uint32_t>(data + 12) != 0) return bad(12, "reserved bytes are not 0");
  // every record takes at least its header: a count the bytes cannot hold is rejected before
  // anything is allocated for it
  if (count > kMaxTuningRecords || count > (size - kBlobHeader) / kRecordHeader)
    return bad(8, fmt::format("{} records do not fit in {} bytes (at most {})", count, size,
                              kMaxTuningRecords));
  r.records.reserve(count);
  size_t at = kBlobHeader;
  for (uint32_t k = 0; k < count; ++k) {
    if (size - at < kRecordHeader)
      return bad(at, fmt::format("record {} of {} is cut off", k, count));
    TuningRecord rec;
    rec.kind = get<uint16_t>(data + at);
    const uint16_t nk = get<uint16_t>(data + at + 2), nv = get<uint16_t>(data + at + 4);
    if (nk > kMaxTuningKey || nv > kMaxTuningValue)
      return bad(at, fmt::format("record {} has {} key and {} value entries (at most {}, {})", k,
                                 nk, nv, kMaxTuningKey, kMaxTuningValue));
    if (get<uint16_t>(data + at + 6) != 0)
      return bad(at + 6, fmt::format("record {}: reserved bytes are not 0", k));
    const size_t body = (size_t{nk} + nv) * sizeof(int64_t);
    if (size - at - kRecordHeader < body)
      return bad(at, fmt::format("record {} of {} is cut off", k, count));
    at += kRecordHeader;
    rec.key.resize(nk);
    rec.value.resize(nv);
    if (nk) std::memcpy(rec.key.data(), data + at, nk * sizeof(int64_t));
    if (nv) std::memcpy(rec.value.data(), data + at + nk * sizeof(int64_t), nv * sizeof(int64_t));
    at += body;
    r.records.push_back(std::move(rec));
  }
  if (at != size) return bad(at, fmt::format("{} bytes after the last record", size - at));
  return r;
}

}  // namespace kiln
