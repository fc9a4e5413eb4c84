// safetensors reader (format and checks: include/kiln/safetensors.h). Files are read with pread,
// never mapped (io/file.h): a file cut short while loading is an IoError, never SIGBUS.
#include "kiln/safetensors.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "core/element_limit.h"
#include "core/errors.h"
#include "io/file.h"

namespace kiln::safetensors {

namespace {
constexpr uint64_t kMaxHeaderBytes = uint64_t{100} << 20;
constexpr int64_t kMaxDim = int64_t{1} << 40;
static_assert(std::endian::native == std::endian::little, "safetensors is little endian");

// The kiln dtype of a safetensors dtype name; false for a name kiln has no dtype for.
bool dtype_of(const std::string& s, DType& t) {
  // (F8_E4M3 is PyTorch's float8_e4m3fn)
  static const std::pair<const char*, DType> kTable[] = {{"F64", f64},
                                                         {"F32", f32},
                                                         {"F16", f16},
                                                         {"BF16", bf16},
                                                         {"I64", i64},
                                                         {"I32", i32},
                                                         {"I16", i16},
                                                         {"I8", i8},
                                                         {"U8", u8},
                                                         {"U16", u16},
                                                         {"U32", u32},
                                                         {"U64", u64},
                                                         {"BOOL", boolean},
                                                         {"F8_E4M3", f8e4m3fn},
                                                         {"F8_E5M2", f8e5m2},
                                                         {"F8_E4M3FNUZ", f8e4m3fnuz},
                                                         {"F8_E5M2FNUZ", f8e5m2fnuz},
                                                         {"F8_E8M0", f8e8m0fnu}};
  for (const auto& [name, dt] : kTable)
    if (s == name) {
      t = dt;
      return true;
    }
  return false;
}
// Names the format defines that kiln cannot hold (an UnsupportedError rather than a FormatError).
bool known_elsewhere(const std::string& s) {
  // (F4 packs two values a byte, where kiln's f4e2m1fn holds one)
  static const char* kOthers[] = {"F4", "F6_E2M3", "F6_E3M2", "C64"};
  return std::find_if(std::begin(kOthers), std::end(kOthers),
                      [&](const char* o) { return s == o; }) != std::end(kOthers);
}
}  // namespace

struct File::Impl {
  std::string label;
  std::vector<Entry> tensors;
  std::map<std::string, size_t> by_name;
  std::map<std::string, std::string> metadata;
  uint64_t data_start = 0;
  std::shared_ptr<io::RegularFile> file;  // or the bytes:
  std::vector<uint8_t> bytes;

  template <typename... Args>
  [[noreturn]] void bad(fmt::format_string<Args...> f, Args&&... args) const {
    fail<FormatError>("[safetensors] {}: {}", label, fmt::format(f, std::forward<Args>(args)...));
  }

  // Reads `n` bytes at `offset` of the file (or the bytes); false when fewer are there.
  bool read_at(void* dst, size_t n, uint64_t offset) const {
    if (file) return file->read_at(dst, n, offset) == n;
    if (offset > bytes.size() || n > bytes.size() - offset) return false;
    if (n) std::memcpy(dst, bytes.data() + offset, n);
    return true;
  }

  // The header's checks; `size` is the whole file's.
  void parse(uint64_t size) {
    if (size < 8) bad("{} bytes: a file starts with an 8-byte header length", size);
    uint64_t n = 0;
    if (!read_at(&n, 8, 0)) bad("cannot read the header length");
    if (n > kMaxHeaderBytes) bad("a header of {} bytes (at most {})", n, kMaxHeaderBytes);
    if (n > size - 8) bad("a header of {} bytes in a file of {}", n, size);
    std::string text(n, '\0');
    if (!read_at(text.data(), n, 8)) bad("cannot read the {}-byte header", n);
    data_start = 8 + n;
    // top-level keys, to refuse duplicates (the parser keeps the last)
    std::set<std::string> keys;
    bool duplicate = false;
    std::string dup;
    auto note_keys = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
      if (depth == 1 && event == nlohmann::json::parse_event_t::key) {
        const std::string k = parsed.get<std::string>();
        if (!keys.insert(k).second && !duplicate) duplicate = true, dup = k;
      }
      return true;
    };
    const nlohmann::json h = nlohmann::json::parse(text, note_keys, /*allow_exceptions=*/false);
    if (h.is_discarded()) bad("the header is not JSON");
    if (!h.is_object()) bad("the header is not a JSON object");
    if (duplicate) bad("the header names '{}' twice", dup);
    for (auto it = h.begin(); it != h.end(); ++it) {
      const std::string& name = it.key();
      const nlohmann::json& v = it.value();
      if (name == "__metadata__") {
        if (!v.is_object()) bad("__metadata__ is not an object");
        for (auto m = v.begin(); m != v.end(); ++m) {
          if (!m.value().is_string()) bad("__metadata__ '{}' is not a string", m.key());
          metadata[m.key()] = m.value().get<std::string>();
        }
        continue;
      }
      tensors.push_back(entry(name, v));
    }
    std::sort(tensors.begin(), tensors.end(), [](const Entry& a, const Entry& b) {
      return a.begin < b.begin || (a.begin == b.begin && a.end < b.end);
    });
    const uint64_t data = size - data_start;
    uint64_t at = 0;
    for (const Entry& e : tensors) {
      if (e.begin != at)
        bad("tensor '{}' starts at byte {} of the data, where {} ({})", e.name, e.begin, at,
            e.begin < at ? "it overlaps the tensor before it" : "a gap is left");
      at = e.end;
    }
    if (at != data) bad("the tensors hold {} bytes of a data section of {}", at, data);
    for (size_t k = 0; k < tensors.size(); ++k) by_name[tensors[k].name] = k;
  }

  Entry entry(const std::string& name, const nlohmann::json& v) const {
    if (name.empty()) bad("a tensor without a name");
    if (!v.is_object()) bad("tensor '{}': not an object", name);
    for (auto f = v.begin(); f != v.end(); ++f)
      if (f.key() != "dtype" && f.key() != "shape" && f.key() != "data_offsets")
        bad("tensor '{}': unknown field '{}'", name, f.key());
    Entry e;
    e.name = name;
    const auto dt = v.find("dtype");
    if (dt == v.end() || !dt->is_string()) bad("tensor '{}': no dtype string", name);
    const std::string d = dt->get<std::string>();
    if (!dtype_of(d, e.dtype)) {
      if (known_elsewhere(d))
        fail<UnsupportedError>(
            "[safetensors] {}: tensor '{}' has dtype {}, which kiln does not hold", label, name, d);
      bad("tensor '{}': unknown dtype '{}'", name, d);
    }
    const auto sh = v.find("shape");
    if (sh == v.end() || !sh->is_array() || sh->size() > 64)
      bad("tensor '{}': no shape array (of at most 64 dims)", name);
    for (const auto& d : *sh) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() > static_cast<uint64_t>(kMaxDim))
        bad("tensor '{}': shape {} holds a dim that is not an integer in [0, 2^40]", name,
            sh->dump());
      e.shape.push_back(static_cast<int64_t>(d.get<uint64_t>()));
    }
    if (!within_element_limit(e.shape))
      bad("tensor '{}': shape {} is too large", name, str(e.shape));
    const auto off = v.find("data_offsets");
    if (off == v.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
        !(*off)[1].is_number_unsigned())
      bad("tensor '{}': data_offsets is not two unsigned integers", name);
    e.begin = (*off)[0].get<uint64_t>();
    e.end = (*off)[1].get<uint64_t>();
    const uint64_t want = static_cast<uint64_t>(numel(e.shape)) * size_of(e.dtype);
    if (e.end < e.begin || e.end - e.begin != want)
      bad("tensor '{}': data_offsets [{}, {}) for {} {}, which takes {} bytes", name, e.begin,
          e.end, name_of(e.dtype), str(e.shape), want);
    return e;
  }

  static const char* name_of(DType t) { return kiln::name(t); }
};

File File::open(const std::string& path) {
  auto impl = std::make_shared<Impl>();
  impl->label = path;
  impl->file = std::make_shared<io::RegularFile>(path, "[safetensors]", path);
  impl->parse(impl->file->size());
  File f;
  f.impl_ = std::move(impl);
  return f;
}

File File::from_bytes(const void* data, size_t size, const std::string& label) {
  auto impl = std::make_shared<Impl>();
  impl->label = label;
  const auto* p = static_cast<const uint8_t*>(data);
  impl->bytes.assign(p, p + size);
  impl->parse(size);
  File f;
  f.impl_ = std::move(impl);
  return f;
}

const std::vector<Entry>& File::tensors() const { return impl_->tensors; }
const std::map<std::string, std::string>& File::metadata() const { return impl_->metadata; }
bool File::contains(const std::string& name) const { return impl_->by_name.count(name) > 0; }

const Entry& File::entry(const std::string& name) const {
  const auto it = impl_->by_name.find(name);
  if (it == impl_->by_name.end())
    fail<ValueError>("[safetensors] {}: no tensor '{}' (the file holds {})", impl_->label, name,
                     impl_->tensors.size());
  return impl_->tensors[it->second];
}

Array File::read(const std::string& name, Device device) const {
  const Entry& e = entry(name);
  Array a = Array::empty(e.shape, e.dtype);
  if (!impl_->read_at(a.data(), e.end - e.begin, impl_->data_start + e.begin))
    fail<IoError>(
        "[safetensors] {}: tensor '{}' could not be read whole (the file changed since "
        "it was opened?)",
        impl_->label, name);
  if (e.dtype == boolean) {
    const auto* b = static_cast<const uint8_t*>(a.data());
    for (int64_t i = 0; i < a.numel(); ++i)
      if (b[i] > 1)
        fail<FormatError>("[safetensors] {}: bool tensor '{}' holds {} at element {}", impl_->label,
                          name, static_cast<int>(b[i]), i);
  }
  return device.kind == Device::Kind::cpu ? a : a.to(device);
}

std::map<std::string, Array> File::read_all(Device device) const {
  std::map<std::string, Array> out;
  for (const Entry& e : impl_->tensors) out[e.name] = read(e.name, device);
  return out;
}

}  // namespace kiln::safetensors
