// Calibration statistics of one activation and the ranges, scales and zero points chosen from
// them (include/kiln/quantize.h).
#pragma once

#include <cstdint>
#include <vector>

#include "kiln/dtype.h"
#include "kiln/quantize.h"

namespace kiln::ptq {

/// What calibration saw of one activation: its range (first pass) and, for percentile and
/// entropy, a histogram over that range (second pass).
class Observer {
 public:
  /// First pass: min and max (NaN and infinities ignored).
  void observe_range(const float* x, int64_t n);
  /// Second pass, after every observe_range: `bins` bins over [min, max] (signed) or over
  /// [0, max |x|] (abs).
  void start_histogram(int bins, bool abs);
  void observe_histogram(const float* x, int64_t n);

  double min() const { return seen_ ? min_ : 0.0; }
  double max() const { return seen_ ? max_ : 0.0; }
  bool seen() const { return seen_; }
  const std::vector<double>& histogram() const { return hist_; }
  bool abs_histogram() const { return abs_; }
  /// The left edge of the histogram and the width of a bin.
  double hist_lo() const { return lo_; }
  double bin_width() const { return width_; }

 private:
  bool seen_ = false;
  double min_ = 0, max_ = 0;
  bool abs_ = false;
  double lo_ = 0, width_ = 0;
  std::vector<double> hist_;
};

/// The (lo, hi) range `method` picks for activations of `dtype` (u8 asymmetric, i8 symmetric).
std::pair<double, double> choose_range(const Observer& o, CalibrationMethod method,
                                       double percentile, DType dtype);
/// The smallest threshold T on |x| minimizing KL(P || Q) between the histogram P clipped at T
/// and its quantization Q into `levels` bins (TensorRT's entropy calibration). `hist` has bins of
/// `width` starting at 0; its first bin counts as the second (the zeros of a relu).
double entropy_threshold(const std::vector<double>& hist, double width, int levels);

/// Scale and zero point of an activation range: u8 covers [min(lo, 0), max(hi, 0)] with a zero
/// point; i8 covers [-a, a], a = max(|lo|, |hi|), with zero point 0.
struct QParams {
  double scale = 1;
  int64_t zero_point = 0;
};
QParams activation_qparams(double lo, double hi, DType dtype);

}  // namespace kiln::ptq
