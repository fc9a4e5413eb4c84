// libFuzzer target: arbitrary bytes through the tokenizer.json reader and the tokenizer
// (include/kiln/tokenizer.h). An input is a tokenizer.json, a 0 byte, then a text: the JSON is
// parsed, the text encoded with and without special tokens, and the ids decoded both ways. Any
// kiln::Error is a fine answer; a crash, a sanitizer report, any other exception or an id
// outside the vocabulary is a bug. Seeds: tests/fuzz/tokenizer_corpus
// (tests/fuzz/make_tokenizer_corpus.py).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "kiln/error.h"
#include "kiln/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const char* bytes = reinterpret_cast<const char*>(data);
  const void* zero = std::memchr(data, 0, size);
  const size_t json_size =
      zero ? static_cast<size_t>(static_cast<const uint8_t*>(zero) - data) : size;
  const std::string json(bytes, json_size);
  const std::string text = zero ? std::string(bytes + json_size + 1, size - json_size - 1) : "";
  try {
    const auto tok = kiln::llm::Tokenizer::parse(json, "fuzz");
    for (bool special : {true, false}) {
      const std::vector<int64_t> ids = tok.encode(text, special);
      for (int64_t id : ids)
        if (id < 0 || id >= tok.vocab_size()) std::abort();
      tok.decode(ids, true);
      tok.decode(ids, false);
    }
  } catch (const kiln::Error&) {
  }
  return 0;
}
