// RoPE frequencies and tables (src/llm/rope.h).
#include "llm/rope.h"

#include <fmt/format.h>

#include <cmath>
#include <numbers>

#include "kiln/error.h"

namespace kiln::llm::detail {

std::vector<float> rope_inv_freq(const Config& c) {
  const int64_t half = c.head_dim / 2;
  std::vector<float> inv(static_cast<size_t>(half));
  const float base = static_cast<float>(c.rope_theta);
  for (int64_t i = 0; i < half; ++i)
    inv[i] = 1.0f / std::pow(base, static_cast<float>(2 * i) / static_cast<float>(c.head_dim));
  const RopeScaling& s = c.rope_scaling;
  if (s.type.empty()) return inv;
  if (s.type == "linear") {
    for (float& f : inv) f = static_cast<float>(f / s.factor);
    return inv;
  }
  if (s.type == "llama3") {
    const double orig = static_cast<double>(s.original_max_positions > 0 ? s.original_max_positions
                                                                         : c.max_positions);
    const double low_wavelen = orig / s.low_freq_factor, high_wavelen = orig / s.high_freq_factor;
    for (float& f : inv) {
      const double wavelen = 2 * std::numbers::pi / f;
      if (wavelen > low_wavelen) {
        f = static_cast<float>(f / s.factor);  // low frequencies: interpolated
      } else if (wavelen >= high_wavelen) {    // between: a blend
        const double smooth =
            (orig / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        f = static_cast<float>((1 - smooth) * f / s.factor + smooth * f);
      }
    }
    return inv;
  }
  throw UnsupportedError(fmt::format(
      "[llm] RoPE scaling '{}' is not built yet (kiln builds none, linear and llama3)", s.type));
}

std::pair<Array, Array> rope_tables(const Config& c, int64_t positions, DType dtype) {
  const std::vector<float> inv = rope_inv_freq(c);
  const int64_t half = static_cast<int64_t>(inv.size());
  std::vector<float> cos(static_cast<size_t>(positions * half)), sin(cos.size());
  for (int64_t p = 0; p < positions; ++p)
    for (int64_t i = 0; i < half; ++i) {
      const float angle = static_cast<float>(p) * inv[i];  // float32, as transformers
      cos[p * half + i] = static_cast<float>(std::cos(static_cast<double>(angle)));
      sin[p * half + i] = static_cast<float>(std::sin(static_cast<double>(angle)));
    }
  return {Array::from_vector(cos, {positions, half}).astype(dtype),
          Array::from_vector(sin, {positions, half}).astype(dtype)};
}

}  // namespace kiln::llm::detail
