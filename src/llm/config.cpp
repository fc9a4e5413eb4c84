// config.json of Hugging Face models (include/kiln/llm.h): the Llama family and GPT-2. The llm
// layer uses kiln's public API (and, for sampling, src/ops/philox.h).
#include <fmt/format.h>

#include <algorithm>
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
  // Token ids: an integer, or a list of them (Llama 3 lists several eos ids); none if absent.
  std::vector<int64_t> tokens(const char* key) const {
    const auto it = j.find(key);
    if (it == j.end() || it->is_null()) return {};
    std::vector<int64_t> ids;
    for (const json& v : it->is_array() ? *it : json::array({*it})) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0)
        bad("'{}' is {}, not a token id", key, it->dump());
      ids.push_back(v.get<int64_t>());
    }
    return ids;
  }
  int64_t token(const char* key) const {
    const auto ids = tokens(key);
    return ids.empty() ? -1 : ids[0];
  }
};

DType torch_dtype(const Reader& r) {
  const char* key = r.j.contains("torch_dtype") ? "torch_dtype" : "dtype";  // transformers 5
  const auto it = r.j.find(key);
  if (it == r.j.end() || it->is_null()) return f32;
  if (!it->is_string()) r.bad("'{}' is {}, not a string", key, it->dump());
  const std::string s = it->get<std::string>();
  if (s == "float32") return f32;
  if (s == "float16") return f16;
  if (s == "bfloat16") return bf16;
  r.bad("'{}' is '{}' (kiln loads float32, float16 and bfloat16 checkpoints)", key, s);
}

// "rope_scaling", or "rope_parameters" (transformers 5: the type, its fields and rope_theta).
RopeScaling read_rope_scaling(const Reader& r) {
  RopeScaling rs;
  const char* key = r.j.contains("rope_parameters") ? "rope_parameters" : "rope_scaling";
  const auto it = r.j.find(key);
  if (it == r.j.end() || it->is_null()) return rs;
  if (!it->is_object()) r.bad("'{}' is {}, not an object", key, it->dump());
  const Reader s{*it, r.label};
  const auto type = it->contains("rope_type") ? it->at("rope_type") : it->value("type", json());
  if (!type.is_string()) r.bad("'{}' has no type", key);
  rs.type = type.get<std::string>();
  if (rs.type == "default") {
    rs.type.clear();
    return rs;
  }
  if (rs.type != "linear" && rs.type != "dynamic" && rs.type != "llama3" && rs.type != "yarn")
    fail<UnsupportedError>("[llm] {}: {} type '{}' (kiln takes linear, dynamic, llama3 and yarn)",
                           r.label, key, rs.type);
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
  c.eos_token_ids = r.tokens("eos_token_id");
  c.eos_token_id = c.eos_token_ids.empty() ? -1 : c.eos_token_ids[0];
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
    if (j.contains("rope_parameters") && j["rope_parameters"].is_object())
      c.rope_theta = Reader{j["rope_parameters"], label}.number("rope_theta", c.rope_theta);
    c.rope_scaling = read_rope_scaling(r);
    c.tie_word_embeddings = r.flag("tie_word_embeddings", false);
    c.attention_bias = r.flag("attention_bias", false) || c.model_type == "qwen2";
    c.mlp_bias = r.flag("mlp_bias", false);
    // Mistral's window applies to every layer whenever set; Qwen2's only with
    // use_sliding_window, from layer max_window_layers on
    if (c.model_type == "mistral" || r.flag("use_sliding_window", false))
      if (j.contains("sliding_window") && !j["sliding_window"].is_null())
        c.sliding_window = r.positive("sliding_window");
    if (c.model_type == "qwen2" && c.sliding_window > 0) {
      const json v = j.value("max_window_layers", json(28));
      if (!v.is_number_integer() || v.get<int64_t>() < 0)
        r.bad("'max_window_layers' is {}, not an integer of 0 or more", v.dump());
      c.first_sliding_layer = v.get<int64_t>();
    }
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
    const std::string act = j.value("activation_function", std::string("gelu_new"));
    if (act == "gelu" || act == "gelu_python") c.gelu_tanh = false;
    else if (act != "gelu_new" && act != "gelu_pytorch_tanh" && act != "gelu_fast")
      fail<UnsupportedError>(
          "[llm] {}: activation_function '{}' (GPT-2's MLP takes gelu_new, gelu_pytorch_tanh, "
          "gelu_fast or gelu)",
          label, act);
    c.scale_attn_by_layer = r.flag("scale_attn_by_inverse_layer_idx", false);
    if (!r.flag("scale_attn_weights", true))
      fail<UnsupportedError>("[llm] {}: scale_attn_weights false", label);
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

namespace {
// A regular file of sane size (never a FIFO or a device, which a read would wait on).
std::string read_text(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    fail<IoError>("[llm] cannot read {}: not a regular file", path);
  if (std::filesystem::file_size(path, ec) > (uintmax_t{16} << 20))
    fail<FormatError>("[llm] {}: more than 16 MiB", path);
  std::ifstream in(path, std::ios::binary);
  if (!in) fail<IoError>("[llm] cannot read {}", path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}
}  // namespace

Config Config::load(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "config.json").string();
  std::error_code ec;
  Config c = parse(read_text(path), path);
  const std::string gen = (std::filesystem::path(dir) / "generation_config.json").string();
  if (std::filesystem::is_regular_file(gen, ec)) {
    const json j = json::parse(read_text(gen), nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) fail<FormatError>("[llm] {}: not a JSON object", gen);
    for (int64_t id : Reader{j, gen}.tokens("eos_token_id"))
      if (std::find(c.eos_token_ids.begin(), c.eos_token_ids.end(), id) == c.eos_token_ids.end())
        c.eos_token_ids.push_back(id);
    if (c.eos_token_id < 0 && !c.eos_token_ids.empty()) c.eos_token_id = c.eos_token_ids[0];
  }
  return c;
}

}  // namespace kiln::llm
