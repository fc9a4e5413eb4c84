// Elementwise ops. Binary ops broadcast as numpy does and promote dtypes with kiln::promote.
// Integer arithmetic wraps on overflow (as numpy). Float-only ops (exp through sigmoid, leaky_relu
// through erf, and tan through atanh) throw DTypeError for integer inputs; bitwise ops take
// integers only. f16/bf16 compute in f32.
#pragma once

#include <limits>

#include "kiln/graph.h"

namespace kiln {

Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
/// True division for floats; integers divide toward negative infinity (numpy floor_divide),
/// and integer x / 0 = 0 (numpy warns and gives 0).
Tensor div(const Tensor& a, const Tensor& b);
/// Integers to a negative power truncate: 1 and -1 keep their value, other bases give 0.
Tensor pow(const Tensor& a, const Tensor& b);
Tensor maximum(const Tensor& a, const Tensor& b);  // NaN propagates
Tensor minimum(const Tensor& a, const Tensor& b);  // NaN propagates
/// Remainder with the sign of the divisor (numpy.mod / Python %); integer x mod 0 = 0, and
/// float x mod 0 = NaN.
Tensor mod(const Tensor& a, const Tensor& b);

Tensor neg(const Tensor& x);  // signed dtypes
Tensor abs(const Tensor& x);
/// -1, 0 or 1 (NaN stays NaN).
Tensor sign(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor log1p(const Tensor& x);
Tensor expm1(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor reciprocal(const Tensor& x);
Tensor sin(const Tensor& x);
Tensor cos(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor relu(const Tensor& x);  // signed dtypes; NaN stays NaN
Tensor leaky_relu(const Tensor& x, double alpha = 0.01);
Tensor elu(const Tensor& x, double alpha = 1.0);
Tensor selu(const Tensor& x);
enum class GeluApprox { none, tanh };
Tensor gelu(const Tensor& x, GeluApprox approximate = GeluApprox::none);
Tensor silu(const Tensor& x);
/// x tanh(softplus(x)) (Misra, "Mish: A Self Regularized Non-Monotonic Activation Function").
Tensor mish(const Tensor& x);
/// log(1 + exp(beta x)) / beta; linear above `threshold` (PyTorch semantics).
Tensor softplus(const Tensor& x, double beta = 1.0, double threshold = 20.0);
Tensor softshrink(const Tensor& x, double lambda = 0.5);
Tensor hardshrink(const Tensor& x, double lambda = 0.5);
Tensor hardswish(const Tensor& x);
/// max(0, min(1, alpha x + beta)).
Tensor hardsigmoid(const Tensor& x, double alpha = 1.0 / 6.0, double beta = 0.5);
Tensor erf(const Tensor& x);
Tensor floor(const Tensor& x);
Tensor ceil(const Tensor& x);
/// Round half to even (numpy.round). floor, ceil and round keep integers as they are.
Tensor round(const Tensor& x);
/// min(max(x, lo), hi); needs lo <= hi (ValueError otherwise). On integers the bounds become the
/// nearest representable values inside [lo, hi]. NaN stays NaN.
Tensor clip(const Tensor& x, double lo = -std::numeric_limits<double>::infinity(),
            double hi = std::numeric_limits<double>::infinity());
/// Trigonometric and hyperbolic functions and their inverses (std:: semantics: NaN outside the
/// domain, e.g. asin/acos beyond [-1, 1], acosh below 1; atanh(+-1) = +-inf).
Tensor tan(const Tensor& x);
Tensor asin(const Tensor& x);
Tensor acos(const Tensor& x);
Tensor atan(const Tensor& x);
Tensor sinh(const Tensor& x);
Tensor cosh(const Tensor& x);
Tensor asinh(const Tensor& x);
Tensor acosh(const Tensor& x);
Tensor atanh(const Tensor& x);

/// Comparisons promote both inputs, then compare; the result is bool (NaN compares unequal).
Tensor equal(const Tensor& a, const Tensor& b);
Tensor not_equal(const Tensor& a, const Tensor& b);
Tensor less(const Tensor& a, const Tensor& b);
Tensor less_equal(const Tensor& a, const Tensor& b);
Tensor greater(const Tensor& a, const Tensor& b);
Tensor greater_equal(const Tensor& a, const Tensor& b);
/// Logical ops take bool tensors.
Tensor logical_and(const Tensor& a, const Tensor& b);
Tensor logical_or(const Tensor& a, const Tensor& b);
Tensor logical_xor(const Tensor& a, const Tensor& b);
Tensor logical_not(const Tensor& x);
/// cond ? x : y, broadcasting all three; cond is bool, x and y are promoted.
Tensor where(const Tensor& cond, const Tensor& x, const Tensor& y);
/// Float to integer truncates toward zero and saturates at the integer's limits; NaN gives 0.
Tensor cast(const Tensor& x, DType dtype);
/// bool results; always false for integers.
Tensor isnan(const Tensor& x);
Tensor isinf(const Tensor& x);

/// Bitwise ops on integer tensors (i8 u8 i16 i32 i64) of the same dtype (DTypeError otherwise; no
/// promotion), broadcasting as numpy.
Tensor bitwise_and(const Tensor& a, const Tensor& b);
Tensor bitwise_or(const Tensor& a, const Tensor& b);
Tensor bitwise_xor(const Tensor& a, const Tensor& b);
Tensor bitwise_not(const Tensor& x);
/// x << y (left) or x >> y (right), elementwise with broadcasting; x and y share an integer dtype
/// (ONNX BitShift, numpy left_shift/right_shift). Right shifts of signed values are arithmetic
/// (they keep the sign); left shifts wrap. Amounts outside [0, bit width) give 0, except a right
/// shift of a negative signed value, which gives -1 (all sign bits), as numpy.
Tensor bit_shift(const Tensor& x, const Tensor& y, bool left);

// Operators; a double operand becomes a scalar of the tensor's dtype.
Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& x);
Tensor operator+(const Tensor& a, double b);
Tensor operator-(const Tensor& a, double b);
Tensor operator*(const Tensor& a, double b);
Tensor operator/(const Tensor& a, double b);
Tensor operator+(double a, const Tensor& b);
Tensor operator-(double a, const Tensor& b);
Tensor operator*(double a, const Tensor& b);
Tensor operator/(double a, const Tensor& b);

}  // namespace kiln
