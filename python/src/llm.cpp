// kiln._kiln.llm: Hugging Face causal language models (include/kiln/llm.h); the tokenizer is in
// tokenizer.cpp. python/kiln/llm.py wraps them with text in and out.
#include "kiln/llm.h"

#include <nanobind/stl/function.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "common.h"

namespace kiln::py {

void bind_llm(nb::module_& m) {
  nb::module_ l = m.def_submodule("llm", "Causal language models from Hugging Face checkpoints.");
  nb::class_<llm::Config>(l, "Config", "What kiln reads of a model's config.json.")
      .def_ro("model_type", &llm::Config::model_type)
      .def_ro("vocab_size", &llm::Config::vocab_size)
      .def_ro("hidden_size", &llm::Config::hidden_size)
      .def_ro("intermediate_size", &llm::Config::intermediate_size)
      .def_ro("num_layers", &llm::Config::num_layers)
      .def_ro("num_heads", &llm::Config::num_heads)
      .def_ro("num_kv_heads", &llm::Config::num_kv_heads)
      .def_ro("head_dim", &llm::Config::head_dim)
      .def_ro("max_positions", &llm::Config::max_positions)
      .def_ro("tie_word_embeddings", &llm::Config::tie_word_embeddings)
      .def_ro("dtype", &llm::Config::dtype)
      .def_ro("bos_token_id", &llm::Config::bos_token_id)
      .def_ro("eos_token_ids", &llm::Config::eos_token_ids)
      .def_static("load", &llm::Config::load, nb::arg("path"),
                  "Reads PATH/config.json (and generation_config.json's eos ids).");

  nb::class_<llm::Model>(l, "Model",
                         "A decoder-only transformer (Llama family, GPT-2) with a KV cache.")
      .def_static(
          "load",
          [](const std::string& path, std::optional<Device> device, std::optional<DType> dtype,
             int64_t max_batch, int64_t max_length) {
            llm::LoadOptions o;
            o.device = device ? *device : default_device();
            o.dtype = dtype;
            o.max_batch = max_batch;
            o.max_length = max_length;
            nb::gil_scoped_release nogil;
            return llm::Model::load(path, o);
          },
          nb::arg("path"), nb::arg("device") = nb::none(), nb::arg("dtype") = nb::none(),
          nb::arg("max_batch") = 1, nb::arg("max_length") = 0,
          "Loads a checkpoint directory (config.json, model.safetensors or its shards). dtype: "
          "of the weights, cache and products (default: the checkpoint's); max_batch: "
          "sequences decoded together; max_length: positions the cache holds (0: the model's, "
          "at most 4096).")
      .def_prop_ro("config", &llm::Model::config)
      .def_prop_ro("device", &llm::Model::device)
      .def_prop_ro("dtype", &llm::Model::dtype)
      .def_prop_ro("max_batch", &llm::Model::max_batch)
      .def_prop_ro("max_length", &llm::Model::max_length)
      .def_prop_ro(
          "memory",
          [](const llm::Model& model) {
            nb::dict d;
            d["weights"] = model.memory().weights;
            d["cache"] = model.memory().cache;
            return d;
          },
          "Bytes on the device: {'weights': ..., 'cache': ...}.")
      .def(
          "logits",
          [](llm::Model& model, const std::vector<int64_t>& tokens) {
            Array a;
            {
              nb::gil_scoped_release nogil;
              a = model.logits(tokens);
            }
            return to_numpy(a);
          },
          nb::arg("tokens"), "The (len(tokens), vocab) float32 logits after every position.")
      .def(
          "generate",
          [](llm::Model& model, const std::vector<std::vector<int64_t>>& prompts,
             int64_t max_new_tokens, bool greedy, double temperature, int64_t top_k, double top_p,
             double repetition_penalty, uint64_t seed, std::vector<int64_t> stop_tokens,
             std::function<bool(int64_t, int64_t)> on_token) {
            llm::GenerateOptions o;
            o.max_new_tokens = max_new_tokens;
            o.sampling = {greedy, temperature, top_k, top_p, repetition_penalty, seed};
            o.stop_tokens = std::move(stop_tokens);
            if (on_token)  // called with the GIL held; an exception ends the call
              o.on_token = [on_token](int64_t seq, int64_t tok) {
                nb::gil_scoped_acquire gil;
                return on_token(seq, tok);
              };
            llm::Generation g;
            {
              nb::gil_scoped_release nogil;
              g = model.generate(prompts, o);
            }
            nb::dict d;
            d["tokens"] = g.tokens;
            d["prompt_tokens"] = g.prompt_tokens;
            d["new_tokens"] = g.new_tokens;
            d["prefill_seconds"] = g.prefill_seconds;
            d["decode_seconds"] = g.decode_seconds;
            return d;
          },
          nb::arg("prompts"), nb::arg("max_new_tokens") = 128, nb::arg("greedy") = true,
          nb::arg("temperature") = 1.0, nb::arg("top_k") = 0, nb::arg("top_p") = 1.0,
          nb::arg("repetition_penalty") = 1.0, nb::arg("seed") = 0,
          nb::arg("stop_tokens") = std::vector<int64_t>{}, nb::arg("on_token") = nb::none(),
          "Continues each prompt (lists of token ids). Returns {'tokens': [[...], ...], "
          "'prompt_tokens', 'new_tokens', 'prefill_seconds', 'decode_seconds'}. on_token(seq, "
          "token) is called for every new token; returning False ends that sequence.");

  l.def(
      "sample",
      [](nb::handle logits, const std::vector<std::vector<int64_t>>& history, bool greedy,
         double temperature, int64_t top_k, double top_p, double repetition_penalty, uint64_t seed,
         uint64_t step) {
        return llm::sample(to_array(logits, f32), history,
                           {greedy, temperature, top_k, top_p, repetition_penalty, seed}, step);
      },
      nb::arg("logits"), nb::arg("history") = std::vector<std::vector<int64_t>>{},
      nb::arg("greedy") = true, nb::arg("temperature") = 1.0, nb::arg("top_k") = 0,
      nb::arg("top_p") = 1.0, nb::arg("repetition_penalty") = 1.0, nb::arg("seed") = 0,
      nb::arg("step") = 0, "One token per row of (rows, vocab) logits (kiln::llm::sample).");
}

}  // namespace kiln::py
