#include "ops/common.h"

#include <algorithm>

#include "kiln/ops/elementwise.h"

namespace kiln::ops {

Tensor cast_to(const Tensor& x, DType t) { return x.dtype() == t ? x : cast(x, t); }

int resolve_axis(const char* op, int64_t axis, const Shape& shape) {
  int a = normalize_axis(axis, static_cast<int>(shape.size()));
  if (a < 0) fail<ValueError>("[{}] axis {} is out of range for shape {}", op, axis, str(shape));
  return a;
}

std::vector<int64_t> resolve_axes(const char* op, const std::vector<int64_t>& axes,
                                  const Shape& shape, bool empty_means_all) {
  std::vector<int64_t> r;
  if (axes.empty() && empty_means_all) {
    for (size_t i = 0; i < shape.size(); ++i) r.push_back(static_cast<int64_t>(i));
    return r;
  }
  for (int64_t a : axes) r.push_back(resolve_axis(op, a, shape));
  std::sort(r.begin(), r.end());
  if (std::adjacent_find(r.begin(), r.end()) != r.end())
    fail<ValueError>("[{}] repeated axis in {} for shape {}", op, fmt::join(axes, ", "), str(shape));
  return r;
}

Shape broadcast_infer(const InferContext& ctx, int first, int count) {
  if (count < 0) count = static_cast<int>(ctx.inputs.size()) - first;
  Shape out = ctx.inputs[first].shape;
  for (int i = first + 1; i < first + count; ++i) {
    Shape next;
    if (!broadcast_shapes(out, ctx.inputs[i].shape, next)) {
      std::string shapes;
      for (int j = first; j < first + count; ++j)
        shapes += (j > first ? " and " : "") + str(ctx.inputs[j].shape);
      fail<ShapeError>("[{}] shapes {} do not broadcast", ctx.name(), shapes);
    }
    out = std::move(next);
  }
  return out;
}

void require_dtype(const InferContext& ctx, int input, DTypeSet ok, const char* what) {
  DType t = ctx.inputs[input].dtype;
  if (!ok.has(t))
    fail<DTypeError>("[{}] input {} has dtype {} (shape {}); expected {}", ctx.name(), input,
                     name(t), str(ctx.inputs[input].shape), what);
}

void require_rank(const InferContext& ctx, int input, int lo, int hi) {
  int r = static_cast<int>(ctx.inputs[input].shape.size());
  if (r < lo || r > hi) {
    if (lo == hi)
      fail<ShapeError>("[{}] input {} must have rank {}, got shape {}", ctx.name(), input, lo,
                       str(ctx.inputs[input].shape));
    fail<ShapeError>("[{}] input {} must have rank {} to {}, got shape {}", ctx.name(), input, lo,
                     hi, str(ctx.inputs[input].shape));
  }
}

bool dims_match(int64_t a, int64_t b) { return a == b || a < 0 || b < 0; }

bool shapes_match(const Shape& a, const Shape& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!dims_match(a[i], b[i])) return false;
  return true;
}

bool dynamic_spatial(const Shape& s) {
  return s.size() > 2 && std::any_of(s.begin() + 2, s.end(), [](int64_t d) { return d < 0; });
}

void add_optional(std::vector<Tensor>& inputs, Attrs& attrs, const char* name,
                  const std::optional<Tensor>& t) {
  attrs.set(std::string("has_") + name, t.has_value());
  if (t) inputs.push_back(*t);
}

}  // namespace kiln::ops
