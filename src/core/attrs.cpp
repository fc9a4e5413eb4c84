#include "kiln/attrs.h"

#include <functional>

#include "core/errors.h"

namespace kiln {

Attrs& Attrs::set(const std::string& key, AttrValue v) {
  for (auto& kv : items_)
    if (kv.first == key) {
      kv.second = std::move(v);
      return *this;
    }
  items_.emplace_back(key, std::move(v));
  return *this;
}

const AttrValue* Attrs::find(const std::string& key) const {
  for (auto& kv : items_)
    if (kv.first == key) return &kv.second;
  return nullptr;
}

bool Attrs::has(const std::string& key) const { return find(key) != nullptr; }

namespace {
template <typename T>
const T& get(const Attrs& a, const AttrValue* v, const std::string& key, const char* type) {
  if (!v) fail<ValueError>("[attrs] missing attribute '{}' (have: {})", key, a.to_string());
  const T* p = std::get_if<T>(v);
  if (!p) fail<ValueError>("[attrs] attribute '{}' is not of type {}", key, type);
  return *p;
}
}  // namespace

int64_t Attrs::i(const std::string& key) const { return get<int64_t>(*this, find(key), key, "int"); }
double Attrs::f(const std::string& key) const {
  const AttrValue* v = find(key);
  if (v)
    if (auto* p = std::get_if<int64_t>(v)) return static_cast<double>(*p);
  return get<double>(*this, v, key, "float");
}
bool Attrs::b(const std::string& key) const { return get<bool>(*this, find(key), key, "bool"); }
const std::vector<int64_t>& Attrs::ints(const std::string& key) const {
  return get<std::vector<int64_t>>(*this, find(key), key, "int list");
}
const std::vector<double>& Attrs::floats(const std::string& key) const {
  return get<std::vector<double>>(*this, find(key), key, "float list");
}
const std::string& Attrs::str(const std::string& key) const {
  return get<std::string>(*this, find(key), key, "string");
}
DType Attrs::dtype(const std::string& key) const { return get<DType>(*this, find(key), key, "dtype"); }
int64_t Attrs::i(const std::string& key, int64_t d) const { return has(key) ? i(key) : d; }
double Attrs::f(const std::string& key, double d) const { return has(key) ? f(key) : d; }
bool Attrs::b(const std::string& key, bool d) const { return has(key) ? b(key) : d; }
std::string Attrs::str(const std::string& key, const std::string& d) const {
  return has(key) ? str(key) : d;
}

size_t Attrs::hash() const {
  size_t h = items_.size();
  auto mix = [&h](size_t v) { h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2); };
  for (auto& [k, v] : items_) {
    mix(std::hash<std::string>{}(k));
    mix(v.index());
    std::visit(
        [&](const auto& x) {
          using T = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<T, std::vector<int64_t>> ||
                        std::is_same_v<T, std::vector<double>>) {
            for (auto e : x) mix(std::hash<typename T::value_type>{}(e));
          } else if constexpr (std::is_same_v<T, DType>) {
            mix(static_cast<size_t>(x));
          } else {
            mix(std::hash<T>{}(x));
          }
        },
        v);
  }
  return h;
}

std::string Attrs::to_string() const {
  std::string r;
  for (auto& [k, v] : items_) {
    if (!r.empty()) r += ", ";
    r += k + "=";
    std::visit(
        [&](const auto& x) {
          using T = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<T, bool>) r += x ? "true" : "false";
          else if constexpr (std::is_same_v<T, DType>) r += name(x);
          else if constexpr (std::is_same_v<T, std::string>) r += "'" + x + "'";
          else r += fmt::format("{}", x);
        },
        v);
  }
  return r;
}

}  // namespace kiln
