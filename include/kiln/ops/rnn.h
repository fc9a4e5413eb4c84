// Recurrent layers: LSTM, GRU and the single-gate RNN (ONNX LSTM/GRU/RNN semantics, MPSGraph's
// LSTM/GRU/single-gate descriptors, PyTorch nn.LSTM/nn.GRU/nn.RNN through a weight reordering).
//
// One layer is one node (ops lstm, gru, rnn); stacked layers are a chain of nodes, layer l + 1
// reading layer l's y as its input (no dropout between layers). With G gates (LSTM 4, GRU 3,
// RNN 1), hidden size H, input size I and D directions (2 when bidirectional, else 1):
//
//   x        (T, B, I), or (B, T, I) with batch_first
//   w        (D, G*H, I)   input weights, ONNX gate order
//   r        (D, G*H, H)   recurrent weights, same order
//   b        (D, 2*G*H)    [Wb, Rb], optional (zeros)
//   p        (D, 3*H)      LSTM peepholes [Pi, Po, Pf], optional (zeros)
//   h0, c0   (D, B, H)     per layer; optional (zeros)
//   seq_lens (B) i32/i64   run-time lengths in [0, T]: a row's steps at or past its length keep
//                          its state and write zeros to y; the reverse direction reads each row
//                          backwards from its own last step
//   y        (T, B, D, H), or (B, T, D, H) with batch_first: every hidden state; the last two dims
//            merge to PyTorch's (…, D*H), forward direction first
//   h, c     (D, B, H): the last hidden (and cell) state of each direction
//
// Gate orders (the rows of w, r and each half of b) are ONNX's:
//   LSTM  i, o, f, c      (PyTorch: i, f, g, o  -> take PyTorch blocks 0, 3, 1, 2)
//   GRU   z, r, h         (PyTorch: r, z, n     -> take PyTorch blocks 1, 0, 2)
// PyTorch's b_ih / b_hh are Wb / Rb; torch_rnn_weights() does the reordering.
//
// Equations (ONNX; f, g, h the activations, ⊙ elementwise, clip bounds every gate's input):
//   LSTM  i = f(x·Wiᵀ + H·Riᵀ + Pi⊙C + Wbi + Rbi)      f = f(… Wf, Rf, Pf⊙C …), or 1 - i with
//         c~ = g(x·Wcᵀ + H·Rcᵀ + Wbc + Rbc)                input_forget
//         C' = f⊙C + i⊙c~   o = f(x·Woᵀ + H·Roᵀ + Po⊙C' + Wbo + Rbo)   H' = o⊙h(C')
//   GRU   z = f(x·Wzᵀ + H·Rzᵀ + Wbz + Rbz)   r = f(… Wr, Rr …)
//         h~ = g(x·Whᵀ + (r⊙H)·Rhᵀ + Rbh + Wbh)            linear_before_reset = false (ONNX's)
//         h~ = g(x·Whᵀ + r⊙(H·Rhᵀ + Rbh) + Wbh)            linear_before_reset = true (PyTorch's,
//                                                          cuDNN's)
//         H' = (1 - z)⊙h~ + z⊙H
//   RNN   H' = f(x·Wiᵀ + H·Riᵀ + Wbi + Rbi)
//
// Gradients flow to x, w, r, b, p, h0 and c0 (not seq_lens) through one rnn_grad node per layer,
// which reads the forward node's reserve output (the gates' inputs and the states of every step);
// a node built without `training` gets a training twin for its gradient.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "kiln/graph.h"

namespace kiln {

enum class RnnCell { lstm, gru, rnn };
enum class RnnDirection { forward, reverse, bidirectional };

/// ONNX's recurrent activations. alpha/beta as ONNX: affine alpha*x + beta; leaky_relu alpha;
/// thresholded_relu x if x > alpha else 0; scaled_tanh alpha*tanh(beta*x); hard_sigmoid
/// clamp(alpha*x + beta, 0, 1); elu alpha.
enum class RnnActivationKind : int64_t {
  sigmoid,
  tanh,
  relu,
  affine,
  leaky_relu,
  thresholded_relu,
  scaled_tanh,
  hard_sigmoid,
  elu,
  softsign,
  softplus
};
struct RnnActivation {
  RnnActivationKind kind = RnnActivationKind::tanh;
  double alpha = 0, beta = 0;
  /// The activation with ONNX's default alpha/beta (leaky_relu 0.01, hard_sigmoid 0.2/0.5,
  /// elu, thresholded_relu, affine and scaled_tanh alpha 1, scaled_tanh beta 1).
  static RnnActivation of(RnnActivationKind k);
};

struct RnnOptions {
  RnnDirection direction = RnnDirection::forward;
  bool batch_first = false;
  /// Per direction: LSTM f, g, h; GRU f, g; RNN f (ONNX's order). Empty: the defaults (sigmoid,
  /// tanh, tanh / sigmoid, tanh / tanh); one direction's list applies to both directions.
  std::vector<RnnActivation> activations;
  /// > 0: every gate's input is clipped to [-clip, clip] (not LSTM's h(C)).
  double clip = 0;
  bool input_forget = false;         // LSTM: f = 1 - i
  bool linear_before_reset = false;  // GRU: false ONNX's default, true PyTorch's and cuDNN's
  /// Also return each layer's reserve (what the gradient needs), as rnn_grad reads it.
  bool training = false;
};

/// One layer's parameters, ONNX layout and gate order (see above).
struct RnnLayerWeights {
  Tensor w, r;
  std::optional<Tensor> b;  // (D, 2*G*H)
  std::optional<Tensor> p;  // LSTM peepholes (D, 3*H)
};

struct RnnResult {
  Tensor y;                     // last layer's hidden states (T, B, D, H) / (B, T, D, H)
  Tensor h;                     // (L*D, B, H), layer-major as PyTorch's h_n
  std::optional<Tensor> c;      // LSTM: (L*D, B, H)
  std::vector<Tensor> reserve;  // with training: one per layer, (T, D, B, S) in x's dtype
};

/// Stacked LSTM layers (one node each), with the layouts, gate order and equations of the
/// comment at the top of kiln/ops/rnn.h. h0 and c0 are (L*D, B, H), layer-major; seq_lens
/// applies to every layer. Float dtypes; weights, biases and states are cast to x's dtype.
/// Returns y, h and c (and each layer's reserve with `training`).
RnnResult lstm(const Tensor& x, const std::vector<RnnLayerWeights>& layers,
               const std::optional<Tensor>& h0 = std::nullopt,
               const std::optional<Tensor>& c0 = std::nullopt,
               const std::optional<Tensor>& seq_lens = std::nullopt, const RnnOptions& opts = {});
/// Stacked GRU layers (one node each), with the layouts, gate order and equations of the comment
/// at the top of kiln/ops/rnn.h; linear_before_reset = true is PyTorch's GRU. h0 is (L*D, B, H),
/// layer-major; seq_lens applies to every layer. Float dtypes; weights, biases and states are
/// cast to x's dtype. Returns y and h (and each layer's reserve with `training`).
RnnResult gru(const Tensor& x, const std::vector<RnnLayerWeights>& layers,
              const std::optional<Tensor>& h0 = std::nullopt,
              const std::optional<Tensor>& seq_lens = std::nullopt, const RnnOptions& opts = {});
/// Stacked single-gate RNN layers (one node each), H' = f(x·Wiᵀ + H·Riᵀ + Wbi + Rbi) with the
/// layouts of the comment at the top of kiln/ops/rnn.h. h0 is (L*D, B, H), layer-major; seq_lens
/// applies to every layer. Float dtypes; weights, biases and states are cast to x's dtype.
/// Returns y and h (and each layer's reserve with `training`).
RnnResult rnn(const Tensor& x, const std::vector<RnnLayerWeights>& layers,
              const std::optional<Tensor>& h0 = std::nullopt,
              const std::optional<Tensor>& seq_lens = std::nullopt, const RnnOptions& opts = {});

/// One layer as PyTorch stores it, per direction (forward, then reverse): weight_ih (G*H, I),
/// weight_hh (G*H, H), bias_ih and bias_hh (G*H) or none, in PyTorch's gate order; returns
/// the layer in kiln's (ONNX's) layout and order.
RnnLayerWeights torch_rnn_weights(RnnCell cell, const std::vector<Tensor>& weight_ih,
                                  const std::vector<Tensor>& weight_hh,
                                  const std::vector<Tensor>& bias_ih = {},
                                  const std::vector<Tensor>& bias_hh = {});

}  // namespace kiln
