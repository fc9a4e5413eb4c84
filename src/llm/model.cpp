// kiln::llm::Model: a Hugging Face checkpoint's weights as variables of one graph, the Llama
// family's and GPT-2's layers built with kiln ops over a KV cache written in place (assign_slice).
#include <fmt/format.h>

#include <limits>
#include <map>

#include "kiln/kiln.h"
#include "kiln/safetensors.h"
#include "llm/model_impl.h"
#include "llm/rope.h"

namespace kiln::llm {

namespace {

// The checkpoint's tensors as variables, each checked against the shape config.json implies.
class Weights {
 public:
  Weights(const safetensors::Checkpoint& ckpt, Model::Impl& m) : ckpt_(ckpt), m_(m) {}

  Tensor get(const std::string& name, const Shape& shape) {
    if (const auto it = made_.find(name); it != made_.end()) return it->second;
    if (!ckpt_.contains(name))
      throw ValueError(
          fmt::format("[llm] {}: the checkpoint has no tensor '{}' (a {} model of {} layers "
                      "needs it)",
                      m_.dir, name, m_.config.model_type, m_.config.num_layers));
    const safetensors::Entry& e = ckpt_.entry(name);
    if (!is_floating(e.dtype))
      throw DTypeError(fmt::format("[llm] {}: tensor '{}' is {}, not a float", m_.dir, name,
                                   kiln::name(e.dtype)));
    if (e.shape != shape)
      throw ShapeError(fmt::format("[llm] {}: tensor '{}' has shape {} but config.json gives {}",
                                   m_.dir, name, to_string(e.shape), to_string(shape)));
    Array a = ckpt_.read(name);
    if (a.dtype() != m_.dtype) a = a.astype(m_.dtype);
    m_.memory.weights += a.nbytes();
    return made_[name] = m_.graph.variable(a, name);
  }
  bool has(const std::string& name) const { return ckpt_.contains(name); }

 private:
  const safetensors::Checkpoint& ckpt_;
  Model::Impl& m_;
  std::map<std::string, Tensor> made_;  // each tensor is one variable, whichever trunk reads it
};

// What every layer's attention shares: positions, the mask, RoPE rows and the cache's start.
struct Context {
  Tensor posid;                       // (B, T) i64: each token's position in its sequence
  Tensor mask;                        // (B, 1, G·T, S) bool: the cache columns each query sees
  std::optional<Tensor> window_mask;  // the same within the sliding window (layers that use it)
  // A prefill (pos 0) attends over its own keys only: (B, 1, 1, T, T), with causal blocks
  // skipped by the kernel.
  Tensor own_mask;
  std::optional<Tensor> own_window_mask;
  Tensor starts;                   // (4,) i64: where this call's keys go in a cache (0, 0, pos, 0)
  std::optional<Tensor> cos, sin;  // (B, T, 1, D/2) RoPE rows (Llama family)
};

Context make_context(Model::Impl& m) {
  Graph& g = m.graph;
  const int64_t S = m.max_length;
  Context c;
  // t = 0 .. T-1 (from the feed's shape); query t sits at cache column pos + t
  const Tensor T = slice(shape_of(m.tokens), {1}, {2});
  const Tensor t = arange(g.constant(Array::from_vector<int64_t>({0}, {1})), T,
                          g.constant(Array::from_vector<int64_t>({1}, {1})), i64);
  const Tensor col = m.pos + t;                                         // (T,)
  const Tensor pad = reshape(m.pad, {m.max_batch, 1});                  // (B, 1)
  c.posid = maximum(reshape(col, {1, -1}) - pad, scalar_like(col, 0));  // (B, T)
  // Key j is seen by the query at column q when pad <= j <= q (and q - j < window). The rows
  // are the G query heads that share a key head, each of the T queries: (B, 1, G·T, S).
  const int64_t G = m.config.num_heads / m.config.num_kv_heads;
  const Tensor j = reshape(arange(g, 0, static_cast<double>(S), 1, i64), {1, 1, 1, S});
  const Tensor q =
      reshape(reshape(col, {1, 1, -1, 1}) + zeros(g, {1, G, 1, 1}, i64), {1, 1, -1, 1});
  c.mask = logical_and(less_equal(j, q), greater_equal(j, reshape(pad, {-1, 1, 1, 1})));
  if (m.config.sliding_window > 0)
    c.window_mask =
        logical_and(c.mask, greater(j, q - static_cast<double>(m.config.sliding_window)));
  const Tensor qt = reshape(col, {1, 1, 1, -1, 1}), kt = reshape(col, {1, 1, 1, 1, -1});
  c.own_mask = logical_and(less_equal(kt, qt), greater_equal(kt, reshape(pad, {-1, 1, 1, 1, 1})));
  if (m.config.sliding_window > 0)
    c.own_window_mask =
        logical_and(c.own_mask, greater(kt, qt - static_cast<double>(m.config.sliding_window)));
  const Tensor zero2 = g.constant(Array::from_vector<int64_t>({0, 0}, {2}));
  c.starts = concat({zero2, m.pos, slice(zero2, {0}, {1})}, 0);
  if (m.config.family == Family::llama) {
    auto [cos, sin] = detail::rope_tables(m.config, S, m.dtype);
    c.cos = expand_dims(embedding(g.constant(cos, "rope_cos"), c.posid), {2});
    c.sin = expand_dims(embedding(g.constant(sin, "rope_sin"), c.posid), {2});
  }
  return c;
}

// x (B, T, heads, D) rotated by RoPE (the halves convention of transformers' rotate_half).
Tensor rope(const Tensor& x, const Context& c, int64_t D) {
  const Tensor x1 = slice(x, {0, 0, 0, 0},
                          {std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::max(),
                           std::numeric_limits<int64_t>::max(), D / 2});
  const Tensor x2 = slice(x, {0, 0, 0, D / 2},
                          {std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::max(),
                           std::numeric_limits<int64_t>::max(), D});
  return concat({x1 * *c.cos - x2 * *c.sin, x2 * *c.cos + x1 * *c.sin}, -1);
}

// Attention of q (B, T, H, D) after writing k, v (B, T, KV, D) into the cache at the call's
// columns; the result is (B, T, H·D). A step attends over the cache; a prefill (`own`, from
// column 0) over its own keys, causally, and its cache writes become updates of the executable.
Tensor attend(Model::Impl& m, int layer, const Context& c, const Tensor& q, const Tensor& k,
              const Tensor& v, double scale, bool own) {
  const Config& cf = m.config;
  const int64_t B = m.max_batch, H = cf.num_heads, KV = cf.num_kv_heads, D = cf.head_dim;
  const int64_t G = H / KV;
  if (m.caches.size() <= static_cast<size_t>(layer)) {
    const Shape shape{B, KV, m.max_length, D};
    auto make = [&](const char* kind) {
      return m.graph.variable(Array::zeros(shape, m.dtype),
                              fmt::format("cache.{}.{}", layer, kind));
    };
    m.caches.push_back({make("k"), make("v")});
    m.memory.cache += 2 * size_of(m.dtype) * static_cast<size_t>(numel(shape));
  }
  const Tensor kt = permute(k, {0, 2, 1, 3}), vt = permute(v, {0, 2, 1, 3});  // (B, KV, T, D)
  const Tensor keys = assign_slice(m.caches[layer].first, kt, c.starts);
  const Tensor values = assign_slice(m.caches[layer].second, vt, c.starts);
  AttentionOptions opts;
  opts.scale = scale;
  const bool windowed = c.window_mask && layer >= cf.first_sliding_layer;
  if (own) {
    m.prefill_updates.push_back(keys);
    m.prefill_updates.push_back(values);
    // (B, KV, G, T, D) queries over (B, KV, 1, T, D) keys
    const Tensor q5 = permute(reshape(q, {B, -1, KV, G, D}), {0, 2, 3, 1, 4});
    opts.causal = true;
    const Tensor o = scaled_dot_product_attention(q5, expand_dims(kt, {2}), expand_dims(vt, {2}),
                                                  windowed ? *c.own_window_mask : c.own_mask, opts);
    return reshape(permute(o, {0, 3, 1, 2, 4}), {B, -1, H * D});
  }
  // The G = H / KV query heads that share a key head are rows of one attention over it:
  // q (B, KV, G·T, D) against the cache (B, KV, S, D) as it is, never repeated per head.
  const Tensor qg =
      reshape(permute(reshape(q, {B, -1, KV, G, D}), {0, 2, 3, 1, 4}), {B, KV, -1, D});
  const Tensor o =
      scaled_dot_product_attention(qg, keys, values, windowed ? *c.window_mask : c.mask, opts);
  return reshape(permute(reshape(o, {B, KV, G, -1, D}), {0, 3, 1, 2, 4}), {B, -1, H * D});
}

std::optional<Tensor> maybe(Weights& w, bool present, const std::string& name, const Shape& s) {
  if (!present) return std::nullopt;
  return w.get(name, s);
}

// The network's last hidden states (B, T, E) and the (V, E) matrix that makes them logits.
struct Trunk {
  Tensor hidden, head;
};

// The Llama family: pre-norm blocks of RoPE attention (grouped keys) and a SwiGLU MLP.
Trunk build_llama(Model::Impl& m, Weights& w, const Context& c, bool own) {
  const Config& cf = m.config;
  const int64_t E = cf.hidden_size, H = cf.num_heads, KV = cf.num_kv_heads, D = cf.head_dim,
                F = cf.intermediate_size, B = m.max_batch;
  const Tensor embed = w.get("model.embed_tokens.weight", {cf.vocab_size, E});
  const bool qkv_bias = cf.attention_bias;
  const bool o_bias = cf.attention_bias && cf.model_type != "qwen2";
  Tensor x = embedding(embed, m.tokens);
  for (int l = 0; l < cf.num_layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    Tensor h = rms_norm(x, w.get(p + "input_layernorm.weight", {E}), -1, cf.norm_eps);
    auto proj = [&](const std::string& name, int64_t rows, bool bias) {
      return linear(h, w.get(p + name + ".weight", {rows, E}),
                    maybe(w, bias, p + name + ".bias", {rows}));
    };
    const Tensor q = rope(reshape(proj("self_attn.q_proj", H * D, qkv_bias), {B, -1, H, D}), c, D);
    const Tensor k =
        rope(reshape(proj("self_attn.k_proj", KV * D, qkv_bias), {B, -1, KV, D}), c, D);
    const Tensor v = reshape(proj("self_attn.v_proj", KV * D, qkv_bias), {B, -1, KV, D});
    const Tensor o = attend(m, l, c, q, k, v, 1.0 / std::sqrt(static_cast<double>(D)), own);
    x = x + linear(o, w.get(p + "self_attn.o_proj.weight", {E, H * D}),
                   maybe(w, o_bias, p + "self_attn.o_proj.bias", {E}));
    h = rms_norm(x, w.get(p + "post_attention_layernorm.weight", {E}), -1, cf.norm_eps);
    const Tensor gate = proj("mlp.gate_proj", F, cf.mlp_bias);
    const Tensor up = proj("mlp.up_proj", F, cf.mlp_bias);
    x = x + linear(silu(gate) * up, w.get(p + "mlp.down_proj.weight", {E, F}),
                   maybe(w, cf.mlp_bias, p + "mlp.down_proj.bias", {E}));
  }
  x = rms_norm(x, w.get("model.norm.weight", {E}), -1, cf.norm_eps);
  return {x, cf.tie_word_embeddings ? embed : w.get("lm_head.weight", {cf.vocab_size, E})};
}

// GPT-2: learned positions, pre-norm blocks (LayerNorm) of attention and a GELU MLP; its
// Conv1D weights are (in, out).
Trunk build_gpt2(Model::Impl& m, Weights& w, const Context& c, bool own) {
  const Config& cf = m.config;
  const int64_t E = cf.hidden_size, H = cf.num_heads, D = cf.head_dim, F = cf.intermediate_size,
                B = m.max_batch;
  const std::string root = w.has("transformer.wte.weight") ? "transformer." : "";
  const Tensor wte = w.get(root + "wte.weight", {cf.vocab_size, E});
  // (positions stay below max_positions: Model::load keeps max_length within it)
  Tensor x = embedding(wte, m.tokens) +
             embedding(w.get(root + "wpe.weight", {cf.max_positions, E}), c.posid);
  auto norm = [&](const Tensor& t, const std::string& name) {
    return layer_norm(t, w.get(name + ".weight", {E}), w.get(name + ".bias", {E}), -1, cf.norm_eps);
  };
  auto conv1d = [&](const Tensor& t, const std::string& name, int64_t in, int64_t out) {
    const Tensor weight = w.get(name + ".weight", {in, out});
    return matmul(t, weight) + w.get(name + ".bias", {out});
  };
  for (int l = 0; l < cf.num_layers; ++l) {
    const std::string p = fmt::format("{}h.{}.", root, l);
    const std::vector<Tensor> qkv =
        split(conv1d(norm(x, p + "ln_1"), p + "attn.c_attn", E, 3 * E), 3, -1);
    double scale = 1.0 / std::sqrt(static_cast<double>(D));
    if (cf.scale_attn_by_layer) scale /= static_cast<double>(l + 1);
    const Tensor o = attend(m, l, c, reshape(qkv[0], {B, -1, H, D}), reshape(qkv[1], {B, -1, H, D}),
                            reshape(qkv[2], {B, -1, H, D}), scale, own);
    x = x + conv1d(o, p + "attn.c_proj", E, E);
    const Tensor h = conv1d(norm(x, p + "ln_2"), p + "mlp.c_fc", E, F);
    x = x +
        conv1d(gelu(h, cf.gelu_tanh ? GeluApprox::tanh : GeluApprox::none), p + "mlp.c_proj", F, E);
  }
  x = norm(x, root + "ln_f");
  return {x, cf.tie_word_embeddings ? wte : w.get("lm_head.weight", {cf.vocab_size, E})};
}

int64_t default_length(const Config& c) { return std::min<int64_t>(c.max_positions, 4096); }

}  // namespace

int64_t detail::bucket_length(int64_t length, int64_t cap) {
  int64_t b = 16;
  while (b < length && b < 64) b *= 2;
  if (b < length) b = (length + 63) / 64 * 64;
  return std::min(b, cap);
}

Model Model::load(const std::string& dir, const LoadOptions& options) {
  auto m = std::make_shared<Impl>();
  m->dir = dir;
  m->config = Config::load(dir);
  const Config& cf = m->config;
  m->device = options.device;
  m->dtype = options.dtype.value_or(cf.dtype);
  if (m->dtype != f32 && m->dtype != f16 && m->dtype != bf16)
    throw DTypeError(fmt::format("[llm] Model::load: dtype {} (f32, f16 or bf16)", name(m->dtype)));
  if (options.max_batch < 1 || options.max_length < 0)
    throw ValueError(
        fmt::format("[llm] Model::load: max_batch {} and max_length {} (at least 1, "
                    "and 0 or more)",
                    options.max_batch, options.max_length));
  m->max_batch = options.max_batch;
  m->max_length = options.max_length > 0 ? options.max_length : default_length(cf);
  if (cf.family == Family::gpt2 && m->max_length > cf.max_positions)
    throw ValueError(
        fmt::format("[llm] Model::load: max_length {} is more than GPT-2's {} positions",
                    m->max_length, cf.max_positions));
  if (cf.family == Family::llama) detail::rope_inv_freq(cf);  // an unsupported scaling fails first
  const safetensors::Checkpoint ckpt = safetensors::Checkpoint::open(dir);
  Weights w(ckpt, *m);
  Graph& g = m->graph;
  m->tokens = g.placeholder({m->max_batch, -1}, i64, "tokens", {{1, "seq", 1, m->max_length}});
  m->pos = g.placeholder({1}, i64, "pos");
  m->pad = g.placeholder({m->max_batch}, i64, "pad");
  const Context c = make_context(*m);
  // two trunks over the same variables: steps attend over the cache, prefills over their own keys
  constexpr int64_t kEnd = std::numeric_limits<int64_t>::max();
  for (const bool own : {false, true}) {
    const Trunk t =
        cf.family == Family::llama ? build_llama(*m, w, c, own) : build_gpt2(*m, w, c, own);
    const Tensor last = slice(t.hidden, {0, -1, 0}, {kEnd, kEnd, kEnd});
    Impl::Heads& h = own ? m->prefill : m->decode;
    h.logits = reshape(cast(linear(last, t.head), f32), {m->max_batch, cf.vocab_size});
    h.argmax = argmax(h.logits, -1);
    if (own) m->all_logits = cast(linear(t.hidden, t.head), f32);
  }
  // compile both now and specialize the step for decoding, so that the first tokens do not wait
  // (what these runs write into the cache, every prefill writes again)
  const Array no_pad = Array::zeros({m->max_batch}, i64);
  if (m->max_length > 1) m->run_step(Array::zeros({m->max_batch, 1}, i64), 1, no_pad, true);
  const int64_t bucket = detail::bucket_length(1, m->max_length);
  m->run_step(Array::zeros({m->max_batch, bucket}, i64), 0, no_pad, true);
  Model model;
  model.impl_ = m;
  return model;
}

Array Model::Impl::run_step(const Array& tok, int64_t at, const Array& pads, bool greedy) {
  std::optional<Executable>& exe = at == 0 ? prefill_exe : step;
  if (!exe)
    exe = at == 0 ? graph.compile(device, {}, {prefill.logits, prefill.argmax}, prefill_updates)
                  : graph.compile(device, {}, {decode.logits, decode.argmax});
  return exe->run({{tokens, tok}, {pos, Array::from_vector<int64_t>({at}, {1})}, {pad, pads}})
      .at(greedy ? 1 : 0)
      .to(Device::cpu());
}

Array Model::logits(const std::vector<int64_t>& tokens) {
  Impl& m = *impl_;
  detail::check_prompts(m, {tokens}, 0);
  if (!m.score) m.score = m.graph.compile(m.device, {}, {m.all_logits}, m.prefill_updates);
  const int64_t L = static_cast<int64_t>(tokens.size()), B = m.max_batch;
  std::vector<int64_t> ids(static_cast<size_t>(B * L), 0), pads(static_cast<size_t>(B), L);
  std::copy(tokens.begin(), tokens.end(), ids.begin());
  pads[0] = 0;
  const Array all = m.score
                        ->run({{m.tokens, Array::from_vector(ids, {B, L})},
                               {m.pos, Array::from_vector<int64_t>({0}, {1})},
                               {m.pad, Array::from_vector(pads, {B})}})[0]
                        .to(Device::cpu());
  return all.first_rows(1).reshape({L, m.config.vocab_size});
}

const Config& Model::config() const { return impl_->config; }
Device Model::device() const { return impl_->device; }
DType Model::dtype() const { return impl_->dtype; }
int64_t Model::max_batch() const { return impl_->max_batch; }
int64_t Model::max_length() const { return impl_->max_length; }
MemoryUse Model::memory() const { return impl_->memory; }

}  // namespace kiln::llm
