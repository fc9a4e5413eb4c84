// einsum: a graph-building function, not an op. Repeated letters within one operand take a
// diagonal (a mask of equal coordinates, then a sum); letters no one else needs are summed
// early; operands then contract pairwise, left to right, through batched matmuls (shared kept
// letters are the batch, shared dropped ones the inner dim). An ellipsis becomes digits aligned
// from the right, which broadcast like numpy batch dims. Gradients come from the lowered ops.
#include <algorithm>
#include <cctype>
#include <cstring>
#include <numeric>

#include "kiln/ops/core.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/linalg.h"
#include "kiln/ops/nn.h"
#include "kiln/ops/reduce.h"
#include "kiln/ops/transform.h"
#include "ops/common.h"

namespace kiln {

using namespace ops;

namespace {

struct Term {
  Tensor t;
  std::string letters;  // one letter per dim of t
};

[[noreturn]] void bad(const std::string& eq, const std::string& why) {
  fail<ValueError>("[einsum] equation '{}': {}", eq, why);
}

// The diagonal of every letter repeated within one operand.
Term take_diagonals(const std::string& eq, Term x) {
  for (size_t i = 0; i < x.letters.size(); ++i) {
    for (size_t j = i + 1; j < x.letters.size(); ++j) {
      if (x.letters[i] != x.letters[j]) continue;
      const int64_t ni = x.t.dim(static_cast<int>(i)), nj = x.t.dim(static_cast<int>(j));
      if (!dims_match(ni, nj))
        fail<ShapeError>("[einsum] equation '{}': index '{}' is repeated over dims of sizes {} "
                         "and {} (shape {})",
                         eq, x.letters[i], ni, nj, str(x.t.shape()));
      const Tensor on = equal(coordinate_along_axis(x.t, static_cast<int64_t>(i)),
                              coordinate_along_axis(x.t, static_cast<int64_t>(j)));
      x.t = sum(where(on, x.t, scalar_like(x.t, 0)), {static_cast<int64_t>(j)});
      x.letters.erase(j, 1);
      --j;
    }
  }
  return x;
}

// Sums the dims whose letters are not in `needed`.
Term sum_unneeded(Term x, const std::string& needed) {
  Axes axes;
  std::string keep;
  for (size_t i = 0; i < x.letters.size(); ++i) {
    if (needed.find(x.letters[i]) == std::string::npos) axes.push_back(static_cast<int64_t>(i));
    else keep += x.letters[i];
  }
  if (!axes.empty()) x.t = sum(x.t, axes);
  x.letters = keep;
  return x;
}

Term permute_to(const Term& x, const std::string& order) {
  std::vector<int64_t> perm;
  for (char ch : order) perm.push_back(static_cast<int64_t>(x.letters.find(ch)));
  bool identity = true;
  for (size_t i = 0; i < perm.size(); ++i) identity &= perm[i] == static_cast<int64_t>(i);
  return {identity ? x.t : transpose(x.t, perm), order};
}

int64_t prod(const Shape& s) {
  return std::accumulate(s.begin(), s.end(), int64_t{1}, std::multiplies<>());
}
Shape joined(Shape a, const Shape& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// The contraction of a (batch, left, inner) with b (batch, inner, right) where some dims are
// known only when run: the same batched matmul on shapes computed from theirs (batch and inner
// dims broadcast from 1 as numpy's). The result keeps the dims of `expected` known now where
// at most one is not.
Tensor contract_run_time(const Tensor& a, const Tensor& b, size_t nb, size_t nl, size_t ni,
                         size_t nr, const Shape& expected) {
  const Tensor sa = shape_of(a), sb = shape_of(b);
  auto part = [](const Tensor& s, size_t from, size_t n) {
    return slice(s, {static_cast<int64_t>(from)}, {static_cast<int64_t>(from + n)});
  };
  const Tensor bs = maximum(part(sa, 0, nb), part(sb, 0, nb));
  const Tensor is = maximum(part(sa, nb + nl, ni), part(sb, nb, ni));
  const Tensor ls = part(sa, nb, nl), rs = part(sb, nb + ni, nr);
  auto size = [](const Tensor& dims) { return prod(dims, {0}, /*keepdims=*/true); };
  const Tensor ta =
      reshape_to(expand(a, concat({bs, ls, is}, 0)), concat({size(bs), size(ls), size(is)}, 0));
  const Tensor tb =
      reshape_to(expand(b, concat({bs, is, rs}, 0)), concat({size(bs), size(is), size(rs)}, 0));
  const Tensor y = reshape_to(matmul(ta, tb), concat({bs, ls, rs}, 0));
  return std::count(expected.begin(), expected.end(), -1) <= 1 ? reshape(y, expected) : y;
}

Term contract(const std::string& eq, const Term& a, const Term& b, const std::string& keep) {
  std::string batch, left, right, inner;
  for (char ch : a.letters) {
    const bool in_b = b.letters.find(ch) != std::string::npos;
    const bool kept = keep.find(ch) != std::string::npos;
    if (in_b && kept) batch += ch;
    else if (in_b) inner += ch;
    else left += ch;
  }
  for (char ch : b.letters)
    if (a.letters.find(ch) == std::string::npos) right += ch;
  const Term pa = permute_to(a, batch + left + inner), pb = permute_to(b, batch + inner + right);
  auto dims = [&](const Term& t, const std::string& ls) {
    Shape s;
    for (char ch : ls) s.push_back(t.t.dim(static_cast<int>(t.letters.find(ch))));
    return s;
  };
  // batch dims broadcast (an ellipsis of size 1 against n)
  const Shape bs_a = dims(pa, batch), bs_b = dims(pb, batch);
  Shape bs;
  if (!broadcast_shapes(bs_a, bs_b, bs))
    fail<ShapeError>("[einsum] equation '{}': shared dims {} and {} do not match", eq, str(bs_a),
                     str(bs_b));
  const Shape ls = dims(pa, left), is = dims(pb, inner), rs = dims(pb, right);
  if (!is_static(joined(joined(bs, ls), joined(is, rs))) || !is_static(dims(pa, inner)))
    return {contract_run_time(pa.t, pb.t, batch.size(), left.size(), inner.size(), right.size(),
                              joined(joined(bs, ls), rs)),
            batch + left + right};
  Tensor ta = pa.t, tb = pb.t;
  const Shape wa = joined(joined(bs, ls), dims(pa, inner)), wb = joined(joined(bs, is), rs);
  if (ta.shape() != wa) ta = broadcast_to(ta, wa);
  if (tb.shape() != wb) tb = broadcast_to(tb, wb);
  ta = reshape(ta, {prod(bs), prod(ls), prod(is)});
  tb = reshape(tb, {prod(bs), prod(is), prod(rs)});
  const Tensor y = reshape(matmul(ta, tb), joined(joined(bs, ls), rs));
  return {y, batch + left + right};
}

// The operand specs and the output of `eq` (spaces removed), checked for well-formedness.
void parse(const std::string& eq, std::vector<std::string>& specs, std::string& out,
           bool& has_out) {
  for (char ch : eq)
    if (!std::isalpha(static_cast<unsigned char>(ch)) && !std::strchr(",.->", ch))
      bad(eq, fmt::format("'{}' is not an index letter, ',', '->' or '...'", ch));
  const size_t arrow = eq.find("->");
  if (arrow != std::string::npos && eq.find("->", arrow + 2) != std::string::npos)
    bad(eq, "more than one '->'");
  const std::string lhs = eq.substr(0, arrow);
  has_out = arrow != std::string::npos;
  out = has_out ? eq.substr(arrow + 2) : "";
  for (size_t p = 0;;) {
    const size_t q = lhs.find(',', p);
    specs.push_back(lhs.substr(p, q == std::string::npos ? std::string::npos : q - p));
    if (q == std::string::npos) break;
    p = q + 1;
  }
  auto check_part = [&](const std::string& s, const char* what) {
    const size_t e = s.find("...");
    if (e != std::string::npos && s.find("...", e + 3) != std::string::npos)
      bad(eq, fmt::format("{} '{}' has more than one ellipsis", what, s));
    std::string rest = e == std::string::npos ? s : s.substr(0, e) + s.substr(e + 3);
    if (rest.find_first_of(".->,") != std::string::npos)
      bad(eq, fmt::format("{} '{}' has a stray '.', '-' or '>'", what, s));
  };
  for (const auto& s : specs) check_part(s, "operand subscripts");
  if (has_out) {
    check_part(out, "output");
    for (size_t i = 0; i < out.size(); ++i)
      if (std::isalpha(static_cast<unsigned char>(out[i])) &&
          out.find(out[i], i + 1) != std::string::npos)
        bad(eq, fmt::format("output index '{}' appears twice", out[i]));
  }
}
}  // namespace

Tensor einsum(const std::string& equation, const std::vector<Tensor>& operands) {
  std::string eq;
  for (char ch : equation)
    if (ch != ' ') eq += ch;
  std::vector<std::string> specs;
  std::string out;
  bool has_out = false;
  parse(eq, specs, out, has_out);
  if (specs.size() != operands.size())
    fail<ValueError>("[einsum] equation '{}' names {} operands, got {}", eq, specs.size(),
                     operands.size());
  for (const auto& t : operands)
    if (!t.valid() || t.graph_impl() != operands[0].graph_impl())
      fail<ValueError>("[einsum] equation '{}': operands must be tensors of one graph", eq);
  // an ellipsis becomes digits '0'.. aligned from the right (numpy broadcasting)
  int ell = 0;
  std::vector<Term> terms;
  for (size_t i = 0; i < specs.size(); ++i) {
    const Tensor& t = operands[i];
    std::string s = specs[i];
    if (const size_t e = s.find("..."); e != std::string::npos) {
      const int n = t.rank() - static_cast<int>(s.size() - 3);
      if (n < 0 || n > 10)
        fail<ShapeError>("[einsum] equation '{}': the ellipsis of operand {} does not fit its "
                         "shape {}",
                         eq, i, str(t.shape()));
      ell = std::max(ell, n);
      std::string digits;
      for (int k = 0; k < n; ++k) digits += static_cast<char>('0' + (10 - n + k));
      s = s.substr(0, e) + digits + s.substr(e + 3);
    }
    if (static_cast<int>(s.size()) != t.rank())
      fail<ShapeError>("[einsum] equation '{}': operand {} has shape {}, its subscripts '{}' "
                       "name {} dims",
                       eq, i, str(t.shape()), specs[i], s.size());
    terms.push_back({t, s});
  }
  // a letter names one size in every operand
  for (char ch = 'A'; ch <= 'z'; ++ch) {
    if (!std::isalpha(static_cast<unsigned char>(ch))) continue;
    int64_t size = -1;
    for (const auto& t : terms)
      for (size_t d = 0; d < t.letters.size(); ++d) {
        if (t.letters[d] != ch) continue;
        const int64_t n = t.t.dim(static_cast<int>(d));
        if (n >= 0 && size >= 0 && n != size)
          fail<ShapeError>("[einsum] equation '{}': index '{}' has sizes {} and {}", eq, ch, size,
                           n);
        if (n >= 0) size = n;
      }
  }
  std::string ell_digits;
  for (int k = 0; k < ell; ++k) ell_digits += static_cast<char>('0' + (10 - ell + k));
  if (!has_out) {
    std::string all;
    for (const auto& t : terms) all += t.letters;
    std::string letters;
    for (char ch : all)
      if (std::isalpha(static_cast<unsigned char>(ch)) &&
          std::count(all.begin(), all.end(), ch) == 1)
        letters += ch;
    std::sort(letters.begin(), letters.end());
    out = ell_digits + letters;
  } else if (const size_t e = out.find("..."); e != std::string::npos) {
    out = out.substr(0, e) + ell_digits + out.substr(e + 3);
  }
  for (char ch : out) {
    bool found = false;
    for (const auto& t : terms) found |= t.letters.find(ch) != std::string::npos;
    if (!found) bad(eq, fmt::format("output index '{}' is in no operand", ch));
  }
  auto needed_after = [&](size_t from) {
    std::string n = out;
    for (size_t j = from; j < terms.size(); ++j) n += terms[j].letters;
    return n;
  };
  for (size_t i = 0; i < terms.size(); ++i) {
    terms[i] = take_diagonals(eq, terms[i]);
    std::string others = out;
    for (size_t j = 0; j < terms.size(); ++j)
      if (j != i) others += terms[j].letters;
    terms[i] = sum_unneeded(terms[i], others);
  }
  Term acc = terms[0];
  for (size_t i = 1; i < terms.size(); ++i) {
    acc = contract(eq, acc, terms[i], needed_after(i + 1));
    acc = sum_unneeded(acc, needed_after(i + 1));
  }
  acc = sum_unneeded(acc, out);
  return permute_to(acc, out).t;
}

}  // namespace kiln
