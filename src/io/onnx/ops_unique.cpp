// ONNX Unique (opset 11): the distinct elements of X (or its distinct slices along `axis`), their
// first indices, each element's (or slice's) index among them, and their counts. Its outputs'
// sizes depend on X's values, so X must be known while importing: onnx::Session runs the node on
// the host between two parts of the model (InputValuesNeeded naming the node), as NonZero.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "io/onnx/map_util.h"

namespace kiln::onnx::detail {

namespace {

Outs unique_op(NodeContext& c) {
  const Array* a = c.constant(0);
  if (!a) {
    const Shape x = c.input(0).shape();
    const bool by_axis = c.has_attr("axis");
    const Shape y = by_axis ? data_dim(x, c.attr_int("axis", 0)) : Shape{-1};
    int64_t inverse = -1;
    if (by_axis && !x.empty()) {
      int64_t ax = c.attr_int("axis", 0);
      if (ax < 0) ax += static_cast<int64_t>(x.size());
      if (ax >= 0 && ax < static_cast<int64_t>(x.size())) inverse = x[static_cast<size_t>(ax)];
    } else if (!by_axis && is_static(x)) {
      inverse = numel(x);
    }
    c.needs_data({0},
                 "input 0 must be known while importing: Unique's output sizes depend on its "
                 "values",
                 {y, {-1}, {std::max<int64_t>(inverse, -1)}, {-1}});
  }
  Tensor x = c.input(0);
  const bool sorted = c.attr_int("sorted", 1) != 0;
  const bool has_axis = c.has_attr("axis");
  if (!has_axis) x = reshape(x, {-1});
  const Shape s = has_axis ? a->shape() : Shape{a->numel()};
  if (s.empty()) c.fail("X must have at least one dim when an axis is given");
  const int64_t axis = has_axis ? axis_of(c, c.attr_int("axis", 0), static_cast<int>(s.size())) : 0;
  // X's slices along the axis, as rows of doubles (the values compare as numpy compares them)
  const std::vector<double> v = a->astype(f64).to_vector<double>();
  const int64_t n = s[static_cast<size_t>(axis)];
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= s[static_cast<size_t>(d)];
  for (size_t d = static_cast<size_t>(axis) + 1; d < s.size(); ++d) inner *= s[d];
  auto at = [&](int64_t slice, int64_t k) {  // the k-th element of slice `slice`
    return v[static_cast<size_t>((k / inner * n + slice) * inner + k % inner)];
  };
  const int64_t width = outer * inner;
  // (NaN after every number and equal to NaN, as numpy's unique counts NaNs as one value)
  auto less = [&](int64_t p, int64_t q) {
    for (int64_t k = 0; k < width; ++k) {
      const double a = at(p, k), b = at(q, k);
      const bool na = std::isnan(a), nb = std::isnan(b);
      if (na || nb) {
        if (na != nb) return nb;
        continue;
      }
      if (a != b) return a < b;
    }
    return false;
  };
  auto same = [&](int64_t p, int64_t q) { return !less(p, q) && !less(q, p); };
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), less);  // (a group's first is its first index)
  std::vector<int64_t> first, counts, group(static_cast<size_t>(n));
  for (size_t i = 0; i < order.size(); ++i) {
    if (i == 0 || !same(order[i - 1], order[i])) {
      first.push_back(order[i]);
      counts.push_back(0);
    }
    group[static_cast<size_t>(order[i])] = static_cast<int64_t>(first.size()) - 1;
    ++counts.back();
  }
  // sorted: ascending slices; else the order of their first occurrences
  std::vector<int64_t> rank(first.size());
  std::iota(rank.begin(), rank.end(), 0);
  if (!sorted)
    std::sort(rank.begin(), rank.end(), [&](int64_t p, int64_t q) {
      return first[static_cast<size_t>(p)] < first[static_cast<size_t>(q)];
    });
  std::vector<int64_t> place(rank.size()), idx, cnt;
  for (size_t k = 0; k < rank.size(); ++k) {
    place[static_cast<size_t>(rank[k])] = static_cast<int64_t>(k);
    idx.push_back(first[static_cast<size_t>(rank[k])]);
    cnt.push_back(counts[static_cast<size_t>(rank[k])]);
  }
  std::vector<int64_t> inverse(group.size());
  for (size_t i = 0; i < group.size(); ++i) inverse[i] = place[static_cast<size_t>(group[i])];
  return {gather(x, known_ints(c, idx), axis), known_ints(c, idx), known_ints(c, inverse),
          known_ints(c, cnt)};
}

}  // namespace

void add_unique_ops(std::vector<OpEntry>& t) { t.push_back({"Unique", 11, unique_op}); }

}  // namespace kiln::onnx::detail
