// MIL's recurrent ops (lstm, gru, rnn; iOS15 to iOS18, semantics as coremltools' op
// definitions) mapped onto kiln's lstm / gru / rnn (include/kiln/ops/rnn.h), one layer each
// (src/io/coreml/mil.h).
//
// Weights and biases are graph tensors (a converter may compute them: the torch frontend's gate
// reordering and bias sums are ops of the program); only their shapes must be known while
// importing. Per direction, MIL's gate blocks become kiln's (ONNX's) order:
//   lstm  weight_ih, weight_hh, bias  i, f, o, z  -> i, o, f, c   peephole i, f, o -> i, o, f
//   gru   weight_ih, weight_hh, bias  r, o, z     -> z, r, h
//   rnn   one gate
// MIL's `bias` is the recurrent half of kiln's [Wb, Rb] and iOS18 gru's `input_bias` the input
// half; the other half is zeros. Without reset_after, gru's candidate reads (r ⊙ h)·Whᵀ (kiln's
// linear_before_reset false, where both halves add alike); iOS18's reset_after = true is
// r ⊙ (h·Whᵀ + bias) (linear_before_reset true, PyTorch's and Keras's GRU).
//
// States are (B, D*H) in MIL, forward direction first, and (D, B, H) in kiln. A reverse op's
// sequence output lists the steps in the order it takes them (its step k reads x[T-1-k]), so it
// runs as kiln's forward direction on x reversed in time; a bidirectional lstm's output aligns
// both halves with x's steps, as kiln's does. output_sequence false gives (1, B, D*H): the last
// state of each direction.
//
// Activations (names in any case) are the MIL activation ops with their default parameters:
// sigmoid, tanh, relu, linear (x), scaled_tanh (tanh), hard_sigmoid or sigmoid_hard
// (clamp(0.2x + 0.5, 0, 1)). Fail with a ValueError naming the parameter: lstm's clip (MIL
// clips the cell state, kiln's clip bounds the gates' inputs), any other activation or
// direction, and parameters that the op definitions do not name.
#include <algorithm>
#include <cctype>
#include <optional>
#include <string>
#include <vector>

#include "io/coreml/mil.h"
#include "kiln/ops/core.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/rnn.h"
#include "kiln/ops/transform.h"

namespace kiln::coreml::detail {

namespace {

enum class Cell { lstm, gru, rnn };

int gates_of(Cell k) { return k == Cell::lstm ? 4 : k == Cell::gru ? 3 : 1; }

// MIL's recurrent activation names as kiln's activations.
RnnActivation activation_of(OpContext& c, const char* param, const char* fallback) {
  const std::string given = c.text(param, fallback);
  std::string n = given;
  for (auto& ch : n) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  using K = RnnActivationKind;
  if (n == "sigmoid") return RnnActivation{K::sigmoid, 0, 0};
  if (n == "tanh") return RnnActivation{K::tanh, 0, 0};
  if (n == "relu") return RnnActivation{K::relu, 0, 0};
  if (n == "linear") return RnnActivation{K::affine, 1, 0};
  if (n == "scaled_tanh") return RnnActivation{K::scaled_tanh, 1, 1};
  if (n == "hard_sigmoid" || n == "sigmoid_hard") return RnnActivation{K::hard_sigmoid, 0.2, 0.5};
  c.fail(
      "parameter '{}': activation '{}' is not one of sigmoid, tanh, relu, linear, scaled_tanh "
      "and hard_sigmoid",
      param, given);
}

// The blocks of t (equal blocks along dim 0), block order[j] of MIL's order at kiln's place j.
Tensor reorder(const Tensor& t, const std::vector<int>& order) {
  if (order.size() == 1) return t;
  const std::vector<Tensor> parts = split(t, static_cast<int64_t>(order.size()), 0);
  std::vector<Tensor> out;
  for (int i : order) out.push_back(parts[static_cast<size_t>(i)]);
  return concat(out, 0);
}

// One direction's parameters as MIL gives them (weights checked, in MIL's gate order).
struct Direction {
  Tensor w, r;
  std::optional<Tensor> wb, rb, p;
};

// Checks a parameter's shape against the one the op's gates need (-1: any).
void check_shape(OpContext& c, const char* name, const Tensor& t, const Shape& want) {
  bool same = t.rank() == static_cast<int>(want.size());
  for (size_t d = 0; same && d < want.size(); ++d)
    same = want[d] < 0 || t.dim(static_cast<int>(d)) == want[d];
  if (!same)
    c.fail("parameter '{}' has shape {}, the op's gates need {}", name, str(t.shape()), str(want));
}

// Parameters the op definitions name, iOS15 to iOS18.
void check_params(OpContext& c, Cell k) {
  static const std::vector<std::string> common = {
      "x",    "initial_h", "weight_ih",       "weight_hh",
      "bias", "direction", "output_sequence", "activation"};
  static const std::vector<std::string> lstm_only = {
      "initial_c",     "peephole", "weight_ih_back",       "weight_hh_back", "bias_back",
      "peephole_back", "clip",     "recurrent_activation", "cell_activation"};
  static const std::vector<std::string> gru_only = {"recurrent_activation", "reset_after",
                                                    "input_bias"};
  for (const auto& entry : c.op().inputs()) {
    const std::string& n = entry.first;
    auto in = [&n](const std::vector<std::string>& v) {
      return std::find(v.begin(), v.end(), n) != v.end();
    };
    if (in(common) || (k == Cell::lstm && in(lstm_only)) || (k == Cell::gru && in(gru_only)))
      continue;
    c.fail("parameter '{}' is not one that kiln's mapping of {} takes", n, c.type());
  }
}

template <Cell K> void recurrent(OpContext& c) {
  check_params(c, K);
  const int G = gates_of(K);
  if (K == Cell::lstm && c.has("clip"))
    c.fail(
        "parameter 'clip' (clipping of the cell state) is not supported: kiln's recurrent clip "
        "bounds the gates' inputs");

  const std::string dir = c.text("direction", "forward");
  const bool reverse = dir == "reverse";
  const int64_t D = dir == "bidirectional" && K == Cell::lstm ? 2 : 1;
  if (dir != "forward" && !reverse && D != 2)
    c.fail("parameter 'direction': '{}' is not {}", dir,
           K == Cell::lstm ? "forward, reverse or bidirectional" : "forward or reverse");
  const bool output_sequence = c.flag("output_sequence", false);
  const bool reset_after = K == Cell::gru && c.flag("reset_after", false);

  Tensor x = c.in("x");
  if (x.rank() != 3) c.fail("x must be (T, B, I), got shape {}", str(x.shape()));
  if (!is_floating(x.dtype())) c.fail("x must be a float tensor, got {}", name(x.dtype()));

  // hidden size from weight_hh (G*H, H), whose shape a const has
  const Tensor r0 = c.in("weight_hh");
  if (r0.rank() != 2 || r0.dim(1) < 0)
    c.fail("parameter 'weight_hh' must be (G*H, H) of known shape, got {}", str(r0.shape()));
  const int64_t H = r0.dim(1);
  const Shape ws = {G * H, x.dim(2)};
  auto direction = [&](const char* w, const char* r, const char* b, const char* p) {
    Direction d{c.in(w), c.in(r), std::nullopt, std::nullopt, std::nullopt};
    check_shape(c, w, d.w, ws);
    check_shape(c, r, d.r, {G * H, H});
    if (c.has(b)) {
      d.rb = c.in(b);
      check_shape(c, b, *d.rb, {G * H});
    }
    if (K == Cell::gru && c.has("input_bias")) {
      d.wb = c.in("input_bias");
      check_shape(c, "input_bias", *d.wb, {G * H});
    }
    if (K == Cell::lstm && c.has(p)) {
      d.p = c.in(p);
      check_shape(c, p, *d.p, {3 * H});
    }
    return d;
  };
  std::vector<Direction> dirs = {direction("weight_ih", "weight_hh", "bias", "peephole")};
  if (D == 2) {
    if (!c.has("weight_ih_back") || !c.has("weight_hh_back"))
      c.fail("a bidirectional lstm needs parameters 'weight_ih_back' and 'weight_hh_back'");
    dirs.push_back(direction("weight_ih_back", "weight_hh_back", "bias_back", "peephole_back"));
  }

  // kiln's layer: MIL's gate blocks in kiln's order, directions stacked
  const std::vector<int> order = K == Cell::lstm  ? std::vector<int>{0, 2, 1, 3}
                                 : K == Cell::gru ? std::vector<int>{2, 0, 1}
                                                  : std::vector<int>{0};
  const bool any_bias =
      std::any_of(dirs.begin(), dirs.end(), [](const Direction& d) { return d.wb || d.rb; });
  const bool any_peephole =
      std::any_of(dirs.begin(), dirs.end(), [](const Direction& d) { return d.p.has_value(); });
  std::vector<Tensor> w, r, b, p;
  for (const Direction& d : dirs) {
    w.push_back(reorder(d.w, order));
    r.push_back(reorder(d.r, order));
    if (any_bias) {
      auto half = [&](const std::optional<Tensor>& v) {
        return v ? reorder(*v, order) : zeros(c.graph(), {G * H}, d.w.dtype());
      };
      b.push_back(concat({half(d.wb), half(d.rb)}, 0));
    }
    if (any_peephole)
      p.push_back(d.p ? reorder(*d.p, {0, 2, 1}) : zeros(c.graph(), {3 * H}, d.w.dtype()));
  }
  RnnLayerWeights layer{stack(w, 0), stack(r, 0), std::nullopt, std::nullopt};
  if (any_bias) layer.b = stack(b, 0);
  if (any_peephole) layer.p = stack(p, 0);

  RnnOptions o;
  o.direction = D == 2 ? RnnDirection::bidirectional : RnnDirection::forward;
  o.linear_before_reset = reset_after;
  if (K == Cell::lstm)
    o.activations = {activation_of(c, "recurrent_activation", "sigmoid"),
                     activation_of(c, "cell_activation", "tanh"),
                     activation_of(c, "activation", "tanh")};
  else if (K == Cell::gru)
    o.activations = {activation_of(c, "recurrent_activation", "sigmoid"),
                     activation_of(c, "activation", "tanh")};
  else o.activations = {activation_of(c, "activation", "tanh")};

  // (B, D*H) -> (D, B, H)
  auto state_in = [&](const char* name) {
    const Tensor s = c.in(name);
    if (s.rank() != 2 || (s.dim(1) >= 0 && s.dim(1) != D * H))
      c.fail("parameter '{}' must be (B, {}), got shape {}", name, D * H, str(s.shape()));
    return D == 1 ? expand_dims(s, {0}) : stack(split(s, 2, 1), 0);
  };
  // (D, B, H) -> (B, D*H)
  auto state_out = [&](const Tensor& s) {
    if (D == 1) return squeeze(s, {0});
    const std::vector<Tensor> halves = split(s, 2, 0);
    return concat({squeeze(halves[0], {0}), squeeze(halves[1], {0})}, 1);
  };

  if (reverse) x = flip(x, {0});
  const Tensor h0 = state_in("initial_h");
  RnnResult res = K == Cell::lstm  ? lstm(x, {layer}, h0, state_in("initial_c"), std::nullopt, o)
                  : K == Cell::gru ? gru(x, {layer}, h0, std::nullopt, o)
                                   : rnn(x, {layer}, h0, std::nullopt, o);

  // y (T, B, D, H) -> (T, B, D*H), or the last states (1, B, D*H)
  Tensor y;
  if (!output_sequence) {
    y = expand_dims(state_out(res.h), {0});
  } else if (D == 1) {
    y = squeeze(res.y, {2});
  } else {
    const std::vector<Tensor> halves = split(res.y, 2, 2);
    y = concat({squeeze(halves[0], {2}), squeeze(halves[1], {2})}, 2);
  }
  c.set(0, y);
  if (c.num_outputs() > 1) c.set(1, state_out(res.h));
  if (K == Cell::lstm && c.num_outputs() > 2) c.set(2, state_out(*res.c));
}

}  // namespace

void add_rnn_ops(OpTable& t) {
  t["lstm"] = recurrent<Cell::lstm>;
  t["gru"] = recurrent<Cell::gru>;
  t["rnn"] = recurrent<Cell::rnn>;
}

}  // namespace kiln::coreml::detail
