#include "kiln/shape.h"

#include <algorithm>

#include "core/sym_dim.h"

namespace kiln {

int64_t numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) {
    if (d < 0) return -1;
    n *= d;
  }
  return n;
}

bool is_static(const Shape& s) {
  return std::none_of(s.begin(), s.end(), [](int64_t d) { return d < 0; });
}

std::string to_string(const Shape& s) {
  std::string r = "(";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) r += ", ";
    r += s[i] < 0 ? std::string("?") : std::to_string(s[i]);
  }
  if (s.size() == 1) r += ",";
  return r + ")";
}

std::vector<int64_t> contiguous_strides(const Shape& s) {
  std::vector<int64_t> st(s.size());
  int64_t acc = 1;
  for (int i = static_cast<int>(s.size()) - 1; i >= 0; --i) {
    st[i] = acc;
    acc *= std::max<int64_t>(s[i], 1);
  }
  return st;
}

bool broadcast_shapes(const Shape& a, const Shape& b, Shape& out) {
  const size_t n = std::max(a.size(), b.size());
  Shape r(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    if (da == db) r[i] = da;
    else if (da == 1) r[i] = db;
    else if (db == 1) r[i] = da;
    else if (da >= 0 && db >= 0) return false;
    // two symbolic dims that broadcast are equal or one is 1: the larger is the output's
    else if (da < 0 && db < 0) r[i] = sym::max(da, db);
    else r[i] = da < 0 ? db : da;  // dynamic against a fixed size: the fixed one wins
  }
  out = std::move(r);
  return true;
}

int normalize_axis(int64_t axis, int rank) {
  if (axis < -rank || axis >= rank) return -1;
  return static_cast<int>(axis < 0 ? axis + rank : axis);
}

}  // namespace kiln
