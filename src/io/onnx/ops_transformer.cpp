// ONNX's transformer ops of opsets 23 to 27: RMSNormalization, RotaryEmbedding, Attention,
// TensorScatter and CausalConvWithState, and ai.onnx.preview's FlexAttention, mapped onto kiln's
// rms_norm, elementwise rotation, scaled_dot_product_attention (or the written-out computation),
// a gather and a depthwise conv1d, following the operator definitions
// (onnx/defs/nn/defs.cc and the reference implementation) and, where those leave room, ONNX
// Runtime.
#include <onnx/onnx_pb.h>

#include <cmath>
#include <limits>

#include "io/onnx/map_util.h"
#include "kiln/ops/attention.h"
#include "kiln/ops/nn.h"
#include "kiln/ops/rearrange.h"

namespace kiln::onnx::detail {

namespace {

constexpr int64_t kEnd = std::numeric_limits<int64_t>::max();

// Y = Cast(X / sqrt(mean(X², axes [axis, rank)) + epsilon), T) · scale, the mean taken in
// stash_type (float32 by default, the only stash type kiln takes).
Outs rms_norm_op(NodeContext& c) {
  const Tensor x = c.input(0), scale = c.input(1);
  const int64_t axis = axis_of(c, c.attr_int("axis", -1), x.rank());
  if (c.attr_int("stash_type", 1) != 1) c.unsupported("stash_type other than 1 (float32)");
  const bool wide = x.dtype() == f16 || x.dtype() == bf16;
  const Tensor normalized =
      rms_norm(wide ? cast(x, f32) : x, std::nullopt, axis, c.attr_float("epsilon", 1e-5f));
  return {mul(wide ? cast(normalized, x.dtype()) : normalized, scale)};
}

// The first `rd` features of each head of x (B, S, H, D) rotated by cos, sin (B, S, 1, rd / 2),
// or of x (B, H, S, D) by cos, sin (B, 1, S, rd / 2):
// halves (x1, x2) -> (x1 cos - x2 sin, x1 sin + x2 cos), or with `interleaved` pairs (x[2i],
// x[2i + 1]); the rest of each head passes through.
Tensor rotate(NodeContext& c, const Tensor& x, const Tensor& cos, const Tensor& sin, int64_t rd,
              bool interleaved) {
  const int64_t D = x.dim(3), h = rd / 2;
  auto part = [&](int64_t from, int64_t to, int64_t step) {
    return slice(x, {0, 0, 0, from}, {kEnd, kEnd, kEnd, to}, {1, 1, 1, step});
  };
  const Tensor x1 = interleaved ? part(0, rd, 2) : part(0, h, 1);
  const Tensor x2 = interleaved ? part(1, rd, 2) : part(h, rd, 1);
  const Tensor re = x1 * cos - x2 * sin, im = x1 * sin + x2 * cos;
  Tensor rotated = interleaved ? reshape_to(stack({re, im}, -1), known_ints(c, {0, 0, 0, rd}), true)
                               : concat({re, im}, -1);
  if (D < 0 && c.attr_int("rotary_embedding_dim", 0) <= 0) return rotated;  // the whole head
  return rd == D ? rotated : concat({rotated, part(rd, kEnd, 1)}, -1);
}

// RotaryEmbedding: X (B, H, S, D), or (B, S, H·D) with num_heads; cos_cache and sin_cache
// (max_position, rd / 2) read at position_ids (B, S), or (B, S, rd / 2) as they are.
Outs rotary_op(NodeContext& c) {
  Tensor x = c.input(0);
  const Tensor cos_cache = c.input(1), sin_cache = c.input(2);
  const bool interleaved = c.attr_int("interleaved", 0) != 0;
  const bool three_d = x.rank() == 3;
  if (x.rank() != 3 && x.rank() != 4) c.fail(fmt::format("input of rank {} (3 or 4)", x.rank()));
  if (three_d) {
    const int64_t heads = c.attr_int("num_heads", 0);
    if (heads <= 0) c.fail("a 3-D input needs num_heads");
    const int64_t width = x.dim(2);
    if (width >= 0 && width % heads != 0)
      c.fail(fmt::format("{} features are not {} heads", width, heads));
    x = reshape_to(x, known_ints(c, {0, 0, heads, width >= 0 ? width / heads : -1}),
                   true);  // (B, S, H, D)
  }
  // the rotated features: rotary_embedding_dim, else the whole head (whose size the caches give
  // where the head's is known only at run time)
  const int64_t D = x.dim(3);
  const int64_t rd = c.attr_int("rotary_embedding_dim", 0) > 0
                         ? c.attr_int("rotary_embedding_dim", 0)
                         : (D >= 0 ? D : 2 * cos_cache.dim(cos_cache.rank() - 1));
  if (rd <= 0 || (D >= 0 && rd > D) || rd % 2 != 0)
    c.fail(fmt::format("rotary_embedding_dim {} for heads of {} features", rd, D));
  Tensor cos = cos_cache, sin = sin_cache;
  if (c.has_input(3)) {
    const Tensor ids = c.input(3);
    cos = embedding(cos, ids);
    sin = embedding(sin, ids);
  }
  // (B, S, 1, rd / 2) against (B, S, H, D); (B, 1, S, rd / 2) against (B, H, S, D)
  const int heads_axis = three_d ? 2 : 1;
  cos = expand_dims(slice(cos, {0, 0, 0}, {kEnd, kEnd, rd / 2}), {heads_axis});
  sin = expand_dims(slice(sin, {0, 0, 0}, {kEnd, kEnd, rd / 2}), {heads_axis});
  const Tensor y = rotate(c, x, cos, sin, rd, interleaved);
  return {three_d ? reshape_to(y, known_ints(c, {0, 0, -1}), true) : y};
}

// (B, S, heads·d) -> (B, heads, S, d); 4-D inputs as they are.
Tensor heads_first(NodeContext& c, const Tensor& t, const char* attr) {
  if (t.rank() == 4) return t;
  if (t.rank() != 3) c.fail(fmt::format("inputs of rank {} (3 or 4)", t.rank()));
  const int64_t heads = c.attr_int(attr, 0);
  if (heads <= 0) c.fail(fmt::format("3-D inputs need {}", attr));
  return permute(reshape_to(t, known_ints(c, {0, 0, heads, -1}), true), {0, 2, 1, 3});
}

// The node's softmax_precision attribute as a float dtype, `otherwise` without it.
DType softmax_precision(NodeContext& c, DType otherwise) {
  if (!c.has_attr("softmax_precision")) return otherwise;
  const auto code = static_cast<int32_t>(c.attr_int("softmax_precision", 1));
  const auto t = from_onnx_dtype(code);
  if (!t || !is_floating(*t))
    c.unsupported(fmt::format("softmax_precision {}", onnx_dtype_name(code)));
  return *t;
}

// K or V (B, Hkv, S, D) with each head repeated for the Hq / Hkv query heads of q (B, Hq, L, E)
// that share it: (B, Hkv, S, D) -> (B, Hkv, Hq / Hkv, S, D) -> (B, Hq, S, D), from the shapes of
// a run. As it is where Hq = Hkv.
Tensor shared_heads(const Tensor& q, const Tensor& t) {
  if (q.dim(1) >= 0 && q.dim(1) == t.dim(1)) return t;
  const Tensor st = shape_of(t), nq = slice(shape_of(q), {1}, {2}), nkv = slice(st, {1}, {2});
  const Tensor grouped = concat({slice(st, {0}, {2}), nq / nkv, slice(st, {2}, {4})}, 0);
  return reshape_to(expand(expand_dims(t, {2}), grouped),
                    concat({slice(st, {0}, {1}), nq, slice(st, {2}, {4})}, 0));
}

// The additive bias of Attention as the ONNX reference builds it when the fused kernel cannot take
// the node: the mask (bool: 0 or -inf; padded with -inf past its last column), the causal
// triangle and the sliding window aligned at `offset` (past keys, or nonpad_kv_seqlen - L per
// batch), and -inf past each batch row's nonpad_kv_seqlen. (L, S), or (B, 1, L, S) per batch.
Tensor attention_bias(NodeContext& c, const Tensor& q, const Tensor& k, const Tensor& offset,
                      bool per_batch, std::optional<Tensor> nonpad) {
  const DType t = q.dtype();
  const double inf = std::numeric_limits<double>::infinity();
  const Tensor nq = slice(shape_of(q), {2}, {3}), nk = slice(shape_of(k), {2}, {3});
  const Tensor qi = reshape(positions(c, nq), {-1, 1});                           // (L, 1)
  const Tensor kj = reshape(positions(c, nk), {1, -1});                           // (1, S)
  const Tensor pos = qi + (per_batch ? reshape(offset, {-1, 1, 1, 1}) : offset);  // query's place
  const Tensor zeros = full(concat({nq, nk}, 0), 0.0, t);                         // (L, S)
  Tensor bias = zeros;
  if (c.has_input(3)) {
    Tensor m = c.input(3);
    if (m.dtype() == boolean) m = where(m, scalar_of(zeros, 0), scalar_of(zeros, -inf));
    const int64_t w = m.dim(m.rank() - 1), s = k.dim(2);
    if (w >= 0 && s >= 0 && w < s) {  // a mask of fewer keys: the rest hidden
      std::vector<int64_t> pads(2 * static_cast<size_t>(m.rank()), 0);
      pads.back() = s - w;
      m = pad(m, pads, PadKind::constant, -inf);
    }
    bias = bias + m;
  }
  auto hide = [&](const Tensor& keep) { bias = where(keep, bias, scalar_of(bias, -inf)); };
  if (c.attr_int("is_causal", 0) != 0) hide(less_equal(kj, pos));
  const int64_t left = c.attr_int("left_window_size", -1);
  const int64_t right = c.attr_int("right_window_size", -1);
  if (left >= 0) hide(less_equal(pos - kj, scalar_like(kj, static_cast<double>(left))));
  if (right >= 0) hide(less_equal(kj - pos, scalar_like(kj, static_cast<double>(right))));
  if (nonpad) hide(less(kj, reshape(*nonpad, {-1, 1, 1, 1})));
  return bias;
}

// Attention written out as the reference computes it (opset 23-25 features the fused kernel lacks:
// softcap, the qk_matmul_output output, nonpad_kv_seqlen, windows, a mask shorter than the keys,
// softmax_precision): scores = scale · Q Kᵀ, softcapped, plus the bias; a softmax whose rows
// that see no key are zeros; Y = P V. Q (B, Hq, L, E), K and V with their heads repeated.
Outs attention_written_out(NodeContext& c, const Tensor& q, const Tensor& k, const Tensor& v,
                           bool past) {
  std::optional<Tensor> nonpad;
  if (c.has_input(6)) {
    if (past) c.fail("nonpad_kv_seqlen cannot come with past_key and past_value");
    nonpad = c.input(6);
  }
  // the causal frontier and the window: past keys, or per batch nonpad_kv_seqlen - L, or none
  const Tensor nq = slice(shape_of(q), {2}, {3});
  const Tensor offset = past     ? slice(shape_of(c.input(4)), {2}, {3})
                        : nonpad ? *nonpad - nq
                                 : known_ints(c, {0});
  const Tensor bias = attention_bias(c, q, k, offset, nonpad.has_value(), nonpad);
  Tensor qk = matmul(q, permute(k, {0, 1, 3, 2}));
  if (c.has_attr("scale")) qk = qk * c.attr_float("scale", 1.0f);
  else if (q.dim(3) >= 0) qk = qk * (1.0 / std::sqrt(static_cast<double>(q.dim(3))));
  else qk = qk * rsqrt(cast(slice(shape_of(q), {3}, {4}), qk.dtype()));  // E known at run time
  const double cap = c.attr_float("softcap", 0.0f);
  if (cap != 0.0) qk = tanh(qk * (1.0 / cap)) * cap;
  const Tensor with_bias = qk + bias;
  const int64_t mode = c.attr_int("qk_matmul_output_mode", 0);
  if (mode < 0 || mode > 3) c.fail(fmt::format("qk_matmul_output_mode {} (0 to 3)", mode));
  const DType precision = softmax_precision(c, q.dtype());
  const Tensor p0 = softmax(cast(with_bias, precision), -1);
  // rows whose bias hides every key: zeros (decided on the bias, not on the scores)
  const Tensor hidden =
      equal(max(bias, {-1}, true), scalar_of(bias, -std::numeric_limits<double>::infinity()));
  const Tensor p = cast(where(hidden, scalar_of(p0, 0), p0), q.dtype());
  Outs r{matmul(p, v), k, v};
  if (c.has_output(3)) {
    // as the reference: 0 the (softcapped) product, 1 softcapped, 2 with the bias, 3 probabilities
    r.push_back(mode == 3 ? p : mode == 2 ? with_bias : qk);
  }
  return r;
}

// Attention (opsets 23 to 25): softmax(scale · Q Kᵀ + mask) V over Q (B, Hq, L, E) and
// K, V (B, Hkv, past + S, E) (3-D inputs with q_num_heads / kv_num_heads), past keys and values
// joined in front (present_key, present_value), key heads shared by Hq / Hkv query heads each,
// is_causal as the ONNX reference aligns it (query i sees keys up to i + past: from the top left
// without past keys, where ONNX Runtime aligns at the last key when L != S), a bool mask keeping
// keys or a float mask added. Nodes the fused kernel cannot take are written out with kiln ops
// (attention_written_out).
Outs attention_op(NodeContext& c) {
  const bool q3 = c.input(0).rank() == 3;
  const Tensor q = heads_first(c, c.input(0), "q_num_heads");
  Tensor k = heads_first(c, c.input(1), "kv_num_heads");
  Tensor v = heads_first(c, c.input(2), "kv_num_heads");
  if (c.has_input(4) != c.has_input(5)) c.fail("past_key and past_value come together");
  const bool past = c.has_input(4);
  if (past) {
    k = concat({c.input(4), k}, 2);
    v = concat({c.input(5), v}, 2);
  }
  const int64_t hq = q.dim(1), hkv = k.dim(1);
  if (hq % hkv != 0)
    c.fail(fmt::format("{} query heads are not a multiple of {} key heads", hq, hkv));
  auto repeated = [&](const Tensor& t) { return shared_heads(q, t); };
  auto heads_last = [&](const Tensor& y) {
    return q3 ? reshape_to(permute(y, {0, 2, 1, 3}), known_ints(c, {0, 0, -1}), true) : y;
  };
  const std::optional<Tensor> mask =
      c.has_input(3) ? std::optional<Tensor>(c.input(3)) : std::nullopt;
  const bool short_mask = mask && mask->dim(mask->rank() - 1) != k.dim(2);
  if (c.attr_float("softcap", 0.0f) != 0.0f || c.has_output(3) || c.has_input(6) ||
      c.attr_int("left_window_size", -1) >= 0 || c.attr_int("right_window_size", -1) >= 0 ||
      c.has_attr("softmax_precision") || short_mask) {
    Outs r = attention_written_out(c, q, repeated(k), repeated(v), past);
    r[0] = heads_last(r[0]);
    r[1] = k;
    r[2] = v;
    return r;
  }
  AttentionOptions o;
  if (c.has_attr("scale")) o.scale = c.attr_float("scale", 1.0f);
  std::optional<Tensor> m = mask;
  if (c.attr_int("is_causal", 0) != 0) {
    if (!past) {
      o.causal = true;  // the kernel's own triangle (j <= i)
    } else {            // keep[i, j] = j <= i + past, from the shapes of a run
      const Tensor qi = reshape(positions(c, slice(shape_of(q), {2}, {3})), {-1, 1});
      const Tensor kj = reshape(positions(c, slice(shape_of(k), {2}, {3})), {1, -1});
      const Tensor keep = less_equal(kj, qi + slice(shape_of(c.input(4)), {2}, {3}));
      if (!m) m = keep;
      else if (m->dtype() == boolean) m = logical_and(*m, keep);
      else m = where(keep, *m, scalar_of(*m, -std::numeric_limits<double>::infinity()));
    }
  }
  const Tensor y = scaled_dot_product_attention(q, repeated(k), repeated(v), m, o);
  Outs r{heads_last(y)};
  if (c.has_output(1)) r.push_back(k);
  if (c.has_output(2)) r.push_back(v);
  return r;
}

// TensorScatter (opset 24): past_cache with each batch row's update written along `axis` from
// write_indices[b] (0 without them), wrapping around the axis in mode "circular". kiln writes a
// new tensor: each position takes the update's entry it receives, or keeps the past's.
Outs tensor_scatter_op(NodeContext& c) {
  const Tensor past = c.input(0), update = c.input(1);
  const int r = past.rank();
  const int64_t axis = axis_of(c, c.attr_int("axis", -2), r);
  const std::string mode = c.attr_string("mode", "linear");
  if (mode != "linear" && mode != "circular")
    c.fail(fmt::format("mode '{}' (linear or circular)", mode));
  if (axis == 0) c.fail("axis 0 is the batch");
  if (update.rank() != r) c.fail("past_cache and update differ in rank");
  const int64_t L = past.dim(static_cast<int>(axis)), S = update.dim(static_cast<int>(axis));
  const int64_t B = past.dim(0);
  if (L < 0 || S < 0 || B < 0)
    c.unsupported("a dynamic batch or sequence axis (kiln needs them when importing)");
  if (S > L) c.fail(fmt::format("an update of {} along the axis into a cache of {}", S, L));
  Shape along(static_cast<size_t>(r), 1), per_row(static_cast<size_t>(r), 1);
  along[axis] = L;
  per_row[0] = B;
  const Tensor w = c.has_input(2) ? cast(c.input(2), i64) : zeros(c.graph(), {B}, i64);
  Tensor rel = reshape(arange(c.graph(), 0, static_cast<double>(L), 1, i64), along) -
               reshape(w, per_row);  // (B, 1.., L, 1..): where in the update position p reads
  if (mode == "circular") rel = mod(rel, scalar_of(rel, L));  // (the divisor's sign: 0 .. L-1)
  const Tensor inside =
      logical_and(greater_equal(rel, scalar_of(rel, 0)), less(rel, scalar_of(rel, S)));
  if (S == 0) return {past};
  const Tensor idx = minimum(maximum(rel, scalar_of(rel, 0)), scalar_of(rel, S - 1));
  const Tensor taken = gather_elements(update, broadcast_to(idx, past.shape()), axis);
  return {where(inside, taken, past)};
}

// CausalConvWithState (opset 27): a causal depthwise conv1d of input (B, C, L) by weight (C, 1,
// k) (+ bias (C)) over the input with the past state (B, C, k - 1) in front (zeros without one),
// then SiLU where activation is "silu" or "swish"; present_state is the last k - 1 positions of
// that padded input (empty for k = 1). As the reference, the activation of f16/bf16 runs in f32.
Outs causal_conv_with_state_op(NodeContext& c) {
  const Tensor x = c.input(0), w = c.input(1);
  const std::string act = c.attr_string("activation", "none");
  if (act != "none" && act != "silu" && act != "swish")
    c.fail(fmt::format("activation '{}' (none, silu or swish)", act));
  if (x.rank() != 3 || w.rank() != 3)
    c.fail(fmt::format("input of rank {} and weight of rank {} (3 and 3)", x.rank(), w.rank()));
  const int64_t k = w.dim(2), channels = w.dim(0);
  if (k < 1 || channels < 1)
    c.unsupported("a weight whose channels or width are known only at run time");
  if (w.dim(1) != 1 || (x.dim(1) >= 0 && x.dim(1) != channels))
    c.fail(fmt::format("weight {} for {} input channels (depthwise: (C, 1, k))", str(w.shape()),
                       x.dim(1)));
  Tensor past;
  if (c.has_input(3)) {
    past = c.input(3);
    if (past.rank() != 3 || (past.dim(2) >= 0 && past.dim(2) != k - 1))
      c.fail(fmt::format("past_state {} for a kernel of width {} (B, C, {})", str(past.shape()), k,
                         k - 1));
  } else {  // zeros (B, C, k - 1), from the shapes of a run
    past = full(concat({slice(shape_of(x), {0}, {2}), known_ints(c, {k - 1})}, 0), 0.0, x.dtype());
  }
  const Tensor padded = concat({past, x}, 2);
  ConvOptions o;
  o.groups = channels;
  const std::optional<Tensor> bias =
      c.has_input(2) ? std::optional<Tensor>(c.input(2)) : std::nullopt;
  Tensor y = conv1d(padded, w, bias, o);
  if (act != "none") {
    const bool half = y.dtype() == f16 || y.dtype() == bf16;
    y = half ? cast(silu(cast(y, f32)), y.dtype()) : silu(y);
  }
  // the last k - 1 positions (none for k = 1: a start past the end)
  const Tensor present = slice(padded, {0, 0, k == 1 ? kEnd : -(k - 1)}, {kEnd, kEnd, kEnd});
  return {y, present};
}

// A FlexAttention modifier (score_mod, prob_mod): its subgraph over the (B, Hq, L, S) tensor x,
// which must give one tensor of x's shape and type.
Tensor modified(NodeContext& c, const char* attr, const Tensor& x) {
  const ::onnx::GraphProto& g = c.attr_graph(attr);
  if (g.input_size() != 1 || g.output_size() != 1)
    c.fail(fmt::format("{} has {} inputs and {} outputs (1 and 1)", attr, g.input_size(),
                       g.output_size()));
  const std::vector<Tensor> out = c.importer().inline_body(g, {x});
  const Tensor& y = out.at(0);
  if (y.dtype() != x.dtype() || y.rank() != 4)
    c.fail(fmt::format("{} gives {} {} for {} {} (the same shape and type)", attr, name(y.dtype()),
                       str(y.shape()), name(x.dtype()), str(x.shape())));
  return y;
}

// FlexAttention (ai.onnx.preview 1): Y = prob_mod(softmax(score_mod(scale · Q Kᵀ))) V over Q
// (B, Hq, L, E) and K, V (B, Hkv, S, E | Ev), each key head shared by Hq / Hkv query heads. As the
// reference: Q and K each scaled by sqrt(scale) in their type, the scores then cast to
// softmax_precision (f32 for f16/bf16/f32 inputs, f64 for f64), where the modifiers, the softmax
// and P V run, and Y cast back. Without modifiers, at the inputs' own precision or f32 for
// f16/bf16, it is kiln's fused attention (whose softmax runs in f32).
Outs flex_attention_op(NodeContext& c) {
  const Tensor q = c.input(0), k = c.input(1), v = c.input(2);
  if (q.rank() != 4 || k.rank() != 4 || v.rank() != 4)
    c.fail(fmt::format("Q, K and V of ranks {}, {} and {} (4 each)", q.rank(), k.rank(), v.rank()));
  const int64_t hq = q.dim(1), hkv = k.dim(1);
  if (hq >= 0 && hkv > 0 && hq % hkv != 0)
    c.fail(fmt::format("{} query heads are not a multiple of {} key heads", hq, hkv));
  if (hkv >= 0 && v.dim(1) >= 0 && hkv != v.dim(1))
    c.fail(fmt::format("K has {} heads and V {}", hkv, v.dim(1)));
  const DType t = q.dtype();
  const DType precision = softmax_precision(c, t == f64 ? f64 : f32);
  const bool score_mod = c.has_attr("score_mod"), prob_mod = c.has_attr("prob_mod");
  const int64_t E = q.dim(3);
  if (!c.has_attr("scale") && E < 0)
    c.unsupported("a head size known only at run time without the scale attribute");
  const double scale =
      c.has_attr("scale") ? c.attr_float("scale", 1.0f) : 1.0 / std::sqrt(static_cast<double>(E));
  const Tensor kr = shared_heads(q, k), vr = shared_heads(q, v);
  if (!score_mod && !prob_mod && t != f64 && precision == f32) {
    AttentionOptions o;
    o.scale = scale;
    return {scaled_dot_product_attention(q, kr, vr, std::nullopt, o)};
  }
  const double root = std::sqrt(static_cast<float>(scale));
  Tensor scores = cast(matmul(q * root, permute(kr * root, {0, 1, 3, 2})), precision);
  if (score_mod) scores = modified(c, "score_mod", scores);
  Tensor p = softmax(scores, -1);
  if (prob_mod) p = modified(c, "prob_mod", p);
  return {cast(matmul(p, cast(vr, precision)), v.dtype())};
}

}  // namespace

void add_transformer_ops(std::vector<OpEntry>& t) {
  t.insert(t.end(), {
                        {"RMSNormalization", 23, rms_norm_op},
                        {"RotaryEmbedding", 23, rotary_op},
                        {"Attention", 23, attention_op},
                        {"Attention", 24, attention_op},
                        {"Attention", 25, attention_op},
                        {"TensorScatter", 24, tensor_scatter_op},
                        {"CausalConvWithState", 27, causal_conv_with_state_op},
                        {"ai.onnx.preview.FlexAttention", 1, flex_attention_op},
                    });
}

}  // namespace kiln::onnx::detail
