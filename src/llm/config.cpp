// config.json of Hugging Face models (include/kiln/llm.h): the Llama family and GPT-2. The llm
// layer uses only kiln's public API.
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "kiln/error.h"
#include "kiln/llm.h"

namespace kiln::llm {

namespace {
using nlohmann::json;

template <typename E, typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw E(fmt::format(f, std::forward<Args>(args)...));
}

struct Reader {
  const json& j;
  const std::string& label;

  template <typename... Args>
  [[noreturn]] void bad(fmt::format_string<Args...> f, Args&&... args) const {
    fail<FormatError>("[llm] {}: {}", label, fmt::format(f, std::forward<Args>(args)...));
  }
  // A positive integer field (`fallback` when absent and given; required otherwise).
  int64_t positive(const char* key, int64_t fallback = -1) const {
    const auto it = j.find(key);
    if (it == j.end() || it->is_null()) {
      if (fallback > 0) return fallback;
      bad("'{}' is missing", key);
    }
    if (!it->is_number_integer() || it->get<int64_t>() <= 0 ||
        it->get<int64_t>() > (int64_t{1} << 40))
      bad("'{}' is {}, not a positive integer", key, it->dump());
    return it->get<int64_t>();
  }
  double number(const char* key, double fallback) const {
    const auto it = j.find(key);
    if (it == j.end() || it->is_null()) return fallback;
    if (!it->is_number() || !(it->get<double>() > 0))
      bad("'{}' is {}, not a positive number", key, it->dump());
    return it->get<double>();
  }
  bool flag(const char* key, bool fallback) const {
    const auto it = j.find(key);
    if (it == j.end() || it->is_null()) return fallback;
    if (!it->is_boolean()) bad("'{}' is {}, not true or false", key, it->dump());
    return it->get<bool>();
  }
  // A token id: an integer, or the first of a list (Llama 3 lists several eos ids); -1 if absent.
  int64_t token(const char* key) const {
    const auto it = j.find(key);
    if (it == j.end() || it->is_null()) return -1;
    const json& v = it->is_array() && !it->empty() ? (*it)[0] : *it;
    if (!v.is_number_integer() || v.get<int64_t>() < 0)
      bad("'{}' is {}, not a token id", key, it->dump());
    return v.get<int64_t>();
  }
};

DType torch_dtype(const Reader& r) {
  const auto it = r.j.find("torch_dtype");
  if (it == r.j.end() || it->is_null()) return f32;
  if (!it->is_string()) r.bad("'torch_dtype' is {}, not a string", it->dump());
  const std::string s = it->get<std::string>();
  if (s == "float32") return f32;
  if (s == "float16") return f16;
  if (s == "bfloat16") return bf16;
  r.bad("'torch_dtype' is '{}' (kiln loads float32, float16 and bfloat16 checkpoints)", s);
}

RopeScaling read_rope_scaling(const Reader& r) {
  RopeScaling rs;
  const auto it = r.j.find("rope_scaling");
  if (it == r.j.end() || it->is_null()) return rs;
  if (!it->is_object()) r.bad("'rope_scaling' is {}, not an object", it->dump());
  const Reader s{*it, r.label};
  const auto type = it->contains("rope_type") ? it->at("rope_type") : it->value("type", json());
  if (!type.is_string()) r.bad("'rope_scaling' has no type");
  rs.type = type.get<std::string>();
  if (rs.type == "default") {
    rs.type.clear();
    return rs;
  }
  if (rs.type != "linear" && rs.type != "dynamic" && rs.type != "llama3" && rs.type != "yarn")
    fail<UnsupportedError>(
        "[llm] {}: rope_scaling type '{}' (kiln takes linear, dynamic, llama3 "
        "and yarn)",
        r.label, rs.type);
  rs.factor = s.number("factor", 1);
  rs.low_freq_factor = s.number("low_freq_factor", 1);
  rs.high_freq_factor = s.number("high_freq_factor", 4);
  const auto orig = it->find("original_max_position_embeddings");
  if (orig != it->end() && !orig->is_null())
    rs.original_max_positions = s.positive("original_max_position_embeddings");
  return rs;
}
}  // namespace

Config Config::parse(const std::string& text, const std::string& label) {
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) fail<FormatError>("[llm] {}: not a JSON object", label);
  const Reader r{j, label};
  Config c;
  const auto mt = j.find("model_type");
  if (mt == j.end() || !mt->is_string()) r.bad("'model_type' is missing");
  c.model_type = mt->get<std::string>();
  c.dtype = torch_dtype(r);
  c.bos_token_id = r.token("bos_token_id");
  c.eos_token_id = r.token("eos_token_id");
  if (c.model_type == "llama" || c.model_type == "mistral" || c.model_type == "qwen2") {
    c.family = Family::llama;
    c.vocab_size = r.positive("vocab_size");
    c.hidden_size = r.positive("hidden_size");
    c.intermediate_size = r.positive("intermediate_size");
    c.num_layers = r.positive("num_hidden_layers");
    c.num_heads = r.positive("num_attention_heads");
    c.num_kv_heads = r.positive("num_key_value_heads", c.num_heads);
    c.max_positions = r.positive("max_position_embeddings", 2048);
    if (c.hidden_size % c.num_heads != 0 && !j.contains("head_dim"))
      r.bad("hidden_size {} is not a multiple of num_attention_heads {}", c.hidden_size,
            c.num_heads);
    c.head_dim = r.positive("head_dim", c.hidden_size / c.num_heads);
    c.norm_eps = r.number("rms_norm_eps", 1e-6);
    c.rope_theta = r.number("rope_theta", 10000);
    c.rope_scaling = read_rope_scaling(r);
    c.tie_word_embeddings = r.flag("tie_word_embeddings", false);
    c.attention_bias = r.flag("attention_bias", c.model_type == "qwen2");
    if (j.contains("hidden_act") && j["hidden_act"] != "silu")
      fail<UnsupportedError>("[llm] {}: hidden_act {} (the Llama family's MLP is SwiGLU: silu)",
                             label, j["hidden_act"].dump());
  } else if (c.model_type == "gpt2") {
    c.family = Family::gpt2;
    c.vocab_size = r.positive("vocab_size");
    c.hidden_size = r.positive("n_embd");
    c.num_layers = r.positive("n_layer");
    c.num_heads = r.positive("n_head");
    c.num_kv_heads = c.num_heads;
    c.max_positions = r.positive("n_positions", 1024);
    c.intermediate_size = r.positive("n_inner", 4 * c.hidden_size);
    if (c.hidden_size % c.num_heads != 0)
      r.bad("n_embd {} is not a multiple of n_head {}", c.hidden_size, c.num_heads);
    c.head_dim = c.hidden_size / c.num_heads;
    c.norm_eps = r.number("layer_norm_epsilon", 1e-5);
    c.tie_word_embeddings = r.flag("tie_word_embeddings", true);
    c.attention_bias = true;
  } else {
    fail<UnsupportedError>(
        "[llm] {}: model_type '{}' is not one kiln builds (llama, mistral, "
        "qwen2, gpt2)",
        label, c.model_type);
  }
  if (c.num_heads % c.num_kv_heads != 0)
    r.bad("num_attention_heads {} is not a multiple of num_key_value_heads {}", c.num_heads,
          c.num_kv_heads);
  return c;
}

Config Config::load(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "config.json").string();
  // (a regular file of sane size: never a FIFO or a device, which a read would wait on)
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    fail<IoError>("[llm] cannot read {}: not a regular file", path);
  if (std::filesystem::file_size(path, ec) > (uintmax_t{16} << 20))
    fail<FormatError>("[llm] {}: more than 16 MiB", path);
  std::ifstream in(path, std::ios::binary);
  if (!in) fail<IoError>("[llm] cannot read {}", path);
  std::stringstream text;
  text << in.rdbuf();
  return parse(text.str(), path);
}

}  // namespace kiln::llm
