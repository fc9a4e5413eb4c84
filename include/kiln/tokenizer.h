// Hugging Face tokenizer.json files with a BPE model (GPT-2, Llama 2 and 3, Mistral, Qwen2, ...):
// text to token ids and back, with the ids and text the `tokenizers` library gives.
//
// What a tokenizer.json may hold (anything else is an UnsupportedError that names it and lists
// what is supported):
//   added_tokens    matched in the text before normalization (those with "normalized": false)
//                   or in each normalized piece (those with true, against their normalized
//                   content); the longest match first; "single_word" (no word character, \w,
//                   right before or after), "lstrip" and "rstrip" (take in the spaces on that
//                   side) and "special" (left out by decode when skip_special_tokens); a
//                   normalized one decodes (and id_to_token gives it) as normalized, as
//                   `tokenizers` does.
//   normalizer      null, Sequence, NFC, Prepend, Replace (a String pattern).
//   pre_tokenizer   null, Sequence, ByteLevel (add_prefix_space, use_regex: GPT-2's regex),
//                   Metaspace (replacement, prepend_scheme first / always / never or the older
//                   add_prefix_space, split), Split with behavior Isolated, not inverted, and a
//                   Regex pattern that is exactly that of GPT-2, Llama 3 or Qwen2 (the regexes
//                   are not interpreted: each is split by code written for it).
//   model           BPE: vocab, merges as "a b" strings or ["a", "b"] pairs (applied by rank),
//                   unk_token, fuse_unk, byte_fallback (<0xNN> tokens), ignore_merges,
//                   continuing_subword_prefix, end_of_word_suffix; dropout null or 0.
//   post_processor  null, Sequence, ByteLevel (no ids), TemplateProcessing (its "single"
//                   template, when encode adds special tokens).
//   decoder         null (tokens joined by spaces), Sequence, ByteLevel, Metaspace, Replace (a
//                   String pattern), ByteFallback, Fuse, Strip.
// "truncation" and "padding" are ignored: encode returns all the ids of a text, unpadded.
// Character classes (\p{L}, \p{N}, \s, \w) and NFC follow Unicode 14 (src/llm/unicode_tables.inc).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace kiln::llm {

/// A tokenizer read from a tokenizer.json. Text is UTF-8; a byte of `text` that is not valid UTF-8
/// is taken as a character of its own (byte-level BPE encodes it as that byte). Copies share the
/// (immutable) tables; all methods are const and safe to call from several threads.
class Tokenizer {
 public:
  /// Reads a tokenizer.json file: IoError when it cannot be read, else as parse.
  static Tokenizer load(const std::string& path);
  /// Parses a tokenizer.json's text; `label` names it in errors. FormatError for malformed JSON
  /// or a field of the wrong type (naming the field), UnsupportedError for a component type or
  /// Split pattern that is not supported (naming it and those that are).
  static Tokenizer parse(const std::string& json, const std::string& label = "tokenizer.json");

  /// The ids of `text`; add_special_tokens applies the post-processor's template (e.g. a BOS).
  /// Throws ValueError when a character is unknown and the model's unk_token is not in its
  /// vocabulary.
  std::vector<int64_t> encode(const std::string& text, bool add_special_tokens = true) const;
  /// The text of `ids` through the decoder, without the special added tokens when
  /// skip_special_tokens. ValueError for an id outside [0, vocab_size()); an id in range that
  /// has no token is left out.
  std::string decode(const std::vector<int64_t>& ids, bool skip_special_tokens = true) const;

  /// 1 + the largest id of the vocabulary and the added tokens.
  int64_t vocab_size() const;
  /// The id of a token (added tokens first, then the model's vocabulary), if there is one.
  std::optional<int64_t> token_to_id(const std::string& token) const;
  /// The token of an id; ValueError when it is outside [0, vocab_size()) or has no token.
  std::string id_to_token(int64_t id) const;

 private:
  struct Impl;
  explicit Tokenizer(std::shared_ptr<const Impl> impl);
  std::shared_ptr<const Impl> impl_;
};

}  // namespace kiln::llm
