// Large language models from Hugging Face checkpoints (issue 35): what kiln reads of a model's
// config.json. The weights come through kiln::safetensors::Checkpoint.
#pragma once

#include <cstdint>
#include <string>

#include "kiln/dtype.h"

namespace kiln::llm {

/// The model families kiln builds: the Llama family (model_type llama, mistral, qwen2: RoPE,
/// grouped-query attention, RMSNorm, SwiGLU) and GPT-2 (learned positions, LayerNorm, GELU).
enum class Family { llama, gpt2 };

/// RoPE's frequency scaling (config.json "rope_scaling"; type "" when there is none).
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
  bool attention_bias = false;  // q, k, v projections with biases (Qwen2; GPT-2's all have them)
  DType dtype = f32;            // torch_dtype: the checkpoint's weights
  int64_t bos_token_id = -1, eos_token_id = -1;

  /// Parses config.json's text; `label` names it in errors. Throws UnsupportedError for a
  /// model_type kiln does not build (naming it and those it does), FormatError for text that is
  /// not a JSON object or a field of the wrong type or out of range (naming the field).
  static Config parse(const std::string& json, const std::string& label = "config.json");
  /// Reads and parses `dir`/config.json (IoError when it cannot be read).
  static Config load(const std::string& dir);
};

}  // namespace kiln::llm
