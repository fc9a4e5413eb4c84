// Test support: fresh random inputs, float64 references, comparisons and error checks.
// Every run draws a new seed (printed on start); KILN_TEST_SEED=<n> replays one.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kiln/kiln.h"

namespace kiln::test {

/// The generator of this test process.
std::mt19937_64& rng();
uint64_t seed();

/// Random data of `shape`: floats uniform in [lo, hi); integers uniform in [lo, hi];
/// bool fair coin flips.
Array random_array(const Shape& shape, DType dtype, double lo = -1.0, double hi = 1.0);
/// Random data without values near zero (|v| >= min_abs), for division-like ops.
Array random_nonzero(const Shape& shape, DType dtype, double min_abs = 0.25, double max_abs = 2.0);
/// Random integers in [lo, hi] as i64.
Array random_ints(const Shape& shape, int64_t lo, int64_t hi, DType dtype = i64);

/// All elements as double.
std::vector<double> to_f64(const Array& a);
/// h = tanh(h · w + xs[t]) for t < steps in float64 (an RNN written as a loop): h (B, H), w (H, H),
/// xs (T, B, H), row-major.
std::vector<double> tanh_recurrence(std::vector<double> h, const std::vector<double>& w,
                                    const std::vector<double>& xs, int64_t B, int64_t H,
                                    int64_t steps);

/// Expects |actual - expected| <= atol + rtol*|expected| elementwise (NaNs must match NaNs)
/// and the given shape.
void expect_close(const Array& actual, const Shape& shape, const std::vector<double>& expected,
                  double rtol = 1e-5, double atol = 1e-6);
/// Expects |actual - expected| <= atol + rtol * magnitude elementwise, magnitude[i] being the
/// size of what element i sums (such as sum |a b| of a dot product: sums in any order stay
/// within a few ulps of it), with f32 values of expected's count.
void expect_close_to_magnitude(const Array& actual, const std::vector<double>& expected,
                               const std::vector<double>& magnitude, double rtol, double atol);
/// Relative (and absolute) tolerance for results of magnitude ~1 of an op computed in dtype t
/// from exactly representable inputs: f64 1e-10, f32 2e-5, f16 2e-3, bf16 1.6e-2.
double tolerance(DType t);
/// Exact equality (integers, bools, indices).
void expect_equal(const Array& actual, const Shape& shape, const std::vector<double>& expected);

/// Compiles `outs` for default_device() (all placeholders fed), runs once, returns host arrays.
std::vector<Array> eval(const Graph& g, const std::vector<Tensor>& outs, const Feeds& feeds = {},
                        const CompileOptions& opts = {});
Array eval1(const Graph& g, const Tensor& out, const Feeds& feeds = {});

/// Expects `f` to throw E whose message contains every one of `parts`.
template <typename E>
void expect_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
  } catch (const E& e) {
    std::string msg = e.what();
    for (auto& p : parts)
      EXPECT_NE(msg.find(p), std::string::npos) << "message '" << msg << "' lacks '" << p << "'";
    return;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw another error type: " << e.what();
    return;
  }
  ADD_FAILURE() << "did not throw";
}

// Index helpers for reference loops.
/// A shape viewed as (outer, len, inner) around `axis`.
struct AxisView {
  int64_t outer = 1, len = 1, inner = 1;
};
AxisView split_axis(const Shape& s, int axis);
std::vector<int64_t> unravel(int64_t i, const Shape& shape);
int64_t ravel(const std::vector<int64_t>& idx, const Shape& shape);
/// Offset in `in` (broadcast to `out`) of output multi-index `idx`.
int64_t broadcast_offset(const std::vector<int64_t>& idx, const Shape& in, const Shape& out);

/// The requantize of an int8 kernel's epilogue in float64: v (the real sum: product, bias,
/// residual) through relu or GELU (gelu 1: exact, 2: the tanh form), then round half to even of
/// v / y_scale, plus y_zero_point, saturated to yt (u8 or i8).
double requantized(double v, bool relu, int gelu, double y_scale, double y_zero_point, DType yt);

}  // namespace kiln::test
