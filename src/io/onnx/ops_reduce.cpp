// ONNX reductions, arg-reductions and cumulative sums.
#include <algorithm>
#include <cmath>

#include "io/onnx/map_util.h"

namespace kiln::onnx::detail {

namespace {

// The axes to reduce: an attribute before `input_since`, the optional second input from then on.
// Empty (and noop_with_empty_axes unset) means every axis.
std::optional<Axes> reduce_axes(NodeContext& c, int input_since) {
  Axes axes;
  if (c.version() < input_since) {
    axes = c.attr_ints("axes");
  } else if (c.has_input(1)) {
    axes = c.ints(1);
  }
  if (axes.empty() && c.version() >= input_since && c.attr_int("noop_with_empty_axes", 0))
    return std::nullopt;
  const int rank = c.input(0).rank();
  for (auto& a : axes) a = axis_of(c, a, rank);
  return axes;
}

// The lowest value of a dtype (-inf for floats).
double lowest(DType t) {
  switch (t) {
    case DType::i8: return -128;
    case DType::i16: return -32768;
    case DType::i32: return -2147483648.0;
    case DType::i64: return -9223372036854775808.0;
    case DType::u8:
    case DType::u16:
    case DType::u32:
    case DType::u64:
    case DType::boolean: return 0;
    default: return -INFINITY;
  }
}

// The highest value of a dtype (+inf for floats; i64 stops at the largest double below 2^63).
double highest(DType t) {
  switch (t) {
    case DType::i8: return 127;
    case DType::i16: return 32767;
    case DType::i32: return 2147483647.0;
    case DType::i64: return 9223372036854774784.0;
    case DType::u8: return 255;
    case DType::u16:
      return 65535;
    case DType::u32:
      return 4294967295.0;
    case DType::u64:
      return 18446744073709549568.0;  // (the largest double below 2^64)
    case DType::boolean: return 1;
    default: return INFINITY;
  }
}

enum class Red { sum, mean, max, min, prod, l1, l2, log_sum, log_sum_exp, sum_square };

template <Red R, int InputSince>
Outs reduce(NodeContext& c) {
  Tensor x = c.input(0);
  const auto axes = reduce_axes(c, InputSince);
  if (!axes) return {x};
  const bool keep = c.attr_int("keepdims", 1) != 0;
  const DType dt = x.dtype();
  if constexpr (R == Red::max || R == Red::min) {
    // ONNX: the max of an empty set is the lowest value, the min the highest
    const Shape s = x.shape();
    bool empty = false;
    for (int64_t a : axes->empty() ? Axes{} : *axes) empty |= s[a] == 0;
    if (axes->empty()) empty = numel(s) == 0;
    if (empty) {
      // the result's shape: x's dims kept (their run-time sizes where they are dynamic)
      Shape out;
      std::vector<Tensor> sizes;
      for (int i = 0; i < x.rank(); ++i) {
        const bool reduced = axes->empty() || std::find(axes->begin(), axes->end(), i) != axes->end();
        if (reduced && !keep) continue;
        out.push_back(reduced ? 1 : s[i]);
        sizes.push_back(reduced ? known_ints(c, {1}) : slice(shape_of(x), {i}, {i + 1}));
      }
      const double v = R == Red::max ? lowest(dt) : highest(dt);
      if (is_static(out)) return {full(c.graph(), out, v, dt)};
      return {full(concat(sizes, 0), v, dt)};
    }
  }
  Tensor y;
  switch (R) {
    case Red::sum: y = sum(x, *axes, keep); break;
    case Red::mean: y = mean(x, *axes, keep); break;
    case Red::max: y = max(x, *axes, keep); break;
    case Red::min: y = min(x, *axes, keep); break;
    case Red::prod: y = prod(x, *axes, keep); break;
    case Red::l1: y = sum(abs(x), *axes, keep); break;
    case Red::l2: y = sqrt(sum(mul(x, x), *axes, keep)); break;
    case Red::log_sum: y = log(sum(x, *axes, keep)); break;
    case Red::log_sum_exp: y = logsumexp(x, *axes, keep); break;
    case Red::sum_square: y = sum(mul(x, x), *axes, keep); break;
  }
  return {y.dtype() == dt ? y : cast(y, dt)};
}

template <bool Max>
Outs arg_reduce(NodeContext& c) {
  Tensor x = c.input(0);
  const int64_t axis = axis_of(c, c.attr_int("axis", 0), x.rank());
  const bool keep = c.attr_int("keepdims", 1) != 0;
  if (c.attr_int("select_last_index", 0)) {
    // the last extreme is the first one of the reversed axis
    Tensor r = Max ? argmax(flip(x, {axis}), axis, keep) : argmin(flip(x, {axis}), axis, keep);
    const int64_t n = x.dim(static_cast<int>(axis));
    if (n >= 0) return {sub(scalar_of(r, static_cast<double>(n - 1)), r)};
    // the axis' size known only when run: from x's shape
    const Tensor last = sub(reshape(slice(shape_of(x), {axis}, {axis + 1}), {}), scalar_of(r, 1));
    return {sub(last, r)};
  }
  return {Max ? argmax(x, axis, keep) : argmin(x, axis, keep)};
}

// LpNormalization: x / ||x||_p along axis (p 1 or 2), 0 where the norm is 0 (as the reference).
Outs lp_normalization_op(NodeContext& c) {
  const Tensor x = c.input(0);
  const int64_t p = c.attr_int("p", 2);
  if (p != 1 && p != 2) c.fail(fmt::format("p = {} (1 or 2)", p));
  const int64_t axis = axis_of(c, c.attr_int("axis", -1), x.rank());
  const Tensor norm = p == 1 ? sum(abs(x), {axis}, true) : sqrt(sum(x * x, {axis}, true));
  const Tensor zero = scalar_of(x, 0);
  return {where(equal(norm, zero), zero, x / norm)};
}

Outs cumsum_op(NodeContext& c) {
  Tensor x = c.input(0);
  const auto axis = c.ints(1);
  if (axis.size() != 1) c.fail("axis must hold one value");
  return {cumsum(x, axis_of(c, axis[0], x.rank()), c.attr_int("exclusive", 0) != 0,
                 c.attr_int("reverse", 0) != 0)};
}

// CumProd (opset 26): products along axis by doubling (y_i *= y_{i - s} for s = 1, 2, 4, ...: a
// log2(n) chain of elementwise products over shifted copies, ones shifted in), exclusive (one
// place later, 1 first) and reverse (from the end) as CumSum's. The axis' length must be known.
Outs cumprod_op(NodeContext& c) {
  Tensor x = c.input(0);
  const auto axes = c.ints(1);
  if (axes.size() != 1) c.fail("axis must hold one value");
  const int64_t axis = axis_of(c, axes[0], x.rank()), n = x.dim(static_cast<int>(axis));
  if (n < 0) c.unsupported("an axis whose length is known only at run time");
  const bool reverse = c.attr_int("reverse", 0) != 0;
  if (reverse) x = flip(x, {axis});
  // x shifted by s places along the axis, ones in front (s < n)
  auto shifted = [&](const Tensor& v, int64_t s) {
    std::vector<int64_t> pads(2 * static_cast<size_t>(v.rank()), 0);
    pads[2 * axis] = s;
    return slice(pad(v, pads, PadKind::constant, 1.0), {0}, {n}, {}, {axis});
  };
  Tensor y = x;
  for (int64_t s = 1; s < n; s *= 2) y = y * shifted(y, s);
  if (c.attr_int("exclusive", 0) != 0 && n > 0) y = shifted(y, 1);
  if (reverse) y = flip(y, {axis});
  return {y};
}

}  // namespace

void add_reduce_ops(std::vector<OpEntry>& t) {
  t.insert(t.end(), {
                        {"ReduceSum", 1, reduce<Red::sum, 13>},
                        {"ReduceMean", 1, reduce<Red::mean, 18>},
                        {"ReduceMax", 1, reduce<Red::max, 18>},
                        {"ReduceMin", 1, reduce<Red::min, 18>},
                        {"ReduceProd", 1, reduce<Red::prod, 18>},
                        {"ReduceL1", 1, reduce<Red::l1, 18>},
                        {"ReduceL2", 1, reduce<Red::l2, 18>},
                        {"ReduceLogSum", 1, reduce<Red::log_sum, 18>},
                        {"ReduceLogSumExp", 1, reduce<Red::log_sum_exp, 18>},
                        {"ReduceSumSquare", 1, reduce<Red::sum_square, 18>},
                        {"ArgMax", 1, arg_reduce<true>},
                        {"ArgMin", 1, arg_reduce<false>},
                        {"LpNormalization", 1, lp_normalization_op},
                        {"CumSum", 11, cumsum_op},
                        {"CumProd", 26, cumprod_op},
                    });
}

}  // namespace kiln::onnx::detail
