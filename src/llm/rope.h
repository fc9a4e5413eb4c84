// Rotary position embeddings of the Llama family: the inverse frequencies of a config (with its
// scaling) and the cos / sin tables the model gathers rows of.
#pragma once

#include <utility>
#include <vector>

#include "kiln/array.h"
#include "kiln/llm.h"

namespace kiln::llm::detail {

/// The head_dim / 2 inverse frequencies, in float32 as transformers computes them: theta^(-2i/d),
/// divided by the factor (linear) or blended by wavelength (llama3). Throws UnsupportedError for
/// the scalings kiln does not build yet (dynamic, yarn).
std::vector<float> rope_inv_freq(const Config& config);

/// cos and sin of position · inv_freq, (positions, head_dim / 2) in `dtype`.
std::pair<Array, Array> rope_tables(const Config& config, int64_t positions, DType dtype);

}  // namespace kiln::llm::detail
