// kiln::llm::sample: the next token of each row from its logits, in Hugging Face's order
// (repetition penalty, temperature, top-k, top-p, a draw), with draws from Philox4x32-10.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "kiln/error.h"
#include "kiln/llm.h"
#include "ops/philox.h"

namespace kiln::llm {

namespace {

void check(const Sampling& s) {
  auto bad = [](const std::string& what) { throw ValueError("[llm] sampling: " + what); };
  if (!(s.repetition_penalty > 0) || !std::isfinite(s.repetition_penalty))
    bad(fmt::format("repetition_penalty {} (a positive number; 1 is off)", s.repetition_penalty));
  if (s.greedy) return;
  if (!(s.temperature > 0) || !std::isfinite(s.temperature))
    bad(fmt::format("temperature {} (a positive number; greedy picks the most likely token)",
                    s.temperature));
  if (s.top_k < 0) bad(fmt::format("top_k {} (0 keeps every token)", s.top_k));
  if (!(s.top_p > 0 && s.top_p <= 1)) bad(fmt::format("top_p {} (in (0, 1])", s.top_p));
}

// A uniform double in [0, 1) from row `r` of step `step`'s Philox block.
double uniform(uint64_t seed, uint64_t block) {
  philox::Key key;
  philox::Block ctr;
  philox::key_counter_from_seed(seed, 0, key, ctr);
  const philox::Block b = philox::philox4x32_10(philox::skip(ctr, block), key);
  const uint64_t bits = (static_cast<uint64_t>(b.w[1]) << 32) | b.w[0];
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

int64_t draw(std::vector<float>& l, const Sampling& s, double u) {
  const int64_t V = static_cast<int64_t>(l.size());
  for (float& x : l) x = static_cast<float>(x / s.temperature);
  std::vector<int64_t> order(l.size());
  std::iota(order.begin(), order.end(), 0);
  // most likely first (NaN last); equal logits by id
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return l[a] > l[b] || (!std::isnan(l[a]) && std::isnan(l[b]));
  });
  int64_t keep = V;
  if (s.top_k > 0 && s.top_k < V) {  // ties with the k-th stay, as in transformers
    keep = s.top_k;
    while (keep < V && l[order[keep]] == l[order[s.top_k - 1]]) ++keep;
  }
  const float top = l[order[0]];
  if (std::isnan(top) || top == -INFINITY)
    throw ValueError("[llm] sampling: a row of logits has no finite value");
  std::vector<double> p(static_cast<size_t>(keep));
  double total = 0;
  for (int64_t i = 0; i < keep; ++i)
    total += p[i] = std::exp(static_cast<double>(l[order[i]] - top));
  if (s.top_p < 1) {  // drop the least likely while what they hold stays within 1 - top_p
    double tail = 0;
    int64_t n = keep;
    while (n > 1 && (tail + p[n - 1]) / total <= 1 - s.top_p) tail += p[--n];
    keep = n;
    total -= tail;
  }
  double acc = 0;
  const double target = u * total;
  for (int64_t i = 0; i < keep; ++i) {
    acc += p[i];
    if (target < acc) return order[i];
  }
  return order[keep - 1];
}

}  // namespace

std::vector<int64_t> sample(const Array& logits, const std::vector<std::vector<int64_t>>& history,
                            const Sampling& sampling, uint64_t step) {
  check(sampling);
  const Array host = logits.device() == Device::cpu() ? logits : logits.to(Device::cpu());
  if (host.rank() != 2 || host.dtype() != f32)
    throw ShapeError(fmt::format("[llm] sample: logits must be (rows, vocab) f32, not {} {}",
                                 to_string(host.shape()), name(host.dtype())));
  const int64_t R = host.shape()[0], V = host.shape()[1];
  if (!history.empty() && static_cast<int64_t>(history.size()) != R)
    throw ValueError(fmt::format("[llm] sample: {} histories for {} rows", history.size(), R));
  std::vector<int64_t> out(static_cast<size_t>(R));
  const float* data = host.data<float>();
  for (int64_t r = 0; r < R; ++r) {
    std::vector<float> l(data + r * V, data + (r + 1) * V);
    if (sampling.repetition_penalty != 1 && !history.empty()) {
      std::vector<int64_t> seen = history[r];
      std::sort(seen.begin(), seen.end());
      seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
      for (int64_t t : seen)
        if (t >= 0 && t < V)
          l[t] = static_cast<float>(l[t] < 0 ? l[t] * sampling.repetition_penalty
                                             : l[t] / sampling.repetition_penalty);
    }
    if (sampling.greedy) {
      int64_t best = -1;
      for (int64_t v = 0; v < V; ++v)
        if (!std::isnan(l[v]) && (best < 0 || l[v] > l[best])) best = v;
      if (best < 0) throw ValueError(fmt::format("[llm] sample: row {} of logits is all NaN", r));
      out[r] = best;
    } else {
      out[r] = draw(l, sampling, uniform(sampling.seed, step * static_cast<uint64_t>(R) + r));
    }
  }
  return out;
}

}  // namespace kiln::llm
