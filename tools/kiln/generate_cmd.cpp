// `kiln generate`: loads a Hugging Face checkpoint directory and continues a prompt, printing the
// text as it comes (--prompt, through the directory's tokenizer.json) or the new token ids on one
// line (--prompt-ids), then the prefill and decode speed.
#include <fmt/format.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <sstream>

#include "kiln/error.h"
#include "kiln/llm.h"
#include "kiln/tokenizer.h"
#include "tools/kiln/commands.h"
#include "tools/kiln/model_args.h"

namespace kiln::cli {

namespace {
struct GenerateOptions {
  std::string model;
  std::string prompt, prompt_ids;
  int64_t max_tokens = 128;
  bool greedy = false, ignore_eos = false;
  double temperature = 1.0, top_p = 1.0, repetition_penalty = 1.0;
  int64_t top_k = 0;
  bool sampling = false;  // --temperature, --top-k or --top-p given
  uint64_t seed = 0;
  std::string device, dtype;
  int64_t max_length = 0;
};

std::vector<int64_t> parse_ids(const std::string& text) {
  std::vector<int64_t> ids;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    size_t used = 0;
    int64_t v = -1;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size() || v < 0)
      throw ValueError(
          fmt::format("--prompt-ids: '{}' is not a token id (ids are comma-separated "
                      "integers, 0 or more)",
                      item));
    ids.push_back(v);
  }
  if (ids.empty()) throw ValueError("--prompt-ids: no token ids");
  return ids;
}

// Prints a sequence's text as tokens come, holding back a character whose bytes are not all
// there yet (its decode ends in U+FFFD).
struct TextStream {
  const llm::Tokenizer& tokenizer;
  std::vector<int64_t> ids;
  size_t shown = 0;
  void add(int64_t id) {
    ids.push_back(id);
    const std::string text = tokenizer.decode(ids);
    if (text.size() >= 3 && text.compare(text.size() - 3, 3, "\xEF\xBF\xBD") == 0) return;
    show(text);
  }
  void show(const std::string& text) {
    if (text.size() > shown) std::fwrite(text.data() + shown, 1, text.size() - shown, stdout);
    shown = std::max(shown, text.size());
    std::fflush(stdout);
  }
};

void generate(const GenerateOptions& o) {
  llm::LoadOptions lo;
  lo.device = pick_device(o.device);
  if (!o.dtype.empty()) lo.dtype = parse_dtype(o.dtype);
  lo.max_length = o.max_length;
  std::optional<llm::Tokenizer> tokenizer;
  std::vector<int64_t> prompt;
  if (!o.prompt_ids.empty()) {
    prompt = parse_ids(o.prompt_ids);
  } else {
    const auto path = std::filesystem::path(o.model) / "tokenizer.json";
    std::error_code ec;
    if (!std::filesystem::is_regular_file(path, ec))
      throw IoError(
          fmt::format("{} has no tokenizer.json: give the prompt as token ids with "
                      "--prompt-ids",
                      o.model));
    tokenizer = llm::Tokenizer::load(path.string());
    prompt = tokenizer->encode(o.prompt);
  }
  llm::Model model = llm::Model::load(o.model, lo);
  llm::GenerateOptions go;
  go.max_new_tokens = o.max_tokens;
  if (o.ignore_eos) go.stop_tokens = {-1};
  go.sampling.greedy = !o.sampling;
  go.sampling.temperature = o.temperature;
  go.sampling.top_k = o.top_k;
  go.sampling.top_p = o.top_p;
  go.sampling.repetition_penalty = o.repetition_penalty;
  go.sampling.seed = o.seed;
  std::optional<TextStream> stream;
  if (tokenizer) {
    stream.emplace(TextStream{*tokenizer, {}, 0});
    go.on_token = [&](int64_t, int64_t id) {
      stream->add(id);
      return true;
    };
  }
  const llm::Generation g = model.generate({prompt}, go);
  if (stream) {
    stream->show(tokenizer->decode(stream->ids));
    fmt::print("\n");
  } else {
    fmt::print("{}\n", fmt::join(g.tokens.at(0), ","));
  }
  const int64_t decoded = g.new_tokens - 1;
  fmt::print(
      "prefill: {} tokens in {:.1f} ms ({:.1f} tokens/s); decode: {} tokens in {:.1f} ms "
      "({:.1f} tokens/s) on {}\n",
      g.prompt_tokens, 1e3 * g.prefill_seconds,
      g.prefill_seconds > 0 ? static_cast<double>(g.prompt_tokens) / g.prefill_seconds : 0, decoded,
      1e3 * g.decode_seconds,
      g.decode_seconds > 0 ? static_cast<double>(decoded) / g.decode_seconds : 0,
      model.device().str());
}
}  // namespace

void add_generate_command(CLI::App& app) {
  auto o = std::make_shared<GenerateOptions>();
  auto* cmd = app.add_subcommand(
      "generate",
      "Continue a prompt with a Hugging Face causal language model (Llama family, GPT-2)");
  cmd->add_option("model", o->model,
                  "Checkpoint directory: config.json, model.safetensors (or shards) and, for "
                  "--prompt, tokenizer.json")
      ->required();
  auto* text = cmd->add_option("--prompt,-p", o->prompt, "Prompt text (needs tokenizer.json)");
  auto* ids = cmd->add_option("--prompt-ids", o->prompt_ids,
                              "Prompt as comma-separated token ids (prints the new ids)");
  text->excludes(ids);
  cmd->add_option("--max-tokens,-n", o->max_tokens, "New tokens at most")->capture_default_str();
  auto* greedy = cmd->add_flag("--greedy", o->greedy,
                               "Pick the most likely token (the default without sampling options)");
  auto* t = cmd->add_option("--temperature", o->temperature, "Sample with this temperature");
  auto* k = cmd->add_option("--top-k", o->top_k, "Sample among the k most likely tokens");
  auto* p = cmd->add_option("--top-p", o->top_p,
                            "Sample among the most likely tokens holding probability p");
  for (auto* opt : {t, k, p}) greedy->excludes(opt);
  cmd->add_option("--repetition-penalty", o->repetition_penalty,
                  "Divide the logits of tokens already in the text by this (1: off)");
  cmd->add_option("--seed", o->seed, "Seed of the random draws")->capture_default_str();
  cmd->add_flag("--ignore-eos", o->ignore_eos, "Do not stop at the model's end-of-sequence token");
  cmd->add_option("--device", o->device,
                  "cpu, cuda or cuda:N (default: KILN_DEVICE or the first GPU)");
  cmd->add_option("--dtype", o->dtype, "f32, f16 or bf16 (default: the checkpoint's)");
  cmd->add_option("--max-length", o->max_length,
                  "Positions the KV cache holds (default: the model's, at most 4096)");
  cmd->callback([cmd, o] {
    if (o->prompt.empty() && o->prompt_ids.empty() && cmd->count("--prompt") == 0)
      throw CLI::RequiredError("--prompt or --prompt-ids");
    o->sampling = cmd->count("--temperature") + cmd->count("--top-k") + cmd->count("--top-p") > 0;
    generate(*o);
  });
}

}  // namespace kiln::cli
