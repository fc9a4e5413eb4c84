// Large language models from Hugging Face checkpoints: a model's config.json (Config), the model
// built from its weights with a KV cache (Model), and text generation (Model::generate). The
// weights come through kiln::safetensors::Checkpoint.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/array.h"
#include "kiln/device.h"
#include "kiln/dtype.h"

namespace kiln::llm {

/// The model families kiln builds: the Llama family (model_type llama, mistral, qwen2: RoPE,
/// grouped-query attention, RMSNorm, SwiGLU) and GPT-2 (learned positions, LayerNorm, GELU).
enum class Family { llama, gpt2 };

/// RoPE's frequency scaling (config.json "rope_scaling", or "rope_parameters" as transformers 5
/// writes it; type "" when there is none).
struct RopeScaling {
  std::string type;  // "", "linear", "dynamic", "llama3" or "yarn"
  double factor = 1;
  double low_freq_factor = 1, high_freq_factor = 4;  // llama3
  int64_t original_max_positions = 0;                // llama3, yarn
};

/// A model's shape and numerics as config.json gives them (GPT-2's n_embd, n_layer, ... are read
/// under these names).
struct Config {
  std::string model_type;
  Family family = Family::llama;
  int64_t vocab_size = 0, hidden_size = 0, intermediate_size = 0, num_layers = 0;
  int64_t num_heads = 0, num_kv_heads = 0, head_dim = 0, max_positions = 0;
  double norm_eps = 1e-5;
  double rope_theta = 10000;  // (Llama family)
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  /// Biases of the attention projections: q, k, v and o (Llama's attention_bias), q, k and v
  /// (Qwen2, always), all (GPT-2).
  bool attention_bias = false;
  bool mlp_bias = false;            // gate, up and down projections with biases (Llama's mlp_bias)
  int64_t sliding_window = 0;       // keys at most this far behind a query (Mistral); 0: all
  int64_t first_sliding_layer = 0;  // the window's first layer (Qwen2's max_window_layers)
  /// GPT-2: its activation is GELU with the tanh approximation ("gelu_new"), or exact ("gelu").
  bool gelu_tanh = true;
  /// GPT-2: attention scores also divided by the layer's number (scale_attn_by_inverse_layer_idx).
  bool scale_attn_by_layer = false;
  DType dtype = f32;  // torch_dtype (or dtype): the checkpoint's weights
  int64_t bos_token_id = -1, eos_token_id = -1;
  /// Every end-of-sequence id: config.json's eos_token_id (an id or a list), with those of
  /// generation_config.json when Config::load finds one.
  std::vector<int64_t> eos_token_ids;

  /// Parses config.json's text; `label` names it in errors. Throws UnsupportedError for a
  /// model_type kiln does not build (naming it and those it does), FormatError for text that is
  /// not a JSON object or a field of the wrong type or out of range (naming the field).
  static Config parse(const std::string& json, const std::string& label = "config.json");
  /// Reads and parses `dir`/config.json (IoError when it cannot be read), and adds the
  /// eos_token_id of `dir`/generation_config.json when there is one.
  static Config load(const std::string& dir);
};

/// How a model is placed and how much it can hold (Model::load).
struct LoadOptions {
  Device device = Device::cpu();
  /// The dtype of the weights, the cache and the products; f32, f16 or bf16. `undefined`: the
  /// checkpoint's (Config::dtype) when unset. Logits are f32 whatever it is.
  std::optional<DType> dtype;
  /// Sequences decoded together: generate takes prompts in groups of this many.
  int64_t max_batch = 1;
  /// Positions the KV cache holds per sequence: a prompt (left-padded to its bucket) and its new
  /// tokens must fit. 0: the model's max_position_embeddings, at most 4096.
  int64_t max_length = 0;
};

/// How the next token is picked from the logits (Hugging Face's order: repetition penalty,
/// temperature, top-k, top-p, then a draw).
struct Sampling {
  /// The most likely token (the lowest id among equals); the fields below but the repetition
  /// penalty are then unused.
  bool greedy = true;
  double temperature = 1.0;  // > 0: logits are divided by it
  int64_t top_k = 0;         // keep the k most likely tokens; 0: all
  double top_p = 1.0;        // keep the fewest most likely tokens whose probability reaches p
  /// > 0: the logit l of a token the sequence holds (prompt included) becomes l / penalty when
  /// l > 0 and l · penalty otherwise (1: off).
  double repetition_penalty = 1.0;
  /// Draws come from Philox4x32-10 keyed by the seed: a seeded run is reproducible on every
  /// device.
  uint64_t seed = 0;
};

/// Picks one token per row of `logits` (R, V) f32 for the rows' histories (`history[r]`: the
/// tokens of row r so far, for the repetition penalty; may be empty); `step` selects the random
/// draws (row r of step s reads Philox block s · R + r). Throws ValueError for bad settings.
std::vector<int64_t> sample(const Array& logits, const std::vector<std::vector<int64_t>>& history,
                            const Sampling& sampling, uint64_t step);

struct GenerateOptions {
  /// New tokens per sequence at most (the stop token counts as one).
  int64_t max_new_tokens = 128;
  Sampling sampling;
  /// A sequence ends after any of these; empty: Config::eos_token_ids. {-1}: never.
  std::vector<int64_t> stop_tokens;
  /// Called with (sequence index, token) for every new token as it is picked; return false to end
  /// that sequence there.
  std::function<bool(int64_t, int64_t)> on_token;
};

/// What a generate call did, with the time it took.
struct Generation {
  std::vector<std::vector<int64_t>> tokens;  // the new tokens of each prompt
  int64_t prompt_tokens = 0, new_tokens = 0;
  double prefill_seconds = 0, decode_seconds = 0;  // decode: every step after the first token
};

/// Bytes a loaded model holds on its device.
struct MemoryUse {
  size_t weights = 0, cache = 0;
};

/// A decoder-only transformer built with kiln ops from a Hugging Face checkpoint directory
/// (config.json and model.safetensors or its shards), with a KV cache of max_batch sequences in
/// device memory, written in place each step. A call runs one executable: prompts are
/// left-padded to a bucket of lengths (16, 32, 64, then multiples of 64) so that a few
/// specializations serve every prompt, and every decode step of a batch is the same shape (a
/// CUDA graph replay on a GPU).
class Model {
 public:
  /// Loads `dir`. Throws the errors of Config::load and safetensors::Checkpoint::open,
  /// UnsupportedError for a RoPE scaling kiln does not build yet (dynamic, yarn), ValueError
  /// naming a tensor the checkpoint lacks, ShapeError naming one whose shape contradicts
  /// config.json, DTypeError for one that is not a float.
  static Model load(const std::string& dir, const LoadOptions& options = {});

  const Config& config() const;
  Device device() const;
  DType dtype() const;
  int64_t max_batch() const;
  int64_t max_length() const;
  MemoryUse memory() const;

  /// The logits (L, V) f32 after every position of `tokens` (one sequence, from position 0).
  Array logits(const std::vector<int64_t>& tokens);
  /// Continues each prompt (token ids in [0, vocab_size)). Throws ValueError for an empty prompt,
  /// a token out of range, or a prompt whose bucket plus max_new_tokens exceeds max_length.
  Generation generate(const std::vector<std::vector<int64_t>>& prompts,
                      const GenerateOptions& options = {});

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace kiln::llm
