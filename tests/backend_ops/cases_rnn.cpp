// Cases of the recurrent ops (lstm, gru, rnn, rnn_grad): each layer kind in a few
// configurations (directions, layouts, initial states, lengths, peepholes and clip, both GRU
// variants, two layers). rnn_grad's cases are the gradients of a training layer's outputs.
#include <cmath>

#include <fmt/format.h>

#include "backend_ops/harness.h"
#include "kiln/ops/rnn.h"

namespace kiln::harness {
namespace {

const std::vector<DType> kFloats = {f32, f16, bf16, f64};

struct Config {
  RnnDirection dir;
  bool batch_first, init, lens, extras;  // extras: LSTM peepholes, clip
  int layers;
  bool lbr = false, relu = false;  // GRU linear_before_reset; RNN relu
  int64_t hidden = 3;
  int64_t input = 4;
};
// CUDA runs configs 0 and 4 (LSTM, RNN; GRU in 4) through cuDNN, the others through its kernels
const Config kConfigs[] = {
    {RnnDirection::forward, false, false, false, false, 1},
    {RnnDirection::bidirectional, true, true, true, true, 1, true},
    {RnnDirection::reverse, false, true, true, false, 1},
    {RnnDirection::bidirectional, false, false, false, true, 2, true},
    {RnnDirection::bidirectional, true, true, false, false, 1, true, true},
    // hidden sizes where CUDA splits the recurrent products (split-K) and gathers dR's product
    {RnnDirection::bidirectional, false, true, true, false, 1, true, false, 256},
    {RnnDirection::forward, true, false, false, false, 1, false, false, 512},
    // no input features: the states come from h0 and the biases alone
    {RnnDirection::forward, true, true, false, false, 1, false, false, 3, 0},
};
constexpr int kNumConfigs = 8;
constexpr int kGradConfigs[] = {1, 2, 5, 6};

std::vector<Tensor> layer(Case& c, DType t, RnnCell cell, const Config& k, bool training) {
  const int64_t T = 5, B = 3, I = k.input, H = k.hidden,
                D = k.dir == RnnDirection::bidirectional ? 2 : 1;
  const int64_t G = cell == RnnCell::lstm ? 4 : cell == RnnCell::gru ? 3 : 1;
  Tensor x = c.rand(k.batch_first ? Shape{B, T, I} : Shape{T, B, I}, t, -1, 1,
                    k.batch_first ? Layout::dense : Layout::transposed);
  std::vector<RnnLayerWeights> layers;
  for (int l = 0; l < k.layers; ++l) {
    const int64_t in = l == 0 ? I : D * H;
    const double wr = 0.6 * std::sqrt(3.0 / static_cast<double>(H));  // 0.6 at H = 3
    RnnLayerWeights w{c.rand({D, G * H, in}, t, -0.6, 0.6), c.rand({D, G * H, H}, t, -wr, wr),
                      c.rand({D, 2 * G * H}, t, -0.5, 0.5), std::nullopt};
    if (cell == RnnCell::lstm && k.extras) w.p = c.rand({D, 3 * H}, t, -0.5, 0.5);
    layers.push_back(w);
  }
  std::optional<Tensor> h0, c0, lens;
  if (k.init) {
    h0 = c.rand({k.layers * D, B, H}, t, -1, 1);
    if (cell == RnnCell::lstm) c0 = c.rand({k.layers * D, B, H}, t, -1, 1);
  }
  if (k.lens) lens = c.ints({B}, 0, T, i32);
  RnnOptions o;
  o.direction = k.dir;
  o.batch_first = k.batch_first;
  o.training = training;
  if (k.extras) o.clip = 1.5;
  o.linear_before_reset = k.lbr;
  if (cell == RnnCell::rnn && k.relu) o.activations = {RnnActivation{RnnActivationKind::relu}};
  RnnResult r = cell == RnnCell::lstm  ? lstm(x, layers, h0, c0, lens, o)
                : cell == RnnCell::gru ? gru(x, layers, h0, lens, o)
                                       : rnn(x, layers, h0, lens, o);
  c.note(
      fmt::format("cell {} dir {} batch_first {} init {} lens {} extras {} layers {} lbr {} "
                  "relu {} hidden {} input {}",
                  static_cast<int>(cell), static_cast<int>(k.dir), k.batch_first, k.init, k.lens,
                  k.extras, k.layers, k.lbr, k.relu, k.hidden, I));
  c.tol_scale = 4;
  std::vector<Tensor> outs{r.y, r.h};
  if (r.c) outs.push_back(*r.c);
  return outs;
}

bool forward_case(Case& c, DType t, int i, RnnCell cell) {
  c.outs = layer(c, t, cell, kConfigs[i], false);
  return true;
}

const bool kLstm = register_cases(
    {OpId::Lstm, kNumConfigs,
     [](Case& c, DType t, int i) { return forward_case(c, t, i, RnnCell::lstm); }, kFloats});
const bool kGru = register_cases(
    {OpId::Gru, kNumConfigs,
     [](Case& c, DType t, int i) { return forward_case(c, t, i, RnnCell::gru); }, kFloats});
const bool kRnn = register_cases(
    {OpId::Rnn, kNumConfigs,
     [](Case& c, DType t, int i) { return forward_case(c, t, i, RnnCell::rnn); }, kFloats});

// rnn_grad: gradients of every float input of one layer, as outputs (compared like any output).
const bool kRnnGrad = register_cases(
    {OpId::RnnGrad, 3 * 4,
     [](Case& c, DType t, int i) {
       const RnnCell cell = static_cast<RnnCell>(i / 4);
       const Config& k = kConfigs[kGradConfigs[i % 4]];
       std::vector<Tensor> outs = layer(c, t, cell, k, true);
       Tensor loss;
       for (const Tensor& o : outs) {
         Tensor term = sum(o * c.rand(o.shape(), t, -1, 1));
         loss = loss.valid() ? loss + term : term;
       }
       std::vector<Tensor> wrt;  // every fed float input (x, weights, biases, states)
       for (const auto& [p, a] : c.feeds)
         if (is_floating(p.dtype())) wrt.push_back(p);
       c.outs = gradients(loss, wrt);
       c.grad = false;
       c.tol_scale = 8;
       return true;
     },
     kFloats});

}  // namespace
}  // namespace kiln::harness
