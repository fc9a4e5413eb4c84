// kiln::llm::Model::generate: prompts in groups of max_batch, left-padded to a bucket, prefilled
// in one step, then one step per new token; greedy picks on the device, sampling on the host
// (kiln::llm::sample).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "kiln/error.h"
#include "llm/model_impl.h"

namespace kiln::llm {

void detail::check_prompts(const Model::Impl& m, const std::vector<std::vector<int64_t>>& prompts,
                           int64_t new_tokens) {
  for (size_t i = 0; i < prompts.size(); ++i) {
    const auto& p = prompts[i];
    if (p.empty()) throw ValueError(fmt::format("[llm] prompt {} is empty", i));
    for (int64_t t : p)
      if (t < 0 || t >= m.config.vocab_size)
        throw ValueError(
            fmt::format("[llm] prompt {} holds token {}, outside the vocabulary "
                        "[0, {})",
                        i, t, m.config.vocab_size));
    const int64_t need = static_cast<int64_t>(p.size()) + new_tokens;
    if (need > m.max_length)
      throw ValueError(fmt::format(
          "[llm] prompt {} has {} tokens; with {} new ones that is {} positions, more than the "
          "cache's max_length {} (LoadOptions::max_length)",
          i, p.size(), new_tokens, need, m.max_length));
  }
}

Generation Model::generate(const std::vector<std::vector<int64_t>>& prompts,
                           const GenerateOptions& options) {
  Impl& m = *impl_;
  if (options.max_new_tokens < 1)
    throw ValueError(
        fmt::format("[llm] generate: max_new_tokens {} (at least 1)", options.max_new_tokens));
  detail::check_prompts(m, prompts, options.max_new_tokens);
  std::vector<int64_t> stops =
      options.stop_tokens.empty() ? m.config.eos_token_ids : options.stop_tokens;
  stops.erase(std::remove(stops.begin(), stops.end(), -1), stops.end());
  using Clock = std::chrono::steady_clock;
  auto seconds = [](Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
  };
  Generation out;
  out.tokens.resize(prompts.size());
  const int64_t B = m.max_batch;
  uint64_t draw = 0;  // Philox steps used: a seeded call's draws never repeat across groups
  for (size_t first = 0; first < prompts.size(); first += static_cast<size_t>(B)) {
    const size_t rows = std::min(prompts.size() - first, static_cast<size_t>(B));
    int64_t width = 0;
    for (size_t r = 0; r < rows; ++r)
      width = std::max<int64_t>(width, static_cast<int64_t>(prompts[first + r].size()));
    // pad left to the bucket while the new tokens still fit (else to the longest prompt)
    const int64_t bucket = detail::bucket_length(width, m.max_length - options.max_new_tokens);
    width = std::max(width, bucket);
    std::vector<int64_t> ids(static_cast<size_t>(B * width), 0),
        pads(static_cast<size_t>(B), width);
    std::vector<std::vector<int64_t>> history(static_cast<size_t>(B));
    std::vector<bool> live(static_cast<size_t>(B), false);
    for (size_t r = 0; r < rows; ++r) {
      const auto& p = prompts[first + r];
      pads[r] = width - static_cast<int64_t>(p.size());
      std::copy(p.begin(), p.end(), ids.begin() + static_cast<int64_t>(r) * width + pads[r]);
      history[r] = p;
      live[r] = true;
      out.prompt_tokens += static_cast<int64_t>(p.size());
    }
    const Array pad = Array::from_vector(pads, {B});
    auto t0 = Clock::now();
    // plain greedy picks on the device; anything else samples on the host from the logits
    const bool on_device = options.sampling.greedy && options.sampling.repetition_penalty == 1;
    Array picked = m.run_step(Array::from_vector(ids, {B, width}), 0, pad, on_device);
    for (int64_t s = 0;; ++s) {
      const std::vector<int64_t> next =
          on_device ? picked.to_vector<int64_t>() : sample(picked, history, options.sampling, draw);
      ++draw;
      std::vector<int64_t> feed(static_cast<size_t>(B), 0);
      for (size_t r = 0; r < rows; ++r) {
        if (!live[r]) continue;
        const int64_t tok = next[r];
        feed[r] = tok;
        history[r].push_back(tok);
        out.tokens[first + r].push_back(tok);
        ++out.new_tokens;
        const bool more =
            !options.on_token || options.on_token(static_cast<int64_t>(first + r), tok);
        if (!more || std::find(stops.begin(), stops.end(), tok) != stops.end()) live[r] = false;
      }
      const auto t1 = Clock::now();
      if (s == 0) {
        out.prefill_seconds += seconds(t0, t1);
        t0 = t1;
      }
      if (s + 1 == options.max_new_tokens ||
          std::none_of(live.begin(), live.end(), [](bool b) { return b; })) {
        if (s > 0) out.decode_seconds += seconds(t0, t1);
        break;
      }
      picked = m.run_step(Array::from_vector(feed, {B, 1}), width + s, pad, on_device);
    }
  }
  return out;
}

}  // namespace kiln::llm
