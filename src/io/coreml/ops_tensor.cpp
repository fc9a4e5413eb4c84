// MIL's tensor ops mapped onto kiln's: shapes and layout, slicing, gather and scatter, padding,
// sorting and generated tensors (src/io/coreml/mil.h; semantics as coremltools' op definitions,
// iOS15 to iOS18).
#include <algorithm>
#include <functional>
#include <limits>
#include <utility>

#include "io/coreml/mil.h"
#include "kiln/ops/core.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/rearrange.h"
#include "kiln/ops/reduce.h"
#include "kiln/ops/transform.h"

namespace kiln::coreml::detail {

namespace {

using Ints = std::vector<int64_t>;

constexpr int64_t kEnd = std::numeric_limits<int64_t>::max();    // a bound past the last element
constexpr int64_t kFirst = std::numeric_limits<int64_t>::min();  // before the first (step < 0)

Tensor ints_const(OpContext& c, const Ints& v) {
  return constant(c.graph(), Array::from_vector(v, {static_cast<int64_t>(v.size())}));
}

// A tensor of like's shape filled with v.
Tensor filled(OpContext& c, const Tensor& like, double v, DType dtype) {
  if (is_static(like.shape())) return full(c.graph(), like.shape(), v, dtype);
  return full(shape_of(like), v, dtype);
}

// The product of dims [a, b) of x as a 1-element i64 value.
Tensor dims_value(OpContext& c, const Tensor& x, int64_t a, int64_t b) {
  const Shape s = x.shape();
  const Shape part(s.begin() + a, s.begin() + b);
  if (is_static(part)) return ints_const(c, {numel(part)});
  return prod(slice(shape_of(x), {a}, {b}), {0}, true);
}

// x with each group [a, b) of its dims merged into one dim.
Tensor merge_dims(OpContext& c, const Tensor& x,
                  const std::vector<std::pair<int64_t, int64_t>>& groups) {
  const Shape s = x.shape();
  Shape out;
  int unknown = 0;
  for (auto [a, b] : groups) {
    const Shape part(s.begin() + a, s.begin() + b);
    out.push_back(is_static(part) ? numel(part) : -1);
    unknown += !is_static(part);
  }
  if (unknown <= 1) return reshape(x, out);
  std::vector<Tensor> parts;
  for (auto [a, b] : groups) parts.push_back(dims_value(c, x, a, b));
  return reshape_to(x, concat(parts, 0));
}

// Axes of `name` normalized against `rank`, in the order given.
Ints axes_param(OpContext& c, const char* name, int64_t rank) {
  Ints a = c.ints(name);
  for (int64_t& v : a) v = axis_of(c, v, rank);
  return a;
}

// reshape: `shape` may hold one -1 (inferred) and 0s, each taking x's dim at its place counted
// from the right (iOS17; iOS15 and 16 allow 0s only where the lengths match, which agrees), or 1
// where x has no such dim.
Tensor reshape_mil(OpContext& c, const Tensor& x) {
  const char* name = "shape";
  const Shape xs = x.shape();
  const int64_t r = x.rank();
  if (c.is_known(name)) {
    Ints s = c.ints(name);
    const int64_t k = static_cast<int64_t>(s.size());
    bool fits = true;
    for (int64_t i = 0; i < k; ++i)
      if (s[i] == 0) {
        const int64_t j = i + r - k;
        s[i] = j < 0 ? 1 : xs[j];
        fits = fits && s[i] >= 0;
      }
    if (fits) return reshape(x, s);
  }
  const Tensor s = cast(c.in(name), i64);
  if (s.rank() != 1 || s.dim(0) < 0) c.fail("parameter '{}' must be 1-d of a known length", name);
  const int64_t k = s.dim(0);
  const Tensor dims = shape_of(x);
  const Tensor aligned = k <= r ? slice(dims, {r - k}, {r})
                                : (r == 0 ? ints_const(c, Ints(k, 1))
                                          : concat({ints_const(c, Ints(k - r, 1)), dims}, 0));
  return reshape_to(x, where(equal(s, scalar_like(s, 0)), aligned, s));
}

// slice_by_index's and slice_update's stride and masks, one entry a dim.
struct SliceArgs {
  Ints stride, begin_mask, end_mask, squeeze_mask;
};

SliceArgs slice_args(OpContext& c, int64_t rank) {
  auto per_dim = [&](const char* name, int64_t fallback) {
    Ints v = c.has(name) ? c.ints(name) : Ints{};
    if (v.empty()) v.assign(rank, fallback);
    if (static_cast<int64_t>(v.size()) != rank)
      c.fail("parameter '{}' has {} entries for x of rank {}", name, v.size(), rank);
    return v;
  };
  SliceArgs a{per_dim("stride", 1), per_dim("begin_mask", 0), per_dim("end_mask", 0),
              per_dim("squeeze_mask", 0)};
  for (int64_t d = 0; d < rank; ++d)
    if (a.stride[d] == 0 && !a.squeeze_mask[d]) c.fail("parameter 'stride' is 0 at dim {}", d);
  return a;
}

// Python slice bounds for known begin and end: a masked bound is the whole dim's (in the stride's
// direction); a squeezed dim takes the one element at begin.
void known_bounds(OpContext& c, const SliceArgs& a, Ints& starts, Ints& stops, Ints& steps) {
  const Ints b = c.ints("begin"), e = c.ints("end");
  const size_t r = a.stride.size();
  if (b.size() != r || e.size() != r)
    c.fail("parameters 'begin' ({} entries) and 'end' ({}) need one entry per dim of x (rank {})",
           b.size(), e.size(), r);
  for (size_t d = 0; d < r; ++d) {
    if (a.squeeze_mask[d]) {
      starts.push_back(b[d]);
      stops.push_back(b[d] == -1 ? kEnd : b[d] + 1);
      steps.push_back(1);
      continue;
    }
    const bool up = a.stride[d] > 0;
    starts.push_back(a.begin_mask[d] ? (up ? 0 : kEnd) : b[d]);
    stops.push_back(a.end_mask[d] ? (up ? kEnd : kFirst) : e[d]);
    steps.push_back(a.stride[d]);
  }
}

Ints squeezed_dims(const SliceArgs& a) {
  Ints s;
  for (size_t d = 0; d < a.squeeze_mask.size(); ++d)
    if (a.squeeze_mask[d]) s.push_back(static_cast<int64_t>(d));
  return s;
}

// Python slicing of a dim of size n: the first position and the count (as slice_dim in kiln).
std::pair<int64_t, int64_t> slice_range(int64_t n, int64_t start, int64_t stop, int64_t step) {
  const int64_t lo = step > 0 ? 0 : -1, hi = step > 0 ? n : n - 1;
  auto resolve = [&](int64_t v) { return std::clamp(v < 0 ? v + n : v, lo, hi); };
  const int64_t b = resolve(start), e = resolve(stop);
  const int64_t span = step > 0 ? e - b : b - e, s = step > 0 ? step : -step;
  return {b, span > 0 ? (span + s - 1) / s : 0};
}

// slice_update: x with the slice that slice_by_index's parameters name replaced by `update`. The
// update is spread to x's shape (flipped where the stride is negative, strided with zeros between
// its elements, padded) and picked where each sliced dim's coordinate is one the slice visits.
Tensor slice_update(OpContext& c, const Tensor& x, Tensor u) {
  const int64_t r = x.rank();
  const SliceArgs a = slice_args(c, r);
  if (!c.is_known("begin") || !c.is_known("end"))
    c.fail("parameters 'begin' and 'end' must be known while importing (consts)");
  Ints starts, stops, steps;
  known_bounds(c, a, starts, stops, steps);
  for (int64_t d : squeezed_dims(a)) u = expand_dims(u, {d});
  if (u.rank() != r) c.fail("'update' has rank {}; the slice has rank {}", u.rank(), r);
  Tensor inside, spread = u;
  for (int64_t d = 0; d < r; ++d) {
    const int64_t n = x.dim(static_cast<int>(d));
    if (starts[d] == 0 && stops[d] == kEnd && steps[d] == 1) continue;  // the whole dim
    if (n < 0) c.fail("dim {} of x is dynamic; slice_update needs it known", d);
    auto [first, count] = slice_range(n, starts[d], stops[d], steps[d]);
    if (count == 0) return x;
    const int64_t s = steps[d] > 0 ? steps[d] : -steps[d];
    if (steps[d] < 0) {  // ascending positions: the update reversed
      first -= (count - 1) * s;
      spread = flip(spread, {d});
    }
    const int64_t last = first + (count - 1) * s;
    if (s > 1) {  // s - 1 zeros after each element, the last ones cut
      Ints pads(2 * (r + 1), 0);
      pads[2 * (d + 1) + 1] = s - 1;
      Tensor w = pad(expand_dims(spread, {d + 1}), pads);
      std::vector<std::pair<int64_t, int64_t>> groups;
      for (int64_t k = 0; k <= r; ++k)
        if (k != d + 1) groups.push_back({k, k == d ? k + 2 : k + 1});
      spread = slice(merge_dims(c, w, groups), {0}, {last - first + 1}, {1}, {d});
    }
    Ints pads(2 * r, 0);
    pads[2 * d] = first;
    pads[2 * d + 1] = n - 1 - last;
    spread = pad(spread, pads);
    const Tensor at = coordinate_along_axis(x, d, i64);
    Tensor in = logical_and(greater_equal(at, scalar_like(at, static_cast<double>(first))),
                            less_equal(at, scalar_like(at, static_cast<double>(last))));
    if (s > 1) {
      const Tensor off = sub(at, scalar_like(at, static_cast<double>(first)));
      in = logical_and(
          in, equal(mod(off, scalar_like(at, static_cast<double>(s))), scalar_like(at, 0)));
    }
    inside = inside.valid() ? logical_and(inside, in) : in;
  }
  if (!inside.valid()) return cast(spread, x.dtype());
  return where(inside, cast(spread, x.dtype()), x);
}

using ScatterFn = std::function<Tensor(const Tensor&, const Tensor&, ScatterReduction)>;

// MIL's scatter modes (default "add") on kiln's reductions: sub adds the negated updates, div
// divides by the product of the updates that reach an element.
Tensor scatter_by_mode(OpContext& c, const Tensor& data, const Tensor& updates,
                       const ScatterFn& f) {
  const std::string mode = c.text("mode", "add");
  if (mode == "update") return f(data, updates, ScatterReduction::none);
  if (mode == "add") return f(data, updates, ScatterReduction::add);
  if (mode == "mul") return f(data, updates, ScatterReduction::mul);
  if (mode == "max") return f(data, updates, ScatterReduction::max);
  if (mode == "min") return f(data, updates, ScatterReduction::min);
  if (mode == "sub") return f(data, neg(updates), ScatterReduction::add);
  if (mode == "div") {
    if (!is_floating(data.dtype()))
      c.fail("parameter 'mode': 'div' on {} data is not supported (float data is)",
             name(data.dtype()));
    return div(data, f(filled(c, data, 1.0, data.dtype()), updates, ScatterReduction::mul));
  }
  c.fail("parameter 'mode': unknown mode '{}' (update, add, sub, mul, div, max or min)", mode);
}

// gather with batch_dims b (tf.gather): x's first b dims and indices' are batch dims. The gathered
// axis moves next to the batch dims, gather_nd picks along it, and the result's dims go back in
// MIL's order: x's dims before axis, indices' own dims, x's dims after axis.
Tensor batch_gather(OpContext& c, const Tensor& x, const Tensor& indices, int64_t axis, int64_t b) {
  const int64_t r = x.rank(), n = indices.rank() - b;
  if (b < 0 || b > axis || b > indices.rank())
    c.fail("parameter 'batch_dims' {} must be in [0, min(axis {}, rank of indices {})]", b, axis,
           indices.rank());
  Tensor xs = x;
  if (axis != b) {
    Ints perm;
    for (int64_t d = 0; d < b; ++d) perm.push_back(d);
    perm.push_back(axis);
    for (int64_t d = b; d < r; ++d)
      if (d != axis) perm.push_back(d);
    xs = permute(x, perm);
  }
  Tensor y = gather_nd(xs, expand_dims(indices, {indices.rank()}), b);
  if (axis == b) return y;
  // y: batch, indices' own dims (n), x's dims [b, axis), the rest
  Ints perm;
  for (int64_t d = 0; d < b; ++d) perm.push_back(d);
  for (int64_t d = 0; d < axis - b; ++d) perm.push_back(b + n + d);
  for (int64_t d = 0; d < n; ++d) perm.push_back(b + d);
  for (int64_t d = b + n + axis - b; d < y.rank(); ++d) perm.push_back(d);
  return permute(y, perm);
}

void add_layout_ops(OpTable& t) {
  t["reshape"] = [](OpContext& c) { c.set(0, reshape_mil(c, c.in("x"))); };
  t["reshape_like"] = [](OpContext& c) {
    // the shape is made of ref_tensors' dims, known when the program is built (MIL requires it):
    // the declared output shape
    const Shape s = c.out_shape();
    if (!is_static(s)) c.fail("the output's declared shape {} is not static", str(s));
    c.set(0, reshape(c.in("x"), s));
  };
  t["transpose"] = [](OpContext& c) {
    const Tensor x = c.in("x");
    c.set(0, x.rank() == 0 ? x : permute(x, axes_param(c, "perm", x.rank())));
  };
  t["squeeze"] = [](OpContext& c) {
    // given axes: only those of size 1 go (PyTorch's rule); none given: every size-1 dim
    const Tensor x = c.in("x");
    if (!c.has("axes")) return c.set(0, squeeze(x));
    Ints ones;
    for (int64_t a : axes_param(c, "axes", x.rank()))
      if (x.dim(static_cast<int>(a)) == 1) ones.push_back(a);
    c.set(0, ones.empty() ? x : squeeze(x, ones));
  };
  t["expand_dims"] = [](OpContext& c) {
    const Tensor x = c.in("x");
    const Ints given = c.ints("axes");
    Ints a = axes_param(c, "axes", x.rank() + static_cast<int64_t>(given.size()));
    std::sort(a.begin(), a.end());
    c.set(0, expand_dims(x, a));
  };
  t["flatten2d"] = [](OpContext& c) {
    const Tensor x = c.in("x");
    const int64_t r = x.rank(), given = c.int_of("axis", 1), a = given < 0 ? given + r : given;
    if (a < 0 || a > r) c.fail("parameter 'axis' {} is out of range for rank {}", given, r);
    c.set(0, merge_dims(c, x, {{0, a}, {a, r}}));
  };
  t["concat"] = [](OpContext& c) {
    std::vector<Tensor> v = c.ins("values");
    if (v.empty()) c.fail("parameter 'values' is empty");
    if (v[0].rank() == 0) return c.set(0, stack(v, 0));  // scalars make a vector
    const int64_t r = v[0].rank(), a = axis_of(c, c.int_of("axis"), r);
    if (!c.flag("interleave", false)) return c.set(0, concat(v, a));
    // interleaved: the values' slices alternate along axis
    std::vector<std::pair<int64_t, int64_t>> groups;
    for (int64_t d = 0; d <= r; ++d)
      if (d != a + 1) groups.push_back({d, d == a ? d + 2 : d + 1});
    c.set(0, merge_dims(c, stack(v, a + 1), groups));
  };
  t["split"] = [](OpContext& c) {
    const Tensor x = c.in("x");
    const int64_t a = axis_of(c, c.int_of("axis"), x.rank());
    if (c.has("split_sizes")) return c.set(split(x, c.ints("split_sizes"), a));
    if (!c.has("num_splits")) c.fail("needs parameter 'num_splits' or 'split_sizes'");
    c.set(split(x, c.int_of("num_splits"), a));
  };
  t["stack"] = [](OpContext& c) {
    const std::vector<Tensor> v = c.ins("values");
    if (v.empty()) c.fail("parameter 'values' is empty");
    c.set(0, stack(v, axis_of(c, c.int_of("axis"), v[0].rank() + 1)));
  };
  t["tile"] = [](OpContext& c) {
    const Tensor x = c.in("x");
    c.set(0, c.is_known("reps") ? tile(x, c.ints("reps")) : tile(x, c.in("reps")));
  };
  t["reverse"] = [](OpContext& c) {
    // no axes: every dim; an empty list: none
    const Tensor x = c.in("x");
    if (!c.has("axes")) return c.set(0, x.rank() ? flip(x, {}) : x);
    const Ints a = axes_param(c, "axes", x.rank());
    c.set(0, a.empty() ? x : flip(x, a));
  };
  t["pixel_shuffle"] = [](OpContext& c) {
    c.set(0, pixel_shuffle(c.in("x"), c.int_of("upscale_factor")));
  };
  t["pixel_unshuffle"] = [](OpContext& c) {
    c.set(0, pixel_unshuffle(c.in("x"), c.int_of("downscale_factor")));
  };
  // TensorFlow's order of a block's channels (DCR)
  t["depth_to_space"] = [](OpContext& c) {
    c.set(0, depth_to_space(c.in("x"), c.int_of("block_size")));
  };
  t["space_to_depth"] = [](OpContext& c) {
    c.set(0, space_to_depth(c.in("x"), c.int_of("block_size")));
  };
}

void add_slice_ops(OpTable& t) {
  t["slice_by_index"] = [](OpContext& c) {
    const Tensor x = c.in("x");
    const int64_t r = x.rank();
    const SliceArgs a = slice_args(c, r);
    const Ints squeezed = squeezed_dims(a);
    Tensor y;
    if (c.is_known("begin") && c.is_known("end")) {
      Ints starts, stops, steps;
      known_bounds(c, a, starts, stops, steps);
      y = slice(x, starts, stops, steps);
    } else {
      // bounds computed by the program; a masked bound is a constant put in its place
      if (!squeezed.empty())
        c.fail(
            "parameter 'squeeze_mask' is not supported with 'begin' or 'end' computed by the "
            "program");
      Tensor b = cast(c.in("begin"), i64), e = cast(c.in("end"), i64);
      Ints bfill, efill;
      for (int64_t d = 0; d < r; ++d) {
        bfill.push_back(a.stride[d] > 0 ? 0 : kEnd);
        efill.push_back(a.stride[d] > 0 ? kEnd : kFirst);
      }
      auto any = [](const Ints& m) { return std::find(m.begin(), m.end(), 1) != m.end(); };
      if (any(a.begin_mask))
        b = where(cast(ints_const(c, a.begin_mask), boolean), ints_const(c, bfill), b);
      if (any(a.end_mask))
        e = where(cast(ints_const(c, a.end_mask), boolean), ints_const(c, efill), e);
      y = slice(x, b, e, a.stride);
    }
    c.set(0, squeezed.empty() ? y : squeeze(y, squeezed));
  };
  t["slice_by_size"] = [](OpContext& c) {
    // size -1: to the end; a negative begin counts from the end
    const Tensor x = c.in("x");
    if (c.is_known("begin") && c.is_known("size")) {
      const Ints b = c.ints("begin"), s = c.ints("size");
      if (b.size() != static_cast<size_t>(x.rank()) || s.size() != b.size())
        c.fail("parameters 'begin' and 'size' need one entry per dim of x (rank {})", x.rank());
      Ints stops;
      for (size_t d = 0; d < b.size(); ++d)
        stops.push_back(s[d] == -1 || (b[d] < 0 && b[d] + s[d] >= 0) ? kEnd : b[d] + s[d]);
      return c.set(0, slice(x, b, stops));
    }
    const Tensor b = cast(c.in("begin"), i64), s = cast(c.in("size"), i64);
    const Tensor zero = scalar_like(b, 0), e = add(b, s);
    const Tensor whole = logical_or(equal(s, scalar_like(s, -1)),
                                    logical_and(less(b, zero), greater_equal(e, zero)));
    c.set(0, slice(x, b, where(whole, ints_const(c, {kEnd}), e)));
  };
  t["slice_update"] = [](OpContext& c) { c.set(0, slice_update(c, c.in("x"), c.in("update"))); };
  t["pad"] = [](OpContext& c) {
    // pad lists (begin, end) pairs for x's last dims
    const Tensor x = c.in("x");
    const std::string mode = c.text("mode", "constant");
    PadKind kind = PadKind::constant;
    if (mode == "reflect") kind = PadKind::reflect;
    else if (mode == "replicate") kind = PadKind::edge;
    else if (mode != "constant")
      c.fail("parameter 'mode': unknown mode '{}' (constant, reflect or replicate)", mode);
    const double value = kind == PadKind::constant ? c.number("constant_val", 0.0) : 0.0;
    if (!c.is_known("pad")) return c.set(0, pad(x, c.in("pad"), kind, value));
    const Ints p = c.ints("pad");
    const size_t all = 2 * static_cast<size_t>(x.rank());
    if (p.size() % 2 || p.size() > all)
      c.fail("parameter 'pad' has {} entries; x of rank {} takes an even number up to {}", p.size(),
             x.rank(), all);
    Ints pads(all - p.size(), 0);
    pads.insert(pads.end(), p.begin(), p.end());
    c.set(0, pad(x, pads, kind, value));
  };
}

void add_index_ops(OpTable& t) {
  // validate_indices: kiln checks every index when the graph runs, and takes negative ones from
  // the end (iOS15's rule; iOS17 leaves them undefined)
  t["gather"] = [](OpContext& c) {
    const Tensor x = c.in("x"), indices = c.in("indices");
    const int64_t a = axis_of(c, c.int_of("axis", 0), x.rank()), b = c.int_of("batch_dims", 0);
    c.set(0, b == 0 ? gather(x, indices, a) : batch_gather(c, x, indices, a, b));
  };
  t["gather_along_axis"] = [](OpContext& c) {
    const Tensor x = c.in("x");
    c.set(0, gather_elements(x, c.in("indices"), axis_of(c, c.int_of("axis", 0), x.rank())));
  };
  t["gather_nd"] = [](OpContext& c) {
    c.set(0, gather_nd(c.in("x"), c.in("indices"), c.int_of("batch_dims", 0)));
  };
  t["scatter"] = [](OpContext& c) {
    // 1-d indices pick slices along axis: each index spread over its update slice
    const Tensor data = c.in("data"), indices = c.in("indices"), updates = c.in("updates");
    const int64_t a = axis_of(c, c.int_of("axis", 0), data.rank());
    if (indices.rank() != 1) c.fail("'indices' must be 1-d, got rank {}", indices.rank());
    Shape along(static_cast<size_t>(data.rank()), 1);
    along[a] = -1;
    const Tensor idx = reshape(indices, along);
    const Tensor spread = is_static(updates.shape()) ? broadcast_to(idx, updates.shape())
                                                     : expand(idx, shape_of(updates));
    c.set(0, scatter_by_mode(c, data, updates,
                             [&](const Tensor& d, const Tensor& u, ScatterReduction r) {
                               return scatter_elements(d, spread, u, a, r);
                             }));
  };
  t["scatter_along_axis"] = [](OpContext& c) {
    const Tensor data = c.in("data"), indices = c.in("indices");
    const int64_t a = axis_of(c, c.int_of("axis", 0), data.rank());
    c.set(0, scatter_by_mode(c, data, c.in("updates"),
                             [&](const Tensor& d, const Tensor& u, ScatterReduction r) {
                               return scatter_elements(d, indices, u, a, r);
                             }));
  };
  t["scatter_nd"] = [](OpContext& c) {
    const Tensor indices = c.in("indices");
    c.set(0, scatter_by_mode(c, c.in("data"), c.in("updates"),
                             [&](const Tensor& d, const Tensor& u, ScatterReduction r) {
                               return scatter_nd(d, indices, u, r);
                             }));
  };
  t["one_hot"] = [](OpContext& c) {
    const Tensor indices = c.in("indices");
    const int64_t given = c.int_of("axis", -1), r = indices.rank();
    const int64_t a = given < 0 ? given + r + 1 : given;
    if (a < 0 || a > r) c.fail("parameter 'axis' {} is out of range for rank {}", given, r + 1);
    const double on = c.number("on_value", 1.0), off = c.number("off_value", 0.0);
    const DType dt = c.out_dtype();
    if (c.is_known("one_hot_vector_size"))
      return c.set(0, one_hot(indices, c.int_of("one_hot_vector_size"), a, dt, on, off));
    c.set(0, one_hot(indices, c.in("one_hot_vector_size"), a, dt, on, off));
  };
  t["sliding_windows"] = [](OpContext& c) {
    // windows of `size` every `stride` along axis: a new dim of the windows' elements after it
    const Tensor x = c.in("x");
    const int64_t a = axis_of(c, c.int_of("axis"), x.rank()), n = x.dim(static_cast<int>(a));
    const int64_t size = c.int_of("size"), stride = c.int_of("stride", 1);
    if (n < 0) c.fail("dim {} of x is dynamic; sliding_windows needs it known", a);
    if (size < 1 || stride < 1 || size > n)
      c.fail("parameters 'size' {} and 'stride' {} do not fit dim {} of size {}", size, stride, a,
             n);
    const int64_t windows = (n - size) / stride + 1;
    Ints idx;
    for (int64_t w = 0; w < windows; ++w)
      for (int64_t k = 0; k < size; ++k) idx.push_back(w * stride + k);
    c.set(0, gather(x, constant(c.graph(), Array::from_vector(idx, {windows, size})), a));
  };
}

void add_value_ops(OpTable& t) {
  t["select"] = [](OpContext& c) {
    Tensor cond = c.in("cond");
    if (cond.dtype() != boolean) cond = not_equal(cond, scalar_like(cond, 0));
    c.set(0, where(cond, c.in("a"), c.in("b")));
  };
  t["fill"] = [](OpContext& c) {
    const double v = c.number("value", 0.0);
    const DType dt = c.out_dtype();
    if (c.is_known("shape")) return c.set(0, full(c.graph(), c.ints("shape"), v, dt));
    c.set(0, full(cast(c.in("shape"), i64), v, dt));
  };
  t["fill_like"] = [](OpContext& c) {
    c.set(0, filled(c, c.in("ref_tensor"), c.number("value", 0.0), c.out_dtype()));
  };
  t["range_1d"] = [](OpContext& c) {
    const DType dt = c.out_dtype();
    if (c.is_known("start") && c.is_known("end") && c.is_known("step"))
      return c.set(0, arange(c.graph(), c.number("start"), c.number("end"), c.number("step"), dt));
    c.set(0, arange(c.in("start"), c.in("end"), c.in("step"), dt));
  };
  t["shape"] = [](OpContext& c) {
    // int32; known while importing when every dim of x is
    const Tensor x = c.in("x");
    const Shape s = x.shape();
    if (!is_static(s)) return c.set(0, cast(shape_of(x), i32));
    c.set_known(0, Array::from_vector(Ints(s.begin(), s.end()), {x.rank()}).astype(i32));
  };
  t["band_part"] = [](OpContext& c) {
    // keeps x[..., m, n] where (lower < 0 or m - n <= lower) and (upper < 0 or n - m <= upper)
    const Tensor x = c.in("x");
    const int64_t lower = c.int_of("lower", -1), upper = c.int_of("upper", -1);
    if (x.rank() < 2) c.fail("x must have rank 2 or more, got {}", x.rank());
    if (lower < 0 && upper < 0) return c.set(0, x);
    const Tensor m = coordinate_along_axis(x, -2, i64), n = coordinate_along_axis(x, -1, i64);
    Tensor keep;
    if (lower >= 0) keep = less_equal(sub(m, n), scalar_like(m, static_cast<double>(lower)));
    if (upper >= 0) {
      const Tensor k = less_equal(sub(n, m), scalar_like(m, static_cast<double>(upper)));
      keep = keep.valid() ? logical_and(keep, k) : k;
    }
    c.set(0, where(keep, x, scalar_like(x, 0)));
  };
  t["cumsum"] = [](OpContext& c) {
    const Tensor x = c.in("x");
    c.set(0, cumsum(x, axis_of(c, c.int_of("axis", 0), x.rank()), c.flag("exclusive", false),
                    c.flag("reverse", false)));
  };
  t["topk"] = [](OpContext& c) {
    // k -1 (iOS17): every element; sort=False allows any order, so sorted output serves
    const Tensor x = c.in("x");
    const int64_t a = axis_of(c, c.int_of("axis", -1), x.rank()), k = c.int_of("k", 1);
    const bool largest = !c.flag("ascending", false);
    std::pair<Tensor, Tensor> r;
    if (k == -1 && x.dim(static_cast<int>(a)) < 0)
      r = topk(x, slice(shape_of(x), {a}, {a + 1}), a, largest);
    else r = topk(x, k == -1 ? x.dim(static_cast<int>(a)) : k, a, largest);
    c.set(0, r.first);
    if (c.num_outputs() > 1) c.set(1, r.second);  // (none where return_indices is false)
  };
  t["argsort"] = [](OpContext& c) {
    const Tensor x = c.in("x");
    c.set(0, argsort(x, axis_of(c, c.int_of("axis", -1), x.rank()), !c.flag("ascending", false)));
  };
}

}  // namespace

void add_tensor_ops(OpTable& t) {
  add_layout_ops(t);
  add_slice_ops(t);
  add_index_ops(t);
  add_value_ops(t);
}

}  // namespace kiln::coreml::detail
