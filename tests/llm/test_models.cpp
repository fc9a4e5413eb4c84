// kiln::llm::Model on tiny random-weight checkpoints of every family kiln builds, against the
// outputs of Hugging Face transformers stored beside them (tests/data/llm/make_models.py): the
// logits over a prompt, 64 greedy tokens, and a batch of two prompts of different lengths.
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "kiln/llm.h"
#include "kiln/safetensors.h"
#include "support/data.h"
#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;
namespace fs = std::filesystem;

const std::string kData = test_data_dir(KILN_TEST_DATA_DIR) + "/llm/";

std::vector<int64_t> ints(const Array& a) { return a.astype(i64).to_vector<int64_t>(); }

struct Golden {
  std::vector<int64_t> prompt_a, prompt_b, greedy_a;
  Array logits_a, batch;
  explicit Golden(const std::string& dir) {
    const auto f = safetensors::File::open(dir + "/goldens.safetensors");
    prompt_a = ints(f.read("prompt_a"));
    prompt_b = ints(f.read("prompt_b"));
    greedy_a = ints(f.read("greedy_a"));
    logits_a = f.read("logits_a");
    batch = f.read("batch");
  }
};

// Whole-array closeness: relative L2 error and the largest error against the largest value.
void expect_logits_close(const Array& got, const Array& want, double rel_l2, double max_rel) {
  ASSERT_EQ(got.shape(), want.shape());
  const std::vector<double> a = to_f64(got), b = to_f64(want);
  double err = 0, ref = 0, worst = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    err += (a[i] - b[i]) * (a[i] - b[i]);
    ref += b[i] * b[i];
    worst = std::max(worst, std::fabs(a[i] - b[i]));
    scale = std::max(scale, std::fabs(b[i]));
  }
  EXPECT_LE(std::sqrt(err / ref), rel_l2);
  EXPECT_LE(worst, max_rel * scale);
}

llm::Model load(const std::string& name, int64_t max_batch = 1, std::optional<DType> dtype = f32) {
  llm::LoadOptions o;
  o.device = default_device();
  o.dtype = dtype;
  o.max_batch = max_batch;
  o.max_length = 128;
  return llm::Model::load(kData + name, o);
}

class Models : public ::testing::TestWithParam<std::string> {};

TEST_P(Models, LogitsMatchTransformers) {
  const Golden g(kData + GetParam());
  llm::Model m = load(GetParam());
  expect_logits_close(m.logits(g.prompt_a), g.logits_a, 2e-5, 2e-5);
}

TEST_P(Models, GreedyGenerationMatchesTransformers) {
  const Golden g(kData + GetParam());
  llm::Model m = load(GetParam());
  llm::GenerateOptions o;
  o.max_new_tokens = static_cast<int64_t>(g.greedy_a.size());
  o.stop_tokens = {-1};
  std::vector<int64_t> streamed;
  o.on_token = [&](int64_t seq, int64_t tok) {
    EXPECT_EQ(seq, 0);
    streamed.push_back(tok);
    return true;
  };
  const llm::Generation out = m.generate({g.prompt_a}, o);
  EXPECT_EQ(out.tokens.at(0), g.greedy_a);
  EXPECT_EQ(streamed, g.greedy_a);
  EXPECT_EQ(out.prompt_tokens, static_cast<int64_t>(g.prompt_a.size()));
  EXPECT_EQ(out.new_tokens, o.max_new_tokens);
}

TEST_P(Models, BatchOfDifferentLengthsMatchesTransformers) {
  const Golden g(kData + GetParam());
  const std::vector<int64_t> want = ints(g.batch);
  const int64_t n = g.batch.shape()[1];
  llm::GenerateOptions o;
  o.max_new_tokens = n;
  o.stop_tokens = {-1};
  for (int64_t max_batch : {2, 3}) {  // a batch of two, and one with an unused row
    llm::Model m = load(GetParam(), max_batch);
    const llm::Generation out = m.generate({g.prompt_a, g.prompt_b}, o);
    ASSERT_EQ(out.tokens.size(), 2u);
    EXPECT_EQ(out.tokens[0], std::vector<int64_t>(want.begin(), want.begin() + n));
    EXPECT_EQ(out.tokens[1], std::vector<int64_t>(want.begin() + n, want.end()));
  }
  // one sequence at a time: the same tokens (the prompts go in two groups)
  const llm::Generation one = load(GetParam()).generate({g.prompt_a, g.prompt_b}, o);
  EXPECT_EQ(one.tokens[1], std::vector<int64_t>(want.begin() + n, want.end()));
}

INSTANTIATE_TEST_SUITE_P(Llm, Models,
                         ::testing::Values("llama", "llama3_scaled", "llama_linear", "mistral",
                                           "mistral_window", "qwen2_window", "qwen2", "gpt2"));

TEST(LlmModel, Bf16RunsCloseToTheF32Logits) {
  const Golden g(kData + "llama");
  llm::Model m = load("llama", 1, bf16);
  EXPECT_EQ(m.dtype(), bf16);
  expect_logits_close(m.logits(g.prompt_a), g.logits_a, 5e-2, 8e-2);
}

TEST(LlmModel, TheCheckpointDtypeIsTheDefaultAndMemoryIsCounted) {
  llm::Model m = load("llama3_scaled", 2, std::nullopt);
  EXPECT_EQ(m.dtype(), bf16);
  const llm::Config& c = m.config();
  EXPECT_EQ(m.memory().cache,
            static_cast<size_t>(2 * c.num_layers * 2 * c.num_kv_heads * 128 * c.head_dim * 2));
  EXPECT_GT(m.memory().weights, static_cast<size_t>(c.vocab_size * c.hidden_size * 2));
}

TEST(LlmModel, StopsAtAStopTokenAndWhenTheCallbackSaysSo) {
  const Golden g(kData + "qwen2");
  llm::Model m = load("qwen2", 2);
  llm::GenerateOptions o;
  o.max_new_tokens = 20;
  o.stop_tokens = {g.greedy_a[3]};
  const auto first = std::find(g.greedy_a.begin(), g.greedy_a.end(), g.greedy_a[3]);
  auto out = m.generate({g.prompt_a}, o);
  EXPECT_EQ(out.tokens[0], std::vector<int64_t>(g.greedy_a.begin(), first + 1));
  o.stop_tokens = {-1};
  o.on_token = [](int64_t seq, int64_t) { return seq != 1; };  // sequence 1 ends at once
  out = m.generate({g.prompt_a, g.prompt_b}, o);
  EXPECT_EQ(out.tokens[0].size(), 20u);
  EXPECT_EQ(out.tokens[1].size(), 1u);
}

TEST(LlmModel, BadPromptsFailNamingTheProblem) {
  llm::Model m = load("llama");
  expect_error<ValueError>([&] { m.generate({{}}); }, {"prompt 0 is empty"});
  expect_error<ValueError>([&] { m.generate({{5, 320}}); }, {"prompt 0", "token 320", "[0, 320)"});
  llm::GenerateOptions o;
  o.max_new_tokens = 120;
  expect_error<ValueError>([&] { m.generate({std::vector<int64_t>(9, 4)}, o); },
                           {"9 tokens", "120 new", "129 positions", "max_length 128"});
  o.max_new_tokens = 0;
  expect_error<ValueError>([&] { m.generate({{5}}, o); }, {"max_new_tokens 0"});
}

// A copy of a test model whose config.json is edited by `edit` (text replaced).
std::string edited_copy(const std::string& name, const std::string& from, const std::string& to) {
  const fs::path dir = fs::temp_directory_path() / ("kiln_llm_" + std::to_string(getpid()) + name);
  fs::remove_all(dir);
  fs::copy(kData + name, dir);
  std::ifstream in(dir / "config.json");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  text.replace(at, from.size(), to);
  std::ofstream(dir / "config.json") << text;
  return dir.string();
}

TEST(LlmModel, CheckpointsThatContradictTheirConfigFailNamingTheTensor) {
  const std::string more =
      edited_copy("llama", "\"num_hidden_layers\": 2", "\"num_hidden_layers\": 3");
  expect_error<ValueError>([&] { llm::Model::load(more); },
                           {"no tensor 'model.layers.2.input_layernorm.weight'", "3 layers"});
  const std::string wide = edited_copy("gpt2", "\"n_inner\": null", "\"n_inner\": 100");
  expect_error<ShapeError>([&] { llm::Model::load(wide); },
                           {"'transformer.h.0.mlp.c_fc.weight'", "(64, 256)", "(64, 100)"});
  const std::string untied =
      edited_copy("qwen2", "\"tie_word_embeddings\": true", "\"tie_word_embeddings\": false");
  expect_error<ValueError>([&] { llm::Model::load(untied); }, {"'lm_head.weight'"});
  const std::string yarn = edited_copy("llama_linear", "\"linear\"", "\"yarn\"");
  expect_error<UnsupportedError>([&] { llm::Model::load(yarn); }, {"'yarn'", "linear"});
  for (const auto& d : {more, wide, untied, yarn}) fs::remove_all(d);
  llm::LoadOptions o;
  o.max_length = 300;
  expect_error<ValueError>([&] { llm::Model::load(kData + "gpt2", o); },
                           {"max_length 300", "256 positions"});
  o.max_length = 0;
  o.dtype = i32;
  expect_error<DTypeError>([&] { llm::Model::load(kData + "gpt2", o); }, {"dtype i32"});
}

}  // namespace
}  // namespace kiln
