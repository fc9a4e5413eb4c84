// The rnn family's attributes (src/ops/rnn.cpp documents them) decoded once into the struct its
// kernels read. (C++17: CUDA files include it.)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/errors.h"
#include "core/op_id.h"
#include "core/op_params.h"
#include "ops/rnn_util.h"

namespace kiln {

/// lstm, gru, rnn and rnn_grad (whose attributes are its forward node's plus cell).
struct RnnParams : OpParams {
  /// 0 lstm, 1 gru, 2 rnn: the op's, or rnn_grad's cell attribute.
  int cell = 0;
  int64_t hidden_size = 0;
  /// Directions (2: bidirectional, else 1); reverse_only: the one direction runs backward.
  int64_t num_dirs = 1;
  bool reverse_only = false;
  /// x and y are (B, T, ...) rather than (T, B, ...).
  bool batch_first = false;
  /// gru: the reset gate applies after the recurrent product; lstm: f = 1 - i.
  bool linear_before_reset = false, input_forget = false;
  /// The layer ops: the reserve output follows the others.
  bool training = false;
  /// The gate inputs' clip (0: none).
  double clip = 0;
  /// acts_per_dir(cell) activations per direction, directions in order.
  std::vector<rnn_math::ActParams> acts;
  /// The optional inputs after x, w, r, in this order (has_b: the layer ops only; has_c0 and
  /// has_p: the LSTM's only, kernels ignore them for the other cells).
  bool has_b = false, has_seq_lens = false, has_h0 = false, has_c0 = false, has_p = false;

  static RnnParams decode(OpId op, const Attrs& a) {
    RnnParams p;
    if (op == OpId::RnnGrad) p.cell = static_cast<int>(a.i("cell"));
    else p.cell = op == OpId::Lstm ? 0 : op == OpId::Gru ? 1 : 2;
    p.hidden_size = a.i("hidden_size");
    const std::string& direction = a.str("direction");
    p.num_dirs = direction == "bidirectional" ? 2 : 1;
    p.reverse_only = direction == "reverse";
    p.batch_first = a.b("batch_first", false);
    p.linear_before_reset = a.b("linear_before_reset", false);
    p.input_forget = a.b("input_forget", false);
    if (op != OpId::RnnGrad) p.training = a.b("training", false);
    p.clip = a.f("clip");
    const std::vector<int64_t>& codes = a.ints("activations");
    const std::vector<double>& alpha = a.floats("activation_alpha");
    const std::vector<double>& beta = a.floats("activation_beta");
    if (alpha.size() != codes.size() || beta.size() != codes.size())
      fail<ValueError>("[{}] needs one activation_alpha and activation_beta per activation, got {}",
                       op_name(op), a.to_string());
    for (size_t i = 0; i < codes.size(); ++i)
      p.acts.push_back({static_cast<int>(codes[i]), alpha[i], beta[i]});
    if (op != OpId::RnnGrad) p.has_b = a.b("has_b", false);
    p.has_seq_lens = a.b("has_seq_lens", false);
    p.has_h0 = a.b("has_h0", false);
    p.has_c0 = a.b("has_c0", false);
    p.has_p = a.b("has_p", false);
    return p;
  }
};

}  // namespace kiln
