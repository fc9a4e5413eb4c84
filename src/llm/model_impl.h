// kiln::llm::Model's state (src/llm/model.cpp builds it, src/llm/generate.cpp runs it).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "kiln/executable.h"
#include "kiln/graph.h"
#include "kiln/llm.h"

namespace kiln::llm {

struct Model::Impl {
  Config config;
  std::string dir;
  Device device = Device::cpu();
  DType dtype = f32;
  int64_t max_batch = 1, max_length = 0;
  MemoryUse memory;

  // One graph: the weights and the caches are its variables, shared by both executables.
  Graph graph;
  Tensor tokens;  // (max_batch, T) i64: the tokens of cache columns pos .. pos + T - 1
  Tensor pos;     // (1,) i64: the cache column of the call's first token
  Tensor pad;     // (max_batch,) i64: left-padding columns of each row (keys no query sees)
  std::vector<std::pair<Tensor, Tensor>> caches;  // per layer: keys and values (B, KV, S, D)
  // What a call returns: (max_batch, V) f32 logits after each row's last token, and their argmax.
  struct Heads {
    Tensor logits, argmax;
  };
  Heads decode;   // a step at pos > 0: attention over the cache
  Heads prefill;  // a step at pos 0: attention over the call's own keys (causal)
  std::vector<Tensor> prefill_updates;  // the prefill's cache writes
  Tensor all_logits;                    // (max_batch, T, V) f32 after every prefill position
  // Executables (Model::load compiles both steps and specializes the decode step for (B, 1)):
  // both outputs stay on the device and only the one a call needs is copied back (greedy: B
  // ids, not B x V logits). `score` (Model::logits) is compiled when first needed.
  std::optional<Executable> step, prefill_exe, score;

  /// Runs a step over `tokens` at cache column `pos` (0: a prefill): the logits after each row's
  /// last token (host memory), or with `greedy` each row's most likely next token.
  Array run_step(const Array& tokens, int64_t pos, const Array& pad, bool greedy);
};

namespace detail {
/// The prompt length a call pads to: 16, 32, 64, then multiples of 64, at most `cap`.
int64_t bucket_length(int64_t length, int64_t cap);
/// Throws ValueError for an empty prompt, a token outside [0, vocab_size), or a prompt that with
/// `new_tokens` more does not fit max_length.
void check_prompts(const Model::Impl& m, const std::vector<std::vector<int64_t>>& prompts,
                   int64_t new_tokens);
}  // namespace detail

}  // namespace kiln::llm
