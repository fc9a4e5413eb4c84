// ONNX's TfIdfVectorizer (opset 9) over integer tokens, written out with kiln ops so that it runs
// on every backend: each pool n-gram's count per row, found by comparing shifted slices of the
// input with the pool, then scattered to the output's coordinates by a 0/1 matrix product and
// weighted. As ONNX's reference (and ONNX Runtime) count: n-grams of min_gram_length to
// max_gram_length items, items 1 to max_skip_count + 1 apart (unigrams once), whole n-grams
// inside the row only.
#include <fmt/ranges.h>

#include <algorithm>
#include <limits>
#include <optional>
#include <set>

#include "io/onnx/map_util.h"

namespace kiln::onnx::detail {

namespace {

constexpr int64_t kEnd = std::numeric_limits<int64_t>::max();

// The pool's n-grams of one length and their output coordinates.
struct Grams {
  int64_t n = 0;
  std::vector<std::vector<int64_t>> items;  // each n-gram's n tokens
  std::vector<int64_t> coords;              // its output coordinate
  std::vector<float> weights;               // its weight (IDF, TFIDF), 1 without weights
};

// The pool split by n-gram length (ngram_counts holds each length's first index; the k-th n-gram
// of the pool has coordinate ngram_indexes[k]), lengths outside [lo, hi] dropped: their entries
// never count. An n-gram twice in the pool is an error, as in ONNX Runtime (ONNX's reference
// counts it at its last entry's coordinate).
std::vector<Grams> pool_grams(NodeContext& c, const std::vector<int64_t>& pool, int64_t lo,
                              int64_t hi, const std::vector<int64_t>& coords,
                              const std::vector<float>& weights) {
  const std::vector<int64_t> starts = c.attr_ints("ngram_counts");
  const auto total = static_cast<int64_t>(pool.size());
  std::vector<Grams> out;
  int64_t k = 0;  // the number of the group's first n-gram in the pool
  for (size_t i = 0; i < starts.size(); ++i) {
    const int64_t n = static_cast<int64_t>(i) + 1;
    const int64_t b = starts[i], e = i + 1 < starts.size() ? starts[i + 1] : total;
    if (b < 0 || e > total || b > e)
      c.fail(fmt::format("ngram_counts [{}, {}) is not a range of a pool of {}", b, e, total));
    const int64_t count = (e - b) / n;
    if (k + count > static_cast<int64_t>(coords.size()))
      c.fail(fmt::format("the pool has more n-grams than the {} ngram_indexes", coords.size()));
    if (n >= lo && n <= hi && count > 0) {
      Grams g{n, {}, {}, {}};
      std::set<std::vector<int64_t>> seen;
      for (int64_t j = 0; j < count; ++j) {
        std::vector<int64_t> items(pool.begin() + b + j * n, pool.begin() + b + (j + 1) * n);
        if (!seen.insert(items).second)
          c.fail(fmt::format("the pool holds the {}-gram [{}] twice", n, fmt::join(items, ", ")));
        g.items.push_back(std::move(items));
        g.coords.push_back(coords[static_cast<size_t>(k + j)]);
        g.weights.push_back(weights.empty() ? 1.0f : weights[static_cast<size_t>(k + j)]);
      }
      out.push_back(std::move(g));
    }
    k += count;
  }
  return out;
}

// How often each n-gram of g occurs in each row of x (N, C), its items `gap` apart: (N, G) f32.
// Position p matches where x[p + j·gap] = g's item j for every j (no match past the row's end).
Tensor occurrences(NodeContext& c, const Tensor& x, const Grams& g, int64_t gap) {
  const auto G = static_cast<int64_t>(g.items.size());
  const int64_t span = (g.n - 1) * gap;  // from an n-gram's first item to its last
  std::optional<Tensor> match;
  for (int64_t j = 0; j < g.n; ++j) {
    std::vector<int64_t> col;
    for (const auto& items : g.items) col.push_back(items[static_cast<size_t>(j)]);
    const Tensor want = cast(known(c, Array::from_vector(col, {1, 1, G})), x.dtype());
    const int64_t to = j * gap - span;  // x[:, j·gap : C - span + j·gap]
    const Tensor part = slice(x, {0, j * gap}, {kEnd, to == 0 ? kEnd : to});
    const Tensor eq = equal(expand_dims(part, {2}), want);  // (N, C - span, G)
    match = match ? logical_and(*match, eq) : eq;
  }
  return sum(cast(*match, f32), {1});
}

// TfIdfVectorizer (opset 9): X (C) or (N, C) of int32/int64 tokens -> Y (D) or (N, D) f32 with
// D = max(ngram_indexes) + 1: per row, each pool n-gram's count (TF), its weight where it occurs
// (IDF) or its count times its weight (TFIDF), added at its coordinate ngram_indexes[i]. The
// weights are the pool's n-grams' (1 without them), as the operator's definition and ONNX
// Runtime take them; ONNX's reference indexes them by coordinate instead. n-grams that share a
// coordinate add up (in IDF mode ONNX Runtime keeps one of them).
Outs tfidf_vectorizer(NodeContext& c) {
  Tensor x = c.input(0);
  if (c.has_attr("pool_strings")) c.unsupported("pool_strings (kiln has no string tensors)");
  if (x.dtype() != i32 && x.dtype() != i64)
    c.fail(fmt::format("X must hold int32 or int64 tokens, got {}", name(x.dtype())));
  if (x.rank() > 2) c.fail(fmt::format("X of rank {} (0 to 2)", x.rank()));
  const std::string mode = c.attr_string("mode", "");
  if (mode != "TF" && mode != "IDF" && mode != "TFIDF")
    c.fail(fmt::format("mode '{}' (TF, IDF or TFIDF)", mode));
  const int64_t lo = c.attr_int("min_gram_length", 1), hi = c.attr_int("max_gram_length", 1);
  const int64_t skips = c.attr_int("max_skip_count", 0);
  if (lo < 1 || hi < lo || skips < 0)
    c.fail(
        fmt::format("min_gram_length {}, max_gram_length {} and max_skip_count {} (1 <= min "
                    "<= max, skips >= 0)",
                    lo, hi, skips));
  const std::vector<int64_t> coords = c.attr_ints("ngram_indexes");
  if (coords.empty()) c.fail("ngram_indexes is empty");
  for (int64_t v : coords)
    if (v < 0) c.fail(fmt::format("ngram_indexes holds {} (coordinates are >= 0)", v));
  const int64_t D = *std::max_element(coords.begin(), coords.end()) + 1;
  const std::vector<float> weights = mode == "TF" ? std::vector<float>{} : c.attr_floats("weights");
  if (!weights.empty() && weights.size() != coords.size())
    c.fail(fmt::format("{} weights for {} ngram_indexes (one a pool n-gram)", weights.size(),
                       coords.size()));
  const int rank = x.rank();
  if (rank < 2) x = reshape(x, {1, -1});
  const std::vector<Grams> grams =
      pool_grams(c, c.attr_ints("pool_int64s"), lo, hi, coords, weights);
  // per row, each coordinate's value: the n-grams' (N, G) times their weighted placement (G, D)
  Tensor y = full(concat({slice(shape_of(x), {0}, {1}), known_ints(c, {D})}, 0), 0.0, f32);
  for (const Grams& g : grams) {
    Tensor counts;
    for (int64_t gap = 1; gap <= (g.n == 1 ? 1 : skips + 1); ++gap) {
      const Tensor n = occurrences(c, x, g, gap);
      counts = gap == 1 ? n : counts + n;
    }
    if (mode == "IDF") counts = cast(greater(counts, scalar_of(counts, 0)), f32);
    std::vector<float> place(g.coords.size() * static_cast<size_t>(D), 0.0f);
    for (size_t i = 0; i < g.coords.size(); ++i)
      place[i * static_cast<size_t>(D) + static_cast<size_t>(g.coords[i])] = g.weights[i];
    y = y + matmul(counts,
                   known(c, Array::from_vector(place, {static_cast<int64_t>(g.coords.size()), D})));
  }
  return {rank < 2 ? reshape(y, {D}) : y};
}

}  // namespace

void add_text_ops(std::vector<OpEntry>& t) {
  t.push_back({"TfIdfVectorizer", 9, tfidf_vectorizer});
}

}  // namespace kiln::onnx::detail
