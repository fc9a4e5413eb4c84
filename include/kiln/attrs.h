// Named, typed op attributes. Each op documents its keys in its family file.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "kiln/dtype.h"

namespace kiln {

using AttrValue =
    std::variant<bool, int64_t, double, std::vector<int64_t>, std::vector<double>, std::string, DType>;

class Attrs {
 public:
  Attrs() = default;
  Attrs(std::initializer_list<std::pair<std::string, AttrValue>> kv) : items_(kv) {}

  Attrs& set(const std::string& key, AttrValue v);
  bool has(const std::string& key) const;
  // Typed getters throw kiln::Error naming the key when it is missing or of another type.
  int64_t i(const std::string& key) const;
  double f(const std::string& key) const;  // accepts an int64 too
  bool b(const std::string& key) const;
  const std::vector<int64_t>& ints(const std::string& key) const;
  const std::vector<double>& floats(const std::string& key) const;
  const std::string& str(const std::string& key) const;
  DType dtype(const std::string& key) const;
  // Getters with a default for optional keys.
  int64_t i(const std::string& key, int64_t dflt) const;
  double f(const std::string& key, double dflt) const;
  bool b(const std::string& key, bool dflt) const;
  std::string str(const std::string& key, const std::string& dflt) const;

  const std::vector<std::pair<std::string, AttrValue>>& items() const { return items_; }
  bool operator==(const Attrs& o) const { return items_ == o.items_; }
  size_t hash() const;
  /// "axis=1, keepdims=true"
  std::string to_string() const;

 private:
  const AttrValue* find(const std::string& key) const;
  std::vector<std::pair<std::string, AttrValue>> items_;
};

}  // namespace kiln
