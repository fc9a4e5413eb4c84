// Shared by the recurrent-op tests (tests/ops/test_rnn.cpp, tests/autodiff/test_rnn_grad.cpp):
// a configuration, its fresh random inputs, and the graph that feeds them to lstm / gru / rnn.
#pragma once

#include <fmt/format.h>

#include "kiln/ops/rnn.h"
#include "support/reference.h"

namespace kiln::rnn_test {
using kiln::test::random_array;
using kiln::test::rng;
using K = RnnActivationKind;

struct Cfg {
  RnnCell cell = RnnCell::lstm;
  int layers = 1;
  RnnDirection dir = RnnDirection::forward;
  bool batch_first = false, init = false, lens = false, bias = true, peep = false;
  DType dtype = f64;
  double clip = 0;
  bool input_forget = false, lbr = false;
  std::vector<RnnActivation> acts;  // one direction's; empty: defaults
  int64_t T = 4, B = 3, I = 5, H = 3;
  double w = 0.6;  // weights are drawn from [-w, w]

  int64_t D() const { return dir == RnnDirection::bidirectional ? 2 : 1; }
  int64_t G() const { return cell == RnnCell::lstm ? 4 : cell == RnnCell::gru ? 3 : 1; }
  std::string str() const {
    return fmt::format(
        "cell {} layers {} dir {} batch_first {} init {} lens {} bias {} peep {} "
        "{} clip {} input_forget {} lbr {} acts {}",
        static_cast<int>(cell), layers, static_cast<int>(dir), batch_first, init, lens, bias, peep,
        name(dtype), clip, input_forget, lbr, acts.size());
  }
};

// The inputs in the order: x, then per layer w, r[, b][, p], then [h0][, c0 (lstm)][, lens].
struct Data {
  std::vector<Array> arrays;
  int n_layer_inputs = 0;
};

inline Data make_data(const Cfg& c) {
  Data d;
  const int64_t D = c.D(), GH = c.G() * c.H;
  d.arrays.push_back(
      random_array(c.batch_first ? Shape{c.B, c.T, c.I} : Shape{c.T, c.B, c.I}, c.dtype, -1, 1));
  for (int l = 0; l < c.layers; ++l) {
    const int64_t in = l == 0 ? c.I : D * c.H;
    d.arrays.push_back(random_array({D, GH, in}, c.dtype, -c.w, c.w));
    d.arrays.push_back(random_array({D, GH, c.H}, c.dtype, -c.w, c.w));
    if (c.bias) d.arrays.push_back(random_array({D, 2 * GH}, c.dtype, -0.5, 0.5));
    if (c.peep) d.arrays.push_back(random_array({D, 3 * c.H}, c.dtype, -0.5, 0.5));
  }
  d.n_layer_inputs = 2 + c.bias + c.peep;
  if (c.init) {
    d.arrays.push_back(random_array({c.layers * D, c.B, c.H}, c.dtype, -1, 1));
    if (c.cell == RnnCell::lstm)
      d.arrays.push_back(random_array({c.layers * D, c.B, c.H}, c.dtype, -1, 1));
  }
  if (c.lens) {
    std::vector<int64_t> lens(static_cast<size_t>(c.B));
    for (int64_t b = 0; b < c.B; ++b)
      lens[b] = (b == 0) ? c.T : (b == 1 ? 0 : 1 + static_cast<int64_t>(rng()() % c.T));
    d.arrays.push_back(Array::from_vector(lens, {c.B}));
  }
  return d;
}

inline RnnOptions options(const Cfg& c) {
  RnnOptions o;
  o.direction = c.dir;
  o.batch_first = c.batch_first;
  o.activations = c.acts;
  o.clip = c.clip;
  o.input_forget = c.input_forget;
  o.linear_before_reset = c.lbr;
  return o;
}

inline std::vector<Tensor> build(const Cfg& c, const std::vector<Tensor>& t,
                                 bool training = false) {
  size_t k = 1;
  std::vector<RnnLayerWeights> layers;
  for (int l = 0; l < c.layers; ++l) {
    RnnLayerWeights w{t[k], t[k + 1], std::nullopt, std::nullopt};
    k += 2;
    if (c.bias) w.b = t[k++];
    if (c.peep) w.p = t[k++];
    layers.push_back(w);
  }
  std::optional<Tensor> h0, c0, lens;
  if (c.init) {
    h0 = t[k++];
    if (c.cell == RnnCell::lstm) c0 = t[k++];
  }
  if (c.lens) lens = t[k++];
  RnnOptions o = options(c);
  o.training = training;
  RnnResult r = c.cell == RnnCell::lstm  ? lstm(t[0], layers, h0, c0, lens, o)
                : c.cell == RnnCell::gru ? gru(t[0], layers, h0, lens, o)
                                         : rnn(t[0], layers, h0, lens, o);
  std::vector<Tensor> out{r.y, r.h};
  if (r.c) out.push_back(*r.c);
  return out;
}

}  // namespace kiln::rnn_test
