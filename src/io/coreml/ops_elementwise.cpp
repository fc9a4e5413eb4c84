// MIL's elementwise ops, activations, softmax and reductions mapped onto kiln's
// (src/io/coreml/mil.h; semantics as coremltools' op definitions, iOS15 to iOS18).
#include <cmath>

#include "io/coreml/mil.h"
#include "kiln/ops/core.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/norm.h"
#include "kiln/ops/reduce.h"

namespace kiln::coreml::detail {

namespace {

Tensor scalar(const Tensor& x, double v) { return scalar_like(x, v); }

void binary(OpTable& t, const char* name, Tensor (*f)(const Tensor&, const Tensor&)) {
  t[name] = [f](OpContext& c) {
    Tensor x = c.in("x"), y = c.in("y");
    // MIL promotes nothing: both sides share a dtype (a scalar const may be of another width)
    if (x.dtype() != y.dtype() && y.rank() == 0) y = cast(y, x.dtype());
    if (x.dtype() != y.dtype() && x.rank() == 0) x = cast(x, y.dtype());
    c.set(0, f(x, y));
  };
}

void unary(OpTable& t, const char* name, Tensor (*f)(const Tensor&)) {
  t[name] = [f](OpContext& c) { c.set(0, f(c.in("x"))); };
}

// floor(x / y), exact for integers (kiln's div truncates toward zero on integers)
Tensor floor_div(const Tensor& x, const Tensor& y) {
  if (is_floating(x.dtype())) return floor(div(x, y));
  const Tensor q = div(x, y);
  const Tensor r = sub(x, mul(q, y));
  // a remainder whose sign differs from the divisor's: one less
  const Tensor zero = scalar(x, 0);
  const Tensor adjust = logical_and(not_equal(r, zero), not_equal(less(r, zero), less(y, zero)));
  return sub(q, cast(adjust, x.dtype()));
}

// x mod y with the divisor's sign (MIL's mod, as numpy's)
Tensor floor_mod(const Tensor& x, const Tensor& y) { return sub(x, mul(floor_div(x, y), y)); }

// reduce_*: `axes` (absent: all), keep_dims
Axes axes_of(OpContext& c, const Tensor& x) {
  Axes a;
  if (!c.has("axes")) return a;
  for (int64_t v : c.ints("axes")) a.push_back(axis_of(c, v, x.rank()));
  if (a.empty()) {  // an empty list reduces every dim
    for (int k = 0; k < x.rank(); ++k) a.push_back(k);
  }
  return a;
}

void reduction(OpTable& t, const char* name, Tensor (*f)(const Tensor&, const Axes&, bool)) {
  t[name] = [f](OpContext& c) {
    const Tensor x = c.in("x");
    Axes a = axes_of(c, x);
    if (a.empty())
      for (int k = 0; k < x.rank(); ++k) a.push_back(k);
    c.set(0, f(x, a, c.flag("keep_dims", false)));
  };
}

}  // namespace

void add_elementwise_ops(OpTable& t) {
  binary(t, "add", add);
  binary(t, "sub", sub);
  binary(t, "mul", mul);
  binary(t, "real_div", [](const Tensor& x, const Tensor& y) {
    // real_div of integers is a float division truncated back (coremltools' definition)
    if (is_floating(x.dtype())) return div(x, y);
    return cast(floor(div(cast(x, f32), cast(y, f32))), x.dtype());
  });
  binary(t, "floor_div", floor_div);
  binary(t, "mod", [](const Tensor& x, const Tensor& y) { return floor_mod(x, y); });
  binary(t, "pow", pow);
  binary(t, "maximum", maximum);
  binary(t, "minimum", minimum);
  binary(t, "equal", equal);
  binary(t, "not_equal", not_equal);
  binary(t, "less", less);
  binary(t, "less_equal", less_equal);
  binary(t, "greater", greater);
  binary(t, "greater_equal", greater_equal);
  binary(t, "logical_and", logical_and);
  binary(t, "logical_or", logical_or);
  binary(t, "logical_xor", logical_xor);

  unary(t, "abs", abs);
  unary(t, "acos", acos);
  unary(t, "asin", asin);
  unary(t, "atan", atan);
  unary(t, "atanh", atanh);
  unary(t, "ceil", ceil);
  unary(t, "cos", cos);
  unary(t, "cosh", cosh);
  unary(t, "erf", erf);
  unary(t, "exp", exp);
  unary(t, "floor", floor);
  unary(t, "round", round);
  unary(t, "sign", sign);
  unary(t, "sin", sin);
  unary(t, "sinh", sinh);
  unary(t, "sqrt", sqrt);
  unary(t, "tan", tan);
  unary(t, "tanh", tanh);
  unary(t, "logical_not", logical_not);
  unary(t, "square", [](const Tensor& x) { return mul(x, x); });
  unary(t, "exp2", [](const Tensor& x) { return pow(scalar(x, 2.0), x); });
  unary(t, "relu", relu);
  unary(t, "relu6", [](const Tensor& x) { return clip(x, 0.0, 6.0); });
  unary(t, "sigmoid", sigmoid);
  unary(t, "silu", silu);
  unary(t, "softsign", [](const Tensor& x) { return div(x, add(abs(x), scalar(x, 1.0))); });
  unary(t, "softplus", [](const Tensor& x) { return softplus(x); });
  unary(t, "identity", [](const Tensor& x) { return x; });

  // unary ops with a stabilizing epsilon
  t["inverse"] = [](OpContext& c) {
    const Tensor x = c.in("x");
    c.set(0, reciprocal(add(x, scalar(x, c.number("epsilon", 1e-4)))));
  };
  t["log"] = [](OpContext& c) {
    const Tensor x = c.in("x");
    c.set(0, log(add(x, scalar(x, c.number("epsilon", 1e-45)))));
  };
  t["rsqrt"] = [](OpContext& c) {
    const Tensor x = c.in("x");
    c.set(0, rsqrt(add(x, scalar(x, c.number("epsilon", 1e-12)))));
  };
  t["clip"] = [](OpContext& c) { c.set(0, clip(c.in("x"), c.number("alpha"), c.number("beta"))); };
  t["threshold"] = [](OpContext& c) {
    const Tensor x = c.in("x");
    c.set(0, maximum(x, scalar(x, c.number("alpha"))));
  };
  t["cast"] = [](OpContext& c) {
    // the target dtype is the output's declared type ("fp16", "int32", ...)
    c.set(0, cast(c.in("x"), c.out_dtype()));
  };

  // activations with parameters
  t["leaky_relu"] = [](OpContext& c) { c.set(0, leaky_relu(c.in("x"), c.number("alpha", 0.01))); };
  t["elu"] = [](OpContext& c) { c.set(0, elu(c.in("x"), c.number("alpha", 1.0))); };
  t["thresholded_relu"] = [](OpContext& c) {
    const Tensor x = c.in("x");
    const double a = c.number("alpha", 1.0);
    c.set(0, where(greater(x, scalar(x, a)), x, scalar(x, 0)));
  };
  t["clamped_relu"] = [](OpContext& c) {
    // min(max(x, 0), beta) + alpha * min(x, 0)
    const Tensor x = c.in("x");
    const double a = c.number("alpha"), b = c.number("beta");
    const Tensor pos = minimum(relu(x), scalar(x, b));
    c.set(0, add(pos, mul(scalar(x, a), minimum(x, scalar(x, 0)))));
  };
  t["linear_activation"] = [](OpContext& c) {
    const Tensor x = c.in("x");
    c.set(0, add(mul(x, scalar(x, c.number("alpha"))), scalar(x, c.number("beta", 0.0))));
  };
  t["scaled_tanh"] = [](OpContext& c) {
    const Tensor x = c.in("x");
    const double a = c.number("alpha", 1.0), b = c.number("beta", 1.0);
    c.set(0, mul(scalar(x, a), tanh(mul(x, scalar(x, b)))));
  };
  t["sigmoid_hard"] = [](OpContext& c) {
    c.set(0, hardsigmoid(c.in("x"), c.number("alpha", 0.2), c.number("beta", 0.5)));
  };
  t["softplus_parametric"] = [](OpContext& c) {
    // alpha * log(1 + exp(beta * x)), alpha and beta per channel (dim 1)
    const Tensor x = c.in("x");
    Shape per{};
    for (int k = 0; k < x.rank(); ++k) per.push_back(k == 1 ? -1 : 1);
    Array a = c.known("alpha").astype(x.dtype()), b = c.known("beta").astype(x.dtype());
    per[1] = a.numel();
    const Tensor at = constant(c.graph(), a.reshape(per));
    const Tensor bt = constant(c.graph(), b.reshape(per));
    c.set(0, mul(at, softplus(mul(x, bt))));
  };
  t["prelu"] = [](OpContext& c) {
    // alpha per channel (dim 1): x where x >= 0, alpha * x elsewhere
    const Tensor x = c.in("x");
    Array a = c.known("alpha").astype(x.dtype());
    Shape per;
    for (int k = 0; k < x.rank(); ++k) per.push_back(k == 1 ? a.numel() : 1);
    const Tensor at = constant(c.graph(), a.reshape(per));
    c.set(0, where(greater_equal(x, scalar(x, 0)), x, mul(x, at)));
  };
  t["gelu"] = [](OpContext& c) {
    const Tensor x = c.in("x");
    const std::string mode = c.text("mode", "EXACT");
    if (mode == "EXACT") c.set(0, gelu(x));
    else if (mode == "TANH_APPROXIMATION") c.set(0, gelu(x, GeluApprox::tanh));
    else if (mode == "SIGMOID_APPROXIMATION") c.set(0, mul(x, sigmoid(mul(x, scalar(x, 1.702)))));
    else c.fail("unknown gelu mode '{}'", mode);
  };
  t["softmax"] = [](OpContext& c) {
    const Tensor x = c.in("x");
    c.set(0, softmax(x, axis_of(c, c.int_of("axis", -1), x.rank())));
  };

  reduction(t, "reduce_sum", sum);
  reduction(t, "reduce_mean", mean);
  reduction(t, "reduce_max", max);
  reduction(t, "reduce_min", min);
  reduction(t, "reduce_prod", prod);
  reduction(t, "reduce_log_sum_exp", logsumexp);
  reduction(t, "reduce_l1_norm", norm_l1);
  reduction(t, "reduce_l2_norm", norm_l2);
  reduction(t, "reduce_log_sum",
            [](const Tensor& x, const Axes& a, bool keep) { return log(sum(x, a, keep)); });
  reduction(t, "reduce_sum_square",
            [](const Tensor& x, const Axes& a, bool keep) { return sum(mul(x, x), a, keep); });
  for (const char* name : {"reduce_argmax", "reduce_argmin"}) {
    const bool is_max = std::string(name) == "reduce_argmax";
    t[name] = [is_max](OpContext& c) {
      const Tensor x = c.in("x");
      const int64_t a = axis_of(c, c.int_of("axis", -1), x.rank());
      const bool keep = c.flag("keep_dims", false);
      c.set(0, is_max ? argmax(x, a, keep) : argmin(x, a, keep));
    };
  }
}

}  // namespace kiln::coreml::detail
