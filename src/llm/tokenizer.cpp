// tokenizer.json BPE tokenizers (include/kiln/tokenizer.h): the file's components, and encode and
// decode through them in the order and with the rules of the `tokenizers` library: added tokens,
// normalizers, pre-tokenizers, BPE, post-processor; decoders. The text side (UTF-8, character
// classes, NFC, the regex splitters, the pre-tokenizers) is in tokenizer_pretokenize.cpp.
#include "kiln/tokenizer.h"

#include <fmt/format.h>

#include <array>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <queue>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "kiln/error.h"
#include "llm/unicode.h"

namespace kiln::llm {

namespace {
using nlohmann::json;
using pretokenize::PreTokenizer;
using pretokenize::Scheme;
using pretokenize::Word;

constexpr int64_t kMaxId = (int64_t{1} << 31) - 1;

// Maps keyed by std::string that also look up a std::string_view.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
template <typename V> using StringMap =
    std::unordered_map<std::string, V, StringHash, std::equal_to<>>;

std::string brief(const json& j) {
  std::string s = j.dump();
  return s.size() > 60 ? s.substr(0, 57) + "..." : s;
}

// A value of the file and where it is ("model.merges[3]"), for the errors.
struct Node {
  const json& j;
  std::string path;
  const std::string& label;

  template <typename... Args>
  [[noreturn]] void bad(fmt::format_string<Args...> f, Args&&... args) const {
    throw FormatError(fmt::format("[tokenizer] {}: '{}' {}", label, path,
                                  fmt::format(f, std::forward<Args>(args)...)));
  }
  // `what` (e.g. "pre_tokenizer type 'Digits'") is not supported; `supported` lists what is.
  [[noreturn]] void unsupported(const std::string& what, std::string_view supported) const {
    throw UnsupportedError(
        fmt::format("[tokenizer] {}: {} at '{}' is not supported (supported: {})", label, what,
                    path, supported));
  }
  bool null() const { return j.is_null(); }
  // A member (null when absent).
  Node operator[](const char* key) const {
    static const json kNull;
    if (!j.is_object()) bad("is {}, not an object", brief(j));
    const auto it = j.find(key);
    return {it == j.end() ? kNull : *it, path.empty() ? key : path + "." + key, label};
  }
  std::vector<Node> items() const {
    if (!j.is_array()) bad("is {}, not a list", brief(j));
    std::vector<Node> out;
    for (size_t i = 0; i < j.size(); ++i)
      out.push_back({j[i], fmt::format("{}[{}]", path, i), label});
    return out;
  }
  std::string string() const {
    if (!j.is_string()) bad("is {}, not a string", brief(j));
    return j.get<std::string>();
  }
  // A string of one character (a Metaspace replacement, a Strip content).
  std::string character() const {
    const std::string s = string();
    if (s.empty() || unicode::char_at(s, 0).len != s.size()) bad("is '{}', not one character", s);
    return s;
  }
  bool boolean(bool fallback) const {
    if (null()) return fallback;
    if (!j.is_boolean()) bad("is {}, not true or false", brief(j));
    return j.get<bool>();
  }
  int64_t integer(int64_t lo, int64_t hi) const {
    if (!j.is_number_integer() || j.get<int64_t>() < lo || j.get<int64_t>() > hi)
      bad("is {}, not an integer in [{}, {}]", brief(j), lo, hi);
    return j.get<int64_t>();
  }
  int64_t id() const { return integer(0, kMaxId); }
  std::string type() const { return (*this)["type"].string(); }
};

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size()))
    s.replace(at, from.size(), to);
}

bool starts_with(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

// The text of a {"String": ...} pattern (Replace normalizer and decoder).
std::string string_pattern(const Node& n, std::string_view owner) {
  if (!n["Regex"].null())
    n.unsupported(fmt::format("{} with a Regex pattern", owner), "String patterns");
  const std::string s = n["String"].string();
  if (s.empty()) n["String"].bad("is empty");
  return s;
}

// ---- Normalizers ----

struct Normalizer {
  enum Kind { kNfc, kPrepend, kReplace } kind;
  std::string a, b;  // Prepend: a; Replace: a by b

  void apply(std::string& s) const {
    switch (kind) {
      case kNfc:
        s = unicode::nfc(s);
        break;
      case kPrepend:
        if (!s.empty()) s.insert(0, a);
        break;
      case kReplace:
        replace_all(s, a, b);
        break;
    }
  }
};

void parse_normalizer(const Node& n, std::vector<Normalizer>& out) {
  if (n.null()) return;
  const std::string type = n.type();
  if (type == "Sequence") {
    for (const Node& c : n["normalizers"].items()) parse_normalizer(c, out);
  } else if (type == "NFC") {
    out.push_back({Normalizer::kNfc, {}, {}});
  } else if (type == "Prepend") {
    out.push_back({Normalizer::kPrepend, n["prepend"].string(), {}});
  } else if (type == "Replace") {
    out.push_back(
        {Normalizer::kReplace, string_pattern(n["pattern"], "Replace"), n["content"].string()});
  } else {
    n.unsupported(fmt::format("normalizer type '{}'", type), "Sequence, NFC, Prepend, Replace");
  }
}

// ---- Pre-tokenizers ----

Scheme parse_scheme(const Node& n) {
  if (n["prepend_scheme"].null())
    return n["add_prefix_space"].boolean(true) ? Scheme::kAlways : Scheme::kNever;
  const std::string s = n["prepend_scheme"].string();
  if (s == "always") return Scheme::kAlways;
  if (s == "first") return Scheme::kFirst;
  if (s == "never") return Scheme::kNever;
  n["prepend_scheme"].bad("is '{}', not first, always or never", s);
}

std::string supported_patterns() {
  std::string s;
  for (auto p : {unicode::Pattern::kGpt2, unicode::Pattern::kLlama3, unicode::Pattern::kQwen2})
    s += fmt::format("{}'{}'", s.empty() ? "" : ", ", unicode::pattern_regex(p));
  return s;
}

void parse_pre_tokenizer(const Node& n, std::vector<PreTokenizer>& out) {
  if (n.null()) return;
  const std::string type = n.type();
  PreTokenizer p;
  if (type == "Sequence") {
    for (const Node& c : n["pretokenizers"].items()) parse_pre_tokenizer(c, out);
    return;
  } else if (type == "ByteLevel") {
    p.add_prefix_space = n["add_prefix_space"].boolean(true);
    p.use_regex = n["use_regex"].boolean(true);
  } else if (type == "Split") {
    p.kind = PreTokenizer::kSplit;
    const Node pattern = n["pattern"];
    if (!pattern["String"].null()) n.unsupported("Split with a String pattern", "Regex patterns");
    const std::string regex = pattern["Regex"].string();
    const auto known = unicode::find_pattern(regex);
    if (!known) n.unsupported(fmt::format("Split pattern '{}'", regex), supported_patterns());
    p.pattern = *known;
    const std::string behavior = n["behavior"].string();
    if (behavior != "Isolated")
      n.unsupported(fmt::format("Split behavior '{}'", behavior), "Isolated");
    if (n["invert"].boolean(false)) n.unsupported("Split with invert true", "invert false");
  } else if (type == "Metaspace") {
    p.kind = PreTokenizer::kMetaspace;
    p.replacement = n["replacement"].character();
    p.scheme = parse_scheme(n);
    p.split = n["split"].boolean(true);
  } else {
    n.unsupported(fmt::format("pre_tokenizer type '{}'", type),
                  "Sequence, ByteLevel, Split, Metaspace");
  }
  out.push_back(std::move(p));
}

// ---- BPE ----

struct Merge {
  int32_t rank;
  int64_t id;  // of the merged token
};

struct Bpe {
  StringMap<int64_t> vocab;
  std::unordered_map<uint64_t, Merge> merges;  // by left id << 32 | right id
  std::array<int64_t, 256> byte_ids;           // <0xNN> tokens (-1 where absent)
  std::optional<std::string> unk_token;
  std::string prefix, suffix;  // continuing_subword_prefix, end_of_word_suffix
  bool fuse_unk = false, byte_fallback = false, ignore_merges = false;
  std::string label;

  const Merge* merge(int64_t left, int64_t right) const {
    const auto it = merges.find(uint64_t(left) << 32 | uint64_t(right));
    return it == merges.end() ? nullptr : &it->second;
  }

  // Appends the ids of one pre-token: its characters (with the affixes; unknown ones as byte
  // tokens or unk_token), merged pair by pair, the pair of lowest rank first (the leftmost among
  // equals) as tokenizers' BPE::merge_word.
  void tokenize(std::string_view word, std::vector<int64_t>& ids) const {
    if (word.empty()) return;
    if (ignore_merges) {
      if (const auto it = vocab.find(word); it != vocab.end()) {
        ids.push_back(it->second);
        return;
      }
    }
    struct Symbol {
      int64_t id;
      int prev, next;  // neighbours still there (-1: none)
      bool gone;
    };
    std::vector<Symbol> symbols;
    const auto add = [&](int64_t id) {
      const int n = static_cast<int>(symbols.size());
      symbols.push_back({id, n - 1, n + 1, false});
    };
    int64_t unk = -1;  // the unk_token of an unknown run not added yet (fuse_unk joins them)
    for (size_t i = 0; i < word.size();) {
      const size_t len = unicode::char_at(word, i).len;
      std::string s = i > 0 ? prefix : std::string();
      s.append(word.substr(i, len));
      i += len;
      if (i == word.size()) s += suffix;
      if (const auto it = vocab.find(s); it != vocab.end()) {
        if (unk >= 0) add(unk);
        unk = -1;
        add(it->second);
        continue;
      }
      if (byte_fallback &&
          std::all_of(s.begin(), s.end(), [&](char b) { return byte_ids[uint8_t(b)] >= 0; })) {
        for (char b : s) add(byte_ids[uint8_t(b)]);  // (a pending unk comes after, as tokenizers)
        continue;
      }
      if (!unk_token) continue;  // no unk_token: the character is dropped
      const auto it = vocab.find(*unk_token);
      if (it == vocab.end())
        throw ValueError(fmt::format("[tokenizer] {}: unk_token '{}' is not in the vocabulary",
                                     label, *unk_token));
      if (unk >= 0 && !fuse_unk) add(unk);
      unk = it->second;
    }
    if (unk >= 0) add(unk);
    if (symbols.empty()) return;
    symbols.back().next = -1;

    struct Candidate {
      int32_t rank;
      int pos;
      int64_t id;
      bool operator<(const Candidate& o) const {  // priority: lowest rank, then leftmost
        return rank != o.rank ? rank > o.rank : pos > o.pos;
      }
    };
    std::priority_queue<Candidate> queue;
    const auto push = [&](int pos) {
      const int next = symbols[pos].next;
      if (next < 0) return;
      if (const Merge* m = merge(symbols[pos].id, symbols[next].id))
        queue.push({m->rank, pos, m->id});
    };
    for (int i = 0; i + 1 < static_cast<int>(symbols.size()); ++i) push(i);
    while (!queue.empty()) {
      const Candidate top = queue.top();
      queue.pop();
      Symbol& left = symbols[top.pos];
      if (left.gone || left.next < 0) continue;
      Symbol& right = symbols[left.next];
      const Merge* m = merge(left.id, right.id);
      if (!m || m->id != top.id) continue;  // stale: a neighbour changed since
      left.id = top.id;
      right.gone = true;
      left.next = right.next;
      if (left.next >= 0) symbols[left.next].prev = top.pos;
      if (left.prev >= 0) push(left.prev);
      push(top.pos);
    }
    for (const Symbol& s : symbols)
      if (!s.gone) ids.push_back(s.id);
  }
};

Bpe parse_model(const Node& n) {
  const std::string type = n["type"].null() && !n["merges"].null() ? "BPE" : n.type();
  if (type != "BPE") n.unsupported(fmt::format("model type '{}'", type), "BPE");
  const Node dropout = n["dropout"];
  if (!dropout.null() && !(dropout.j.is_number() && dropout.j.get<double>() == 0))
    n.unsupported(fmt::format("BPE dropout {}", brief(dropout.j)), "null or 0");
  Bpe bpe;
  bpe.label = n.label;
  const Node vocab = n["vocab"];
  if (!vocab.j.is_object()) vocab.bad("is {}, not an object", brief(vocab.j));
  for (const auto& [token, id] : vocab.j.items())
    bpe.vocab.emplace(token, Node{id, vocab.path + "." + token, n.label}.id());
  if (!n["unk_token"].null()) bpe.unk_token = n["unk_token"].string();
  if (!n["continuing_subword_prefix"].null()) bpe.prefix = n["continuing_subword_prefix"].string();
  if (!n["end_of_word_suffix"].null()) bpe.suffix = n["end_of_word_suffix"].string();
  bpe.fuse_unk = n["fuse_unk"].boolean(false);
  bpe.byte_fallback = n["byte_fallback"].boolean(false);
  bpe.ignore_merges = n["ignore_merges"].boolean(false);
  for (int b = 0; b < 256; ++b) {
    const auto it = bpe.vocab.find(fmt::format("<0x{:02X}>", b));
    bpe.byte_ids[b] = it == bpe.vocab.end() ? -1 : it->second;
  }
  const auto id_of = [&](const Node& where, const std::string& token) {
    const auto it = bpe.vocab.find(token);
    if (it == bpe.vocab.end()) where.bad("merges '{}', which is not in the vocabulary", token);
    return it->second;
  };
  const std::vector<Node> merges = n["merges"].null() ? std::vector<Node>{} : n["merges"].items();
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const Node& m = merges[rank];
    std::string a, b;
    if (m.j.is_string()) {  // "a b"
      const std::string s = m.string();
      const size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos)
        m.bad("is '{}', not two tokens separated by a space", s);
      a = s.substr(0, space);
      b = s.substr(space + 1);
    } else {  // ["a", "b"]
      const std::vector<Node> pair = m.items();
      if (pair.size() != 2) m.bad("is {}, not a pair of tokens", brief(m.j));
      a = pair[0].string();
      b = pair[1].string();
    }
    if (b.size() < bpe.prefix.size())
      m.bad("'{}' is shorter than the continuing_subword_prefix", b);
    const Merge merge{static_cast<int32_t>(rank), id_of(m, a + b.substr(bpe.prefix.size()))};
    // (a pair listed twice keeps its later rank, as tokenizers' map of merges does)
    bpe.merges[uint64_t(id_of(m, a)) << 32 | uint64_t(id_of(m, b))] = merge;
  }
  return bpe;
}

// ---- Added tokens ----

struct AddedToken {
  std::string content;
  int64_t id = 0;
  bool single_word = false, lstrip = false, rstrip = false, normalized = false, special = false;
};

// A part of the text: an added token (id >= 0) or text for the model (id -1).
struct Span {
  size_t begin, end;
  int64_t id;
};

// Finds added tokens in a text, leftmost first and the longest there, as the Aho-Corasick
// automaton (MatchKind::LeftmostLongest) of tokenizers' AddedVocabulary.
struct AddedMatcher {
  std::vector<std::pair<std::string, const AddedToken*>> patterns;
  std::array<std::vector<size_t>, 256> by_first_byte;  // indices of patterns, the longest first

  void add(std::string pattern, const AddedToken* token) {
    if (!pattern.empty()) patterns.emplace_back(std::move(pattern), token);
  }
  void build() {
    for (size_t i = 0; i < patterns.size(); ++i)
      by_first_byte[uint8_t(patterns[i].first[0])].push_back(i);
    for (auto& list : by_first_byte)
      std::stable_sort(list.begin(), list.end(), [&](size_t x, size_t y) {
        return patterns[x].first.size() > patterns[y].first.size();
      });
  }

  // tokenizers' AddedVocabulary::find_matches: the text cut into added tokens and the rest.
  std::vector<Span> split(std::string_view text) const {
    if (patterns.empty()) return {{0, text.size(), -1}};
    const auto is_space = [&](size_t i) {
      return unicode::flags(unicode::char_at(text, i).cp) & unicode::kSpace;
    };
    const auto char_before = [&](size_t i) {  // the start of the character that ends at i
      size_t k = i - 1;
      while (k > 0 && i - k < 4 && (text[k] & 0xC0) == 0x80) --k;
      return unicode::char_at(text, k).len == i - k ? k : i - 1;
    };
    std::vector<Span> spans;
    size_t done = 0;  // the end of the last span
    for (size_t pos = 0; pos < text.size();) {
      const AddedToken* token = nullptr;
      size_t len = 0;
      for (size_t i : by_first_byte[uint8_t(text[pos])]) {
        if (text.compare(pos, patterns[i].first.size(), patterns[i].first) == 0) {
          token = patterns[i].second;
          len = patterns[i].first.size();
          break;
        }
      }
      if (!token) {
        ++pos;
        continue;
      }
      size_t start = pos, stop = pos + len;
      pos = stop;
      if (token->single_word) {
        const auto word = [&](size_t i) {
          return unicode::flags(unicode::char_at(text, i).cp) & unicode::kWord;
        };
        if ((start > 0 && word(char_before(start))) || (stop < text.size() && word(stop))) continue;
      }
      if (token->lstrip) {
        while (start > 0 && is_space(char_before(start))) start = char_before(start);
        start = std::max(start, done);
      }
      if (token->rstrip)
        while (stop < text.size() && is_space(stop)) stop += unicode::char_at(text, stop).len;
      if (done < start) spans.push_back({done, start, -1});
      spans.push_back({start, stop, token->id});
      done = stop;
    }
    if (done < text.size()) spans.push_back({done, text.size(), -1});
    return spans;
  }
};

// ---- Post-processors ----

// A TemplateProcessing's "single": the ids of its special tokens, and nullopt for $A.
using Template = std::vector<std::optional<std::vector<int64_t>>>;

void parse_post_processor(const Node& n, std::vector<Template>& out) {
  if (n.null()) return;
  const std::string type = n.type();
  if (type == "Sequence") {
    for (const Node& c : n["processors"].items()) parse_post_processor(c, out);
  } else if (type == "TemplateProcessing") {
    Template t;
    const Node specials = n["special_tokens"];
    for (const Node& item : n["single"].items()) {
      if (const Node seq = item["Sequence"]; !seq.null()) {
        if (seq["id"].string() != "A")
          seq["id"].bad("is '{}': the single template takes $A", seq["id"].string());
        t.push_back(std::nullopt);
        continue;
      }
      const Node name = item["SpecialToken"]["id"];
      const Node special = specials[name.string().c_str()];
      if (special.null()) name.bad("is '{}', which is not in '{}'", name.string(), specials.path);
      std::vector<int64_t> ids;
      for (const Node& id : special["ids"].items()) ids.push_back(id.id());
      t.push_back(std::move(ids));
    }
    out.push_back(std::move(t));
  } else if (type != "ByteLevel") {  // ByteLevel only trims offsets
    n.unsupported(fmt::format("post_processor type '{}'", type),
                  "Sequence, ByteLevel, TemplateProcessing");
  }
}

// ---- Decoders ----

struct Decoder {
  enum Kind { kByteLevel, kMetaspace, kReplace, kByteFallback, kFuse, kStrip } kind = kByteLevel;
  std::string a, b;  // Replace: a by b; Metaspace: a, the replacement; Strip: a, the content
  size_t start = 0, stop = 0;
  Scheme scheme = Scheme::kAlways;

  std::vector<std::string> apply(std::vector<std::string> tokens) const;
};

// The byte of a "<0xNN>" token, or -1.
int byte_token(std::string_view t) {
  if (t.size() != 6 || !starts_with(t, "<0x") || t[5] != '>') return -1;
  unsigned v = 0;
  const auto [end, error] = std::from_chars(t.data() + 3, t.data() + 5, v, 16);
  return error == std::errc() && end == t.data() + 5 ? int(v) : -1;
}

std::vector<std::string> Decoder::apply(std::vector<std::string> tokens) const {
  std::vector<std::string> out;
  switch (kind) {
    case kByteLevel: {  // a token of other characters stays as it is
      std::string bytes;
      for (const std::string& t : tokens) {
        std::string mapped;
        size_t i = 0;
        while (i < t.size()) {
          const unicode::Char c = unicode::char_at(t, i);
          const int b = pretokenize::char_byte(c.cp);
          if (b < 0) break;
          mapped += char(b);
          i += c.len;
        }
        bytes += i == t.size() ? mapped : t;
      }
      return {unicode::from_utf8_lossy(bytes)};
    }
    case kByteFallback: {  // runs of byte tokens become their text, or U+FFFD per byte if invalid
      std::string run;
      size_t run_len = 0;
      const auto flush = [&] {
        if (run_len == 0) return;
        if (unicode::is_valid_utf8(run)) {
          out.push_back(run);
        } else {
          for (size_t i = 0; i < run_len; ++i) out.push_back("\xEF\xBF\xBD");
        }
        run.clear();
        run_len = 0;
      };
      for (std::string& t : tokens) {
        if (const int b = byte_token(t); b >= 0) {
          run += char(b);
          ++run_len;
        } else {
          flush();
          out.push_back(std::move(t));
        }
      }
      flush();
      return out;
    }
    case kFuse: {
      std::string all;
      for (const std::string& t : tokens) all += t;
      return {all};
    }
    default:
      break;
  }
  for (size_t k = 0; k < tokens.size(); ++k) {
    std::string& t = tokens[k];
    if (kind == kReplace) {
      replace_all(t, a, b);
    } else if (kind == kMetaspace) {  // every replacement of the first token goes, unless "never"
      replace_all(t, a, k == 0 && scheme != Scheme::kNever ? "" : " ");
    } else if (kind == kStrip) {  // up to `start` contents at the front, `stop` at the back
      std::vector<size_t> at;     // character starts
      for (size_t i = 0; i < t.size(); i += unicode::char_at(t, i).len) at.push_back(i);
      at.push_back(t.size());
      const size_t n = at.size() - 1;
      const auto is_content = [&](size_t c) { return t.compare(at[c], at[c + 1] - at[c], a) == 0; };
      size_t first = 0, last = n;
      while (first < std::min(start, n) && is_content(first)) ++first;
      while (n - last < std::min(stop, n) && is_content(last - 1)) --last;
      t = first < last ? t.substr(at[first], at[last] - at[first]) : std::string();
    }
  }
  return tokens;
}

void parse_decoder(const Node& n, std::vector<Decoder>& out) {
  const std::string type = n.type();
  Decoder d;
  if (type == "Sequence") {
    for (const Node& c : n["decoders"].items()) parse_decoder(c, out);
    return;
  } else if (type == "ByteLevel") {
  } else if (type == "ByteFallback") {
    d.kind = Decoder::kByteFallback;
  } else if (type == "Fuse") {
    d.kind = Decoder::kFuse;
  } else if (type == "Replace") {
    d.kind = Decoder::kReplace;
    d.a = string_pattern(n["pattern"], "Replace");
    d.b = n["content"].string();
  } else if (type == "Strip") {
    d.kind = Decoder::kStrip;
    d.a = n["content"].character();
    d.start = size_t(n["start"].integer(0, kMaxId));
    d.stop = size_t(n["stop"].integer(0, kMaxId));
  } else if (type == "Metaspace") {
    d.kind = Decoder::kMetaspace;
    d.a = n["replacement"].character();
    d.scheme = parse_scheme(n);
  } else {
    n.unsupported(fmt::format("decoder type '{}'", type),
                  "Sequence, ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip");
  }
  out.push_back(std::move(d));
}

}  // namespace

// ---- Tokenizer ----

struct Tokenizer::Impl {
  std::string label;
  Bpe bpe;
  std::vector<AddedToken> added;
  StringMap<int64_t> added_ids;
  AddedMatcher raw, normalized;  // added tokens matched before / after normalization
  std::vector<Normalizer> normalizers;
  std::vector<PreTokenizer> pre_tokenizers;
  std::optional<std::vector<Decoder>> decoders;  // none: tokens joined by spaces
  std::vector<Template> templates;
  std::vector<std::string> tokens;        // by id
  std::vector<uint8_t> present, special;  // whether an id has a token; is a special added token

  std::string normalize(std::string s) const {
    for (const Normalizer& n : normalizers) n.apply(s);
    return s;
  }
};

Tokenizer::Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}

Tokenizer Tokenizer::load(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    throw IoError(fmt::format("[tokenizer] cannot read {}: not a regular file", path));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError(fmt::format("[tokenizer] cannot read {}", path));
  std::stringstream text;
  text << in.rdbuf();
  if (in.bad()) throw IoError(fmt::format("[tokenizer] cannot read {}", path));
  return parse(text.str(), path);
}

Tokenizer Tokenizer::parse(const std::string& text, const std::string& label) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    throw FormatError(fmt::format("[tokenizer] {}: not valid JSON ({})", label, e.what()));
  }
  if (!j.is_object()) throw FormatError(fmt::format("[tokenizer] {}: not a JSON object", label));
  const Node root{j, "", label};
  auto m = std::make_shared<Impl>();
  m->label = label;
  if (root["model"].null()) root["model"].bad("is missing");
  m->bpe = parse_model(root["model"]);
  parse_normalizer(root["normalizer"], m->normalizers);
  parse_pre_tokenizer(root["pre_tokenizer"], m->pre_tokenizers);
  parse_post_processor(root["post_processor"], m->templates);
  if (!root["decoder"].null()) parse_decoder(root["decoder"], m->decoders.emplace());

  const Node added = root["added_tokens"];
  for (const Node& t : added.null() ? std::vector<Node>{} : added.items()) {
    AddedToken a;
    a.content = t["content"].string();
    a.id = t["id"].id();
    a.special = t["special"].boolean(false);
    a.single_word = t["single_word"].boolean(false);
    a.lstrip = t["lstrip"].boolean(false);
    a.rstrip = t["rstrip"].boolean(false);
    a.normalized = t["normalized"].boolean(!a.special);
    if (!a.content.empty()) m->added.push_back(std::move(a));
  }
  // Special tokens are matched before the others (of the same length), as tokenizers orders them.
  std::stable_partition(m->added.begin(), m->added.end(),
                        [](const AddedToken& a) { return a.special; });
  for (const AddedToken& a : m->added) {
    m->added_ids[a.content] = a.id;
    if (a.normalized) {
      m->normalized.add(m->normalize(a.content), &a);
    } else {
      m->raw.add(a.content, &a);
    }
  }
  m->raw.build();
  m->normalized.build();

  int64_t size = 0;
  for (const auto& [token, id] : m->bpe.vocab) size = std::max(size, id + 1);
  for (const AddedToken& a : m->added) size = std::max(size, a.id + 1);
  m->tokens.resize(size);
  m->present.resize(size);
  m->special.resize(size);
  for (const auto& [token, id] : m->bpe.vocab) {  // (an id given twice: its smallest token)
    if (!m->present[id] || token < m->tokens[id]) m->tokens[id] = token;
    m->present[id] = 1;
  }
  std::unordered_set<std::string> specials;
  for (const AddedToken& a : m->added) {
    // decode (and id_to_token) give a normalized token as the normalizer writes it, as tokenizers
    m->tokens[a.id] = a.normalized ? m->normalize(a.content) : a.content;
    m->present[a.id] = 1;
    if (a.special) specials.insert(a.content);
  }
  for (int64_t id = 0; id < size; ++id)
    m->special[id] = m->present[id] && specials.count(m->tokens[id]);
  return Tokenizer(std::move(m));
}

std::vector<int64_t> Tokenizer::encode(const std::string& text, bool add_special_tokens) const {
  const Impl& m = *impl_;
  std::vector<int64_t> ids;
  // Added tokens in the text, then in each normalized piece; the rest goes through the
  // pre-tokenizers to the model.
  for (const Span& raw : m.raw.split(text)) {
    if (raw.id >= 0) {
      ids.push_back(raw.id);
      continue;
    }
    const std::string normalized = m.normalize(text.substr(raw.begin, raw.end - raw.begin));
    for (const Span& span : m.normalized.split(normalized)) {
      if (span.id >= 0) {
        ids.push_back(span.id);
        continue;
      }
      if (span.begin == span.end) continue;
      std::vector<Word> words{{normalized.substr(span.begin, span.end - span.begin),
                               raw.begin == 0 && span.begin == 0}};
      for (const PreTokenizer& p : m.pre_tokenizers) {
        std::vector<Word> pieces;
        for (const Word& w : words) p.apply(w, pieces);
        words = std::move(pieces);
      }
      for (const Word& w : words) m.bpe.tokenize(w.text, ids);
    }
  }
  if (!add_special_tokens) return ids;
  for (const Template& t : m.templates) {
    std::vector<int64_t> out;
    for (const auto& item : t) {
      const std::vector<int64_t>& part = item ? *item : ids;
      out.insert(out.end(), part.begin(), part.end());
    }
    ids = std::move(out);
  }
  return ids;
}

std::string Tokenizer::decode(const std::vector<int64_t>& ids, bool skip_special_tokens) const {
  const Impl& m = *impl_;
  std::vector<std::string> tokens;
  for (int64_t id : ids) {
    if (id < 0 || id >= vocab_size())
      throw ValueError(fmt::format("[tokenizer] {}: cannot decode id {}: not in [0, {})", m.label,
                                   id, vocab_size()));
    if (m.present[id] && !(skip_special_tokens && m.special[id])) tokens.push_back(m.tokens[id]);
  }
  std::string text;
  if (!m.decoders) {
    for (size_t i = 0; i < tokens.size(); ++i) text += (i ? " " : "") + tokens[i];
    return text;
  }
  for (const Decoder& d : *m.decoders) tokens = d.apply(std::move(tokens));
  for (const std::string& t : tokens) text += t;
  return text;
}

int64_t Tokenizer::vocab_size() const { return static_cast<int64_t>(impl_->tokens.size()); }

std::optional<int64_t> Tokenizer::token_to_id(const std::string& token) const {
  if (const auto it = impl_->added_ids.find(token); it != impl_->added_ids.end()) return it->second;
  if (const auto it = impl_->bpe.vocab.find(token); it != impl_->bpe.vocab.end()) return it->second;
  return std::nullopt;
}

std::string Tokenizer::id_to_token(int64_t id) const {
  if (id < 0 || id >= vocab_size() || !impl_->present[id])
    throw ValueError(fmt::format("[tokenizer] {}: id {} has no token (vocab_size {})", impl_->label,
                                 id, vocab_size()));
  return impl_->tokens[id];
}

}  // namespace kiln::llm
