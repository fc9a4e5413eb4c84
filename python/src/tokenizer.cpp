// kiln._kiln.llm.Tokenizer: tokenizer.json BPE tokenizers (include/kiln/tokenizer.h).
#include "kiln/tokenizer.h"

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "common.h"

namespace kiln::py {

void bind_tokenizer(nb::module_& m) {
  nb::module_ l = nb::borrow<nb::module_>(m.attr("llm"));
  nb::class_<llm::Tokenizer>(l, "Tokenizer",
                             "A tokenizer.json BPE tokenizer (byte-level or SentencePiece-style), "
                             "with the ids and text of the tokenizers package.")
      .def_static("load", &llm::Tokenizer::load, nb::arg("path"))
      .def_static("parse", &llm::Tokenizer::parse, nb::arg("json"),
                  nb::arg("label") = "tokenizer.json")
      .def("encode", &llm::Tokenizer::encode, nb::arg("text"), nb::arg("add_special_tokens") = true)
      .def("decode", &llm::Tokenizer::decode, nb::arg("ids"), nb::arg("skip_special_tokens") = true)
      .def_prop_ro("vocab_size", &llm::Tokenizer::vocab_size)
      .def("token_to_id", &llm::Tokenizer::token_to_id, nb::arg("token"))
      .def("id_to_token", &llm::Tokenizer::id_to_token, nb::arg("id"));
}

}  // namespace kiln::py
