// ONNX recurrent layers (RNN, GRU, LSTM) as kiln's lstm / gru / rnn ops (include/kiln/ops/rnn.h),
// which take ONNX's weights, gate orders, activations, clip, input_forget, linear_before_reset,
// peepholes and run-time sequence_lens as they are. layout = 1 is the op's batch_first for X and
// Y; the states (B, D, H) are transposed to the op's (D, B, H) and back.
#include <onnx/onnx_pb.h>

#include <algorithm>
#include <cctype>
#include <cmath>

#include "io/onnx/map_util.h"
#include "kiln/ops/rnn.h"

namespace kiln::onnx::detail {

namespace {

struct Act {
  std::string name;  // lower case
  double alpha = 0, beta = 0;
};

bool uses_alpha(const std::string& n) {
  return n == "affine" || n == "leakyrelu" || n == "thresholdedrelu" || n == "scaledtanh" ||
         n == "hardsigmoid" || n == "elu";
}
bool uses_beta(const std::string& n) {
  return n == "affine" || n == "scaledtanh" || n == "hardsigmoid";
}
double default_alpha(const std::string& n) {
  if (n == "leakyrelu") return 0.01;
  if (n == "hardsigmoid") return 0.2;
  return 1.0;  // affine, thresholdedrelu, scaledtanh, elu
}
double default_beta(const std::string& n) {
  if (n == "hardsigmoid") return 0.5;
  if (n == "scaledtanh") return 1.0;
  return 0.0;  // affine
}

// The activations of every direction, `per_dir` each; activation_alpha/beta are consumed in
// order by the activations that take them (the others take none, as onnxruntime reads them),
// defaults where they run out: the ONNX operators' (LeakyRelu 0.01, HardSigmoid 0.2/0.5, Elu 1,
// ThresholdedRelu 1), Affine 1/0 and ScaledTanh 1/1.
std::vector<Act> activations(NodeContext& c, int per_dir, int dirs,
                             const std::vector<std::string>& defaults) {
  std::vector<std::string> names;
  for (const auto& a : c.proto().attribute())
    if (a.name() == "activations") names.assign(a.strings().begin(), a.strings().end());
  if (names.empty())
    for (int d = 0; d < dirs; ++d) names.insert(names.end(), defaults.begin(), defaults.end());
  if (static_cast<int>(names.size()) == per_dir && dirs == 2)
    names.insert(names.end(), names.begin(), names.end());
  if (static_cast<int>(names.size()) != per_dir * dirs)
    c.fail(fmt::format("activations has {} names; {} direction(s) need {}", names.size(), dirs,
                       per_dir * dirs));
  const auto alphas = c.attr_floats("activation_alpha"), betas = c.attr_floats("activation_beta");
  size_t ai = 0, bi = 0;
  std::vector<Act> acts;
  for (const auto& given : names) {
    std::string n = given;
    for (auto& ch : n) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    static const char* known_names[] = {
        "relu",       "tanh",        "sigmoid", "affine",   "leakyrelu", "thresholdedrelu",
        "scaledtanh", "hardsigmoid", "elu",     "softsign", "softplus"};
    if (std::find(std::begin(known_names), std::end(known_names), n) == std::end(known_names))
      c.unsupported(fmt::format("activation '{}'", given));
    Act a{n, 0, 0};
    if (uses_alpha(n)) a.alpha = ai < alphas.size() ? alphas[ai++] : default_alpha(n);
    if (uses_beta(n)) a.beta = bi < betas.size() ? betas[bi++] : default_beta(n);
    acts.push_back(a);
  }
  return acts;
}

RnnActivation to_kiln(const Act& a) {
  using K = RnnActivationKind;
  static const std::pair<const char*, K> kinds[] = {{"relu", K::relu},
                                                    {"tanh", K::tanh},
                                                    {"sigmoid", K::sigmoid},
                                                    {"affine", K::affine},
                                                    {"leakyrelu", K::leaky_relu},
                                                    {"thresholdedrelu", K::thresholded_relu},
                                                    {"scaledtanh", K::scaled_tanh},
                                                    {"hardsigmoid", K::hard_sigmoid},
                                                    {"elu", K::elu},
                                                    {"softsign", K::softsign},
                                                    {"softplus", K::softplus}};
  for (const auto& [n, k] : kinds)
    if (a.name == n) return {k, a.alpha, a.beta};
  return {K::tanh, 0, 0};  // unreachable: activations() rejects unknown names
}

enum class Kind { rnn, gru, lstm };

template <Kind K>
Outs recurrent_op(NodeContext& c) {
  const int gates = K == Kind::rnn ? 1 : K == Kind::gru ? 3 : 4;
  const int per_dir = K == Kind::rnn ? 1 : K == Kind::gru ? 2 : 3;
  RnnOptions o;
  const std::string direction = c.attr_string("direction", "forward");
  int64_t D = 1;
  if (direction == "bidirectional") {
    o.direction = RnnDirection::bidirectional;
    D = 2;
  } else if (direction == "reverse") {
    o.direction = RnnDirection::reverse;
  } else if (direction != "forward") {
    c.fail(fmt::format("unknown direction '{}'", direction));
  }
  const bool layout1 = c.version() >= 14 && c.attr_int("layout", 0) != 0;
  o.batch_first = layout1;
  o.input_forget = K == Kind::lstm && c.attr_int("input_forget", 0) != 0;
  o.linear_before_reset = K == Kind::gru && c.attr_int("linear_before_reset", 0) != 0;
  if (c.has_attr("clip")) {
    const double v = c.attr_float("clip", 0);
    if (!(v > 0)) c.fail(fmt::format("clip must be positive, got {}", v));
    o.clip = v;
  }
  const std::vector<std::string> defaults =
      K == Kind::rnn   ? std::vector<std::string>{"Tanh"}
      : K == Kind::gru ? std::vector<std::string>{"Sigmoid", "Tanh"}
                       : std::vector<std::string>{"Sigmoid", "Tanh", "Tanh"};
  for (const Act& a : activations(c, per_dir, static_cast<int>(D), defaults))
    o.activations.push_back(to_kiln(a));

  Tensor x = c.input(0), w = c.input(1), r = c.input(2);
  if (!is_floating(x.dtype()))
    c.fail(fmt::format("X must be a float tensor, got {}", name(x.dtype())));
  if (x.rank() != 3 || w.rank() != 3 || r.rank() != 3)
    c.fail(fmt::format("X, W and R must be 3-D, got {}, {} and {}", str(x.shape()), str(w.shape()),
                       str(r.shape())));
  const Shape ws = w.shape(), rs = r.shape();
  if (!is_static(ws) || !is_static(rs))
    c.unsupported(
        fmt::format("needs the static shapes of W and R, which are {} and {}", str(ws), str(rs)));
  const int64_t hs = c.attr_int("hidden_size", rs[2]), gh = gates * hs;
  if (ws[0] != D || rs[0] != D || ws[1] != gh || rs[1] != gh || rs[2] != hs)
    c.fail(fmt::format("W {} and R {} do not fit {} direction(s) of {} gates with hidden_size {}",
                       str(ws), str(rs), D, gates, hs));
  if (x.dim(2) >= 0 && x.dim(2) != ws[2])
    c.fail(fmt::format("X {} has input size {}, W {} expects {}", str(x.shape()), x.dim(2), str(ws),
                       ws[2]));
  const int64_t T = x.dim(layout1 ? 1 : 0);

  RnnLayerWeights lw{w, r, std::nullopt, std::nullopt};
  if (c.has_input(3)) {
    Tensor b = c.input(3);
    if (b.rank() != 2 || b.dim(0) != D || b.dim(1) != 2 * gh)
      c.fail(fmt::format("B must be ({}, {}), got {}", D, 2 * gh, str(b.shape())));
    lw.b = b;
  }
  if (K == Kind::lstm && c.has_input(7)) lw.p = c.input(7);
  std::optional<Tensor> lens;
  if (c.has_input(4)) {
    bool all_full = false;
    if (c.constant(4) && T >= 0) {
      const auto v = c.ints(4);
      all_full = std::all_of(v.begin(), v.end(), [&](int64_t n) { return n == T; });
      for (int64_t n : v)
        if (n < 0 || n > T) c.fail(fmt::format("sequence_lens value {} is outside [0, {}]", n, T));
    }
    if (!all_full) {
      lens = c.input(4);
      if (lens->dtype() != i32 && lens->dtype() != i64) lens = cast(*lens, i64);
    }
  }
  auto state = [&](int i) -> std::optional<Tensor> {
    if (!c.has_input(i)) return std::nullopt;
    Tensor s = c.input(i);
    if (s.rank() != 3) c.fail(fmt::format("initial states must be 3-D, got {}", str(s.shape())));
    return layout1 ? transpose(s, {1, 0, 2}) : s;
  };
  RnnResult res = K == Kind::lstm  ? lstm(x, {lw}, state(5), state(6), lens, o)
                  : K == Kind::gru ? gru(x, {lw}, state(5), lens, o)
                                   : rnn(x, {lw}, state(5), lens, o);
  Outs out(K == Kind::lstm ? 3 : 2);
  // the op's y is (T, B, D, H) or, batch first, (B, T, D, H): ONNX's layout 1 already
  if (c.has_output(0)) out[0] = layout1 ? res.y : transpose(res.y, {0, 2, 1, 3});
  auto final_state = [&](const Tensor& v) { return layout1 ? transpose(v, {1, 0, 2}) : v; };
  if (c.has_output(1)) out[1] = final_state(res.h);
  if (K == Kind::lstm && c.has_output(2)) out[2] = final_state(*res.c);
  while (!out.empty() && !out.back().valid()) out.pop_back();
  return out;
}

}  // namespace

void add_rnn_ops(std::vector<OpEntry>& t) {
  t.insert(t.end(), {
                        {"RNN", 7, recurrent_op<Kind::rnn>},
                        {"RNN", 14, recurrent_op<Kind::rnn>},
                        {"GRU", 7, recurrent_op<Kind::gru>},
                        {"GRU", 14, recurrent_op<Kind::gru>},
                        {"LSTM", 7, recurrent_op<Kind::lstm>},
                        {"LSTM", 14, recurrent_op<Kind::lstm>},
                    });
}

}  // namespace kiln::onnx::detail
