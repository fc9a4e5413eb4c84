#include "core/sym_dim.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

namespace kiln::sym {
namespace {

// Codes: kBase - id * kStride. The stride keeps a code plus or minus a size, or times a factor,
// from landing on another code.
constexpr int64_t kBase = -(int64_t{1} << 40);
constexpr int64_t kStride = int64_t{1} << 20;
constexpr size_t kMaxExprs = size_t{1} << 19;
constexpr int64_t kMaxSize = int64_t{1} << 59;

enum class Kind : uint8_t { symbol, add, sub, mul, floordiv, ceildiv, min, max };

struct Expr {
  Kind kind;
  int64_t a = 0, b = 0;  // operands (dims), for all kinds but symbol
  std::string name;      // symbol
  bool operator<(const Expr& o) const {
    return std::tie(kind, a, b, name) < std::tie(o.kind, o.a, o.b, o.name);
  }
};

struct Table {
  std::mutex mu;
  std::deque<Expr> exprs;  // (stable addresses: readers hold references without the lock)
  std::map<Expr, size_t> index;
  std::atomic<size_t> size{0};
};
Table& table() {
  static Table t;
  return t;
}

int64_t intern(Expr e) {
  Table& t = table();
  std::lock_guard<std::mutex> l(t.mu);
  auto it = t.index.find(e);
  if (it != t.index.end()) return kBase - static_cast<int64_t>(it->second) * kStride;
  if (t.exprs.size() >= kMaxExprs) return kDynamic;  // (beyond that, dims stay unknown)
  const size_t id = t.exprs.size();
  t.exprs.push_back(e);
  t.index.emplace(std::move(e), id);
  t.size.store(t.exprs.size());
  return kBase - static_cast<int64_t>(id) * kStride;
}

const Expr& expr(int64_t d) {
  Table& t = table();
  std::lock_guard<std::mutex> l(t.mu);
  return t.exprs[static_cast<size_t>((kBase - d) / kStride)];
}

bool known(int64_t d) { return d >= 0 || is_symbolic(d); }

// Sums and products as flat lists: a constant and the symbolic terms (sorted), so that operands
// in another order or grouping give the same code.
void flatten(Kind k, int64_t d, int64_t& constant, std::vector<int64_t>& terms) {
  if (d >= 0) {
    const bool over = k == Kind::add ? constant > kMaxSize - d : d != 0 && constant > kMaxSize / d;
    constant = over ? kMaxSize + 1 : k == Kind::add ? constant + d : constant * d;
    return;
  }
  const Expr& e = expr(d);
  if (e.kind == k) {
    flatten(k, e.a, constant, terms);
    flatten(k, e.b, constant, terms);
  } else {
    terms.push_back(d);
  }
}

int64_t rebuild(Kind k, int64_t constant, std::vector<int64_t> terms) {
  const int64_t unit = k == Kind::add ? 0 : 1;
  if (k == Kind::mul && constant == 0) return 0;
  if (constant < 0 || constant > kMaxSize) return kDynamic;
  std::sort(terms.begin(), terms.end(), std::greater<>());
  if (terms.empty()) return constant;
  int64_t r = terms[0];
  for (size_t i = 1; i < terms.size(); ++i) r = intern({k, r, terms[i], {}});
  return constant == unit ? r : intern({k, r, constant, {}});
}

int64_t combine(Kind k, int64_t a, int64_t b) {
  if (!known(a) || !known(b)) return kDynamic;
  int64_t constant = k == Kind::add ? 0 : 1;
  std::vector<int64_t> terms;
  flatten(k, a, constant, terms);
  flatten(k, b, constant, terms);
  return rebuild(k, constant, std::move(terms));
}

// a / b when every factor of b is a factor of a: the factors left; -1 otherwise.
int64_t cancel(int64_t a, int64_t b) {
  int64_t ca = 1, cb = 1;
  std::vector<int64_t> fa, fb;
  flatten(Kind::mul, a, ca, fa);
  flatten(Kind::mul, b, cb, fb);
  if (cb == 0 || ca % cb != 0) return kDynamic;
  for (int64_t f : fb) {
    auto it = std::find(fa.begin(), fa.end(), f);
    if (it == fa.end()) return kDynamic;
    fa.erase(it);
  }
  return rebuild(Kind::mul, ca / cb, std::move(fa));
}

int64_t divide(Kind k, int64_t a, int64_t b) {
  if (!known(a) || !known(b) || b == 0) return kDynamic;
  if (a >= 0 && b >= 0) return k == Kind::floordiv ? a / b : (a + b - 1) / b;
  if (b == 1) return a;
  const int64_t exact = cancel(a, b);
  if (exact != kDynamic) return exact;
  return intern({k, a, b, {}});
}

// d as base + offset: x + c, x - c (c a size), or d + 0.
std::pair<int64_t, int64_t> offset_form(int64_t d) {
  if (!is_symbolic(d)) return {d, 0};
  const Expr& e = expr(d);
  if (e.kind == Kind::add && e.b >= 0) return {e.a, e.b};
  if (e.kind == Kind::sub && e.b >= 0) return {e.a, -e.b};
  return {d, 0};
}

std::string text(int64_t d, bool bracket) {
  if (d >= 0) return std::to_string(d);
  if (!is_symbolic(d)) return "?";
  const Expr& e = expr(d);
  std::string r;
  switch (e.kind) {
    case Kind::symbol:
      return e.name;
    case Kind::add:
      r = text(e.a, false) + "+" + text(e.b, false);
      break;
    case Kind::sub:
      r = text(e.a, false) + "-" + text(e.b, true);
      break;
    case Kind::mul:
      return text(e.a, true) + "*" + text(e.b, true);
    case Kind::floordiv:
      return text(e.a, true) + "//" + text(e.b, true);
    case Kind::ceildiv:
      return "ceil(" + text(e.a, false) + "/" + text(e.b, false) + ")";
    case Kind::min:
      return "min(" + text(e.a, false) + ", " + text(e.b, false) + ")";
    case Kind::max:
      return "max(" + text(e.a, false) + ", " + text(e.b, false) + ")";
  }
  return bracket ? "(" + r + ")" : r;
}

}  // namespace

bool is_symbolic(int64_t d) {
  if (d > kBase || (kBase - d) % kStride != 0) return false;
  return static_cast<size_t>((kBase - d) / kStride) < table().size.load();
}

int64_t symbol(const std::string& name) { return intern({Kind::symbol, 0, 0, name}); }

int64_t add(int64_t a, int64_t b) { return combine(Kind::add, a, b); }
int64_t mul(int64_t a, int64_t b) { return combine(Kind::mul, a, b); }

int64_t sub(int64_t a, int64_t b) {
  if (!known(a) || !known(b)) return kDynamic;
  if (a >= 0 && b >= 0) return a >= b ? a - b : kDynamic;
  if (b == 0) return a;
  if (a == b) return 0;
  // (x + c1) - (x + c2) with offsets of either sign: c1 - c2
  const auto [xa, ca] = offset_form(a);
  const auto [xb, cb] = offset_form(b);
  if (xa == xb && !(xa >= 0)) return ca >= cb ? ca - cb : kDynamic;
  // (x + c) - d with sizes c >= d: x + (c - d)
  int64_t c = 0;
  std::vector<int64_t> terms;
  flatten(Kind::add, a, c, terms);
  if (b >= 0 && c >= b) return rebuild(Kind::add, c - b, std::move(terms));
  return intern({Kind::sub, a, b, {}});
}

int64_t floordiv(int64_t a, int64_t b) { return divide(Kind::floordiv, a, b); }
int64_t ceildiv(int64_t a, int64_t b) { return divide(Kind::ceildiv, a, b); }

int64_t min(int64_t a, int64_t b) {
  if (!known(a) || !known(b)) return kDynamic;
  if (a >= 0 && b >= 0) return std::min(a, b);
  if (a == b || b == 0) return b;
  if (a == 0) return a;
  return intern({Kind::min, std::max(a, b), std::min(a, b), {}});
}

int64_t max(int64_t a, int64_t b) {
  if (!known(a) || !known(b)) return kDynamic;
  if (a >= 0 && b >= 0) return std::max(a, b);
  if (a == b || b == 0) return a;
  if (a == 0) return b;
  return intern({Kind::max, std::max(a, b), std::min(a, b), {}});
}

int64_t product(const Shape& s, size_t begin, size_t end) {
  int64_t r = 1;
  for (size_t i = begin; i < std::min(end, s.size()); ++i) r = mul(r, s[i]);
  return r;
}

int64_t evaluate(int64_t d, const std::function<int64_t(const std::string&)>& value) {
  if (d >= 0) return d;
  if (!is_symbolic(d)) return kDynamic;
  const Expr& e = expr(d);
  if (e.kind == Kind::symbol) return value(e.name);
  const int64_t a = evaluate(e.a, value), b = evaluate(e.b, value);
  if (a < 0 || b < 0) return kDynamic;
  switch (e.kind) {
    case Kind::add:
      return a + b;
    case Kind::sub:
      return a >= b ? a - b : kDynamic;
    case Kind::mul:
      return b != 0 && a > kMaxSize / b ? kDynamic : a * b;
    case Kind::floordiv:
      return b > 0 ? a / b : kDynamic;
    case Kind::ceildiv:
      return b > 0 ? (a + b - 1) / b : kDynamic;
    case Kind::min:
      return std::min(a, b);
    case Kind::max:
      return std::max(a, b);
    case Kind::symbol:
      break;
  }
  return kDynamic;
}

int64_t choose(int64_t d, const std::function<int64_t(const std::string&)>& value) {
  if (!is_symbolic(d)) return d;
  const Expr e = expr(d);  // (a copy: interning below may grow the table)
  switch (e.kind) {
    case Kind::symbol:
      return d;
    case Kind::min:
    case Kind::max: {
      const int64_t a = evaluate(e.a, value), b = evaluate(e.b, value);
      if (a < 0 || b < 0) return d;
      const bool take_a =
          a == b ? is_symbolic(e.a) || !is_symbolic(e.b) : (e.kind == Kind::min) == (a < b);
      return choose(take_a ? e.a : e.b, value);
    }
    case Kind::add:
      return add(choose(e.a, value), choose(e.b, value));
    case Kind::sub:
      return sub(choose(e.a, value), choose(e.b, value));
    case Kind::mul:
      return mul(choose(e.a, value), choose(e.b, value));
    case Kind::floordiv:
      return floordiv(choose(e.a, value), choose(e.b, value));
    case Kind::ceildiv:
      return ceildiv(choose(e.a, value), choose(e.b, value));
  }
  return d;
}

std::string str(int64_t d) { return text(d, false); }

std::string str(const Shape& s) {
  std::string r = "(";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + str(s[i]);
  return r + (s.size() == 1 ? ",)" : ")");
}

Shape erase(const Shape& s) {
  Shape r = s;
  for (int64_t& d : r) d = d < 0 ? kDynamic : d;
  return r;
}

}  // namespace kiln::sym
