// ONNX's transformer ops of opsets 23 and 24: RMSNormalization, RotaryEmbedding, Attention and
// TensorScatter, mapped onto kiln's rms_norm, elementwise rotation, scaled_dot_product_attention
// and a gather, following the operator definitions (onnx/defs/nn/defs.cc and the reference
// implementation) and, where those leave room, ONNX Runtime.
#include <limits>

#include "io/onnx/map_util.h"
#include "kiln/ops/attention.h"
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

// The first `rd` features of each head of x (B, S, H, D) rotated by cos, sin (B, S, 1, rd / 2):
// halves (x1, x2) -> (x1 cos - x2 sin, x1 sin + x2 cos), or with `interleaved` pairs (x[2i],
// x[2i + 1]); the rest of each head passes through.
Tensor rotate(const Tensor& x, const Tensor& cos, const Tensor& sin, int64_t rd, bool interleaved) {
  const int64_t D = x.dim(3), h = rd / 2;
  auto part = [&](int64_t from, int64_t to, int64_t step) {
    return slice(x, {0, 0, 0, from}, {kEnd, kEnd, kEnd, to}, {1, 1, 1, step});
  };
  const Tensor x1 = interleaved ? part(0, rd, 2) : part(0, h, 1);
  const Tensor x2 = interleaved ? part(1, rd, 2) : part(h, rd, 1);
  const Tensor re = x1 * cos - x2 * sin, im = x1 * sin + x2 * cos;
  Tensor rotated = interleaved ? reshape(stack({re, im}, -1), {x.dim(0), -1, x.dim(2), rd})
                               : concat({re, im}, -1);
  return rd == D ? rotated : concat({rotated, part(rd, D, 1)}, -1);
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
    x = reshape(x, {x.dim(0), x.dim(1), heads, -1});  // (B, S, H, D)
  } else {
    x = permute(x, {0, 2, 1, 3});
  }
  const int64_t D = x.dim(3);
  const int64_t rd =
      c.attr_int("rotary_embedding_dim", 0) > 0 ? c.attr_int("rotary_embedding_dim", 0) : D;
  if (rd > D || rd % 2 != 0)
    c.fail(fmt::format("rotary_embedding_dim {} for heads of {} features", rd, D));
  Tensor cos = cos_cache, sin = sin_cache;
  if (c.has_input(3)) {
    const Tensor ids = c.input(3);
    cos = embedding(cos, ids);
    sin = embedding(sin, ids);
  }
  cos = expand_dims(slice(cos, {0, 0, 0}, {kEnd, kEnd, rd / 2}), {2});
  sin = expand_dims(slice(sin, {0, 0, 0}, {kEnd, kEnd, rd / 2}), {2});
  const Tensor y = rotate(x, cos, sin, rd, interleaved);
  return {three_d ? reshape(y, {y.dim(0), y.dim(1), -1}) : permute(y, {0, 2, 1, 3})};
}

// (B, S, heads·d) -> (B, heads, S, d); 4-D inputs as they are.
Tensor heads_first(NodeContext& c, const Tensor& t, const char* attr) {
  if (t.rank() == 4) return t;
  if (t.rank() != 3) c.fail(fmt::format("inputs of rank {} (3 or 4)", t.rank()));
  const int64_t heads = c.attr_int(attr, 0);
  if (heads <= 0) c.fail(fmt::format("3-D inputs need {}", attr));
  return permute(reshape(t, {t.dim(0), t.dim(1), heads, -1}), {0, 2, 1, 3});
}

// Attention (opsets 23, 24): softmax(scale · Q Kᵀ + mask) V over Q (B, Hq, L, E) and
// K, V (B, Hkv, past + S, E) (3-D inputs with q_num_heads / kv_num_heads), past keys and values
// joined in front (present_key, present_value), key heads shared by Hq / Hkv query heads each,
// is_causal aligned at the last key (query i of L sees keys up to past + S - L + i, as ONNX
// Runtime does), a bool mask keeping keys or a float mask added.
Outs attention_op(NodeContext& c) {
  const bool q3 = c.input(0).rank() == 3;
  const Tensor q = heads_first(c, c.input(0), "q_num_heads");
  Tensor k = heads_first(c, c.input(1), "kv_num_heads");
  Tensor v = heads_first(c, c.input(2), "kv_num_heads");
  if (c.attr_float("softcap", 0.0f) != 0.0f) c.unsupported("softcap");
  if (c.has_output(3)) c.unsupported("the qk_matmul_output output");
  if (c.has_input(6)) c.unsupported("nonpad_kv_seqlen");
  if (c.has_input(4) != c.has_input(5)) c.fail("past_key and past_value come together");
  if (c.has_input(4)) {
    k = concat({c.input(4), k}, 2);
    v = concat({c.input(5), v}, 2);
  }
  const int64_t hq = q.dim(1), hkv = k.dim(1);
  if (hq % hkv != 0)
    c.fail(fmt::format("{} query heads are not a multiple of {} key heads", hq, hkv));
  auto repeated = [&](const Tensor& t) {  // each key head for its hq / hkv query heads
    if (hq == hkv) return t;
    const Shape s = t.shape();
    return reshape(broadcast_to(expand_dims(t, {2}), {s[0], hkv, hq / hkv, s[2], s[3]}),
                   {s[0], hq, s[2], s[3]});
  };
  AttentionOptions o;
  if (c.has_attr("scale")) o.scale = c.attr_float("scale", 1.0f);
  std::optional<Tensor> mask;
  if (c.has_input(3)) mask = c.input(3);
  if (c.attr_int("is_causal", 0) != 0) {
    const int64_t lq = q.dim(2), lk = k.dim(2);
    if (lq >= 0 && lq == lk) {
      o.causal = true;  // the kernel's own triangle
    } else {            // keep[i, j] = j <= i + lk - lq, from the shapes of a run
      const Tensor nq = slice(shape_of(q), {2}, {3}), nk = slice(shape_of(k), {2}, {3});
      const Tensor zero = known_ints(c, {0}), one = known_ints(c, {1});
      const Tensor qi = reshape(arange(zero, nq, one, i64), {-1, 1});
      const Tensor kj = reshape(arange(zero, nk, one, i64), {1, -1});
      const Tensor keep = less_equal(kj, qi + (nk - nq));
      if (!mask) mask = keep;
      else if (mask->dtype() == boolean) mask = logical_and(*mask, keep);
      else mask = where(keep, *mask, scalar_of(*mask, -std::numeric_limits<double>::infinity()));
    }
  }
  const Tensor y = scaled_dot_product_attention(q, repeated(k), repeated(v), mask, o);
  Outs r{q3 ? reshape(permute(y, {0, 2, 1, 3}), {y.dim(0), y.dim(2), -1}) : y};
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

}  // namespace

void add_transformer_ops(std::vector<OpEntry>& t) {
  t.insert(t.end(), {
                        {"RMSNormalization", 23, rms_norm_op},
                        {"RotaryEmbedding", 23, rotary_op},
                        {"Attention", 23, attention_op},
                        {"Attention", 24, attention_op},
                        {"TensorScatter", 24, tensor_scatter_op},
                    });
}

}  // namespace kiln::onnx::detail
