// Calibration statistics and range selection (src/quant/calibration.h).
#include "quant/calibration.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/errors.h"

namespace kiln::ptq {

void Observer::observe_range(const float* x, int64_t n) {
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    if (!std::isfinite(v)) continue;
    lo = std::min(lo, static_cast<double>(v));
    hi = std::max(hi, static_cast<double>(v));
  }
  if (lo > hi) return;  // nothing finite
  if (!seen_) min_ = lo, max_ = hi;
  min_ = std::min(min_, lo), max_ = std::max(max_, hi);
  seen_ = true;
}

void Observer::start_histogram(int bins, bool abs) {
  abs_ = abs;
  hist_.assign(static_cast<size_t>(std::max(bins, 1)), 0.0);
  lo_ = abs ? 0.0 : min();
  const double hi = abs ? std::max(std::fabs(min()), std::fabs(max())) : max();
  width_ = (hi - lo_) / static_cast<double>(hist_.size());
}

void Observer::observe_histogram(const float* x, int64_t n) {
  const auto last = static_cast<int64_t>(hist_.size()) - 1;
  if (width_ <= 0) {  // a constant activation: everything in the first bin
    for (int64_t i = 0; i < n; ++i) hist_[0] += std::isfinite(x[i]) ? 1 : 0;
    return;
  }
  const double inv = 1.0 / width_;
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    if (!std::isfinite(v)) continue;
    const double d = ((abs_ ? std::fabs(static_cast<double>(v)) : static_cast<double>(v)) - lo_);
    const auto b = std::clamp(static_cast<int64_t>(d * inv), int64_t{0}, last);
    hist_[static_cast<size_t>(b)] += 1;
  }
}

namespace {
// Smallest x with cumulative(x) >= q * total, at a bin's upper edge (from_top: scanning from the
// last bin down, at a bin's lower edge).
double quantile_edge(const Observer& o, double q, bool from_top) {
  const auto& h = o.histogram();
  double total = 0;
  for (double c : h) total += c;
  const double want = q * total;
  double acc = 0;
  const auto n = static_cast<int64_t>(h.size());
  for (int64_t k = 0; k < n; ++k) {
    const int64_t b = from_top ? n - 1 - k : k;
    acc += h[static_cast<size_t>(b)];
    if (acc >= want) return o.hist_lo() + o.bin_width() * static_cast<double>(from_top ? b : b + 1);
  }
  return from_top ? o.hist_lo() : o.hist_lo() + o.bin_width() * static_cast<double>(n);
}
}  // namespace

double entropy_threshold(const std::vector<double>& observed, double width, int levels) {
  // the first bin takes the second's count, as TensorRT's calibrator does: after a relu it holds
  // every zero, a spike that would otherwise decide the divergence
  std::vector<double> hist = observed;
  if (hist.size() > 1) hist[0] = hist[1];
  const auto bins = static_cast<int64_t>(hist.size());
  const int64_t nq = levels;
  if (bins <= nq || width <= 0) return width * static_cast<double>(bins);
  std::vector<double> suffix(static_cast<size_t>(bins) + 1, 0.0);
  for (int64_t b = bins - 1; b >= 0; --b)
    suffix[static_cast<size_t>(b)] =
        suffix[static_cast<size_t>(b) + 1] + hist[static_cast<size_t>(b)];
  double best_kl = std::numeric_limits<double>::infinity();
  int64_t best = bins;
  std::vector<double> p, q;
  for (int64_t i = nq; i <= bins; ++i) {
    // P: the first i bins, the outliers added to the last
    p.assign(hist.begin(), hist.begin() + i);
    p[static_cast<size_t>(i) - 1] += suffix[static_cast<size_t>(i)];
    // Q: the first i bins (without outliers) merged into nq levels, each level spread evenly
    // over the bins of its group that P does not leave empty
    q.assign(static_cast<size_t>(i), 0.0);
    const double per = static_cast<double>(i) / static_cast<double>(nq);
    for (int64_t j = 0; j < nq; ++j) {
      const auto start = static_cast<int64_t>(std::floor(static_cast<double>(j) * per));
      const int64_t stop =
          j == nq - 1 ? i : static_cast<int64_t>(std::floor(static_cast<double>(j + 1) * per));
      double sum = 0;
      int64_t nonzero = 0;
      for (int64_t b = start; b < stop; ++b) {
        sum += hist[static_cast<size_t>(b)];
        nonzero += p[static_cast<size_t>(b)] != 0;
      }
      if (nonzero == 0) continue;
      for (int64_t b = start; b < stop; ++b)
        if (p[static_cast<size_t>(b)] != 0)
          q[static_cast<size_t>(b)] = sum / static_cast<double>(nonzero);
    }
    double ps = 0, qs = 0;
    for (int64_t b = 0; b < i; ++b)
      ps += p[static_cast<size_t>(b)], qs += q[static_cast<size_t>(b)];
    if (ps <= 0 || qs <= 0) continue;
    double kl = 0;
    for (int64_t b = 0; b < i && std::isfinite(kl); ++b) {
      const double pb = p[static_cast<size_t>(b)] / ps;
      if (pb == 0) continue;
      const double qb = q[static_cast<size_t>(b)] / qs;
      kl = qb == 0 ? std::numeric_limits<double>::infinity() : kl + pb * std::log(pb / qb);
    }
    if (kl < best_kl) best_kl = kl, best = i;
  }
  return width * static_cast<double>(best);
}

std::pair<double, double> choose_range(const Observer& o, CalibrationMethod method,
                                       double percentile, DType dtype) {
  const double mn = o.min(), mx = o.max();
  if (method == CalibrationMethod::minmax || !o.seen()) return {mn, mx};
  const double amax = std::max(std::fabs(mn), std::fabs(mx));
  if (method == CalibrationMethod::percentile) {
    const double p = percentile / 100.0;
    if (o.abs_histogram()) {
      const double t = std::min(quantile_edge(o, p, false), amax);
      return {std::max(mn, -t), std::min(mx, t)};
    }
    return {std::max(mn, quantile_edge(o, p, true)), std::min(mx, quantile_edge(o, p, false))};
  }
  // entropy: 128 levels for data of both signs (or i8), 256 for non-negative data in u8
  const int levels = (dtype == u8 && mn >= 0) ? 256 : 128;
  const double t = std::min(entropy_threshold(o.histogram(), o.bin_width(), levels), amax);
  return {std::max(mn, -t), std::min(mx, t)};
}

QParams activation_qparams(double lo, double hi, DType dtype) {
  QParams r;
  if (dtype == i8) {
    const double a = std::max(std::fabs(lo), std::fabs(hi));
    r.scale = a > 0 ? a / 127.0 : 1.0;
    return r;
  }
  lo = std::min(lo, 0.0), hi = std::max(hi, 0.0);
  if (hi - lo <= 0) return r;
  r.scale = (hi - lo) / 255.0;
  r.zero_point = std::clamp<int64_t>(static_cast<int64_t>(std::nearbyint(-lo / r.scale)), 0, 255);
  return r;
}

}  // namespace kiln::ptq
