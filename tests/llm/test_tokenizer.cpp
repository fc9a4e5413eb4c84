// kiln::llm::Tokenizer against the `tokenizers` library: the ids and texts that library gives
// for the tokenizers and texts of tests/data/llm/tokenizers (both written by
// tests/data/llm/make_tokenizers.py), and the errors of files kiln does not take.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "kiln/error.h"
#include "kiln/tokenizer.h"
#include "support/data.h"

namespace {

using kiln::llm::Tokenizer;
using nlohmann::json;

std::string data_path(const std::string& name) {
  return kiln::test::test_data_dir(KILN_TEST_DATA_DIR) + "/llm/" + name;
}

std::string read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << path;
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

const json& cases() {
  static const json j = json::parse(read(data_path("tokenizers/cases.json")));
  return j;
}

// Every case of cases.json for the tokenizer `name`: the same ids with and without special
// tokens, the same decodes, and decode(encode(text)) == text where tokenizers round-trips it;
// the same decodes of the random id lists.
void check_cases(const Tokenizer& tok, const std::string& name) {
  ASSERT_TRUE(cases().contains(name)) << name;
  ASSERT_FALSE(cases()[name].empty());
  for (const json& c : cases()[name]) {
    const auto ids = c["ids"].get<std::vector<int64_t>>();
    if (!c.contains("text")) {  // a decode-only case
      SCOPED_TRACE(name + ": decode " + c["ids"].dump());
      EXPECT_EQ(tok.decode(ids), c["decoded"].get<std::string>());
      EXPECT_EQ(tok.decode(ids, false), c["decoded_special"].get<std::string>());
      continue;
    }
    const std::string text = c["text"].get<std::string>();
    SCOPED_TRACE(name + ": " + json(text).dump());
    EXPECT_EQ(tok.encode(text), ids);
    EXPECT_EQ(tok.encode(text, /*add_special_tokens=*/false),
              c["ids_plain"].get<std::vector<int64_t>>());
    EXPECT_EQ(tok.decode(ids), c["decoded"].get<std::string>());
    EXPECT_EQ(tok.decode(ids, /*skip_special_tokens=*/false),
              c["decoded_special"].get<std::string>());
    if (c["decoded"] == text) {
      EXPECT_EQ(tok.decode(tok.encode(text)), text);
    }
  }
}

void check_cases(const std::string& name) {
  check_cases(Tokenizer::load(data_path("tokenizers/" + name + ".json")), name);
}

// Every tokenizer of cases.json (one TEST each below).
const std::vector<std::string> kStyles = {"gpt2",
                                          "gpt2_prefix_space",
                                          "llama3",
                                          "qwen2",
                                          "sentencepiece",
                                          "metaspace",
                                          "metaspace_always",
                                          "added_tokens",
                                          "sentencepiece_added",
                                          "gpt2_splits",
                                          "llama3_splits",
                                          "qwen2_splits",
                                          "nfc",
                                          "bpe_unk",
                                          "bpe_affixes"};

// The message of the kiln::Error `f` throws as E (empty, and a failure, if none).
template <typename E, typename F> std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "another exception: " << e.what();
    return "";
  }
  ADD_FAILURE() << "no exception";
  return "";
}

// A small byte-level tokenizer.json with `pre_tokenizer` and `model` swapped in when given.
std::string tiny_json(const json& model = nullptr, const json& pre_tokenizer = nullptr) {
  json j = json::parse(read(data_path("tokenizers/gpt2.json")));
  if (!model.is_null()) j["model"] = model;
  if (!pre_tokenizer.is_null()) j["pre_tokenizer"] = pre_tokenizer;
  return j.dump();
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

}  // namespace

TEST(Tokenizer, CasesCoverEveryStyle) {
  for (const auto& [name, list] : cases().items())
    EXPECT_NE(std::find(kStyles.begin(), kStyles.end(), name), kStyles.end()) << name;
  EXPECT_EQ(cases().size(), kStyles.size());
}

TEST(Tokenizer, Gpt2) { check_cases("gpt2"); }
TEST(Tokenizer, Gpt2PrefixSpace) { check_cases("gpt2_prefix_space"); }
TEST(Tokenizer, Llama3) { check_cases("llama3"); }
TEST(Tokenizer, Qwen2) { check_cases("qwen2"); }
TEST(Tokenizer, SentencePiece) { check_cases("sentencepiece"); }
TEST(Tokenizer, Metaspace) { check_cases("metaspace"); }
TEST(Tokenizer, MetaspaceAlways) { check_cases("metaspace_always"); }
TEST(Tokenizer, AddedTokens) { check_cases("added_tokens"); }
TEST(Tokenizer, SentencePieceAdded) { check_cases("sentencepiece_added"); }
// Random texts through tokenizers whose ids are the pieces of the pre-tokenizer (or, for NFC,
// the bytes of the normalized text).
TEST(Tokenizer, Gpt2Splits) { check_cases("gpt2_splits"); }
TEST(Tokenizer, Llama3Splits) { check_cases("llama3_splits"); }
TEST(Tokenizer, Qwen2Splits) { check_cases("qwen2_splits"); }
TEST(Tokenizer, Nfc) { check_cases("nfc"); }
TEST(Tokenizer, BpeUnknownAndIgnoreMerges) { check_cases("bpe_unk"); }
TEST(Tokenizer, BpeAffixes) { check_cases("bpe_affixes"); }

// The tokenizers of the tiny checkpoints: the gpt2 and sentencepiece styles, with the 320 ids of
// their models and the bos / eos ids of their config.json.
TEST(Tokenizer, CheckpointTokenizers) {
  const Tokenizer gpt2 = Tokenizer::load(data_path("gpt2/tokenizer.json"));
  EXPECT_EQ(gpt2.vocab_size(), 320);
  EXPECT_EQ(gpt2.token_to_id("<|startoftext|>"), 1);
  EXPECT_EQ(gpt2.token_to_id("<|endoftext|>"), 2);
  check_cases(gpt2, "gpt2");
  const Tokenizer llama = Tokenizer::load(data_path("llama/tokenizer.json"));
  EXPECT_EQ(llama.vocab_size(), 320);
  EXPECT_EQ(llama.token_to_id("<s>"), 1);
  EXPECT_EQ(llama.token_to_id("</s>"), 2);
  EXPECT_EQ(llama.token_to_id("<0x41>"), 3 + 0x41);
  check_cases(llama, "sentencepiece");
}

TEST(Tokenizer, Vocabulary) {
  const Tokenizer tok = Tokenizer::load(data_path("tokenizers/gpt2.json"));
  EXPECT_EQ(tok.vocab_size(), 320);
  EXPECT_EQ(tok.token_to_id(" kiln"), 319);  // a non-special added token
  EXPECT_EQ(tok.id_to_token(319), " kiln");
  EXPECT_EQ(tok.token_to_id("<|padding|>"), 0);
  EXPECT_EQ(tok.token_to_id("\xC4\xA0"), tok.encode(" ").at(0));  // "Ġ", the byte-level space
  EXPECT_EQ(tok.token_to_id("no such token"), std::nullopt);
  for (int64_t id = 0; id < tok.vocab_size(); ++id)
    EXPECT_EQ(tok.token_to_id(tok.id_to_token(id)), id);
  EXPECT_TRUE(contains(error_of<kiln::ValueError>([&] { tok.id_to_token(320); }), "320"));
  EXPECT_TRUE(contains(error_of<kiln::ValueError>([&] { tok.id_to_token(-1); }), "-1"));
}

// Bytes that are not UTF-8 are characters of one byte: byte-level BPE keeps them, and decode
// writes U+FFFD for each maximal invalid sequence (byte-level) or byte (byte fallback).
TEST(Tokenizer, InvalidUtf8) {
  const std::string text = "\xFF\xFE abc \xE2\x82";
  const Tokenizer gpt2 = Tokenizer::load(data_path("tokenizers/gpt2.json"));
  const auto ids = gpt2.encode(text);
  EXPECT_EQ(gpt2.decode(ids), "\uFFFD\uFFFD abc \uFFFD");
  const Tokenizer llama3 = Tokenizer::load(data_path("tokenizers/llama3.json"));
  EXPECT_EQ(llama3.decode(llama3.encode(text)), "\uFFFD\uFFFD abc \uFFFD");
  const Tokenizer sp = Tokenizer::load(data_path("tokenizers/sentencepiece.json"));
  const auto sp_ids = sp.encode("\xFF", false);
  EXPECT_EQ(sp_ids, (std::vector<int64_t>{*sp.token_to_id("\xE2\x96\x81"), 3 + 0xFF}));
  EXPECT_EQ(sp.decode(sp_ids), "\uFFFD");
  const Tokenizer qwen2 = Tokenizer::load(data_path("tokenizers/qwen2.json"));  // NFC
  EXPECT_EQ(qwen2.decode(qwen2.encode("e\xCC")), "e\uFFFD");
}

// Random bytes, mostly not UTF-8, through every tokenizer: nothing throws or reads out of bounds,
// and the byte-level ones give the bytes back where they are valid UTF-8.
TEST(Tokenizer, RandomBytes) {
  std::mt19937 rng(7);
  const std::string pieces[] = {"a",        " ",        "\n",           "'s",
                                "1",        "\xC3\xA9", "\xE2\x96\x81", "\xF0\x9F\x98\x80",
                                "\xCC\x81", "<s>",      "</s>",         "<|endoftext|>",
                                "<mask>"};
  for (const std::string& name : kStyles) {
    const Tokenizer tok = Tokenizer::load(data_path("tokenizers/" + name + ".json"));
    const bool byte_level = name == "gpt2" || name == "llama3" || name == "gpt2_splits";
    for (int i = 0; i < 200; ++i) {
      std::string text;
      bool valid = true;
      for (int k = std::uniform_int_distribution<int>(0, 12)(rng); k > 0; --k) {
        if (rng() % 3 == 0) {
          text += char(std::uniform_int_distribution<int>(0x80, 0xFF)(rng));
          valid = false;
        } else {
          text += pieces[rng() % std::size(pieces)];
        }
      }
      SCOPED_TRACE(name + ": " + json(text).dump(-1, ' ', false, json::error_handler_t::replace));
      const std::string decoded = tok.decode(tok.encode(text, false), false);
      if (byte_level && valid && text.find('<') == std::string::npos) {
        EXPECT_EQ(decoded, text);
      }
    }
  }
}

// A long text (no cache, one pass): the round trip holds and takes little time.
TEST(Tokenizer, LongText) {
  std::string text;
  for (int i = 0; i < 2000; ++i)
    text += "The quick brown fox, number " + std::to_string(i) + ", jumps over the lazy dog.\n";
  text += std::string(5000, 'a') + std::string(3000, ' ') + "end";
  for (const char* name : {"gpt2", "llama3", "qwen2", "sentencepiece"}) {
    const Tokenizer tok = Tokenizer::load(data_path(std::string("tokenizers/") + name + ".json"));
    const auto ids = tok.encode(text, false);
    EXPECT_LT(ids.size(), text.size()) << name;
    EXPECT_TRUE(tok.decode(ids) == text) << name;  // (not EXPECT_EQ: no diff of 150 kB)
  }
}

TEST(Tokenizer, DecodeOutOfRange) {
  const Tokenizer tok = Tokenizer::load(data_path("tokenizers/gpt2.json"));
  const std::string msg = error_of<kiln::ValueError>([&] { tok.decode({5, 320}); });
  EXPECT_EQ(msg.rfind("[tokenizer] ", 0), 0u) << msg;
  EXPECT_TRUE(contains(msg, "320")) << msg;
  error_of<kiln::ValueError>([&] { tok.decode({-1}); });
}

TEST(Tokenizer, MalformedJson) {
  const std::string msg =
      error_of<kiln::FormatError>([] { Tokenizer::parse("{\"model\": ", "tok.json"); });
  EXPECT_EQ(msg.rfind("[tokenizer] tok.json", 0), 0u) << msg;
  error_of<kiln::FormatError>([] { Tokenizer::parse("[1, 2]"); });
  error_of<kiln::FormatError>([] { Tokenizer::parse("{}"); });  // no model
  // a field of the wrong type, named with its place
  json j = json::parse(tiny_json());
  j["model"]["vocab"]["Ġ"] = "seven";
  const std::string vocab = error_of<kiln::FormatError>([&] { Tokenizer::parse(j.dump()); });
  EXPECT_TRUE(contains(vocab, "model.vocab.Ġ")) << vocab;
  j = json::parse(tiny_json());
  j["model"]["merges"].push_back("Ġ nosuchtoken");
  const std::string merge = error_of<kiln::FormatError>([&] { Tokenizer::parse(j.dump()); });
  EXPECT_TRUE(contains(merge, "nosuchtoken")) << merge;
  j = json::parse(tiny_json());
  j["added_tokens"][0]["lstrip"] = "yes";
  const std::string added = error_of<kiln::FormatError>([&] { Tokenizer::parse(j.dump()); });
  EXPECT_TRUE(contains(added, "added_tokens[0].lstrip")) << added;
}

TEST(Tokenizer, LoadMissingFile) {
  const std::string msg =
      error_of<kiln::IoError>([] { Tokenizer::load(data_path("no/such/tokenizer.json")); });
  EXPECT_TRUE(contains(msg, "no/such/tokenizer.json")) << msg;
}

TEST(Tokenizer, UnsupportedComponents) {
  const json word_piece = {{"type", "WordPiece"}, {"vocab", {{"a", 0}}}, {"unk_token", "a"}};
  std::string msg =
      error_of<kiln::UnsupportedError>([&] { Tokenizer::parse(tiny_json(word_piece)); });
  EXPECT_EQ(msg.rfind("[tokenizer] ", 0), 0u) << msg;
  EXPECT_TRUE(contains(msg, "WordPiece") && contains(msg, "BPE")) << msg;

  const std::string pattern = R"(\p{L}+|\s+)";
  const json split = {{"type", "Split"},
                      {"pattern", {{"Regex", pattern}}},
                      {"behavior", "Isolated"},
                      {"invert", false}};
  msg = error_of<kiln::UnsupportedError>([&] { Tokenizer::parse(tiny_json(nullptr, split)); });
  EXPECT_TRUE(contains(msg, "'" + pattern + "'")) << msg;
  EXPECT_TRUE(contains(msg, R"(\p{N}{1,3})")) << msg;  // lists the supported ones

  json j = json::parse(tiny_json());
  j["normalizer"] = {{"type", "Lowercase"}};
  msg = error_of<kiln::UnsupportedError>([&] { Tokenizer::parse(j.dump()); });
  EXPECT_TRUE(contains(msg, "Lowercase") && contains(msg, "NFC")) << msg;
  j = json::parse(tiny_json());
  j["decoder"] = {{"type", "WordPiece"}, {"prefix", "##"}, {"cleanup", true}};
  msg = error_of<kiln::UnsupportedError>([&] { Tokenizer::parse(j.dump()); });
  EXPECT_TRUE(contains(msg, "WordPiece") && contains(msg, "ByteFallback")) << msg;
  j = json::parse(tiny_json());
  j["post_processor"] = {{"type", "BertProcessing"}, {"sep", {"[SEP]", 1}}, {"cls", {"[CLS]", 0}}};
  msg = error_of<kiln::UnsupportedError>([&] { Tokenizer::parse(j.dump()); });
  EXPECT_TRUE(contains(msg, "BertProcessing") && contains(msg, "TemplateProcessing")) << msg;
  j = json::parse(tiny_json());
  j["model"]["dropout"] = 0.1;
  error_of<kiln::UnsupportedError>([&] { Tokenizer::parse(j.dump()); });
}
