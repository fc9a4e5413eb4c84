// The text side of the tokenizer (include/kiln/tokenizer.h): UTF-8, Unicode character classes and
// NFC, the splitters of the pre-tokenizer regexes it knows, and the pre-tokenizers. Defined in
// tokenizer_pretokenize.cpp, with the tables of unicode_tables.inc
// (scripts/make_unicode_tables.py); tokenizer.cpp reads the pre-tokenizers from the JSON.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::llm::unicode {

/// A byte that is not part of valid UTF-8 is read as one character, kByteMarker + the byte (above
/// the last code point): it is no letter, number or space, and append_utf8 writes the byte back.
constexpr char32_t kByteMarker = 0x110000;

/// The character at byte `i` of `s` (i < s.size()) and its length in bytes. A byte that does not
/// start valid UTF-8 is a character of one byte, kByteMarker + the byte.
struct Char {
  char32_t cp;
  size_t len;
};
Char char_at(std::string_view s, size_t i);

/// Appends the UTF-8 of `cp`, or the byte of a kByteMarker character.
void append_utf8(std::string& out, char32_t cp);

/// `bytes` as valid UTF-8: each maximal ill-formed subsequence becomes one U+FFFD, as Rust's
/// String::from_utf8_lossy does (and the ByteLevel decoder of `tokenizers`).
std::string from_utf8_lossy(std::string_view bytes);

/// Whether `bytes` is valid UTF-8.
bool is_valid_utf8(std::string_view bytes);

/// Character classes, as the regexes of tokenizer.json files read them.
enum Flag : uint8_t {
  kLetter = 1,  ///< \p{L}
  kNumber = 2,  ///< \p{N}
  kSpace = 4,   ///< \s: White_Space
  kWord = 8,    ///< \w: letters, Nd, Nl, marks, Pc and the join controls (close to Rust's \w)
};
uint8_t flags(char32_t cp);

/// Unicode Normalization Form C of UTF-8 text (invalid bytes are left as they are).
std::string nfc(std::string_view text);

/// The pre-tokenizer regexes that real checkpoints use, each split by hand-written code that
/// gives the pieces the regex (leftmost-first alternation, as Oniguruma) gives.
enum class Pattern {
  kGpt2,    ///< GPT-2's, also the ByteLevel pre-tokenizer's own when use_regex
  kLlama3,  ///< Llama 3's: case-insensitive contractions, numbers of up to 3 digits
  kQwen2,   ///< Qwen2's: Llama 3's with single digits
};
/// The pattern whose regex is exactly `regex`, if it is one of them.
std::optional<Pattern> find_pattern(std::string_view regex);
/// The regex of a pattern.
std::string_view pattern_regex(Pattern p);

/// Splits `text` into the matches of the pattern (which cover the whole text): returns the end
/// offset of each piece, in order.
std::vector<size_t> split(std::string_view text, Pattern p);

}  // namespace kiln::llm::unicode

namespace kiln::llm::pretokenize {

/// The byte of a character of GPT-2's byte-level alphabet (which writes each byte as a printable
/// character), or -1.
int char_byte(char32_t c);

/// A piece of text on its way to the model; `first` when it starts the input text.
struct Word {
  std::string text;
  bool first;
};

/// When Metaspace puts its replacement before a piece that does not start with it.
enum class Scheme { kAlways, kFirst, kNever };

/// One pre-tokenizer of a tokenizer.json (a Sequence is a list of them).
struct PreTokenizer {
  enum Kind { kByteLevel, kSplit, kMetaspace } kind = kByteLevel;
  bool add_prefix_space = false, use_regex = false;    // ByteLevel
  unicode::Pattern pattern = unicode::Pattern::kGpt2;  // Split, and ByteLevel with use_regex
  std::string replacement;                             // Metaspace
  Scheme scheme = Scheme::kAlways;
  bool split = true;

  /// Appends the (non-empty) pieces of `w` to `out`, as the pre-tokenizer of `tokenizers` cuts
  /// and rewrites them: ByteLevel adds the prefix space, splits with GPT-2's regex and maps the
  /// bytes to its alphabet; Split splits; Metaspace replaces spaces, prepends and splits before
  /// each replacement.
  void apply(const Word& w, std::vector<Word>& out) const;
};

}  // namespace kiln::llm::pretokenize
