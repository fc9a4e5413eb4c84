// kiln::llm::sample against a float64 reference of Hugging Face's logits processing
// (repetition penalty, temperature, top-k, top-p): greedy picks, and the frequencies of seeded
// draws against the reference probabilities.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "kiln/llm.h"
#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;

// The probabilities a sampler should draw from, written from the definitions: logits of tokens in
// `history` divided by the penalty (positive) or multiplied (negative), divided by the
// temperature; tokens below the k-th largest removed; then the least likely removed while their
// total stays within 1 - top_p (at least one kept); the rest softmaxed.
std::vector<double> reference(std::vector<double> l, const std::vector<int64_t>& history,
                              const llm::Sampling& s) {
  std::vector<bool> seen(l.size(), false);
  for (int64_t t : history) seen[t] = true;
  for (size_t v = 0; v < l.size(); ++v)
    if (seen[v]) l[v] = l[v] > 0 ? l[v] / s.repetition_penalty : l[v] * s.repetition_penalty;
  for (double& x : l) x /= s.temperature;
  std::vector<bool> keep(l.size(), true);
  if (s.top_k > 0 && s.top_k < static_cast<int64_t>(l.size())) {
    std::vector<double> sorted = l;
    std::sort(sorted.rbegin(), sorted.rend());
    for (size_t v = 0; v < l.size(); ++v) keep[v] = l[v] >= sorted[s.top_k - 1];
  }
  auto softmax = [&] {
    std::vector<double> p(l.size(), 0.0);
    double top = -INFINITY, total = 0;
    for (size_t v = 0; v < l.size(); ++v)
      if (keep[v]) top = std::max(top, l[v]);
    for (size_t v = 0; v < l.size(); ++v)
      if (keep[v]) total += p[v] = std::exp(l[v] - top);
    for (double& x : p) x /= total;
    return p;
  };
  std::vector<double> p = softmax();
  std::vector<size_t> ascending(l.size());
  std::iota(ascending.begin(), ascending.end(), 0);
  std::stable_sort(ascending.begin(), ascending.end(),
                   [&](size_t a, size_t b) { return l[a] < l[b] || (l[a] == l[b] && a > b); });
  double cumulative = 0;
  size_t kept = std::count(keep.begin(), keep.end(), true);
  for (size_t v : ascending) {
    if (!keep[v]) continue;
    if (kept == 1 || cumulative + p[v] > 1 - s.top_p) break;
    cumulative += p[v];
    keep[v] = false;
    --kept;
  }
  return softmax();
}

Array row(const std::vector<double>& l) {
  std::vector<float> f(l.begin(), l.end());
  return Array::from_vector(f, {1, static_cast<int64_t>(l.size())});
}

TEST(LlmSample, GreedyPicksTheLargestAfterTheRepetitionPenalty) {
  for (int trial = 0; trial < 50; ++trial) {
    const std::vector<double> l = to_f64(random_array({3, 40}, f32, -3, 3));
    std::vector<std::vector<int64_t>> history(3);
    for (auto& h : history) h = random_ints({6}, 0, 39).to_vector<int64_t>();
    llm::Sampling s;
    s.repetition_penalty = 1.7;
    const std::vector<int64_t> got = llm::sample(
        Array::from_vector(std::vector<float>(l.begin(), l.end()), {3, 40}), history, s, 0);
    for (int r = 0; r < 3; ++r) {
      const std::vector<double> p = reference(
          std::vector<double>(l.begin() + r * 40, l.begin() + (r + 1) * 40), history[r], s);
      EXPECT_EQ(got[r], std::max_element(p.begin(), p.end()) - p.begin());
    }
  }
  // equal logits: the lowest id
  EXPECT_EQ(llm::sample(row({0.5, 2, 2, 1}), {}, {}, 0), std::vector<int64_t>{1});
}

TEST(LlmSample, DrawsFollowTheReferenceDistribution) {
  struct Case {
    double temperature, top_p, penalty;
    int64_t top_k;
  };
  for (const Case c : {Case{1.0, 1.0, 1.0, 0}, Case{0.7, 1.0, 1.0, 4}, Case{1.3, 0.8, 1.0, 0},
                       Case{0.9, 0.6, 1.5, 5}}) {
    const std::vector<double> l = to_f64(random_array({8}, f32, -2, 2));
    const std::vector<int64_t> history = {1, 6};
    llm::Sampling s;
    s.greedy = false;
    s.temperature = c.temperature;
    s.top_k = c.top_k;
    s.top_p = c.top_p;
    s.repetition_penalty = c.penalty;
    s.seed = seed();
    const std::vector<double> want = reference(l, history, s);
    constexpr int kDraws = 20000;
    std::vector<int> count(8, 0);
    for (int i = 0; i < kDraws; ++i) ++count[llm::sample(row(l), {history}, s, i)[0]];
    for (int v = 0; v < 8; ++v) {
      const double p = want[v], sigma = std::sqrt(p * (1 - p) / kDraws);
      if (p == 0) EXPECT_EQ(count[v], 0) << "token " << v;
      else EXPECT_NEAR(count[v] / double(kDraws), p, 5 * sigma + 1e-4) << "token " << v;
    }
  }
}

TEST(LlmSample, ASeededDrawIsReproducibleAndSeedsDiffer) {
  const Array l = random_array({4, 50}, f32, -1, 1);
  llm::Sampling s;
  s.greedy = false;
  s.seed = 7;
  std::vector<int64_t> a, b, c;
  for (uint64_t step = 0; step < 30; ++step) {
    for (int64_t t : llm::sample(l, {}, s, step)) a.push_back(t);
    for (int64_t t : llm::sample(l, {}, s, step)) b.push_back(t);
  }
  s.seed = 8;
  for (uint64_t step = 0; step < 30; ++step)
    for (int64_t t : llm::sample(l, {}, s, step)) c.push_back(t);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

TEST(LlmSample, BadSettingsFail) {
  const Array l = random_array({1, 5}, f32);
  llm::Sampling s;
  s.greedy = false;
  s.temperature = 0;
  expect_error<ValueError>([&] { llm::sample(l, {}, s, 0); }, {"temperature 0"});
  s.temperature = 1;
  s.top_p = 0;
  expect_error<ValueError>([&] { llm::sample(l, {}, s, 0); }, {"top_p 0"});
  s.top_p = 1;
  s.top_k = -1;
  expect_error<ValueError>([&] { llm::sample(l, {}, s, 0); }, {"top_k -1"});
  s.top_k = 0;
  s.repetition_penalty = 0;
  expect_error<ValueError>([&] { llm::sample(l, {}, s, 0); }, {"repetition_penalty 0"});
  expect_error<ShapeError>([&] { llm::sample(random_array({5}, f32), {}, {}, 0); },
                           {"(rows, vocab) f32"});
  expect_error<ValueError>([&] { llm::sample(l, {{}, {}}, {}, 0); }, {"2 histories for 1 rows"});
  const float nan = std::nanf("");
  expect_error<ValueError>(
      [&] {
        llm::sample(Array::from_vector<float>({nan, nan}, {1, 2}), {}, {}, 0);
      },
      {"all NaN"});
}

}  // namespace
}  // namespace kiln
