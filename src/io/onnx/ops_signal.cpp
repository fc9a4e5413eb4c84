// ONNX signal ops: windows, DFT, STFT and mel filter banks. Windows and filter banks are
// constants; DFT is a matmul with constant cosine and sine matrices along the signal axis.
#include <cmath>
#include <numbers>

#include "io/onnx/map_util.h"

namespace kiln::onnx::detail {

namespace {

DType output_dtype(NodeContext& c, int64_t fallback_onnx = 1) {
  const auto t = from_onnx_dtype(static_cast<int32_t>(c.attr_int("output_datatype", fallback_onnx)));
  if (!t) c.unsupported("output_datatype is not a kiln element type");
  return *t;
}

int64_t known_scalar(NodeContext& c, int i) {
  const auto v = c.ints(i);
  if (v.size() != 1) c.fail(fmt::format("input {} must hold one value", i));
  return v[0];
}

template <int Kind>  // 0 Hann, 1 Hamming, 2 Blackman
Outs window_op(NodeContext& c) {
  const int64_t n = known_scalar(c, 0);
  if (n < 0 || n > (int64_t{1} << 24)) c.fail(fmt::format("size {} is out of range", n));
  const bool periodic = c.attr_int("periodic", 1) != 0;
  const double denom = periodic ? static_cast<double>(n) : static_cast<double>(n - 1);
  std::vector<double> w(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const double a = 2 * std::numbers::pi * static_cast<double>(i) / denom;
    if (Kind == 0) w[i] = 0.5 - 0.5 * std::cos(a);
    if (Kind == 1) w[i] = 25.0 / 46.0 - 21.0 / 46.0 * std::cos(a);
    if (Kind == 2) w[i] = 0.42 - 0.5 * std::cos(a) + 0.08 * std::cos(2 * a);
  }
  return {known(c, Array::from_vector(w, {n}).astype(output_dtype(c)))};
}

// The DFT of x along `axis` (x's last dim holds 1 (real) or 2 (real, imag) values), `length`
// points, onesided or not, forward or inverse. The inverse of a onesided spectrum (numpy's irfft)
// takes its length / 2 + 1 bins, the rest being their conjugates, and gives a real signal
// (..., length, 1).
Tensor dft(NodeContext& c, Tensor x, int64_t axis, int64_t length, bool onesided, bool inverse) {
  const int r = x.rank();
  const int64_t parts = x.dim(-1);
  if (parts != 1 && parts != 2) c.fail("the last dim must be 1 (real) or 2 (complex)");
  if (axis < 0 || axis >= r - 1) c.fail(fmt::format("axis {} is out of range", axis));
  // move the signal axis next to the complex dim
  std::vector<int64_t> perm;
  for (int i = 0; i < r - 1; ++i)
    if (i != axis) perm.push_back(i);
  perm.push_back(axis);
  perm.push_back(r - 1);
  Tensor xt = transpose(x, perm);
  const int64_t n = xt.dim(-2);
  if (n < 0) c.unsupported("needs the signal length while importing");
  if (length <= 0 || length > (int64_t{1} << 14))
    c.unsupported(fmt::format("dft_length {} (kiln's DFT is a matmul: 1 to 16384 points)", length));
  const int64_t bins = inverse && onesided ? length / 2 + 1 : length;  // the input's
  auto fit = [&](Tensor v) {  // v (..., n) -> (..., bins): truncate or zero-pad
    if (bins < n) return slice(v, {0}, {bins}, {}, {v.rank() - 1});
    if (bins > n) {
      std::vector<int64_t> pads(2 * v.rank(), 0);
      pads.back() = bins - n;
      return pad(v, pads);
    }
    return v;
  };
  Tensor re = fit(squeeze(slice(xt, {0}, {1}, {}, {r - 1}), {r - 1}));
  std::optional<Tensor> im;
  if (parts == 2) im = fit(squeeze(slice(xt, {1}, {2}, {}, {r - 1}), {r - 1}));
  const int64_t k = onesided ? length / 2 + 1 : length;
  const DType t = is_floating(x.dtype()) ? x.dtype() : f32;
  std::vector<int64_t> inv(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) inv[perm[i]] = static_cast<int64_t>(i);
  if (inverse && onesided) {
    // y[t] = (1/length) sum_j w_j (Re X_j cos(2 pi j t / length) - Im X_j sin(...)), w_j = 2 for
    // the bins whose conjugates stand for the missing ones, 1 for 0 and (even lengths) length / 2
    Array cw = Array::zeros({k, length}, f64), sw = Array::zeros({k, length}, f64);
    for (int64_t j = 0; j < k; ++j) {
      const double w = (j == 0 || 2 * j == length ? 1.0 : 2.0) / static_cast<double>(length);
      for (int64_t i = 0; i < length; ++i) {
        const double a = 2 * std::numbers::pi * static_cast<double>((i * j) % length) /
                         static_cast<double>(length);
        cw.data<double>()[j * length + i] = w * std::cos(a);
        sw.data<double>()[j * length + i] = w * std::sin(a);
      }
    }
    Tensor y = matmul(cast(re, t), known(c, cw.astype(t)));
    if (im) y = sub(y, matmul(cast(*im, t), known(c, sw.astype(t))));
    return transpose(expand_dims(y, {y.rank()}), inv);  // (..., length, 1) in the moved order
  }
  Array cm = Array::zeros({length, k}, f64), sm = Array::zeros({length, k}, f64);
  for (int64_t i = 0; i < length; ++i)
    for (int64_t j = 0; j < k; ++j) {
      // reduce (i * j) mod length first so large lengths keep their precision
      const double a = 2 * std::numbers::pi * static_cast<double>((i * j) % length) /
                       static_cast<double>(length);
      cm.data<double>()[i * k + j] = std::cos(a);
      sm.data<double>()[i * k + j] = std::sin(a);
    }
  Tensor C = known(c, cm.astype(t)), S = known(c, sm.astype(t));
  re = cast(re, t);
  Tensor out_re, out_im;
  if (!inverse) {
    out_re = matmul(re, C);
    out_im = neg(matmul(re, S));
    if (im) {
      Tensor i2 = cast(*im, t);
      out_re = add(out_re, matmul(i2, S));
      out_im = add(out_im, matmul(i2, C));
    }
  } else {
    out_re = matmul(re, C);
    out_im = matmul(re, S);
    if (im) {
      Tensor i2 = cast(*im, t);
      out_re = sub(out_re, matmul(i2, S));
      out_im = add(out_im, matmul(i2, C));
    }
    out_re = div(out_re, scalar_of(out_re, static_cast<double>(length)));
    out_im = div(out_im, scalar_of(out_im, static_cast<double>(length)));
  }
  Tensor y = stack({out_re, out_im}, -1);  // (..., k, 2) in the moved order
  return transpose(y, inv);
}

Outs dft_op(NodeContext& c) {
  Tensor x = c.input(0);
  int64_t axis = c.version() >= 20 ? (c.has_input(2) ? known_scalar(c, 2) : -2) : c.attr_int("axis", 1);
  if (axis < 0) axis += x.rank();
  const bool onesided = c.attr_int("onesided", 0) != 0, inverse = c.attr_int("inverse", 0) != 0;
  const int64_t n = axis >= 0 && axis < x.rank() ? x.dim(static_cast<int>(axis)) : -1;
  // (an inverse of a onesided spectrum of n bins defaults to 2 (n - 1) points, as numpy's irfft)
  const int64_t length = c.has_input(1)                 ? known_scalar(c, 1)
                         : inverse && onesided && n > 0 ? 2 * (n - 1)
                                                        : n;
  Tensor y = dft(c, x, axis, length, onesided, inverse);
  return {y.dtype() == x.dtype() ? y : cast(y, x.dtype())};
}

Outs stft_op(NodeContext& c) {
  Tensor x = c.input(0);  // (batch, length, 1 or 2)
  if (x.rank() != 3) c.fail("the signal must be (batch, length, 1 or 2)");
  const int64_t step = known_scalar(c, 1);
  std::optional<Tensor> window;
  if (c.has_input(2)) window = c.input(2);
  int64_t frame = c.has_input(3) ? known_scalar(c, 3) : (window ? window->dim(0) : -1);
  if (frame <= 0) c.fail("needs a window or a frame_length");
  const int64_t len = x.dim(1);
  if (len < 0) c.unsupported("needs the signal length while importing");
  if (step <= 0) c.fail("frame_step must be positive");
  const int64_t frames = len >= frame ? (len - frame) / step + 1 : 0;
  std::vector<int64_t> idx;
  for (int64_t f = 0; f < frames; ++f)
    for (int64_t j = 0; j < frame; ++j) idx.push_back(f * step + j);
  Tensor framed = gather(x, known(c, Array::from_vector(idx, {frames, frame})), 1);
  if (window) framed = mul(framed, reshape(cast(*window, x.dtype()), {frame, 1}));
  Tensor y = dft(c, framed, 2, frame, c.attr_int("onesided", 1) != 0, false);
  return {y.dtype() == x.dtype() ? y : cast(y, x.dtype())};
}

Outs mel_weight_matrix(NodeContext& c) {
  const int64_t bins = known_scalar(c, 0), length = known_scalar(c, 1), rate = known_scalar(c, 2);
  const double lo = c.doubles(3).at(0), hi = c.doubles(4).at(0);
  if (bins <= 0 || length <= 0 || rate <= 0 || bins > (1 << 16) || length > (1 << 20))
    c.fail("bins, dft_length and sample_rate must be positive (and not huge)");
  const int64_t spec = length / 2 + 1;
  const double lo_mel = 2595 * std::log1p(lo / 700) / std::log(10.0);
  const double hi_mel = 2595 * std::log1p(hi / 700) / std::log(10.0);
  const double step = (hi_mel - lo_mel) / static_cast<double>(bins + 2);
  std::vector<int64_t> f(static_cast<size_t>(bins + 2));
  for (int64_t i = 0; i < bins + 2; ++i) {
    const double hz = 700 * std::expm1((static_cast<double>(i) * step + lo_mel) / 2595 * std::log(10.0));
    f[i] = static_cast<int64_t>(std::floor(static_cast<double>(length + 1) * hz / static_cast<double>(rate)));
  }
  Array out = Array::zeros({spec, bins}, f64);
  double* o = out.data<double>();
  auto at = [&](int64_t j, int64_t i) -> double& {
    if (j < 0 || j >= spec) c.fail("a mel band falls outside the spectrogram bins");
    return o[j * bins + i];
  };
  for (int64_t i = 0; i < bins; ++i) {
    const int64_t left = f[i], center = f[i + 1], right = f[i + 2];
    if (center == left) at(center, i) = 1;
    else
      for (int64_t j = left; j <= center; ++j)
        at(j, i) = static_cast<double>(j - left) / static_cast<double>(center - left);
    if (right > center)
      for (int64_t j = center; j < right; ++j)
        at(j, i) = static_cast<double>(right - j) / static_cast<double>(right - center);
  }
  return {known(c, out.astype(output_dtype(c)))};
}

}  // namespace

void add_signal_ops(std::vector<OpEntry>& t) {
  t.insert(t.end(), {
      {"HannWindow", 17, window_op<0>},
      {"HammingWindow", 17, window_op<1>},
      {"BlackmanWindow", 17, window_op<2>},
      {"DFT", 17, dft_op},
      {"STFT", 17, stft_op},
      {"MelWeightMatrix", 17, mel_weight_matrix},
  });
}

}  // namespace kiln::onnx::detail
