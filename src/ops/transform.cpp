// Ops of the transform family that move data without looking at it (indexing and sorting live in
// transform_index.cpp). Attrs:
//   reshape:      shape (ints; one -1 is inferred), input_dims (ints, optional: an entry k >= 0
//                 takes input dim k, so squeeze/expand_dims keep dynamic dims); with shape_like
//                 (bool), to the shape of input 1 (gradients of graphs with dynamic dims)
//   transpose:    perm (ints, a permutation of the dims)
//   split:        axis, sizes (ints; empty means `parts` equal pieces), parts
//   concat:       axis
//   slice:        starts, stops, steps (ints, one per dim; Python semantics, resolved against the
//                 concrete shape by transform::slice_dim)
//   pad:          pads (ints, begin/end per dim; a negative pad crops), mode ("constant" |
//                 "reflect" | "edge"), value (float). Reflect mirrors about the input's edges and
//                 needs pads < dim size; edge needs a non-empty dim.
//   tile:         reps (ints, one per dim)
//   broadcast_to: shape (ints; -1 keeps x's dim); with shape_like (bool), to the shape of input 1
//                 (dynamic dims and all; specialize_shapes writes it into shape once static);
//                 with bidirectional (bool), to the numpy broadcast of x's shape and shape
//                 (ONNX Expand)
// reshape's copy_zeros (bool) copies x's dim where shape has a 0 (ONNX Reshape). With
// from_values (bool), reshape's and broadcast_to's shape and slice's starts and stops are the
// values of their last inputs until shapes are specialized (src/ops/shape_values.h); such a
// slice's kept_dims (ints) are the dims its values leave whole, which keep their size.
//   flip:         axes (ints, resolved)
// All of them take every dtype. Their gradients move g back the way the data came.
#include "kiln/ops/transform.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <limits>
#include <numeric>

#include "core/sym_dim.h"
#include "kiln/autodiff.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/reduce.h"
#include "ops/common.h"
#include "ops/shape_values.h"
#include "ops/transform_params.h"
#include "ops/transform_util.h"

namespace kiln {

using namespace ops;

namespace {
constexpr int64_t kMaxIndex = std::numeric_limits<int64_t>::max();

// ---- reshape

std::vector<TensorInfo> infer_reshape(const InferContext& ctx) {
  const Shape& in = ctx.inputs[0].shape;
  if (from_values(ctx)) return {{Shape(value_length(ctx, 1, "shape"), -1), ctx.inputs[0].dtype}};
  if (ctx.attrs.b("shape_like", false)) {  // to the shape of input 1, whose dims may be dynamic
    const Shape& like = ctx.inputs[1].shape;
    if (is_static(in) && is_static(like) && numel(in) != numel(like))
      fail<ShapeError>("[reshape] cannot reshape {} into the shape {} of input 1", str(in),
                       str(like));
    return {{like, ctx.inputs[0].dtype}};
  }
  const Shape want = ctx.attrs.ints("shape");
  const bool copy_zeros = ctx.attrs.b("copy_zeros", false);  // ONNX: a 0 takes the input's dim
  const std::vector<int64_t> none;
  const auto& from = ctx.attrs.has("input_dims") ? ctx.attrs.ints("input_dims") : none;
  Shape out = want;
  int infer_at = -1;
  int64_t known = 1;  // (symbolic where dims are)
  for (size_t i = 0; i < out.size(); ++i) {
    if (copy_zeros && want[i] == 0) {
      if (i >= in.size())
        fail<ShapeError>("[reshape] a 0 at place {} of shape ({}) has no dim of {} to copy", i,
                         fmt::join(want, ", "), str(in));
      out[i] = in[i];
    } else if (!from.empty() && from[i] >= 0) {
      out[i] = in[from[i]];
    } else if (out[i] == -1 && infer_at >= 0) {
      fail<ValueError>("[reshape] shape ({}) has more than one -1", fmt::join(want, ", "));
    } else if (out[i] == -1) {
      infer_at = static_cast<int>(i);
      continue;
    } else if (out[i] < 0 && !sym::is_symbolic(out[i])) {  // (symbolic: a value's dim)
      fail<ValueError>("[reshape] bad dim {} in shape ({})", out[i], fmt::join(want, ", "));
    }
    known = sym::mul(known, out[i]);
  }
  if (!is_static(in) || known < 0) {  // the dim to infer: the elements over the others'
    if (infer_at >= 0) out[infer_at] = sym::floordiv(sym::product(in), known);
    return {{out, ctx.inputs[0].dtype}};
  }
  const int64_t n = numel(in);
  const bool fits = infer_at >= 0 ? known > 0 && n % known == 0 : known == n;
  if (!fits)
    fail<ShapeError>("[reshape] cannot reshape {} ({} elements) into ({})", str(in), n,
                     fmt::join(want, ", "));
  if (infer_at >= 0) out[infer_at] = n / known;
  return {{out, ctx.inputs[0].dtype}};
}

Tensor reshape_keeping(const Tensor& x, const Shape& shape, const std::vector<int64_t>& from) {
  return make_node1(OpId::Reshape, {x}, {{"shape", shape}, {"input_dims", from}});
}

// ---- transpose

// Resolves negative entries; throws unless perm is a permutation of x's dims.
std::vector<int64_t> check_perm(const char* op, const std::vector<int64_t>& perm,
                                const Shape& shape) {
  const int rank = static_cast<int>(shape.size());
  std::vector<int64_t> r;
  std::vector<char> seen(rank, 0);
  bool ok = static_cast<int>(perm.size()) == rank;
  for (size_t i = 0; ok && i < perm.size(); ++i) {
    const int a = normalize_axis(perm[i], rank);
    ok = a >= 0 && !seen[a];
    if (ok) seen[a] = 1;
    r.push_back(a);
  }
  if (!ok)
    fail<ValueError>("[{}] perm ({}) is not a permutation of the dims of shape {}", op,
                     fmt::join(perm, ", "), str(shape));
  return r;
}

std::vector<TensorInfo> infer_transpose(const InferContext& ctx) {
  const Shape& in = ctx.inputs[0].shape;
  const auto perm = check_perm(ctx.name(), ctx.attrs.ints("perm"), in);
  Shape out;
  for (int64_t p : perm) out.push_back(in[p]);
  return {{out, ctx.inputs[0].dtype}};
}

// ---- split and concat

std::vector<TensorInfo> infer_split(const InferContext& ctx) {
  const Shape& in = ctx.inputs[0].shape;
  const int axis = resolve_axis(ctx.name(), ctx.attrs.i("axis"), in);
  const int64_t n = in[axis];
  std::vector<int64_t> sizes = ctx.attrs.ints("sizes");
  if (sizes.empty()) {
    const int64_t parts = ctx.attrs.i("parts");
    if (n >= 0 && n % parts != 0)
      fail<ShapeError>("[split] cannot split axis {} of shape {} into {} equal parts", axis,
                       str(in), parts);
    sizes.assign(parts, sym::floordiv(n, parts));
  } else {
    const int64_t sum = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
    if (n >= 0 && sum != n)
      fail<ShapeError>("[split] sizes ({}) sum to {} but axis {} of shape {} has size {}",
                       fmt::join(sizes, ", "), sum, axis, str(in), n);
  }
  std::vector<TensorInfo> outs;
  for (int64_t s : sizes) {
    Shape o = in;
    o[axis] = s;
    outs.push_back({o, ctx.inputs[0].dtype});
  }
  return outs;
}

std::vector<TensorInfo> infer_concat(const InferContext& ctx) {
  const Shape& first = ctx.inputs[0].shape;
  const int axis = resolve_axis(ctx.name(), ctx.attrs.i("axis"), first);
  Shape out = first;
  for (size_t i = 1; i < ctx.inputs.size(); ++i) {
    const Shape& s = ctx.inputs[i].shape;
    if (ctx.inputs[i].dtype != ctx.inputs[0].dtype)
      fail<DTypeError>("[concat] input {} has dtype {} but input 0 has {}", i,
                       name(ctx.inputs[i].dtype), name(ctx.inputs[0].dtype));
    bool ok = s.size() == first.size();
    for (size_t d = 0; ok && d < s.size(); ++d) {
      if (static_cast<int>(d) == axis) out[d] = sym::add(out[d], s[d]);
      else if (out[d] < 0 && (s[d] >= 0 || out[d] == kDynamic)) out[d] = s[d];
      else ok = s[d] < 0 || out[d] < 0 || s[d] == out[d];
    }
    if (!ok)
      fail<ShapeError>("[concat] input {} has shape {} but input 0 has shape {}; all dims but "
                       "axis {} must match",
                       i, str(s), str(first), axis);
  }
  return {{out, ctx.inputs[0].dtype}};
}

// ---- slice, pad, tile, broadcast_to, flip

// The length of a slice of a dim n known only as an expression, as transform::slice_dim counts
// it. The expression assumes what the clamps there would otherwise fix (a start within n, say):
// where it goes below 0 or misses for some n, it does not evaluate to the dim, and shapes where
// it does not run the passes again (passes/program.h instantiate).
int64_t symbolic_slice_count(int64_t n, int64_t start, int64_t stop, int64_t step) {
  constexpr int64_t kEnd = int64_t{1} << 62;
  const int64_t s = step > 0 ? step : -step;
  // a symbolic start or stop is a dim computed from shapes: at least 0
  if (step > 0) {
    if (start == 0 && step == 1 && stop >= kEnd) return n;
    auto at = [&](int64_t i) {
      return i >= kEnd ? n : i >= 0 || sym::is_symbolic(i) ? sym::min(i, n) : sym::sub(n, -i);
    };
    return sym::ceildiv(sym::sub(at(stop), at(start)), s);
  }
  const int64_t last = sym::sub(n, 1);
  auto at = [&](int64_t i) {
    return i >= kEnd ? last : i >= 0 || sym::is_symbolic(i) ? sym::min(i, last) : sym::sub(n, -i);
  };
  if (stop <= -kEnd) return sym::ceildiv(sym::add(at(start), 1), s);  // down to the first
  return sym::ceildiv(sym::sub(at(start), at(stop)), s);
}

std::vector<TensorInfo> infer_slice(const InferContext& ctx) {
  const Shape& in = ctx.inputs[0].shape;
  if (from_values(ctx)) {
    for (int i = 1; i <= 2; ++i)
      if (value_length(ctx, i, i == 1 ? "starts" : "stops") != static_cast<int64_t>(in.size()))
        fail<ShapeError>("[slice] the {} value needs one entry per dim of shape {}",
                         i == 1 ? "starts" : "stops", str(in));
    // dims the bounds leave whole (kept_dims, set by the builder) keep their size
    Shape out(in.size(), -1);
    if (ctx.attrs.has("kept_dims"))
      for (int64_t d : ctx.attrs.ints("kept_dims"))
        if (d >= 0 && d < static_cast<int64_t>(in.size())) out[d] = in[d];
    return {{out, ctx.inputs[0].dtype}};
  }
  const auto &starts = ctx.attrs.ints("starts"), &stops = ctx.attrs.ints("stops"),
             &steps = ctx.attrs.ints("steps");
  KILN_ASSERT(starts.size() == in.size() && stops.size() == in.size() && steps.size() == in.size());
  Shape out = in;
  for (size_t d = 0; d < in.size(); ++d)
    out[d] = in[d] >= 0 && !sym::is_symbolic(starts[d]) && !sym::is_symbolic(stops[d])
                 ? transform::slice_dim(in[d], starts[d], stops[d], steps[d]).count
                 : symbolic_slice_count(in[d], starts[d], stops[d], steps[d]);
  return {{out, ctx.inputs[0].dtype}};
}

std::vector<TensorInfo> infer_pad(const InferContext& ctx) {
  const Shape& in = ctx.inputs[0].shape;
  const std::string& mode = ctx.attrs.str("mode");
  if (from_values(ctx)) {  // pads computed from shapes: every dim known once they are
    if (value_length(ctx, 1, "pads") != 2 * static_cast<int64_t>(in.size()))
      fail<ShapeError>("[pad] the pads value needs 2 entries per dim of shape {}", str(in));
    return {{Shape(in.size(), -1), ctx.inputs[0].dtype}};
  }
  const auto& pads = ctx.attrs.ints("pads");
  if (pads.size() != 2 * in.size())
    fail<ValueError>("[pad] needs 2 pads per dim ({} for shape {}), got {}", 2 * in.size(),
                     str(in), pads.size());
  if (mode != "constant" && mode != "reflect" && mode != "edge")
    fail<ValueError>("[pad] unknown mode '{}'", mode);
  Shape out = in;
  for (size_t d = 0; d < in.size(); ++d) {
    const int64_t n = in[d], b = pads[2 * d], e = pads[2 * d + 1];
    if (sym::is_symbolic(b) || sym::is_symbolic(e)) {  // (pads from symbolic values)
      auto plus = [](int64_t a, int64_t v) {
        return sym::is_symbolic(v) || v >= 0 ? sym::add(a, v) : sym::sub(a, -v);
      };
      out[d] = plus(plus(n, b), e);
      continue;
    }
    if (n < 0) {
      out[d] = b + e >= 0 ? sym::add(n, b + e) : sym::sub(n, -(b + e));
      continue;
    }
    out[d] = n + b + e;
    if (out[d] < 0)
      fail<ShapeError>("[pad] pads ({}) crop more than shape {} has", fmt::join(pads, ", "),
                       str(in));
    if (mode == "reflect" && ((b > 0 && b >= n) || (e > 0 && e >= n)))
      fail<ValueError>("[pad] reflect pads ({}) must be smaller than the dims of shape {}",
                       fmt::join(pads, ", "), str(in));
    if (mode == "edge" && n == 0 && (b > 0 || e > 0))
      fail<ValueError>("[pad] edge mode cannot pad empty dim {} of shape {}", d, str(in));
  }
  return {{out, ctx.inputs[0].dtype}};
}

std::vector<TensorInfo> infer_tile(const InferContext& ctx) {
  const Shape& in = ctx.inputs[0].shape;
  if (from_values(ctx)) {  // reps computed from shapes
    if (value_length(ctx, 1, "reps") != static_cast<int64_t>(in.size()))
      fail<ShapeError>("[tile] the reps value needs one entry per dim of shape {}", str(in));
    return {{Shape(in.size(), -1), ctx.inputs[0].dtype}};
  }
  const auto& reps = ctx.attrs.ints("reps");
  KILN_ASSERT(reps.size() == in.size());
  Shape out = in;
  for (size_t d = 0; d < in.size(); ++d) {
    // (a value written in when shapes are specialized, or a symbolic one; builders check theirs)
    if (reps[d] < 0 && !sym::is_symbolic(reps[d]))
      fail<ValueError>("[tile] reps ({}) must be non-negative", fmt::join(reps, ", "));
    out[d] = sym::mul(in[d], reps[d]);
  }
  return {{out, ctx.inputs[0].dtype}};
}

std::vector<TensorInfo> infer_broadcast_to(const InferContext& ctx) {
  const Shape& in = ctx.inputs[0].shape;
  const bool both = ctx.attrs.b("bidirectional", false);  // ONNX Expand: numpy broadcast of both
  if (from_values(ctx)) {
    const auto n = static_cast<size_t>(value_length(ctx, 1, "shape"));
    return {{Shape(both ? std::max(n, in.size()) : n, -1), ctx.inputs[0].dtype}};
  }
  if (both) {
    const Shape& want = ctx.attrs.ints("shape");
    for (int64_t d : want)
      if (d < 0 && !sym::is_symbolic(d))  // (symbolic: a value's dim)
        fail<ShapeError>("[broadcast_to] bad dim {} in shape ({})", d, fmt::join(want, ", "));
    Shape out;
    if (!broadcast_shapes(in, want, out))
      fail<ShapeError>("[broadcast_to] shape {} does not broadcast with ({})", str(in),
                       fmt::join(want, ", "));
    return {{out, ctx.inputs[0].dtype}};
  }
  if (ctx.attrs.b("shape_like", false)) {  // to the shape of input 1, whose dims may be dynamic
    const Shape& like = ctx.inputs[1].shape;
    if (like.size() < in.size())
      fail<ShapeError>("[broadcast_to] cannot broadcast shape {} to the shape {} of input 1",
                       str(in), str(like));
    const size_t lead = like.size() - in.size();
    Shape out = like;
    for (size_t d = lead; d < like.size(); ++d) {
      const int64_t s = in[d - lead];
      if (like[d] < 0 && s > 1) out[d] = s;
      else if (like[d] >= 0 && s >= 0 && s != 1 && s != like[d])
        fail<ShapeError>("[broadcast_to] cannot broadcast shape {} to the shape {} of input 1",
                         str(in), str(like));
    }
    return {{out, ctx.inputs[0].dtype}};
  }
  const Shape& want = ctx.attrs.ints("shape");
  auto bad = [&] {
    fail<ShapeError>("[broadcast_to] cannot broadcast shape {} to {}", str(in), str(want));
  };
  if (want.size() < in.size()) bad();
  const size_t lead = want.size() - in.size();
  Shape out = want;
  for (size_t d = 0; d < want.size(); ++d) {
    const int64_t s = d < lead ? 1 : in[d - lead];
    if (want[d] < -1 && !sym::is_symbolic(want[d])) bad();
    if (want[d] == -1) out[d] = s;
    else if (s >= 0 && s != 1 && s != want[d]) bad();
  }
  return {{out, ctx.inputs[0].dtype}};
}

std::vector<TensorInfo> infer_flip(const InferContext& ctx) {
  for (int64_t a : ctx.attrs.ints("axes")) resolve_axis(ctx.name(), a, ctx.inputs[0].shape);
  return {ctx.inputs[0]};
}

// ---- gradient rules (written with kiln ops, so they are differentiable themselves)

using Grads = std::vector<std::optional<Tensor>>;
using transform::static_input_shape;

// Back to x's shape; with more than one dynamic dim, a reshape that reads x's shape (made static
// when shapes are specialized).
Grads vjp_reshape(const VjpContext& c) {
  const Tensor& x = c.inputs[0];
  Grads r{reshape_like(*c.cotangents[0], x)};
  if (c.inputs.size() > 1) r.push_back(std::nullopt);  // (only its shape is read)
  return r;
}

Grads vjp_transpose(const VjpContext& c) {
  const auto& perm = c.attrs.ints("perm");
  std::vector<int64_t> inverse(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) inverse[perm[i]] = static_cast<int64_t>(i);
  return {permute(*c.cotangents[0], inverse)};
}

Grads vjp_split(const VjpContext& c) {
  std::vector<Tensor> parts;
  for (int i = 0; i < static_cast<int>(c.outputs.size()); ++i)
    parts.push_back(c.cotangent_or_zeros(i));
  return {concat(parts, c.attrs.i("axis"))};
}

Grads vjp_concat(const VjpContext& c) {
  const int64_t axis = c.attrs.i("axis");
  Grads grads;
  int64_t at = 0;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    const int64_t n = c.inputs[i].shape()[axis];
    if (n < 0) {  // sizes along axis known at run time
      grads.clear();
      for (const Tensor& g : transform::concat_grad(c.inputs, *c.cotangents[0], axis))
        grads.push_back(g);
      return grads;
    }
    grads.push_back(slice(*c.cotangents[0], {at}, {at + n}, {1}, {axis}));
    at += n;
  }
  return grads;
}

// Adds up g's entries along dim d that reflect/edge padding copied from the same input position:
// a scatter-add of g with each output position's source (the map is separable, so dim by dim).
Tensor fold_padded_dim(const Tensor& g, int d, int64_t n, int64_t begin, const std::string& mode) {
  const Tensor s = coordinate_along_axis(g, d, i64) - static_cast<double>(begin);
  const double last = static_cast<double>(n - 1);
  const Tensor source = mode == "edge" ? clip(s, 0, last) : last - abs(last - abs(s));
  Shape shape = g.shape();
  shape[d] = n;
  return scatter_elements(transform::full_on(g, shape, 0, g.dtype()), source, g, d,
                          ScatterReduction::add);
}

// Constant mode: padding g by -pads crops what was added and zero-fills what was cropped.
Grads vjp_pad(const VjpContext& c) {
  const std::string& mode = c.attrs.str("mode");
  Tensor g = *c.cotangents[0];
  if (c.attrs.b("from_values", false)) {  // pads computed from shapes: input 1
    const Tensor pads = cast(c.inputs[1], i64);
    if (mode == "constant") return {ops::reshape_like(pad(g, -pads), c.inputs[0])};
    return {ops::reshape_like(transform::fold_pad_grad(c.inputs[0], g, pads, mode), c.inputs[0])};
  }
  const auto& pads = c.attrs.ints("pads");
  if (mode == "constant") {
    std::vector<int64_t> negated;
    for (int64_t p : pads) negated.push_back(-p);
    return {pad(g, negated)};
  }
  if (!is_static(c.inputs[0].shape()))
    return {transform::fold_pad_grad(c.inputs[0], g, pads, mode)};
  const Shape in = c.inputs[0].shape();
  for (size_t d = 0; d < in.size(); ++d)
    if (pads[2 * d] != 0 || pads[2 * d + 1] != 0)
      g = fold_padded_dim(g, static_cast<int>(d), in[d], pads[2 * d], mode);
  return {g};
}

// tile's output seen as (reps_0, n_0, reps_1, n_1, ...): summing the reps axes adds up the copies.
Grads vjp_tile(const VjpContext& c) {
  if (c.attrs.b("from_values", false)) {  // repeats computed from shapes
    std::vector<Tensor> reps;
    for (int64_t d = 0; d < static_cast<int64_t>(c.inputs[0].shape().size()); ++d)
      reps.push_back(slice(c.inputs[1], {d}, {d + 1}));
    return {transform::tile_grad(c.inputs[0], *c.cotangents[0], reps), std::nullopt};
  }
  const auto& reps = c.attrs.ints("reps");
  if (!is_static(c.inputs[0].shape()))
    return {transform::tile_grad(c.inputs[0], *c.cotangents[0], reps)};
  const Shape in = c.inputs[0].shape();
  Shape blocks;
  Axes copies;
  for (size_t d = 0; d < in.size(); ++d) {
    copies.push_back(static_cast<int64_t>(blocks.size()));
    blocks.insert(blocks.end(), {reps[d], in[d]});
  }
  return {sum(reshape(*c.cotangents[0], blocks), copies)};
}

Grads vjp_broadcast_to(const VjpContext& c) {
  Grads r{sum_to_shape_of(*c.cotangents[0], c.inputs[0])};
  if (c.inputs.size() > 1) r.push_back(std::nullopt);  // (only its shape is read)
  return r;
}

Grads vjp_flip(const VjpContext& c) { return {flip(*c.cotangents[0], c.attrs.ints("axes"))}; }

// Stored (package) nodes: the attributes inference indexes, divides or multiplies with.
std::string check_stored_reshape(const InferContext& c) {
  const auto& shape = c.attrs.ints("shape");
  uint64_t prod = 1;
  for (int64_t d : shape) {
    if (d < -1) return fmt::format("reshape to a dim of {}", d);
    if (d > 0)
      prod = static_cast<uint64_t>(d) > stored::kMaxBytes / prod ? stored::kMaxBytes : prod * d;
  }
  if (prod >= stored::kMaxBytes) return "reshape to too many elements";
  if (c.attrs.has("input_dims"))
    return stored::check_ints(c.attrs, "input_dims", shape.size(), -1,
                              static_cast<int64_t>(c.inputs[0].shape.size()) - 1);
  return {};
}

std::string check_stored_split(const InferContext& c) {
  if (c.attrs.ints("sizes").empty() && c.attrs.i("parts") < 1)
    return "split into fewer than 1 part";
  for (int64_t e : c.attrs.ints("sizes"))
    if (e < 0) return "a negative split size";
  return {};
}

std::string check_stored_slice(const InferContext& c) {
  const size_t rank = c.inputs[0].shape.size();
  std::string why;
  if (!(why = stored::check_ints(c.attrs, "starts", rank, INT64_MIN, INT64_MAX)).empty())
    return why;
  if (!(why = stored::check_ints(c.attrs, "stops", rank, INT64_MIN, INT64_MAX)).empty()) return why;
  if (!(why = stored::check_ints(c.attrs, "steps", rank, -stored::kMaxDim, stored::kMaxDim))
           .empty())
    return why;
  for (int64_t e : c.attrs.ints("steps"))
    if (e == 0) return "a slice step of 0";
  return {};
}

std::string check_stored_tile(const InferContext& c) {
  return stored::check_ints(c.attrs, "reps", c.inputs[0].shape.size(), 0, stored::kMaxGeometry);
}
}  // namespace

namespace transform {
Shape static_input_shape(const VjpContext& c, int i) {
  Shape s = c.inputs[i].shape();
  if (!is_static(s))
    fail<ShapeError>("[gradients] the gradient of {} needs a static shape for input {}, got {}",
                     c.name(), i, str(s));
  return s;
}

Tensor full_on(const Tensor& on, const Shape& shape, double value, DType dtype) {
  return detail::make_source_node(*on.graph_impl(), OpId::Full,
                                  {{"shape", shape}, {"value", value}, {"dtype", dtype}})[0];
}

Tensor full_shaped_like(const Tensor& like, double value, DType dtype) {
  const Shape s = like.shape();
  if (is_static(s)) return full_on(like, s, value, dtype);
  return detail::make_node1(
      OpId::Full, {like}, {{"shape", s}, {"value", value}, {"dtype", dtype}, {"shape_like", true}});
}
}  // namespace transform

void register_transform_ops() {
  define_op(OpId::Reshape)
      .set_infer(infer_reshape)
      .alias()
      .grad(vjp_reshape)
      .inputs(1)
      .optional_inputs({"shape_like"})
      .from_values({"shape"})
      .check_stored(check_stored_reshape);
  define_op(OpId::Transpose)
      .set_infer(infer_transpose)
      .grad(vjp_transpose)
      .inputs(1)
      .params<TransposeParams>();
  define_op(OpId::Split)
      .set_infer(infer_split)
      .grad(vjp_split)
      .inputs(1)
      .check_stored(check_stored_split)
      .params<AxisParams>();
  define_op(OpId::Concat)
      .set_infer(infer_concat)
      .grad(vjp_concat)
      .variadic(1, INT_MAX)
      .params<AxisParams>();
  // starts and stops span all of int64 (an axis sliced whole stops at INT64_MAX)
  define_op(OpId::Slice)
      .set_infer(infer_slice)
      .grad(transform::vjp_slice)
      .inputs(1)
      .wide_ints({"starts", "stops"})
      .from_values({"starts", "stops"})
      .check_stored(check_stored_slice)
      .params<SliceParams>();
  define_op(OpId::Pad)
      .set_infer(infer_pad)
      .grad(vjp_pad)
      .inputs(1)
      .from_values({"pads"})
      .params<PadParams>();
  define_op(OpId::Tile)
      .set_infer(infer_tile)
      .grad(vjp_tile)
      .inputs(1)
      .from_values({"reps"})
      .check_stored(check_stored_tile);
  define_op(OpId::BroadcastTo)
      .set_infer(infer_broadcast_to)
      .grad(vjp_broadcast_to)
      .inputs(1)
      .optional_inputs({"shape_like"})
      .from_values({"shape"});
  define_op(OpId::Flip).set_infer(infer_flip).grad(vjp_flip).inputs(1).params<FlipParams>();
  register_transform_index_ops();
  register_transform_nd_ops();
  register_resize_ops();
  register_rearrange_ops();
}

Tensor reshape(const Tensor& x, const Shape& shape) {
  return make_node1(OpId::Reshape, {x}, {{"shape", shape}});
}

Tensor transpose(const Tensor& x, const std::vector<int64_t>& perm) {
  if (!perm.empty()) return permute(x, perm);
  std::vector<int64_t> rev(x.rank());
  std::iota(rev.rbegin(), rev.rend(), int64_t{0});
  return make_node1(OpId::Transpose, {x}, {{"perm", rev}});
}

Tensor permute(const Tensor& x, const std::vector<int64_t>& perm) {
  return make_node1(OpId::Transpose, {x}, {{"perm", check_perm("transpose", perm, x.shape())}});
}

Tensor expand_dims(const Tensor& x, const std::vector<int64_t>& axes) {
  const int out_rank = x.rank() + static_cast<int>(axes.size());
  std::vector<char> inserted(out_rank, 0);
  for (int64_t a : axes) {
    const int r = normalize_axis(a, out_rank);
    if (r < 0 || inserted[r])
      fail<ValueError>("[expand_dims] axes ({}) are out of range or repeated for result rank {} "
                       "(input shape {})",
                       fmt::join(axes, ", "), out_rank, str(x.shape()));
    inserted[r] = 1;
  }
  Shape shape;
  std::vector<int64_t> from;
  int64_t k = 0;
  for (int d = 0; d < out_rank; ++d) {
    shape.push_back(inserted[d] ? 1 : x.shape()[k]);
    from.push_back(inserted[d] ? -1 : k++);
  }
  return reshape_keeping(x, shape, from);
}

Tensor squeeze(const Tensor& x, const std::vector<int64_t>& axes) {
  const Shape in = x.shape();
  std::vector<char> drop(in.size(), 0);
  for (size_t d = 0; d < in.size() && axes.empty(); ++d) drop[d] = in[d] == 1;
  for (int64_t a : resolve_axes("squeeze", axes, in, false)) {
    if (in[a] != 1)
      fail<ShapeError>("[squeeze] cannot squeeze axis {} of shape {}: its size is not 1", a,
                       str(in));
    drop[a] = 1;
  }
  Shape shape;
  std::vector<int64_t> from;
  for (size_t d = 0; d < in.size(); ++d) {
    if (drop[d]) continue;
    shape.push_back(in[d]);
    from.push_back(static_cast<int64_t>(d));
  }
  return reshape_keeping(x, shape, from);
}

std::vector<Tensor> split(const Tensor& x, int64_t parts, int64_t axis) {
  if (parts < 1) fail<ValueError>("[split] parts must be at least 1, got {}", parts);
  const int a = resolve_axis("split", axis, x.shape());
  return make_node(OpId::Split, {x},
                   {{"axis", int64_t{a}}, {"sizes", std::vector<int64_t>{}}, {"parts", parts}});
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t axis) {
  const int a = resolve_axis("split", axis, x.shape());
  if (sizes.empty() || std::any_of(sizes.begin(), sizes.end(), [](int64_t s) { return s < 0; }))
    fail<ValueError>("[split] sizes ({}) must be non-empty and non-negative for shape {}",
                     fmt::join(sizes, ", "), str(x.shape()));
  return make_node(OpId::Split, {x},
                   {{"axis", int64_t{a}}, {"sizes", sizes}, {"parts", int64_t(sizes.size())}});
}

Tensor concat(const std::vector<Tensor>& xs, int64_t axis) {
  if (xs.empty()) fail<ValueError>("[concat] needs at least one input");
  DType t = xs[0].dtype();
  for (auto& x : xs) t = promote(t, x.dtype());
  std::vector<Tensor> ins;
  for (auto& x : xs) ins.push_back(cast_to(x, t));
  const int a = resolve_axis("concat", axis, xs[0].shape());
  return make_node1(OpId::Concat, ins, {{"axis", int64_t{a}}});
}

Tensor stack(const std::vector<Tensor>& xs, int64_t axis) {
  if (xs.empty()) fail<ValueError>("[stack] needs at least one input");
  for (size_t i = 1; i < xs.size(); ++i)
    if (xs[i].shape() != xs[0].shape())
      fail<ShapeError>("[stack] input {} has shape {} but input 0 has shape {}", i,
                       str(xs[i].shape()), str(xs[0].shape()));
  const int out_rank = xs[0].rank() + 1;
  const int a = normalize_axis(axis, out_rank);
  if (a < 0)
    fail<ValueError>("[stack] axis {} is out of range for result rank {} (input shape {})", axis,
                     out_rank, str(xs[0].shape()));
  std::vector<Tensor> expanded;
  for (auto& x : xs) expanded.push_back(expand_dims(x, {a}));
  return concat(expanded, a);
}

namespace ops {
Attrs slice_attrs(const Shape& in, const std::vector<int64_t>& starts,
                  const std::vector<int64_t>& stops, const std::vector<int64_t>& steps,
                  const std::vector<int64_t>& axes) {
  const size_t n = starts.size();
  std::vector<int64_t> ax = axes;
  if (ax.empty())
    for (size_t i = 0; i < n; ++i) ax.push_back(static_cast<int64_t>(i));
  if (stops.size() != n || (!steps.empty() && steps.size() != n) || ax.size() != n)
    fail<ValueError>("[slice] starts ({}), stops ({}), steps ({}) and axes ({}) differ in length "
                     "for shape {}",
                     fmt::join(starts, ", "), fmt::join(stops, ", "), fmt::join(steps, ", "),
                     fmt::join(axes, ", "), str(in));
  std::vector<int64_t> b(in.size(), 0), e(in.size(), kMaxIndex), s(in.size(), 1);
  std::vector<char> seen(in.size(), 0);
  for (size_t i = 0; i < n; ++i) {
    const int a = resolve_axis("slice", ax[i], in);
    const int64_t step = steps.empty() ? 1 : steps[i];
    if (seen[a]) fail<ValueError>("[slice] axis {} given twice for shape {}", a, str(in));
    if (step == 0 || step == std::numeric_limits<int64_t>::min())
      fail<ValueError>("[slice] bad step {} on axis {} of shape {}", step, a, str(in));
    seen[a] = 1;
    b[a] = starts[i];
    e[a] = stops[i];
    s[a] = step;
  }
  return {{"starts", b}, {"stops", e}, {"steps", s}};
}
}  // namespace ops

Tensor slice(const Tensor& x, const std::vector<int64_t>& starts, const std::vector<int64_t>& stops,
             const std::vector<int64_t>& steps, const std::vector<int64_t>& axes) {
  return make_node1(OpId::Slice, {x}, slice_attrs(x.shape(), starts, stops, steps, axes));
}

namespace ops {
std::string pad_mode(PadKind kind) {
  return kind == PadKind::constant ? "constant" : kind == PadKind::reflect ? "reflect" : "edge";
}
}  // namespace ops

Tensor pad(const Tensor& x, const std::vector<int64_t>& pads, PadKind kind, double value) {
  return make_node1(OpId::Pad, {x}, {{"pads", pads}, {"mode", pad_mode(kind)}, {"value", value}});
}

Tensor tile(const Tensor& x, const std::vector<int64_t>& reps) {
  for (int64_t r : reps)
    if (r < 0)
      fail<ValueError>("[tile] reps ({}) must be non-negative (shape {})", fmt::join(reps, ", "),
                       str(x.shape()));
  // numpy: the shorter of x's dims and reps is padded with leading 1s
  std::vector<int64_t> r = reps;
  if (r.size() < static_cast<size_t>(x.rank())) r.insert(r.begin(), x.rank() - r.size(), 1);
  Tensor y = x;
  if (r.size() > static_cast<size_t>(x.rank())) {
    std::vector<int64_t> lead(r.size() - x.rank());
    std::iota(lead.begin(), lead.end(), int64_t{0});
    y = expand_dims(x, lead);
  }
  return make_node1(OpId::Tile, {y}, {{"reps", r}});
}

namespace ops {
Tensor reshape_like(const Tensor& x, const Tensor& like) {
  const Shape s = like.shape();
  if (is_static(s)) return reshape(x, s);
  return make_node1(OpId::Reshape, {x, like}, {{"shape", s}, {"shape_like", true}});
}

Tensor broadcast_to_like(const Tensor& x, const Tensor& like) {
  const Shape s = like.shape();
  if (x.shape() == s && is_static(s)) return x;
  if (is_static(s)) return broadcast_to(x, s);
  return make_node1(OpId::BroadcastTo, {x, like}, {{"shape", s}, {"shape_like", true}});
}
}  // namespace ops

Tensor broadcast_to(const Tensor& x, const Shape& shape) {
  return make_node1(OpId::BroadcastTo, {x}, {{"shape", shape}});
}

Tensor flip(const Tensor& x, const std::vector<int64_t>& axes) {
  return make_node1(OpId::Flip, {x}, {{"axes", resolve_axes("flip", axes, x.shape())}});
}

}  // namespace kiln
