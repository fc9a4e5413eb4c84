// ONNX's ai.onnx.ml ops that are tensor arithmetic: Binarizer and ArrayFeatureExtractor (version
// 1) and TreeEnsemble (version 5), as ONNX's reference (and ONNX Runtime) compute them.
#include <algorithm>
#include <cmath>
#include <limits>

#include "io/onnx/map_util.h"

namespace kiln::onnx::detail {

namespace {

// Binarizer: 1 where x > threshold, else 0 (NaN too), in x's dtype.
Outs binarizer(NodeContext& c) {
  const Tensor x = c.input(0);
  const double threshold = c.attr_float("threshold", 0);
  return {where(greater(x, scalar_of(x, threshold)), scalar_of(x, 1), scalar_of(x, 0))};
}

// ArrayFeatureExtractor: X's elements along its last axis at the indices Y (all of Y's values, in
// order); a 1-D X gives one row, (1, k).
Outs array_feature_extractor(NodeContext& c) {
  Tensor x = c.input(0);
  const Tensor y = c.input(1);
  if (!is_integer(y.dtype()))
    c.fail(fmt::format("Y must hold integer indices, got {}", name(y.dtype())));
  if (x.rank() == 0) c.fail("X must have at least one dim");
  if (x.rank() == 1) x = reshape(x, {1, x.dim(0)});
  return {gather(x, reshape(cast(y, i64), {-1}), x.rank() - 1)};
}

// TreeEnsemble: every sample through every tree, vectorized. The tree structure is attributes,
// known while importing: every node's comparison is computed at once (B x nodes, bools), then
// each tree's walk advances one level a step for as many steps as the deepest tree has, all
// trees together (B x trees node indices, gathered from the true / false children); the leaves
// reached give (weight, target), summed (or averaged, or their min or max) into B x n_targets.
Outs tree_ensemble(NodeContext& c) {
  const Tensor x = c.input(0);
  if (x.rank() != 2)
    c.fail(fmt::format("X must be 2-D (samples, features), got rank {}", x.rank()));
  if (!is_floating(x.dtype()))
    c.fail(fmt::format("X must be a float tensor, got {}", name(x.dtype())));
  const std::vector<int64_t> features = c.attr_ints("nodes_featureids"),
                             true_ids = c.attr_ints("nodes_truenodeids"),
                             false_ids = c.attr_ints("nodes_falsenodeids"),
                             true_leaf = c.attr_ints("nodes_trueleafs"),
                             false_leaf = c.attr_ints("nodes_falseleafs"),
                             leaf_targets = c.attr_ints("leaf_targetids"),
                             roots = c.attr_ints("tree_roots");
  const std::vector<double> splits = c.attr_tensor("nodes_splits").to_vector<double>();
  const std::vector<double> leaf_weights = c.attr_tensor("leaf_weights").to_vector<double>();
  const std::vector<int64_t> modes = c.has_attr("nodes_modes")
                                         ? c.attr_tensor("nodes_modes").to_vector<int64_t>()
                                         : std::vector<int64_t>(features.size(), 0);
  const std::vector<int64_t> tracks = c.attr_ints("nodes_missing_value_tracks_true");
  const int64_t n_targets = c.required_int("n_targets");
  const int64_t aggregate = c.attr_int("aggregate_function", 1),
                post = c.attr_int("post_transform", 0);
  const size_t n = features.size(), leaves = leaf_weights.size();
  if (n == 0 || splits.size() != n || true_ids.size() != n || false_ids.size() != n ||
      true_leaf.size() != n || false_leaf.size() != n || modes.size() != n ||
      (!tracks.empty() && tracks.size() != n))
    c.fail(
        fmt::format("the nodes_* attributes must all hold one value for each of the {} nodes", n));
  if (leaf_targets.size() != leaves) c.fail("leaf_targetids and leaf_weights differ in length");
  if (roots.empty()) c.fail("tree_roots is empty");
  if (aggregate < 0 || aggregate > 3)
    c.unsupported(fmt::format("aggregate_function {}", aggregate));
  if (post != 0 && post != 1 && post != 2)
    c.unsupported(fmt::format("post_transform {} (NONE, SOFTMAX and LOGISTIC are mapped)", post));
  auto check = [&](int64_t id, bool leaf, const char* what) {
    if (id < 0 || id >= static_cast<int64_t>(leaf ? leaves : n))
      c.fail(fmt::format("{} {} is not a {} index", what, id, leaf ? "leaf" : "node"));
  };
  for (size_t i = 0; i < n; ++i) {
    check(true_ids[i], true_leaf[i] != 0, "nodes_truenodeids");
    check(false_ids[i], false_leaf[i] != 0, "nodes_falsenodeids");
    if (features[i] < 0 || (x.dim(1) >= 0 && features[i] >= x.dim(1)))
      c.fail(fmt::format("nodes_featureids {} is past X's {} features", features[i], x.dim(1)));
    if (modes[i] < 0 || modes[i] > 6) c.fail(fmt::format("nodes_modes {} is not a mode", modes[i]));
  }
  for (int64_t t : leaf_targets)
    if (t < 0 || t >= n_targets) c.fail(fmt::format("leaf_targetids {} is past n_targets", t));
  // set membership: each MEMBER node's values, NaN-separated in order
  std::vector<std::vector<double>> members(n);
  if (std::count(modes.begin(), modes.end(), 6) > 0) {
    const std::vector<double> m = c.attr_tensor("membership_values").to_vector<double>();
    size_t k = 0;
    for (size_t i = 0; i < n; ++i) {
      if (modes[i] != 6) continue;
      for (; k < m.size() && !std::isnan(m[k]); ++k) members[i].push_back(m[k]);
      if (k++ >= m.size()) c.fail("membership_values holds fewer sets than there are MEMBER nodes");
    }
  }
  // the deepest walk from any root: each node's height once (nodes may share children), by an
  // explicit stack; a node met again while open closes a cycle, an error
  std::vector<int64_t> height(n, 0);
  std::vector<char> state(n, 0);  // 0 new, 1 open, 2 done
  auto height_of = [&](int64_t root) {
    std::vector<int64_t> stack{root};
    while (!stack.empty()) {
      const auto u = static_cast<size_t>(stack.back());
      if (state[u] == 2) {
        stack.pop_back();
        continue;
      }
      state[u] = 1;
      bool ready = true;
      for (const auto& [id, leaf] :
           {std::pair{true_ids[u], true_leaf[u]}, std::pair{false_ids[u], false_leaf[u]}}) {
        if (leaf) continue;
        const auto v = static_cast<size_t>(id);
        if (state[v] == 1) c.fail("the nodes form a cycle");
        if (state[v] == 0) stack.push_back(id), ready = false;
      }
      if (!ready) continue;
      int64_t h = 1;
      if (!true_leaf[u]) h = std::max(h, 1 + height[static_cast<size_t>(true_ids[u])]);
      if (!false_leaf[u]) h = std::max(h, 1 + height[static_cast<size_t>(false_ids[u])]);
      height[u] = h;
      state[u] = 2;
      stack.pop_back();
    }
    return height[static_cast<size_t>(root)];
  };
  int64_t depth = 0;
  for (int64_t r : roots) {
    check(r, false, "tree_roots");
    const auto u = static_cast<size_t>(r);
    if (!(true_leaf[u] && false_leaf[u] && true_ids[u] == false_ids[u]))
      depth = std::max(depth, height_of(r));
  }
  const DType dt = x.dtype();
  auto consts = [&](const std::vector<double>& v, DType t) {
    return known(c, Array::from_vector(v, {static_cast<int64_t>(v.size())}).astype(t));
  };
  auto ints = [&](const std::vector<int64_t>& v) { return known_ints(c, v); };
  // the comparisons of every node, (B, n)
  const Tensor f = gather(x, ints(features), 1);
  const Tensor s = reshape(consts(splits, dt), {1, static_cast<int64_t>(n)});
  const Tensor cmp[6] = {less_equal(f, s), less(f, s),  greater_equal(f, s),
                         greater(f, s),    equal(f, s), not_equal(f, s)};
  Tensor cond;
  for (int m = 0; m < 7; ++m) {
    std::vector<double> is(n, 0);
    bool any = false;
    for (size_t i = 0; i < n; ++i) any |= (is[i] = modes[i] == m) != 0;
    if (!any) continue;
    Tensor cm;
    if (m < 6) {
      cm = cmp[m];
    } else {  // f in the node's set: against a padded (n, widest set) table (NaN never equal)
      size_t width = 1;
      for (const auto& v : members) width = std::max(width, v.size());
      std::vector<double> table(n * width, std::numeric_limits<double>::quiet_NaN());
      for (size_t i = 0; i < n; ++i)
        std::copy(members[i].begin(), members[i].end(),
                  table.begin() + static_cast<long>(i * width));
      const Tensor t =
          reshape(consts(table, dt), {1, static_cast<int64_t>(n), static_cast<int64_t>(width)});
      cm = cast(max(cast(equal(expand_dims(f, {2}), t), f32), {2}), boolean);
    }
    const Tensor where_m = cast(reshape(consts(is, f32), {1, static_cast<int64_t>(n)}), boolean);
    cond = cond.valid() ? where(where_m, cm, cond) : logical_and(cm, where_m);
  }
  if (!tracks.empty()) {
    std::vector<double> tr(tracks.begin(), tracks.end());
    const Tensor t = cast(reshape(consts(tr, f32), {1, static_cast<int64_t>(n)}), boolean);
    cond = logical_or(cond, logical_and(isnan(f), t));
  }
  // the walks: (B, trees) node indices, then leaf indices once a walk has reached its leaf (a root
  // whose two branches are one leaf is that leaf, indexed by the root's own index, as in ONNX's
  // reference)
  const auto trees = static_cast<int64_t>(roots.size());
  std::vector<double> root_leaf(roots.size());
  for (size_t t = 0; t < roots.size(); ++t) {
    const auto r = static_cast<size_t>(roots[t]);
    root_leaf[t] = true_leaf[r] && false_leaf[r] && true_ids[r] == false_ids[r];
    if (root_leaf[t]) check(roots[t], true, "a leaf tree_roots");
  }
  const Tensor f0 = gather(f, ints({0}), 1);
  const Tensor none = less(f0, f0);  // (B, 1), false (NaN too)
  const Tensor zero = cast(none, i64);
  Tensor at = add(zero, reshape(ints(roots), {1, trees}));
  Tensor done = logical_or(none, cast(reshape(consts(root_leaf, f32), {1, trees}), boolean));
  // (the gathers read f32 and i64 tables, the types every backend's gathers take)
  const Tensor tid = ints(true_ids), fid = ints(false_ids);
  const Tensor tleaf = ints(true_leaf), fleaf = ints(false_leaf);
  const Tensor condf = cast(cond, f32);
  for (int64_t step = 0; step < depth; ++step) {
    const Tensor node = where(done, zero, at);  // (a finished walk looks at node 0, unused)
    const Tensor go = greater(gather_elements(condf, node, 1), scalar_of(condf, 0.5));
    const Tensor next = where(go, gather(tid, node), gather(fid, node));
    const Tensor leaf = where(go, gather(tleaf, node), gather(fleaf, node));
    at = where(done, at, next);
    done = logical_or(done, not_equal(leaf, scalar_of(leaf, 0)));
  }
  // the leaves' weights into their targets
  const Tensor w = gather(consts(leaf_weights, dt), at);  // (B, trees)
  const Tensor hot =
      cast(one_hot(gather(ints(leaf_targets), at), n_targets, -1, f32), boolean);  // (B, T, k)
  const Tensor wk = expand_dims(w, {2});
  Tensor y;
  if (aggregate <= 1) {
    y = sum(where(hot, wk, scalar_of(wk, 0)), {1});
    if (aggregate == 0) y = div(y, scalar_of(y, static_cast<double>(trees)));
  } else {
    const double far = aggregate == 2 ? std::numeric_limits<double>::infinity()
                                      : -std::numeric_limits<double>::infinity();
    const Tensor picked = where(hot, wk, scalar_of(wk, far));
    y = aggregate == 2 ? min(picked, {1}) : max(picked, {1});
    // (a target no tree reaches keeps the reference's start: the type's largest or lowest)
    const double start = aggregate == 2 ? (dt == f64 ? std::numeric_limits<double>::max()
                                                     : std::numeric_limits<float>::max())
                                        : (dt == f64 ? std::numeric_limits<double>::lowest()
                                                     : std::numeric_limits<float>::lowest());
    y = where(equal(y, scalar_of(y, far)), scalar_of(y, start), y);
  }
  if (post == 1) y = softmax(y, -1);
  if (post == 2) y = sigmoid(y);
  return {y};
}

}  // namespace

void add_ml_ops(std::vector<OpEntry>& t) {
  t.insert(t.end(), {
                        {"ai.onnx.ml.Binarizer", 1, binarizer},
                        {"ai.onnx.ml.ArrayFeatureExtractor", 1, array_feature_extractor},
                        {"ai.onnx.ml.TreeEnsemble", 5, tree_ensemble},
                    });
}

}  // namespace kiln::onnx::detail
