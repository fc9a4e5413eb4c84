// config.json of the model families kiln builds: the fields of real configs (TinyLlama, Llama 3,
// Mistral, Qwen2, GPT-2, written here as their files have them), defaults, and every refusal.
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "kiln/llm.h"
#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;
using llm::Config;

TEST(LlmConfig, ReadsTheLlamaFamily) {
  const Config tiny = Config::parse(R"({
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
    "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 22,
    "num_attention_heads": 32, "num_key_value_heads": 4, "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "rope_scaling": null,
    "tie_word_embeddings": false, "torch_dtype": "bfloat16", "vocab_size": 32000,
    "bos_token_id": 1, "eos_token_id": 2})");
  EXPECT_EQ(tiny.family, llm::Family::llama);
  EXPECT_EQ(tiny.head_dim, 64);
  EXPECT_EQ(tiny.num_kv_heads, 4);
  EXPECT_EQ(tiny.dtype, bf16);
  EXPECT_EQ(tiny.rope_scaling.type, "");
  EXPECT_DOUBLE_EQ(tiny.norm_eps, 1e-5);
  EXPECT_EQ(tiny.eos_token_id, 2);
  const Config l3 = Config::parse(R"({"model_type": "llama", "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "max_position_embeddings": 131072, "rope_theta": 500000.0,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "vocab_size": 128256, "eos_token_id": [128001, 128008, 128009], "torch_dtype": "bfloat16"})");
  EXPECT_EQ(l3.rope_scaling.type, "llama3");
  EXPECT_DOUBLE_EQ(l3.rope_scaling.factor, 8);
  EXPECT_EQ(l3.rope_scaling.original_max_positions, 8192);
  EXPECT_EQ(l3.eos_token_id, 128001);
  EXPECT_DOUBLE_EQ(l3.rope_theta, 500000);
  const Config qwen = Config::parse(R"({"model_type": "qwen2", "hidden_size": 896,
    "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
    "num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": true,
    "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768})");
  EXPECT_TRUE(qwen.tie_word_embeddings);
  EXPECT_TRUE(qwen.attention_bias);  // Qwen2's q, k, v projections have biases
  EXPECT_EQ(qwen.head_dim, 64);
  EXPECT_EQ(qwen.dtype, f32);  // no torch_dtype: float32
  const Config mistral = Config::parse(R"({"model_type": "mistral", "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 32768})");
  EXPECT_EQ(mistral.head_dim, 128);
  EXPECT_FALSE(mistral.attention_bias);
}

TEST(LlmConfig, ReadsGpt2AndLoadsFromADirectory) {
  const std::string dir = ::testing::TempDir() + "kiln_cfg_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << R"({"model_type": "gpt2", "n_embd": 768, "n_layer": 12,
    "n_head": 12, "n_positions": 1024, "n_inner": null, "layer_norm_epsilon": 1e-05,
    "vocab_size": 50257, "activation_function": "gelu_new", "bos_token_id": 50256})";
  const Config g = Config::load(dir);
  std::filesystem::remove_all(dir);
  EXPECT_EQ(g.family, llm::Family::gpt2);
  EXPECT_EQ(g.intermediate_size, 4 * 768);
  EXPECT_EQ(g.head_dim, 64);
  EXPECT_TRUE(g.tie_word_embeddings);
  EXPECT_EQ(g.max_positions, 1024);
  expect_error<IoError>([] { Config::load("/nonexistent"); }, {"[llm] cannot read", "config.json"});
}

TEST(LlmConfig, RefusesWhatItCannotBuild) {
  const std::string base = R"("hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "vocab_size": 100)";
  auto cfg = [&](const std::string& more) { return "{" + base + more + "}"; };
  expect_error<UnsupportedError>(
      [&] { Config::parse(cfg(R"(, "model_type": "mamba")")); },
      {"[llm] config.json", "model_type 'mamba'", "llama, mistral, qwen2, gpt2"});
  expect_error<FormatError>([&] { Config::parse(cfg("")); }, {"'model_type' is missing"});
  expect_error<FormatError>([] { Config::parse("[1]"); }, {"not a JSON object"});
  expect_error<FormatError>(
      [&] { Config::parse(cfg(R"(, "model_type": "llama", "num_key_value_heads": 3)")); },
      {"num_attention_heads 4 is not a multiple of num_key_value_heads 3"});
  expect_error<FormatError>(
      [&] {
        Config::parse(R"({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "vocab_size": 100})");
      },
      {"'intermediate_size' is missing"});
  expect_error<FormatError>(
      [&] { Config::parse(cfg(R"(, "model_type": "llama", "num_hidden_layers": -2)")); },
      {"'num_hidden_layers' is -2, not a positive integer"});
  expect_error<FormatError>(
      [&] { Config::parse(cfg(R"(, "model_type": "llama", "torch_dtype": "float8_e4m3fn")")); },
      {"'torch_dtype' is 'float8_e4m3fn'"});
  expect_error<UnsupportedError>(
      [&] {
        Config::parse(
            cfg(R"(, "model_type": "llama", "rope_scaling": {"type": "su", "factor": 2})"));
      },
      {"rope_scaling type 'su'"});
  expect_error<UnsupportedError>(
      [&] { Config::parse(cfg(R"(, "model_type": "llama", "hidden_act": "gelu")")); },
      {"hidden_act \"gelu\""});
}

}  // namespace
}  // namespace kiln
