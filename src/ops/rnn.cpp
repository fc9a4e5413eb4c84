// Ops of the rnn family (include/kiln/ops/rnn.h): lstm, gru, rnn (one layer each) and rnn_grad.
//   lstm / gru / rnn: inputs x, w, r[, b][, seq_lens][, h0][, c0 (lstm)][, p (lstm)], all float
//     inputs in x's dtype, seq_lens i32/i64. Attrs hidden_size, direction ("forward" | "reverse"
//     | "bidirectional"), batch_first, activations (codes of RnnActivationKind, acts_per_dir * D),
//     activation_alpha / activation_beta (one per activation), clip (0: none), input_forget,
//     linear_before_reset, training, has_b, has_seq_lens, has_h0, has_c0, has_p.
//     Outputs y, h[, c (lstm)][, reserve (training; layout in ops/rnn_util.h)].
//   rnn_grad: the forward attrs plus cell (0 lstm, 1 gru, 2 rnn); inputs x, w, r[, seq_lens]
//     [, h0][, c0][, p], reserve, dy, dh[, dc (lstm)]; outputs dx, dw, dr, db, dh0 and for the
//     LSTM dc0, dp (always all of them, zeros where the forward node had no such input).
#include "kiln/ops/rnn.h"

#include <algorithm>

#include "kiln/ops/core.h"
#include "kiln/ops/transform.h"
#include "ops/common.h"
#include "ops/rnn_params.h"
#include "ops/rnn_util.h"
#include "ops/shape_values.h"

namespace kiln {

using namespace ops;

namespace {

int cell_of(OpId op) { return op == OpId::Lstm ? 0 : op == OpId::Gru ? 1 : 2; }
OpId op_of(RnnCell c) {
  return c == RnnCell::lstm ? OpId::Lstm : c == RnnCell::gru ? OpId::Gru : OpId::Rnn;
}
const char* kDirections[] = {"forward", "reverse", "bidirectional"};

int64_t num_dirs(const InferContext& ctx) {
  const std::string& d = ctx.attrs.str("direction");
  if (d == "bidirectional") return 2;
  if (d != "forward" && d != "reverse")
    fail<ValueError>("[{}] unknown direction '{}'", ctx.name(), d);
  return 1;
}

// Checks the optional input `name` (present per has_<name>) against `want`; returns its index
// or -1. `next` walks the inputs.
int optional_input(const InferContext& ctx, const char* key, const char* what, size_t& next,
                   const Shape& want, DType dtype) {
  if (!ctx.attrs.b(key, false)) return -1;
  if (next >= ctx.inputs.size())
    fail<ValueError>("[{}] has {} inputs; its attributes ({}) call for more", ctx.name(),
                     ctx.inputs.size(), ctx.attrs.to_string());
  const TensorInfo& t = ctx.inputs[next];
  if (!shapes_match(t.shape, want) || t.dtype != dtype)
    fail<ShapeError>("[{}] {} is ({}, {}); expected ({}, {})", ctx.name(), what, str(t.shape),
                     name(t.dtype), str(want), name(dtype));
  return static_cast<int>(next++);
}

struct Dims {
  int64_t T, B, I, H, D, G;
};

// Checks the forward inputs (x, w, r and the optional ones) and returns the layer's dims; `next`
// ends past the inputs read. With `grad`, b is absent (rnn_grad does not take it).
Dims check_layer(const InferContext& ctx, size_t& next, bool grad, int cell) {
  require_dtype(ctx, 0, kFloatTypes, "a float dtype");
  for (int i = 0; i < 3; ++i) require_rank(ctx, i, 3, 3);
  const TensorInfo &x = ctx.inputs[0], &w = ctx.inputs[1], &r = ctx.inputs[2];
  const bool bf = ctx.attrs.b("batch_first", false);
  Dims d{};
  d.T = x.shape[bf ? 1 : 0];
  d.B = x.shape[bf ? 0 : 1];
  d.I = x.shape[2];
  d.H = ctx.attrs.i("hidden_size");
  d.D = num_dirs(ctx);
  d.G = rnn_math::gates_of(cell);
  if (d.H <= 0) fail<ValueError>("[{}] hidden_size must be positive, got {}", ctx.name(), d.H);
  for (int i = 1; i < 3; ++i)
    if (ctx.inputs[i].dtype != x.dtype)
      fail<DTypeError>("[{}] input {} has dtype {}; x has {}", ctx.name(), i,
                       name(ctx.inputs[i].dtype), name(x.dtype));
  if (!shapes_match(w.shape, {d.D, d.G * d.H, d.I}) ||
      !shapes_match(r.shape, {d.D, d.G * d.H, d.H}))
    fail<ShapeError>(
        "[{}] w {} and r {} do not fit x {} with {} direction(s) of {} gates and "
        "hidden_size {}: expected ({}, {}, {}) and ({}, {}, {})",
        ctx.name(), str(w.shape), str(r.shape), str(x.shape), d.D, d.G, d.H, d.D, d.G * d.H, d.I,
        d.D, d.G * d.H, d.H);
  const size_t acts = static_cast<size_t>(rnn_math::acts_per_dir(cell) * d.D);
  const auto& codes = ctx.attrs.ints("activations");
  if (codes.size() != acts || ctx.attrs.floats("activation_alpha").size() != acts ||
      ctx.attrs.floats("activation_beta").size() != acts)
    fail<ValueError>("[{}] needs {} activations with alpha and beta, got {}", ctx.name(), acts,
                     codes.size());
  for (int64_t c : codes)
    if (c < 0 || c >= rnn_math::kNumActs)
      fail<ValueError>("[{}] unknown activation code {}", ctx.name(), c);
  if (ctx.attrs.f("clip") < 0)
    fail<ValueError>("[{}] clip must be >= 0 (0: none), got {}", ctx.name(), ctx.attrs.f("clip"));
  next = 3;
  if (!grad) optional_input(ctx, "has_b", "b", next, {d.D, 2 * d.G * d.H}, x.dtype);
  if (ctx.attrs.b("has_seq_lens", false)) {
    const TensorInfo& s = ctx.inputs.at(next);
    if ((s.dtype != i32 && s.dtype != i64) || !shapes_match(s.shape, {d.B}))
      fail<ShapeError>("[{}] seq_lens is ({}, {}); expected ({}) of i32 or i64", ctx.name(),
                       str(s.shape), name(s.dtype), d.B);
    ++next;
  }
  const Shape state{d.D, d.B, d.H};
  optional_input(ctx, "has_h0", "h0", next, state, x.dtype);
  if (cell == 0) {
    optional_input(ctx, "has_c0", "c0", next, state, x.dtype);
    optional_input(ctx, "has_p", "p", next, {d.D, 3 * d.H}, x.dtype);
  }
  return d;
}

std::vector<TensorInfo> infer_layer(const InferContext& ctx) {
  const int cell = cell_of(ctx.op);
  size_t next = 0;
  const Dims d = check_layer(ctx, next, false, cell);
  if (next != ctx.inputs.size())
    fail<ValueError>("[{}] has {} inputs; its attributes ({}) call for {}", ctx.name(),
                     ctx.inputs.size(), ctx.attrs.to_string(), next);
  const DType t = ctx.inputs[0].dtype;
  const bool bf = ctx.attrs.b("batch_first", false);
  std::vector<TensorInfo> out{{bf ? Shape{d.B, d.T, d.D, d.H} : Shape{d.T, d.B, d.D, d.H}, t},
                              {{d.D, d.B, d.H}, t}};
  if (cell == 0) out.push_back({{d.D, d.B, d.H}, t});
  if (ctx.attrs.b("training", false))
    out.push_back({{d.T, d.D, d.B, rnn_math::reserve_width(cell) * d.H}, t});
  return out;
}

std::vector<TensorInfo> infer_grad(const InferContext& ctx) {
  const int64_t cell = ctx.attrs.i("cell");
  if (cell < 0 || cell > 2) fail<ValueError>("[{}] unknown cell {}", ctx.name(), cell);
  size_t next = 0;
  const Dims d = check_layer(ctx, next, true, static_cast<int>(cell));
  const DType t = ctx.inputs[0].dtype;
  const bool bf = ctx.attrs.b("batch_first", false);
  const size_t want = next + (cell == 0 ? 4 : 3);
  if (ctx.inputs.size() != want)
    fail<ValueError>("[{}] has {} inputs; its attributes ({}) call for {}", ctx.name(),
                     ctx.inputs.size(), ctx.attrs.to_string(), want);
  const Shape state{d.D, d.B, d.H};
  auto check = [&](size_t i, const char* what, const Shape& s) {
    const TensorInfo& v = ctx.inputs[i];
    if (!shapes_match(v.shape, s) || v.dtype != t)
      fail<ShapeError>("[{}] {} is ({}, {}); expected ({}, {})", ctx.name(), what, str(v.shape),
                       name(v.dtype), str(s), name(t));
  };
  check(next, "reserve", {d.T, d.D, d.B, rnn_math::reserve_width(static_cast<int>(cell)) * d.H});
  check(next + 1, "dy", bf ? Shape{d.B, d.T, d.D, d.H} : Shape{d.T, d.B, d.D, d.H});
  check(next + 2, "dh", state);
  if (cell == 0) check(next + 3, "dc", state);
  std::vector<TensorInfo> out{
      ctx.inputs[0], ctx.inputs[1], ctx.inputs[2], {{d.D, 2 * d.G * d.H}, t}, {state, t}};
  if (cell == 0) {
    out.push_back({state, t});
    out.push_back({{d.D, 3 * d.H}, t});
  }
  return out;
}

// ---- gradient

using Grads = std::vector<std::optional<Tensor>>;

Grads vjp_layer(const VjpContext& c) {
  const int cell = cell_of(c.op);
  const Attrs& a = c.attrs;
  // the reserve: this node's, or a training twin's (same inputs, so the same forward values)
  Tensor reserve;
  if (a.b("training", false)) {
    reserve = c.outputs.back();
  } else {
    Attrs t = a;
    t.set("training", true);
    reserve = make_node(c.op, c.inputs, t).back();
  }
  Attrs ga = a;
  ga.set("cell", static_cast<int64_t>(cell));
  ga.set("has_b", false);
  ga.set("training", false);
  std::vector<Tensor> in{c.inputs[0], c.inputs[1], c.inputs[2]};
  size_t k = 3;
  int ib = -1, ih0 = -1, ic0 = -1, ip = -1;
  if (a.b("has_b", false)) ib = static_cast<int>(k++);
  if (a.b("has_seq_lens", false)) in.push_back(c.inputs[k++]);
  if (a.b("has_h0", false)) {
    ih0 = static_cast<int>(k);
    in.push_back(c.inputs[k++]);
  }
  if (cell == 0 && a.b("has_c0", false)) {
    ic0 = static_cast<int>(k);
    in.push_back(c.inputs[k++]);
  }
  if (cell == 0 && a.b("has_p", false)) {
    ip = static_cast<int>(k);
    in.push_back(c.inputs[k++]);
  }
  in.push_back(reserve);
  in.push_back(c.cotangent_or_zeros(0));
  in.push_back(c.cotangent_or_zeros(1));
  if (cell == 0) in.push_back(c.cotangent_or_zeros(2));
  auto g = make_node(OpId::RnnGrad, in, ga);
  Grads grads(c.inputs.size());
  grads[0] = g[0];
  grads[1] = g[1];
  grads[2] = g[2];
  if (ib >= 0) grads[ib] = g[3];
  if (ih0 >= 0) grads[ih0] = g[4];
  if (ic0 >= 0) grads[ic0] = g[5];
  if (ip >= 0) grads[ip] = g[6];
  return grads;
}

// ---- builders

const char* kOpNames[] = {"lstm", "gru", "rnn"};

std::vector<RnnActivation> default_acts(RnnCell cell) {
  using K = RnnActivationKind;
  if (cell == RnnCell::lstm) return {RnnActivation::of(K::sigmoid), {K::tanh}, {K::tanh}};
  if (cell == RnnCell::gru) return {RnnActivation::of(K::sigmoid), {K::tanh}};
  return {{K::tanh}};
}

Tensor cast_param(const char* op, const Tensor& t, const Tensor& x, const char* what) {
  if (!is_floating(t.dtype()))
    fail<DTypeError>("[{}] {} must be a float tensor, got {} (shape {})", op, what, name(t.dtype()),
                     str(t.shape()));
  return cast_to(t, x.dtype());
}

std::optional<Tensor> cast_opt(const char* op, const std::optional<Tensor>& t, const Tensor& x,
                               const char* what) {
  if (!t) return std::nullopt;
  return cast_param(op, *t, x, what);
}

// Layer `l`'s (D, B, H) slice of a layer-major (L*D, B, H) state.
std::optional<Tensor> layer_state(const std::optional<Tensor>& s, size_t l, size_t layers,
                                  int64_t D) {
  if (!s) return std::nullopt;
  if (layers == 1) return s;
  const int64_t lo = static_cast<int64_t>(l) * D;
  return slice(*s, {lo, 0, 0}, {lo + D, s->dim(1), s->dim(2)});
}

RnnResult stacked(RnnCell cell, Tensor x, const std::vector<RnnLayerWeights>& layers,
                  const std::optional<Tensor>& h0, const std::optional<Tensor>& c0,
                  const std::optional<Tensor>& seq_lens, const RnnOptions& o) {
  const char* op = kOpNames[static_cast<int>(cell)];
  if (!is_floating(x.dtype()))
    fail<DTypeError>("[{}] x must be a float tensor, got {} (shape {})", op, name(x.dtype()),
                     str(x.shape()));
  if (x.rank() != 3) fail<ShapeError>("[{}] x must be 3-D, got shape {}", op, str(x.shape()));
  if (layers.empty()) fail<ValueError>("[{}] needs at least one layer", op);
  const int64_t D = o.direction == RnnDirection::bidirectional ? 2 : 1;
  const int per_dir = rnn_math::acts_per_dir(static_cast<int>(cell));
  std::vector<RnnActivation> acts = o.activations.empty() ? default_acts(cell) : o.activations;
  if (static_cast<int64_t>(acts.size()) == per_dir && D == 2)
    acts.insert(acts.end(), acts.begin(), acts.end());
  if (static_cast<int64_t>(acts.size()) != per_dir * D)
    fail<ValueError>("[{}] {} activations given; {} direction(s) need {} (or {} for both)", op,
                     o.activations.size(), D, per_dir * D, per_dir);
  std::vector<int64_t> codes;
  std::vector<double> alpha, beta;
  for (const auto& a : acts) {
    codes.push_back(static_cast<int64_t>(a.kind));
    alpha.push_back(a.alpha);
    beta.push_back(a.beta);
  }
  if (!(o.clip >= 0)) fail<ValueError>("[{}] clip must be >= 0 (0: none), got {}", op, o.clip);
  std::optional<Tensor> lens;
  if (seq_lens) {
    if (seq_lens->dtype() != i32 && seq_lens->dtype() != i64)
      fail<DTypeError>("[{}] seq_lens must be i32 or i64, got {}", op, name(seq_lens->dtype()));
    lens = seq_lens;
  }
  RnnResult res;
  std::vector<Tensor> hs, cs;
  for (size_t l = 0; l < layers.size(); ++l) {
    const RnnLayerWeights& lw = layers[l];
    if (!lw.w.valid() || !lw.r.valid()) fail<ValueError>("[{}] layer {} lacks w or r", op, l);
    const Tensor w = cast_param(op, lw.w, x, "w"), r = cast_param(op, lw.r, x, "r");
    if (r.rank() != 3 || r.dim(2) <= 0)
      fail<ShapeError>("[{}] r of layer {} must be (D, G*H, H) with a static H, got {}", op, l,
                       str(r.shape()));
    Attrs attrs{{"hidden_size", r.dim(2)},
                {"direction", std::string(kDirections[static_cast<int>(o.direction)])},
                {"batch_first", o.batch_first},
                {"activations", codes},
                {"activation_alpha", alpha},
                {"activation_beta", beta},
                {"clip", o.clip},
                {"input_forget", cell == RnnCell::lstm && o.input_forget},
                {"linear_before_reset", cell == RnnCell::gru && o.linear_before_reset},
                {"training", o.training}};
    std::vector<Tensor> in{x, w, r};
    add_optional(in, attrs, "b", cast_opt(op, lw.b, x, "b"));
    add_optional(in, attrs, "seq_lens", lens);
    add_optional(in, attrs, "h0", cast_opt(op, layer_state(h0, l, layers.size(), D), x, "h0"));
    if (cell == RnnCell::lstm) {
      add_optional(in, attrs, "c0", cast_opt(op, layer_state(c0, l, layers.size(), D), x, "c0"));
      add_optional(in, attrs, "p", cast_opt(op, lw.p, x, "p"));
    } else if (lw.p) {
      fail<ValueError>("[{}] peepholes are an LSTM feature", op);
    }
    auto out = make_node(op_of(cell), in, std::move(attrs));
    res.y = out[0];
    hs.push_back(out[1]);
    if (cell == RnnCell::lstm) cs.push_back(out[2]);
    if (o.training) res.reserve.push_back(out.back());
    if (l + 1 < layers.size()) {
      const Shape ys = res.y.shape();
      if (ys[0] >= 0 || ys[1] >= 0) {
        x = reshape(res.y, {ys[0], ys[1], ys[2] * ys[3]});
      } else {  // T and B known only when run: (T, B) from y's shape, its last two dims joined
        const Tensor joined = constant_on(
            *res.y.graph_impl(), Array::from_vector(std::vector<int64_t>{ys[2] * ys[3]}, {1}));
        x = reshape_to(res.y, concat({slice(shape_of(res.y), {0}, {2}), joined}, 0));
      }
    }
  }
  res.h = hs.size() == 1 ? hs[0] : concat(hs, 0);
  if (cell == RnnCell::lstm) res.c = cs.size() == 1 ? cs[0] : concat(cs, 0);
  return res;
}

// PyTorch's gate blocks in kiln's order.
std::vector<int64_t> torch_blocks(RnnCell cell) {
  if (cell == RnnCell::lstm) return {0, 3, 1, 2};  // i f g o -> i o f c
  if (cell == RnnCell::gru) return {1, 0, 2};      // r z n -> z r h
  return {0};
}

Tensor reorder_gates(const Tensor& t, RnnCell cell) {
  const std::vector<int64_t> order = torch_blocks(cell);
  if (order.size() == 1) return t;
  auto parts = split(t, static_cast<int64_t>(order.size()), 0);
  std::vector<Tensor> out;
  for (int64_t b : order) out.push_back(parts[static_cast<size_t>(b)]);
  return concat(out, 0);
}

// rnn_grad's dc: the LSTM's cell state gradient.
int lstm_cell_state_grad(const Attrs& a) { return a.i("cell", 0) == 0 ? 1 : 0; }
}  // namespace

RnnActivation RnnActivation::of(RnnActivationKind k) {
  using K = RnnActivationKind;
  switch (k) {
    case K::leaky_relu:
      return {k, 0.01, 0};
    case K::hard_sigmoid:
      return {k, 0.2, 0.5};
    case K::affine:
    case K::elu:
    case K::thresholded_relu:
      return {k, 1, 0};
    case K::scaled_tanh:
      return {k, 1, 1};
    default:
      return {k, 0, 0};
  }
}

void register_rnn_ops() {
  // x, w, r and the optional ones
  define_op(OpId::Lstm)
      .set_infer(infer_layer)
      .grad(vjp_layer)
      .inputs(3)
      .optional_inputs({"has_b", "has_seq_lens", "has_h0", "has_c0", "has_p"})
      .params<RnnParams>();
  for (OpId op : {OpId::Gru, OpId::Rnn})
    define_op(op)
        .set_infer(infer_layer)
        .grad(vjp_layer)
        .inputs(3)
        .optional_inputs({"has_b", "has_seq_lens", "has_h0"})
        .params<RnnParams>();
  // x, w, r, the optional ones, reserve, dy, dh[, dc]
  define_op(OpId::RnnGrad)
      .set_infer(infer_grad)
      .not_differentiable()
      .inputs(6)
      .optional_inputs({"has_seq_lens", "has_h0", "has_c0", "has_p"})
      .more_inputs(lstm_cell_state_grad)
      .params<RnnParams>();
}

RnnResult lstm(const Tensor& x, const std::vector<RnnLayerWeights>& layers,
               const std::optional<Tensor>& h0, const std::optional<Tensor>& c0,
               const std::optional<Tensor>& seq_lens, const RnnOptions& opts) {
  return stacked(RnnCell::lstm, x, layers, h0, c0, seq_lens, opts);
}
RnnResult gru(const Tensor& x, const std::vector<RnnLayerWeights>& layers,
              const std::optional<Tensor>& h0, const std::optional<Tensor>& seq_lens,
              const RnnOptions& opts) {
  return stacked(RnnCell::gru, x, layers, h0, std::nullopt, seq_lens, opts);
}
RnnResult rnn(const Tensor& x, const std::vector<RnnLayerWeights>& layers,
              const std::optional<Tensor>& h0, const std::optional<Tensor>& seq_lens,
              const RnnOptions& opts) {
  return stacked(RnnCell::rnn, x, layers, h0, std::nullopt, seq_lens, opts);
}

RnnLayerWeights torch_rnn_weights(RnnCell cell, const std::vector<Tensor>& weight_ih,
                                  const std::vector<Tensor>& weight_hh,
                                  const std::vector<Tensor>& bias_ih,
                                  const std::vector<Tensor>& bias_hh) {
  const size_t D = weight_ih.size();
  if (D < 1 || D > 2 || weight_hh.size() != D || bias_ih.size() != bias_hh.size() ||
      (!bias_ih.empty() && bias_ih.size() != D))
    fail<ValueError>(
        "[torch_rnn_weights] needs 1 or 2 directions of weight_ih and weight_hh "
        "(and both biases or none), got {}, {}, {} and {}",
        weight_ih.size(), weight_hh.size(), bias_ih.size(), bias_hh.size());
  std::vector<Tensor> w, r, b;
  for (size_t d = 0; d < D; ++d) {
    w.push_back(reorder_gates(weight_ih[d], cell));
    r.push_back(reorder_gates(weight_hh[d], cell));
    if (!bias_ih.empty())
      b.push_back(concat({reorder_gates(bias_ih[d], cell), reorder_gates(bias_hh[d], cell)}, 0));
  }
  RnnLayerWeights out{stack(w, 0), stack(r, 0), std::nullopt, std::nullopt};
  if (!b.empty()) out.b = stack(b, 0);
  return out;
}

}  // namespace kiln
