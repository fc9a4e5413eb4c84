// Elementwise ops. Binary ops broadcast as numpy does and promote dtypes with kiln::promote.
// Integer arithmetic wraps on overflow (as numpy). Float-only ops (exp through sigmoid, leaky_relu
// through erf, and tan through atanh) throw DTypeError for integer inputs; bitwise ops take
// integers only. f16/bf16 compute in f32.
#pragma once

#include <limits>

#include "kiln/graph.h"
#include "kiln/narrow.h"

namespace kiln {

/// a + b, elementwise.
Tensor add(const Tensor& a, const Tensor& b);
/// a - b, elementwise.
Tensor sub(const Tensor& a, const Tensor& b);
/// a * b, elementwise.
Tensor mul(const Tensor& a, const Tensor& b);
/// a / b, elementwise. True division for floats; integers divide toward negative infinity (numpy
/// floor_divide), and integer x / 0 = 0 (numpy warns and gives 0).
Tensor div(const Tensor& a, const Tensor& b);
/// a to the power b, elementwise. Integers to a negative power truncate: 1 and -1 keep their
/// value, other bases give 0.
Tensor pow(const Tensor& a, const Tensor& b);
/// The larger of a and b, elementwise; NaN propagates.
Tensor maximum(const Tensor& a, const Tensor& b);  // NaN propagates
/// The smaller of a and b, elementwise; NaN propagates.
Tensor minimum(const Tensor& a, const Tensor& b);  // NaN propagates
/// Remainder with the sign of the divisor (numpy.mod / Python %); integer x mod 0 = 0, and
/// float x mod 0 = NaN.
Tensor mod(const Tensor& a, const Tensor& b);

/// -x, for signed dtypes (integers wrap).
Tensor neg(const Tensor& x);  // signed dtypes
/// |x|; the most negative integer stays as it is (it wraps).
Tensor abs(const Tensor& x);
/// The sign of x: -1, 0 or 1 (NaN stays NaN).
Tensor sign(const Tensor& x);
/// e to the power x.
Tensor exp(const Tensor& x);
/// Natural logarithm; NaN below 0, -inf at 0.
Tensor log(const Tensor& x);
/// log(1 + x), accurate for small x.
Tensor log1p(const Tensor& x);
/// exp(x) - 1, accurate for small x.
Tensor expm1(const Tensor& x);
/// Square root; NaN below 0.
Tensor sqrt(const Tensor& x);
/// 1 / sqrt(x).
Tensor rsqrt(const Tensor& x);
/// 1 / x.
Tensor reciprocal(const Tensor& x);
/// Sine of x (radians).
Tensor sin(const Tensor& x);
/// Cosine of x (radians).
Tensor cos(const Tensor& x);
/// Hyperbolic tangent.
Tensor tanh(const Tensor& x);
/// The logistic function 1 / (1 + exp(-x)).
Tensor sigmoid(const Tensor& x);
/// max(x, 0), for signed dtypes; NaN stays NaN.
Tensor relu(const Tensor& x);  // signed dtypes; NaN stays NaN
/// x where x > 0, else alpha x.
Tensor leaky_relu(const Tensor& x, double alpha = 0.01);
/// x where x > 0, else alpha (exp(x) - 1).
Tensor elu(const Tensor& x, double alpha = 1.0);
/// scale (x where x > 0, else alpha (exp(x) - 1)) with the constants of Klambauer et al.,
/// "Self-Normalizing Neural Networks" (scale 1.0507..., alpha 1.6732...).
Tensor selu(const Tensor& x);
enum class GeluApprox { none, tanh };
/// x Φ(x), Φ the standard normal distribution function (computed through erf); with
/// `approximate` tanh, 0.5 x (1 + tanh(sqrt(2 / π) (x + 0.044715 x³))).
Tensor gelu(const Tensor& x, GeluApprox approximate = GeluApprox::none);
/// x sigmoid(x) (swish).
Tensor silu(const Tensor& x);
/// x tanh(softplus(x)) (Misra, "Mish: A Self Regularized Non-Monotonic Activation Function").
Tensor mish(const Tensor& x);
/// log(1 + exp(beta x)) / beta; linear above `threshold` (PyTorch semantics).
Tensor softplus(const Tensor& x, double beta = 1.0, double threshold = 20.0);
/// x - lambda above lambda, x + lambda below -lambda, 0 between (PyTorch Softshrink).
Tensor softshrink(const Tensor& x, double lambda = 0.5);
/// x where |x| > lambda, else 0 (PyTorch Hardshrink).
Tensor hardshrink(const Tensor& x, double lambda = 0.5);
/// x min(max(x + 3, 0), 6) / 6: 0 below -3, x above 3; NaN stays NaN.
Tensor hardswish(const Tensor& x);
/// max(0, min(1, alpha x + beta)).
Tensor hardsigmoid(const Tensor& x, double alpha = 1.0 / 6.0, double beta = 0.5);
/// The Gauss error function.
Tensor erf(const Tensor& x);
/// The largest integer not above x; integers stay as they are.
Tensor floor(const Tensor& x);
/// The smallest integer not below x; integers stay as they are.
Tensor ceil(const Tensor& x);
/// x rounded to the nearest integer, half to even (numpy.round). floor, ceil and round keep
/// integers as they are.
Tensor round(const Tensor& x);
/// min(max(x, lo), hi); needs lo <= hi (ValueError otherwise). On integers the bounds become the
/// nearest representable values inside [lo, hi]. NaN stays NaN.
Tensor clip(const Tensor& x, double lo = -std::numeric_limits<double>::infinity(),
            double hi = std::numeric_limits<double>::infinity());
// Trigonometric and hyperbolic functions and their inverses (std:: semantics: NaN outside the
// domain, e.g. asin/acos beyond [-1, 1], acosh below 1; atanh(+-1) = +-inf).
/// Tangent of x (radians).
Tensor tan(const Tensor& x);
/// Inverse sine in [-π/2, π/2]; NaN outside [-1, 1].
Tensor asin(const Tensor& x);
/// Inverse cosine in [0, π]; NaN outside [-1, 1].
Tensor acos(const Tensor& x);
/// Inverse tangent in (-π/2, π/2).
Tensor atan(const Tensor& x);
/// Hyperbolic sine.
Tensor sinh(const Tensor& x);
/// Hyperbolic cosine.
Tensor cosh(const Tensor& x);
/// Inverse hyperbolic sine.
Tensor asinh(const Tensor& x);
/// Inverse hyperbolic cosine; NaN below 1.
Tensor acosh(const Tensor& x);
/// Inverse hyperbolic tangent; +-inf at +-1, NaN outside [-1, 1].
Tensor atanh(const Tensor& x);

// Comparisons promote both inputs, then compare; the result is bool (NaN compares unequal).
/// a == b, elementwise, as bool (inputs promoted; NaN compares unequal).
Tensor equal(const Tensor& a, const Tensor& b);
/// a != b, elementwise, as bool (inputs promoted; NaN compares unequal, so NaN != NaN is true).
Tensor not_equal(const Tensor& a, const Tensor& b);
/// a < b, elementwise, as bool (inputs promoted; false where either is NaN).
Tensor less(const Tensor& a, const Tensor& b);
/// a <= b, elementwise, as bool (inputs promoted; false where either is NaN).
Tensor less_equal(const Tensor& a, const Tensor& b);
/// a > b, elementwise, as bool (inputs promoted; false where either is NaN).
Tensor greater(const Tensor& a, const Tensor& b);
/// a >= b, elementwise, as bool (inputs promoted; false where either is NaN).
Tensor greater_equal(const Tensor& a, const Tensor& b);
// Logical ops take bool tensors.
/// a and b, elementwise, on bool tensors.
Tensor logical_and(const Tensor& a, const Tensor& b);
/// a or b, elementwise, on bool tensors.
Tensor logical_or(const Tensor& a, const Tensor& b);
/// a xor b (true where exactly one is true), elementwise, on bool tensors.
Tensor logical_xor(const Tensor& a, const Tensor& b);
/// not x, elementwise, on a bool tensor.
Tensor logical_not(const Tensor& x);
/// cond ? x : y, broadcasting all three; cond is bool, x and y are promoted.
Tensor where(const Tensor& cond, const Tensor& x, const Tensor& y);
/// x converted to `dtype`. Float to integer truncates toward zero and saturates at the integer's
/// limits; NaN gives 0. Integer to integer saturates. To the 8-bit floats (f8e4m3fn f8e4m3fnuz
/// f8e5m2 f8e5m2fnuz): rounded to nearest even, once from x's own precision; beyond the target's
/// largest finite value (448, 240, 57344, 57344), infinities included, the result is that value
/// with x's sign, unless `saturate` is false: then infinity for f8e5m2 and NaN for the others, as
/// ONNX's Cast. To f8e8m0fnu: a power of two, x's exponent rounded by `rules.round` (up by
/// default), past 2^127 that or NaN as `saturate` says. To f4e2m1fn: nearest even, saturating at
/// 6 (NaN gives 6). To i4 u4 i2 u2: rounded to nearest even and saturated (NaN gives 0).
/// The narrow types' rules in full: kiln/narrow.h.
Tensor cast(const Tensor& x, DType dtype);
Tensor cast(const Tensor& x, DType dtype, bool saturate);
Tensor cast(const Tensor& x, DType dtype, const narrow::Rules& rules);
/// x's bytes read as `dtype`, of the same element size (4: f32 i32 u32; 8: f64 i64 u64; 2: f16 bf16
/// i16 u16; 1: i8 u8 bool, the narrow types), bits kept exactly (ONNX BitCast, numpy view); same
/// shape. DTypeError when the sizes differ. A bool result holds the bytes as they are (a byte other
/// than 0 or 1 too). Not differentiable.
Tensor bitcast(const Tensor& x, DType dtype);
/// True where x is NaN (bool result); always false for integers.
Tensor isnan(const Tensor& x);
/// True where x is +inf or -inf (bool result); always false for integers.
Tensor isinf(const Tensor& x);

// Bitwise ops on integer tensors (i8 u8 i16 u16 i32 u32 i64 u64) of one dtype (DTypeError else; no
// promotion), broadcasting as numpy.
/// a & b on integer tensors of one dtype (DTypeError otherwise; no promotion).
Tensor bitwise_and(const Tensor& a, const Tensor& b);
/// a | b on integer tensors of one dtype (DTypeError otherwise; no promotion).
Tensor bitwise_or(const Tensor& a, const Tensor& b);
/// a ^ b on integer tensors of one dtype (DTypeError otherwise; no promotion).
Tensor bitwise_xor(const Tensor& a, const Tensor& b);
/// ~x (every bit flipped) on an integer tensor.
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
