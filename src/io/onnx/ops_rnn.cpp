// ONNX recurrent layers (RNN, GRU, LSTM) unrolled over a static sequence length.
//
// The input projection X·Wᵀ (+ the biases that do not depend on the state) is one matmul over
// every time step and direction; each step then adds only the recurrent matmul H·Rᵀ and the gate
// math. sequence_lens is a run-time tensor: a batch row's steps at or past its length keep its
// state and write zeros to Y, and the reverse direction reads each row backwards from its own
// last step.
#include <algorithm>
#include <cctype>
#include <cmath>

#include <onnx/onnx_pb.h>

#include "io/onnx/map_util.h"

namespace kiln::onnx::detail {

namespace {

enum class Kind { rnn, gru, lstm };

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
    static const char* known_names[] = {"relu",       "tanh",        "sigmoid", "affine",
                                        "leakyrelu",  "thresholdedrelu", "scaledtanh",
                                        "hardsigmoid", "elu",        "softsign", "softplus"};
    if (std::find(std::begin(known_names), std::end(known_names), n) == std::end(known_names))
      c.unsupported(fmt::format("activation '{}'", given));
    Act a{n, 0, 0};
    if (uses_alpha(n)) a.alpha = ai < alphas.size() ? alphas[ai++] : default_alpha(n);
    if (uses_beta(n)) a.beta = bi < betas.size() ? betas[bi++] : default_beta(n);
    acts.push_back(a);
  }
  return acts;
}

Tensor activate(const Act& a, const Tensor& x) {
  const std::string& n = a.name;
  if (n == "relu") return relu(x);
  if (n == "tanh") return tanh(x);
  if (n == "sigmoid") return sigmoid(x);
  if (n == "affine") return add(mul(x, scalar_of(x, a.alpha)), scalar_of(x, a.beta));
  if (n == "leakyrelu") return leaky_relu(x, a.alpha);
  if (n == "thresholdedrelu")
    return where(greater(x, scalar_of(x, a.alpha)), x, scalar_of(x, 0));
  if (n == "scaledtanh") return mul(scalar_of(x, a.alpha), tanh(mul(x, scalar_of(x, a.beta))));
  if (n == "hardsigmoid") return hardsigmoid(x, a.alpha, a.beta);
  if (n == "elu") return elu(x, a.alpha);
  if (n == "softsign") return div(x, add(abs(x), scalar_of(x, 1)));
  // softplus: log(1 + exp(x)) = max(x, 0) + log1p(exp(-|x|)), stable for large |x|
  return add(maximum(x, scalar_of(x, 0)), log1p(exp(neg(abs(x)))));
}

struct Layer {
  Kind kind;
  int gates;  // 1, 3 or 4
  int64_t hidden = 0, steps = 0, dirs = 1;
  bool reverse_only = false, layout1 = false, input_forget = false, lbr = false;
  std::optional<double> clip;
  std::vector<Act> acts;
  int per_dir = 1;
};

Tensor clipped(const Layer& l, const Tensor& x) {
  return l.clip ? clip(x, -*l.clip, *l.clip) : x;
}
// Activation i of direction `dir` on the clipped x (clip bounds the gates' inputs only: LSTM's
// h(C) sees the cell state as it is, as in onnxruntime).
Tensor act(const Layer& l, int dir, int i, const Tensor& x, bool clip_input = true) {
  return activate(l.acts[static_cast<size_t>(dir * l.per_dir + i)], clip_input ? clipped(l, x) : x);
}

// Per-step pieces of a (T, B, N) tensor, each (B, N).
std::vector<Tensor> steps_of(const Tensor& x, int64_t steps, int64_t n) {
  std::vector<Tensor> parts = steps == 1 ? std::vector<Tensor>{x} : split(x, steps, 0);
  for (auto& p : parts) p = reshape(p, {-1, n});
  return parts;
}

// One direction over time. xw: per-step input projections (B, G*H) in processing order;
// mask: per-step (B, 1) bool (empty: every step is valid). Returns the per-step outputs (in
// processing order) and the final H and C.
struct DirResult {
  std::vector<Tensor> ys;
  Tensor h, c;
};

DirResult run_direction(const Layer& l, int d, const std::vector<Tensor>& xw,
                        const std::vector<Tensor>& mask, const Tensor& r,
                        const std::optional<Tensor>& rbias, std::optional<Tensor> h,
                        std::optional<Tensor> cst, const std::optional<Tensor>& peep) {
  const int64_t hs = l.hidden;
  // split weights once
  Tensor r_zr, r_h;
  if (l.kind == Kind::gru && !l.lbr) {
    auto parts = split(r, std::vector<int64_t>{2 * hs, hs}, 0);
    r_zr = parts[0];
    r_h = parts[1];
  }
  Tensor p_i, p_o, p_f;
  if (peep) {
    auto parts = split(*peep, 3, 0);
    p_i = parts[0];
    p_o = parts[1];
    p_f = parts[2];
  }
  DirResult res;
  for (size_t t = 0; t < xw.size(); ++t) {
    const Tensor& x = xw[t];
    Tensor h_new, c_new;
    if (l.kind == Kind::rnn) {
      Tensor pre = h ? add(x, linear(*h, r)) : x;
      h_new = act(l, d, 0, pre);
    } else if (l.kind == Kind::gru) {
      auto xs = split(x, 3, 1);  // z, r, h
      Tensor z, rg, hh;
      if (l.lbr) {
        // h~ = g(x·Whᵀ + Wbh + r ⊙ (H·Rhᵀ + Rbh)); the recurrent biases stay on this side
        std::vector<Tensor> hr;
        if (h) {
          hr = split(linear(*h, r, rbias), 3, 1);
        } else if (rbias) {
          hr = split(reshape(*rbias, {1, 3 * hs}), 3, 1);
        }
        z = act(l, d, 0, hr.empty() ? xs[0] : add(xs[0], hr[0]));
        rg = act(l, d, 0, hr.empty() ? xs[1] : add(xs[1], hr[1]));
        hh = act(l, d, 1, hr.empty() ? xs[2] : add(xs[2], mul(rg, hr[2])));
      } else {
        if (h) {
          auto hr = split(linear(*h, r_zr), 2, 1);
          z = act(l, d, 0, add(xs[0], hr[0]));
          rg = act(l, d, 0, add(xs[1], hr[1]));
          hh = act(l, d, 1, add(xs[2], linear(mul(rg, *h), r_h)));
        } else {
          z = act(l, d, 0, xs[0]);
          rg = act(l, d, 0, xs[1]);
          hh = act(l, d, 1, xs[2]);
        }
      }
      // H = (1 - z) ⊙ h~ + z ⊙ H_prev
      h_new = mul(sub(scalar_of(z, 1), z), hh);
      if (h) h_new = add(h_new, mul(z, *h));
    } else {
      Tensor g = h ? add(x, linear(*h, r)) : x;
      auto gs = split(g, 4, 1);  // i, o, f, c
      Tensor gi = gs[0], go = gs[1], gf = gs[2], gc = gs[3];
      if (peep && cst) {
        gi = add(gi, mul(p_i, *cst));
        gf = add(gf, mul(p_f, *cst));
      }
      Tensor i = act(l, d, 0, gi);
      Tensor f = l.input_forget ? sub(scalar_of(i, 1), i) : act(l, d, 0, gf);
      Tensor cc = act(l, d, 1, gc);
      c_new = mul(i, cc);
      if (cst) c_new = add(c_new, mul(f, *cst));
      if (peep) go = add(go, mul(p_o, c_new));
      Tensor o = act(l, d, 0, go);
      h_new = mul(o, act(l, d, 2, c_new, false));
    }
    if (!mask.empty()) {
      const Tensor& m = mask[t];
      res.ys.push_back(where(m, h_new, scalar_of(h_new, 0)));
      h_new = where(m, h_new, h ? *h : scalar_of(h_new, 0));
      if (c_new.valid()) c_new = where(m, c_new, cst ? *cst : scalar_of(c_new, 0));
    } else {
      res.ys.push_back(h_new);
    }
    h = h_new;
    if (c_new.valid()) cst = c_new;
  }
  res.h = *h;
  if (cst) res.c = *cst;
  return res;
}

Shape static_dims(NodeContext& c, const Tensor& x, const char* what) {
  Shape s = x.shape();
  if (!is_static(s))
    c.unsupported(fmt::format("needs the static shape of {}, which is {}", what, str(s)));
  return s;
}

template <Kind K>
Outs recurrent_op(NodeContext& c) {
  Layer l;
  l.kind = K;
  l.gates = K == Kind::rnn ? 1 : K == Kind::gru ? 3 : 4;
  l.per_dir = K == Kind::rnn ? 1 : K == Kind::gru ? 2 : 3;
  const std::string direction = c.attr_string("direction", "forward");
  if (direction == "bidirectional") {
    l.dirs = 2;
  } else if (direction == "reverse") {
    l.reverse_only = true;
  } else if (direction != "forward") {
    c.fail(fmt::format("unknown direction '{}'", direction));
  }
  l.layout1 = c.version() >= 14 && c.attr_int("layout", 0) != 0;
  l.input_forget = K == Kind::lstm && c.attr_int("input_forget", 0) != 0;
  l.lbr = K == Kind::gru && c.attr_int("linear_before_reset", 0) != 0;
  if (c.has_attr("clip")) {
    const double v = c.attr_float("clip", 0);
    if (!(v > 0)) c.fail(fmt::format("clip must be positive, got {}", v));
    l.clip = v;
  }
  const std::vector<std::string> defaults =
      K == Kind::rnn   ? std::vector<std::string>{"Tanh"}
      : K == Kind::gru ? std::vector<std::string>{"Sigmoid", "Tanh"}
                       : std::vector<std::string>{"Sigmoid", "Tanh", "Tanh"};
  l.acts = activations(c, l.per_dir, static_cast<int>(l.dirs), defaults);

  Tensor x = c.input(0), w = c.input(1), r = c.input(2);
  if (!is_floating(x.dtype())) c.fail(fmt::format("X must be a float tensor, got {}", name(x.dtype())));
  if (x.rank() != 3 || w.rank() != 3 || r.rank() != 3)
    c.fail(fmt::format("X, W and R must be 3-D, got {}, {} and {}", str(x.shape()),
                       str(w.shape()), str(r.shape())));
  if (l.layout1) x = transpose(x, {1, 0, 2});
  const Shape ws = static_dims(c, w, "W"), rs = static_dims(c, r, "R");
  l.hidden = c.attr_int("hidden_size", rs[2]);
  const int64_t hs = l.hidden, gh = l.gates * hs, in = ws[2];
  if (ws[0] != l.dirs || rs[0] != l.dirs || ws[1] != gh || rs[1] != gh || rs[2] != hs)
    c.fail(fmt::format("W {} and R {} do not fit {} direction(s) of {} gates with hidden_size {}",
                       str(ws), str(rs), l.dirs, l.gates, hs));
  l.steps = x.dim(0);
  if (l.steps < 0) c.unsupported("needs the static sequence length of X");
  if (x.dim(2) >= 0 && x.dim(2) != in)
    c.fail(fmt::format("X {} has input size {}, W {} expects {}", str(x.shape()), x.dim(2),
                       str(ws), in));
  const int64_t T = l.steps, D = l.dirs;
  const bool has_y = c.has_output(0), has_yh = c.has_output(1),
             has_yc = K == Kind::lstm && c.has_output(2);
  if (T == 0) c.unsupported("an empty sequence");

  // biases: B (D, 2*G*H) = [Wb, Rb]
  std::optional<Tensor> wb, rb;  // (D, G*H)
  if (c.has_input(3)) {
    Tensor b = c.input(3);
    if (b.rank() != 2 || b.dim(0) != D || b.dim(1) != 2 * gh)
      c.fail(fmt::format("B must be ({}, {}), got {}", D, 2 * gh, str(b.shape())));
    auto parts = split(b, 2, 1);
    wb = parts[0];
    rb = parts[1];
  }
  // what the projection adds; for GRU with linear_before_reset the recurrent biases stay with H
  std::optional<Tensor> proj_bias, rec_bias;
  if (wb) {
    if (l.lbr) {
      proj_bias = *wb;
      rec_bias = *rb;
    } else {
      proj_bias = add(*wb, *rb);
    }
  }
  // X·Wᵀ for every step and direction at once: (T*B, I) · (D*G*H, I)ᵀ
  Tensor xw = linear(reshape(x, {-1, in}), reshape(w, {D * gh, in}),
                     proj_bias ? std::optional<Tensor>(reshape(*proj_bias, {D * gh}))
                               : std::nullopt);
  xw = reshape(xw, {T, -1, D * gh});
  std::vector<Tensor> xw_dirs = D == 1 ? std::vector<Tensor>{xw} : split(xw, D, 2);

  // sequence_lens: per-step validity masks and, for the reverse direction, per-row reversal
  std::vector<Tensor> mask;
  std::optional<Tensor> rev_idx;  // (T, B, 1) i64: t < len ? len - 1 - t : t
  if (c.has_input(4)) {
    bool all_full = false;
    if (c.constant(4)) {
      const auto lens = c.ints(4);
      all_full = std::all_of(lens.begin(), lens.end(), [&](int64_t v) { return v == T; });
      for (int64_t v : lens)
        if (v < 0 || v > T)
          c.fail(fmt::format("sequence_lens value {} is outside [0, {}]", v, T));
    }
    if (!all_full) {
      Tensor lens = reshape(cast(c.input(4), i64), {1, -1, 1});
      Tensor t = reshape(arange(c.graph(), 0, static_cast<double>(T), 1, i64), {T, 1, 1});
      Tensor valid = less(t, lens);  // (T, B, 1)
      mask = steps_of(valid, T, 1);
      rev_idx = where(valid, sub(sub(lens, scalar_of(lens, 1)), t), t);
    }
  }

  auto state = [&](int input, int d) -> std::optional<Tensor> {
    if (!c.has_input(input)) return std::nullopt;
    Tensor s = c.input(input);
    if (s.rank() != 3) c.fail(fmt::format("initial states must be 3-D, got {}", str(s.shape())));
    if (l.layout1) s = transpose(s, {1, 0, 2});
    if (D == 1) return reshape(s, {-1, hs});
    return reshape(split(s, D, 0)[static_cast<size_t>(d)], {-1, hs});
  };
  std::vector<Tensor> rdir = D == 1 ? std::vector<Tensor>{reshape(r, {gh, hs})} : split(r, D, 0);
  std::optional<Tensor> peeps;
  if (K == Kind::lstm && c.has_input(7)) peeps = c.input(7);

  std::vector<Tensor> y_dirs, h_dirs, c_dirs;
  for (int d = 0; d < D; ++d) {
    const bool backward = l.reverse_only || d == 1;
    Tensor xd = xw_dirs[static_cast<size_t>(d)];  // (T, B, G*H)
    if (backward && rev_idx)
      xd = gather_elements(xd, broadcast_to(*rev_idx, {T, -1, gh}), 0);
    std::vector<Tensor> xs = steps_of(xd, T, gh);
    std::vector<Tensor> m = mask;
    if (backward && !rev_idx) {
      std::reverse(xs.begin(), xs.end());
      std::reverse(m.begin(), m.end());
    }
    std::optional<Tensor> rbias, peep;
    if (rec_bias) rbias = reshape(D == 1 ? *rec_bias : split(*rec_bias, D, 0)[d], {gh});
    if (peeps) peep = reshape(D == 1 ? *peeps : split(*peeps, D, 0)[d], {3 * hs});
    Tensor rd = reshape(rdir[static_cast<size_t>(d)], {gh, hs});
    DirResult res = run_direction(l, d, xs, m, rd, rbias, state(5, d),
                                  K == Kind::lstm ? state(6, d) : std::nullopt, peep);
    if (has_y) {
      if (backward && !rev_idx) std::reverse(res.ys.begin(), res.ys.end());
      Tensor y = stack(res.ys, 0);  // (T, B, H)
      if (backward && rev_idx) y = gather_elements(y, broadcast_to(*rev_idx, {T, -1, hs}), 0);
      y_dirs.push_back(y);
    }
    h_dirs.push_back(res.h);
    if (res.c.valid()) c_dirs.push_back(res.c);
  }

  Outs out(K == Kind::lstm ? 3 : 2);
  if (has_y) {
    Tensor y = stack(y_dirs, 1);  // (T, D, B, H)
    out[0] = l.layout1 ? transpose(y, {2, 0, 1, 3}) : y;
  }
  auto final_state = [&](const std::vector<Tensor>& s) {
    Tensor v = stack(s, 0);  // (D, B, H)
    return l.layout1 ? transpose(v, {1, 0, 2}) : v;
  };
  if (has_yh) out[1] = final_state(h_dirs);
  if (has_yc) out[2] = final_state(c_dirs);
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
