// Gradient rules of the transform family for dims known only at run time: the sizes they need
// come from shape_of and the integer ops on it, which shape specialization evaluates on the host
// (and the symbolic program follows), so one graph's gradients run at every shape.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/errors.h"
#include "core/op_registry.h"
#include "kiln/autodiff.h"
#include "kiln/ops/core.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/reduce.h"
#include "kiln/ops/transform.h"
#include "ops/common.h"
#include "ops/shape_values.h"
#include "ops/transform_util.h"

namespace kiln::transform {

namespace {
// A 1-d int64 constant on x's graph.
Tensor ints_on(const Tensor& x, const std::vector<int64_t>& v) {
  return ops::constant_on(*x.graph_impl(), Array::from_vector(v, {static_cast<int64_t>(v.size())}));
}

// Dim d of x's shape, as a 1-element int64 value.
Tensor dim_value(const Tensor& x, int64_t d) { return slice(shape_of(x), {d}, {d + 1}); }

// A slice bound v (Python slicing, step 1) of a dim of size n resolved to [0, n]: a static bound.
Tensor resolve_bound(const Tensor& n, int64_t v) {
  const Tensor zero = ints_on(n, {0});
  constexpr int64_t kFar = int64_t{1} << 62;  // past any size: the dim's end (or start)
  if (v >= kFar) return n;
  if (v <= -kFar) return zero;
  return v >= 0 ? minimum(ints_on(n, {v}), n) : maximum(n - ints_on(n, {-v}), zero);
}

// The same for a bound that is a value (1 element, any integer dtype).
Tensor resolve_bound(const Tensor& n, const Tensor& v) {
  const Tensor zero = ints_on(n, {0});
  const Tensor b = cast(v, DType::i64);
  return minimum(maximum(where(less(b, zero), b + n, b), zero), n);
}
}  // namespace

Tensor gather_grad(const Tensor& x, const Tensor& indices, const Tensor& g, int64_t axis) {
  // g is x's dims before axis, the indices' dims, then x's dims after axis: the indices' dims
  // merge into one, and a scatter-add along axis puts each row back where it was taken
  const int64_t rank = static_cast<int64_t>(x.shape().size());
  const Tensor sx = shape_of(x);
  std::vector<Tensor> parts;
  if (axis > 0) parts.push_back(slice(sx, {0}, {axis}));
  parts.push_back(ints_on(x, {-1}));
  if (axis + 1 < rank) parts.push_back(slice(sx, {axis + 1}, {rank}));
  const Tensor merged = reshape_to(g, parts.size() == 1 ? parts[0] : concat(parts, 0));
  Shape along(rank, 1);
  along[axis] = -1;
  const Tensor at = expand(reshape(indices, along), shape_of(merged));
  return scatter_elements(zeros_like(x), at, merged, axis, ScatterReduction::add);
}

// Any steps, sizes known only at run time: x's flat positions (an iota of x's shape) sliced as
// the forward slice does are the positions g goes back to, scatter-added into zeros of x's size.
static Tensor slice_grad_by_positions(const VjpContext& c) {
  const Tensor& x = c.inputs[0];
  const int64_t rank = static_cast<int64_t>(x.shape().size());
  const Tensor sx = shape_of(x);
  const Tensor n = prod(sx);
  const Tensor zero = reshape(ints_on(x, {0}), Shape{}), one = reshape(ints_on(x, {1}), Shape{});
  const Tensor iota = reshape_to(arange(zero, n, one, DType::i64), sx);
  std::vector<int64_t> axes(rank);
  for (int64_t d = 0; d < rank; ++d) axes[d] = d;
  const auto& steps = c.attrs.ints("steps");
  const Tensor at = c.attrs.b("from_values", false)
                        ? slice(iota, c.inputs[1], c.inputs[2], steps, axes)
                        : slice(iota, c.attrs.ints("starts"), c.attrs.ints("stops"), steps, axes);
  const Tensor& g = *c.cotangents[0];
  const Tensor flat = scatter_elements(full(reshape(n, {1}), 0, g.dtype()), reshape(at, {-1}),
                                       reshape(g, {-1}), 0, ScatterReduction::add);
  return ops::reshape_like(flat, x);
}

// Slices whose bounds are values or that do not take a dynamic dim whole: pads computed from the
// shape at run time; with a step other than 1 where it matters, the positions sliced.
static Tensor slice_grad(const VjpContext& c) {
  const Tensor& x = c.inputs[0];
  const Shape in = x.shape();
  const bool values = c.attrs.b("from_values", false);
  const auto &starts = c.attrs.ints("starts"), &stops = c.attrs.ints("stops"),
             &steps = c.attrs.ints("steps");
  for (size_t d = 0; d < in.size(); ++d) {
    const bool known = !values && in[d] >= 0;
    if (steps[d] != 1 && (!known || slice_dim(in[d], starts[d], stops[d], steps[d]).count > 1))
      return slice_grad_by_positions(c);
  }
  std::vector<Tensor> pads;
  for (size_t d = 0; d < in.size(); ++d) {
    const auto dim = static_cast<int64_t>(d);
    if (!values && in[d] >= 0) {  // all known now
      const SliceDim taken = slice_dim(in[d], starts[d], stops[d], steps[d]);
      const int64_t first = steps[d] > 0 ? taken.start : taken.start - (taken.count - 1);
      pads.push_back(ints_on(x, {first, in[d] - first - taken.count}));
      continue;
    }
    const Tensor n = dim_value(x, dim);
    const Tensor begin = values ? resolve_bound(n, slice(c.inputs[1], {dim}, {dim + 1}))
                                : resolve_bound(n, starts[d]);
    const Tensor end = values ? resolve_bound(n, slice(c.inputs[2], {dim}, {dim + 1}))
                              : resolve_bound(n, stops[d]);
    const Tensor count = maximum(end - begin, ints_on(x, {0}));
    pads.push_back(begin);
    pads.push_back(n - begin - count);
  }
  return ops::reshape_like(pad(*c.cotangents[0], concat(pads, 0)), x);  // (x's known dims)
}

Tensor element_ids(const Tensor& u) {
  const Shape us = u.shape();
  if (is_static(us)) {
    const Attrs range{
        {"start", 1.0}, {"stop", numel(us) + 1.0}, {"step", 1.0}, {"dtype", DType::i64}};
    return reshape(detail::make_source_node(*u.graph_impl(), OpId::Arange, range)[0], us);
  }
  const Tensor su = shape_of(u);
  const Tensor one = reshape(ints_on(u, {1}), Shape{});
  return reshape_to(arange(one, prod(su) + 1.0, one, DType::i64), su);
}

Tensor tile_grad(const Tensor& x, const Tensor& g, const std::vector<int64_t>& reps) {
  std::vector<Tensor> each;
  for (int64_t r : reps) each.push_back(ints_on(x, {r}));
  return tile_grad(x, g, each);
}

Tensor tile_grad(const Tensor& x, const Tensor& g, const std::vector<Tensor>& reps) {
  // g seen as (reps_0, n_0, reps_1, n_1, ...): summing the reps axes adds up the copies
  std::vector<Tensor> blocks;
  Axes copies;
  for (size_t d = 0; d < x.shape().size(); ++d) {
    copies.push_back(static_cast<int64_t>(2 * d));
    blocks.push_back(cast(reps[d], DType::i64));
    blocks.push_back(dim_value(x, static_cast<int64_t>(d)));
  }
  return ops::reshape_like(sum(reshape_to(g, concat(blocks, 0)), copies), x);
}

std::vector<Tensor> concat_grad(const std::vector<Tensor>& xs, const Tensor& g, int64_t axis) {
  std::vector<Tensor> grads;
  Tensor at = ints_on(g, {0});
  for (const Tensor& x : xs) {
    const Tensor stop = at + dim_value(x, axis);
    grads.push_back(ops::reshape_like(slice(g, at, stop, {1}, {axis}), x));
    at = stop;
  }
  return grads;
}

// g goes back to the positions slicing took, zeros elsewhere. Negative steps are flipped into
// positive ones; a step s > 1 puts s-1 zeros after each element (reshape to (k, 1), pad to (k, s),
// reshape to k*s); a last pad moves the run to its first position and crops the trailing zeros.
std::vector<std::optional<Tensor>> vjp_slice(const VjpContext& c) {
  const Shape in = c.inputs[0].shape();
  const auto &starts = c.attrs.ints("starts"), &stops = c.attrs.ints("stops"),
             &steps = c.attrs.ints("steps");
  // bounds from values, or a dynamic dim not taken whole: pads computed at run time
  bool at_run_time = c.attrs.b("from_values", false);
  for (size_t d = 0; d < in.size(); ++d)
    at_run_time =
        at_run_time ||
        (in[d] < 0 && !(starts[d] == 0 && steps[d] == 1 && stops[d] >= (int64_t{1} << 62)));
  if (at_run_time) {
    return {slice_grad(c)};  // (none for the bounds: gradients() adds them)
  }
  Tensor g = *c.cotangents[0];
  if (numel(g.shape()) == 0) return {zeros_like(c.inputs[0])};
  std::vector<int64_t> flipped, interleave_pads, pads;
  Shape interleaved, dilated;
  for (size_t d = 0; d < in.size(); ++d) {
    if (in[d] < 0) {  // taken whole
      interleaved.push_back(-1);
      interleave_pads.insert(interleave_pads.end(), {0, 0});
      dilated.push_back(-1);
      pads.insert(pads.end(), {0, 0});
      continue;
    }
    const auto taken = transform::slice_dim(in[d], starts[d], stops[d], steps[d]);
    // one element taken: its step is irrelevant (and may be huge), so no zeros in between
    const int64_t s = taken.count > 1 ? std::abs(steps[d]) : 1;
    const int64_t first = steps[d] > 0 ? taken.start : taken.start - (taken.count - 1) * s;
    if (steps[d] < 0) flipped.push_back(static_cast<int64_t>(d));
    interleaved.push_back(taken.count);
    interleave_pads.insert(interleave_pads.end(), {0, 0});
    if (s > 1) {
      interleaved.push_back(1);
      interleave_pads.insert(interleave_pads.end(), {0, s - 1});
    }
    dilated.push_back(taken.count * s);
    pads.insert(pads.end(), {first, in[d] - first - taken.count * s});
  }
  if (!flipped.empty()) g = flip(g, flipped);
  if (interleaved.size() > in.size())
    g = reshape(pad(reshape(g, interleaved), interleave_pads), dilated);
  return {pad(g, pads)};
}

// One padded dim d of g folded back onto x's run-time size: each position comes from source
// (position - begin) of x, clamped (edge) or mirrored (reflect) into [0, n - 1].
static Tensor fold_pad_dim(const Tensor& x, const Tensor& g, int64_t d, const Tensor& begin,
                           const std::string& mode) {
  const int64_t rank = static_cast<int64_t>(x.shape().size());
  const Tensor n = dim_value(x, d);
  const Tensor last = reshape(n, Shape{}) - 1.0;
  const Tensor at = coordinate_along_axis(g, d, DType::i64) - begin;
  const Tensor source =
      mode == "edge" ? minimum(maximum(at, scalar_like(at, 0)), last) : last - abs(last - abs(at));
  const Tensor so = shape_of(g);
  std::vector<Tensor> parts;
  if (d > 0) parts.push_back(slice(so, {0}, {d}));
  parts.push_back(n);
  if (d + 1 < rank) parts.push_back(slice(so, {d + 1}, {rank}));
  const Tensor zeros = full(parts.size() == 1 ? parts[0] : concat(parts, 0), 0, g.dtype());
  return scatter_elements(zeros, source, g, d, ScatterReduction::add);
}

Tensor fold_pad_grad(const Tensor& x, const Tensor& g, const std::vector<int64_t>& pads,
                     const std::string& mode) {
  const int64_t rank = static_cast<int64_t>(x.shape().size());
  Tensor out = g;
  for (int64_t d = 0; d < rank; ++d) {
    if (pads[2 * d] == 0 && pads[2 * d + 1] == 0) continue;
    out = fold_pad_dim(x, out, d, reshape(ints_on(x, {pads[2 * d]}), Shape{}), mode);
  }
  return out;
}

Tensor fold_pad_grad(const Tensor& x, const Tensor& g, const Tensor& pads,
                     const std::string& mode) {
  const int64_t rank = static_cast<int64_t>(x.shape().size());
  const Tensor p = cast(pads, DType::i64);
  Tensor out = g;
  for (int64_t d = 0; d < rank; ++d)  // (every dim: which are padded is known only when run)
    out = fold_pad_dim(x, out, d, reshape(slice(p, {2 * d}, {2 * d + 1}), Shape{}), mode);
  return out;
}

}  // namespace kiln::transform
