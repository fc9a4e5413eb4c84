// ONNX's LinearAttention (opset 27): the recurrence of linear attention over the tokens, state
// S (B, H_kv, d_k, d_v) in f32, per token t (the operator's definition and reference):
//   gated rules:  S = exp(g_t) · S            (g_t per key element or per head)
//   delta rules:  v_t = β_t · (v_t − Sᵀ k_t)   (β_t per head or one)
//   all:          S = S + k_t ⊗ v_t;  o_t = scale · q_tᵀ S (query heads h read key head h / G)
// update_rule "linear" (neither), "gated", "delta" or "gated_delta" (both, the default). kiln
// writes the recurrence out token by token, so the sequence length must be known when the model
// is imported (at most kMaxTokens); the batch may vary.
#include <cmath>

#include "io/onnx/map_util.h"
#include "kiln/ops/nn.h"

namespace kiln::onnx::detail {

namespace {

constexpr int64_t kMaxTokens = 256;

// Token t of x (B, T, width) as (B, heads, width / heads).
Tensor token(NodeContext& c, const Tensor& x, int64_t t, int64_t heads) {
  const Tensor row =
      slice(x, {0, t, 0},
            {std::numeric_limits<int64_t>::max(), t + 1, std::numeric_limits<int64_t>::max()});
  return reshape_to(row, known_ints(c, {0, heads, x.dim(2) / heads}), true);
}

Outs linear_attention_op(NodeContext& c) {
  const std::string rule = c.attr_string("update_rule", "gated_delta");
  if (rule != "linear" && rule != "gated" && rule != "delta" && rule != "gated_delta")
    c.fail(fmt::format("update_rule '{}' (linear, gated, delta or gated_delta)", rule));
  const bool gating = rule == "gated" || rule == "gated_delta";
  const bool delta = rule == "delta" || rule == "gated_delta";
  const int64_t hq = c.attr_int("q_num_heads", 0), hkv = c.attr_int("kv_num_heads", 0);
  if (hq <= 0 || hkv <= 0 || hq % hkv != 0)
    c.fail(fmt::format("q_num_heads {} must be a positive multiple of kv_num_heads {}", hq, hkv));
  if (gating != c.has_input(4))
    c.fail(fmt::format("update_rule '{}' {} a decay input", rule, gating ? "needs" : "takes no"));
  if (delta != c.has_input(5))
    c.fail(fmt::format("update_rule '{}' {} a beta input", rule, delta ? "needs" : "takes no"));
  const Tensor q = c.input(0), k = c.input(1), v = c.input(2);
  if (q.rank() != 3 || k.rank() != 3 || v.rank() != 3)
    c.fail("query, key and value are (B, T, heads · d)");
  const int64_t T = q.dim(1);
  if (T < 0 || q.dim(2) < 0 || k.dim(2) < 0 || v.dim(2) < 0)
    c.unsupported(
        "a sequence length or head size known only at run time (kiln writes the "
        "recurrence out token by token when importing)");
  if (T > kMaxTokens)
    c.unsupported(fmt::format("{} tokens (kiln writes the recurrence out token by token, up to {})",
                              T, kMaxTokens));
  if (q.dim(2) % hq != 0 || k.dim(2) % hkv != 0 || v.dim(2) % hkv != 0 || k.dim(1) != T ||
      v.dim(1) != T)
    c.fail(fmt::format("query {}, key {} and value {} for {} and {} heads", str(q.shape()),
                       str(k.shape()), str(v.shape()), hq, hkv));
  const int64_t dk = q.dim(2) / hq, dv = v.dim(2) / hkv, groups = hq / hkv;
  if (k.dim(2) / hkv != dk)
    c.fail(fmt::format("keys of {} elements for queries of {}", k.dim(2) / hkv, dk));
  const DType out_t = q.dtype();
  auto f32_of = [](const Tensor& x) { return x.dtype() == f32 ? x : cast(x, f32); };
  const Tensor qf = f32_of(q), kf = f32_of(k), vf = f32_of(v);
  std::optional<Tensor> decay, beta;
  if (gating) {
    decay = f32_of(c.input(4));
    if (decay->rank() != 3 || decay->dim(1) != T ||
        (decay->dim(2) != hkv && decay->dim(2) != hkv * dk))
      c.fail(
          fmt::format("decay {} ((B, T, {}) or (B, T, {}))", str(decay->shape()), hkv, hkv * dk));
  }
  if (delta) {
    beta = f32_of(c.input(5));
    if (beta->rank() != 3 || beta->dim(1) != T || (beta->dim(2) != hkv && beta->dim(2) != 1))
      c.fail(fmt::format("beta {} ((B, T, {}) or (B, T, 1))", str(beta->shape()), hkv));
  }
  Tensor state;
  DType state_t = out_t;
  if (c.has_input(3)) {
    const Tensor past = c.input(3);
    if (past.rank() != 4 || past.dim(1) != hkv || past.dim(2) != dk || past.dim(3) != dv)
      c.fail(fmt::format("past_state {} (B, {}, {}, {})", str(past.shape()), hkv, dk, dv));
    state_t = past.dtype();
    state = f32_of(past);
  } else {  // zeros (B, H_kv, d_k, d_v), from the batch of a run
    state = full(concat({slice(shape_of(q), {0}, {1}), known_ints(c, {hkv, dk, dv})}, 0), 0.0, f32);
  }
  const double scale = c.attr_float("scale", 0.0f) != 0.0f
                           ? c.attr_float("scale", 0.0f)
                           : 1.0 / std::sqrt(static_cast<double>(dk));
  std::vector<Tensor> outs;
  for (int64_t t = 0; t < T; ++t) {
    if (gating) {  // (B, H_kv, 1 or d_k, 1) against (B, H_kv, d_k, d_v)
      const Tensor g = token(c, *decay, t, hkv);
      state = state * exp(expand_dims(g, {3}));
    }
    const Tensor kt = token(c, kf, t, hkv);  // (B, H_kv, d_k)
    Tensor vt = token(c, vf, t, hkv);        // (B, H_kv, d_v)
    if (delta) {                             // Sᵀ k: (B, H_kv, 1, d_k) · (B, H_kv, d_k, d_v)
      const Tensor retrieved = squeeze(matmul(expand_dims(kt, {2}), state), {2});
      vt = token(c, *beta, t, beta->dim(2)) * (vt - retrieved);
    }
    state = state + expand_dims(kt, {3}) * expand_dims(vt, {2});
    // the G query heads of key head h: (B, H_kv, G, d_k) · (B, H_kv, d_k, d_v)
    const Tensor qt = reshape_to(token(c, qf, t, hq), known_ints(c, {0, hkv, groups, dk}), true);
    outs.push_back(reshape_to(matmul(qt, state) * scale, known_ints(c, {0, 1, hq * dv}), true));
  }
  const Tensor y = T == 1 ? outs[0] : concat(outs, 1);
  return {out_t == f32 ? y : cast(y, out_t), state_t == f32 ? state : cast(state, state_t)};
}

}  // namespace

void add_linear_attention_ops(std::vector<OpEntry>& t) {
  t.push_back({"LinearAttention", 27, linear_attention_op});
}

}  // namespace kiln::onnx::detail
