// The text side of the tokenizer (src/llm/unicode.h): UTF-8, character classes and NFC from the
// tables of unicode_tables.inc, the splitters of the pre-tokenizer regexes, the pre-tokenizers.
#include <algorithm>
#include <array>
#include <unordered_map>

#include "llm/unicode.h"

namespace kiln::llm::unicode {

namespace {

struct ClassStart {
  char32_t first;
  uint8_t flags;
};
struct CombiningStart {
  char32_t first;
  uint8_t ccc;
};
struct Decomposition {
  char32_t cp, first, second;
};

#include "llm/unicode_tables.inc"

// The value of the last entry of a "starts" table whose first is <= cp.
template <typename Table> auto lookup(const Table& table, char32_t cp) {
  const auto it = std::upper_bound(std::begin(table), std::end(table), cp,
                                   [](char32_t c, const auto& e) { return c < e.first; });
  return std::prev(it);
}

// Hangul syllables decompose and compose by arithmetic (Unicode 3.12).
constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr char32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount;
constexpr char32_t kSCount = kLCount * kNCount;

int combining_class(char32_t cp) { return cp < 0x300 ? 0 : lookup(kCombiningStarts, cp)->ccc; }

const Decomposition* decomposition(char32_t cp) {
  if (cp < 0xC0) return nullptr;
  const auto it = std::lower_bound(std::begin(kDecompositions), std::end(kDecompositions), cp,
                                   [](const Decomposition& d, char32_t c) { return d.cp < c; });
  return it != std::end(kDecompositions) && it->cp == cp ? it : nullptr;
}

void decompose(char32_t cp, std::u32string& out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const char32_t s = cp - kSBase;
    out += kLBase + s / kNCount;
    out += kVBase + s % kNCount / kTCount;
    if (s % kTCount) out += kTBase + s % kTCount;
    return;
  }
  const Decomposition* d = decomposition(cp);
  if (!d) {
    out += cp;
    return;
  }
  decompose(d->first, out);
  if (d->second) decompose(d->second, out);
}

// The primary composites, by (first << 21 | second).
const std::unordered_map<uint64_t, char32_t>& compositions() {
  static const auto table = [] {
    std::unordered_map<uint64_t, char32_t> t;
    for (const Decomposition& d : kDecompositions) {
      const bool excluded =
          std::find(std::begin(kCompositionExclusions), std::end(kCompositionExclusions), d.cp) !=
          std::end(kCompositionExclusions);
      if (d.second && !excluded && combining_class(d.cp) == 0 && combining_class(d.first) == 0)
        t.emplace(uint64_t{d.first} << 21 | d.second, d.cp);
    }
    return t;
  }();
  return table;
}

// The composite of a starter and the next character, or 0.
char32_t compose(char32_t a, char32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount)
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase &&
      b < kTBase + kTCount)
    return a + (b - kTBase);
  const auto& table = compositions();
  const auto it = table.find(uint64_t{a} << 21 | b);
  return it == table.end() ? 0 : it->second;
}

// Reads the whole text as characters.
std::u32string chars_of(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const Char c = char_at(s, i);
    out += c.cp;
    i += c.len;
  }
  return out;
}

}  // namespace

// ---- UTF-8 ----

namespace {
// The length of the well-formed UTF-8 character at s[i], or 0 with `bad` set to the length of
// the maximal ill-formed subsequence there (Unicode table 3-7).
size_t utf8_length(std::string_view s, size_t i, size_t& bad) {
  const auto b = [&](size_t k) { return static_cast<uint8_t>(s[i + k]); };
  const uint8_t b0 = b(0);
  bad = 1;
  if (b0 < 0x80) return 1;
  size_t need;
  uint8_t lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  for (size_t k = 1; k <= need; ++k) {
    const bool ok =
        i + k < s.size() && b(k) >= (k == 1 ? lo : 0x80) && b(k) <= (k == 1 ? hi : 0xBF);
    if (!ok) {
      bad = k;
      return 0;
    }
  }
  return need + 1;
}
}  // namespace

Char char_at(std::string_view s, size_t i) {
  size_t bad;
  const size_t len = utf8_length(s, i, bad);
  const auto b = [&](size_t k) { return char32_t{static_cast<uint8_t>(s[i + k])}; };
  switch (len) {
    case 1:
      return {b(0), 1};
    case 2:
      return {(b(0) & 0x1F) << 6 | (b(1) & 0x3F), 2};
    case 3:
      return {(b(0) & 0x0F) << 12 | (b(1) & 0x3F) << 6 | (b(2) & 0x3F), 3};
    case 4:
      return {(b(0) & 0x07) << 18 | (b(1) & 0x3F) << 12 | (b(2) & 0x3F) << 6 | (b(3) & 0x3F), 4};
    default:
      return {kByteMarker + b(0), 1};
  }
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | cp >> 6);
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | cp >> 12);
    out += static_cast<char>(0x80 | (cp >> 6 & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < kByteMarker) {
    out += static_cast<char>(0xF0 | cp >> 18);
    out += static_cast<char>(0x80 | (cp >> 12 & 0x3F));
    out += static_cast<char>(0x80 | (cp >> 6 & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(cp - kByteMarker);
  }
}

std::string from_utf8_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t i = 0; i < bytes.size();) {
    size_t bad;
    const size_t len = utf8_length(bytes, i, bad);
    if (len) {
      out.append(bytes.substr(i, len));
      i += len;
    } else {
      out += "\xEF\xBF\xBD";  // U+FFFD
      i += bad;
    }
  }
  return out;
}

bool is_valid_utf8(std::string_view bytes) {
  for (size_t i = 0; i < bytes.size();) {
    size_t bad;
    const size_t len = utf8_length(bytes, i, bad);
    if (!len) return false;
    i += len;
  }
  return true;
}

// ---- Character classes and NFC ----

uint8_t flags(char32_t cp) {
  if (cp >= kByteMarker) return 0;
  return lookup(kClassStarts, cp)->flags;
}

std::string nfc(std::string_view text) {
  if (std::all_of(text.begin(), text.end(), [](char c) { return (c & 0x80) == 0; }))
    return std::string(text);  // ASCII is in every normal form
  // Canonical decomposition, then canonical order of each run of non-starters.
  std::u32string d;
  for (char32_t cp : chars_of(text)) {
    if (cp >= kByteMarker) {
      d += cp;
    } else {
      decompose(cp, d);
    }
  }
  for (size_t i = 0; i < d.size();) {
    size_t j = i;
    while (j < d.size() && d[j] < kByteMarker && combining_class(d[j]) != 0) ++j;
    if (j - i > 1)
      std::stable_sort(d.begin() + i, d.begin() + j, [](char32_t a, char32_t b) {
        return combining_class(a) < combining_class(b);
      });
    i = j + 1;
  }
  // Canonical composition: a character joins the last starter unless blocked (a character
  // between them of class 0 or of a class not below its own).
  std::u32string out;
  size_t starter = std::u32string::npos;
  int last_class = 0;
  for (char32_t cp : d) {
    const int cc = cp < kByteMarker ? combining_class(cp) : 0;
    if (starter != std::u32string::npos && cp < kByteMarker) {
      const bool adjacent = out.size() == starter + 1;
      if (adjacent || (last_class != 0 && last_class < cc)) {
        if (const char32_t composite = compose(out[starter], cp)) {
          out[starter] = composite;
          continue;
        }
      }
    }
    if (cc == 0) starter = cp < kByteMarker ? out.size() : std::u32string::npos;
    out += cp;
    last_class = cc;
  }
  std::string s;
  s.reserve(text.size());
  for (char32_t cp : out) append_utf8(s, cp);
  return s;
}

// ---- Regex splitters ----

namespace {

constexpr std::string_view kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr std::string_view kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|)"
    R"( ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|)"
    R"( ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// The text as characters with their classes; the splitters work on character indices.
struct Text {
  std::u32string cp;
  std::vector<uint8_t> cls;
  size_t size() const { return cp.size(); }
  bool is(size_t i, uint8_t flag) const { return i < cp.size() && (cls[i] & flag); }
  // Neither space, letter nor number: [^\s\p{L}\p{N}].
  bool other(size_t i) const { return i < cp.size() && !(cls[i] & (kSpace | kLetter | kNumber)); }
  // The end of the run of characters with `flag` (or of `other` ones when flag is 0) from i.
  size_t run(size_t i, uint8_t flag) const {
    while (flag ? is(i, flag) : other(i)) ++i;
    return i;
  }
};

// The contractions 's 't 're 've 'm 'll 'd at i: the end of the match, or i. Case-insensitive
// folds as Oniguruma does: S and the long s (U+017F) match s.
size_t contraction(const Text& t, size_t i, bool ignore_case) {
  if (t.cp[i] != U'\'' || i + 1 >= t.size()) return i;
  const auto lower = [&](size_t k) -> char32_t {
    if (k >= t.size()) return 0;
    const char32_t c = t.cp[k];
    if (!ignore_case) return c;
    if (c == 0x17F) return U's';
    return c >= U'A' && c <= U'Z' ? c + 32 : c;
  };
  switch (lower(i + 1)) {
    case U's':
    case U't':
    case U'm':
    case U'd':
      return i + 2;
    case U'r':
    case U'v':
      return lower(i + 2) == U'e' ? i + 3 : i;
    case U'l':
      return lower(i + 2) == U'l' ? i + 3 : i;
    default:
      return i;
  }
}

// \s+(?!\S)|\s+ at i (a space): the run, less its last space when a non-space follows it and
// the run has more than one.
size_t spaces(const Text& t, size_t i) {
  const size_t end = t.run(i, kSpace);
  return (end < t.size() && end - i > 1) ? end - 1 : end;
}

// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
size_t gpt2_match(const Text& t, size_t i) {
  if (const size_t end = contraction(t, i, false); end > i) return end;
  const size_t start = t.cp[i] == U' ' && i + 1 < t.size() && !t.is(i + 1, kSpace) ? i + 1 : i;
  if (t.is(start, kLetter)) return t.run(start, kLetter);
  if (t.is(start, kNumber)) return t.run(start, kNumber);
  if (t.other(start)) return t.run(start, 0);
  return spaces(t, i);
}

// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
// \s*[\r\n]+|\s+(?!\S)|\s+   (Qwen2: \p{N} instead of \p{N}{1,3})
size_t llama3_match(const Text& t, size_t i, size_t max_digits) {
  const auto newline = [&](size_t k) { return t.cp[k] == U'\r' || t.cp[k] == U'\n'; };
  if (const size_t end = contraction(t, i, true); end > i) return end;
  if (t.is(i, kLetter)) return t.run(i, kLetter);
  if (!newline(i) && !t.is(i, kNumber) && t.is(i + 1, kLetter)) return t.run(i + 1, kLetter);
  if (t.is(i, kNumber)) {
    size_t end = i;
    while (end - i < max_digits && t.is(end, kNumber)) ++end;
    return end;
  }
  const size_t start = t.cp[i] == U' ' && t.other(i + 1) ? i + 1 : i;
  if (t.other(start)) {
    size_t end = t.run(start, 0);
    while (end < t.size() && newline(end)) ++end;
    return end;
  }
  // \s*[\r\n]+: the spaces up to the last line break among them.
  const size_t end = t.run(i, kSpace);
  for (size_t k = end; k > i; --k)
    if (newline(k - 1)) return k;
  return spaces(t, i);
}

}  // namespace

std::optional<Pattern> find_pattern(std::string_view regex) {
  for (Pattern p : {Pattern::kGpt2, Pattern::kLlama3, Pattern::kQwen2})
    if (regex == pattern_regex(p)) return p;
  return std::nullopt;
}

std::string_view pattern_regex(Pattern p) {
  switch (p) {
    case Pattern::kGpt2:
      return kGpt2Regex;
    case Pattern::kLlama3:
      return kLlama3Regex;
    case Pattern::kQwen2:
      return kQwen2Regex;
  }
  return {};
}

std::vector<size_t> split(std::string_view text, Pattern p) {
  Text t;
  std::vector<size_t> offsets;  // byte offset of each character, and of the end
  for (size_t i = 0; i < text.size();) {
    const Char c = char_at(text, i);
    t.cp += c.cp;
    t.cls.push_back(flags(c.cp));
    offsets.push_back(i);
    i += c.len;
  }
  offsets.push_back(text.size());
  std::vector<size_t> ends;
  for (size_t i = 0; i < t.size();) {
    i = p == Pattern::kGpt2 ? gpt2_match(t, i) : llama3_match(t, i, p == Pattern::kLlama3 ? 3 : 1);
    ends.push_back(offsets[i]);
  }
  return ends;
}

}  // namespace kiln::llm::unicode

namespace kiln::llm::pretokenize {

namespace {
// The byte-level alphabet: the printable bytes stand for themselves, the others take the code
// points from U+0100 on, in order.
const std::array<std::string, 256>& byte_chars() {
  static const auto table = [] {
    std::array<std::string, 256> t;
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      unicode::append_utf8(t[b], printable ? char32_t(b) : next++);
    }
    return t;
  }();
  return table;
}

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size()))
    s.replace(at, from.size(), to);
}
}  // namespace

int char_byte(char32_t c) {
  static const auto table = [] {
    std::array<int, 0x144> t;  // the alphabet ends at U+0143
    t.fill(-1);
    for (int b = 0; b < 256; ++b) t[unicode::char_at(byte_chars()[b], 0).cp] = b;
    return t;
  }();
  return c < table.size() ? table[c] : -1;
}

void PreTokenizer::apply(const Word& w, std::vector<Word>& out) const {
  std::string s = w.text;
  if (kind == kByteLevel && add_prefix_space && !s.empty() && s[0] != ' ') s.insert(0, " ");
  if (kind == kMetaspace) {
    replace_all(s, " ", replacement);
    const bool prepend = scheme == Scheme::kAlways || (scheme == Scheme::kFirst && w.first);
    if (prepend && !s.empty() && s.compare(0, replacement.size(), replacement) != 0)
      s.insert(0, replacement);
  }
  std::vector<size_t> ends;
  if (kind == kSplit || (kind == kByteLevel && use_regex)) {
    ends = unicode::split(s, pattern);
  } else if (kind == kMetaspace && split) {  // each replacement starts a piece
    for (size_t at = s.find(replacement, 1); at != std::string::npos;
         at = s.find(replacement, at + 1))
      ends.push_back(at);
    ends.push_back(s.size());
  } else {
    ends.push_back(s.size());
  }
  size_t begin = 0;
  for (size_t end : ends) {
    if (end == begin) continue;
    std::string piece = s.substr(begin, end - begin);
    if (kind == kByteLevel) {
      std::string mapped;
      for (unsigned char b : piece) mapped += byte_chars()[b];
      piece = std::move(mapped);
    }
    out.push_back({std::move(piece), w.first && begin == 0});
    begin = end;
  }
}

}  // namespace kiln::llm::pretokenize
