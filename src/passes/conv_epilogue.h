// What a convolution's epilogue absorbs, for the passes that make fused_conv nodes (channels_last
// on CUDA, prepare_cpu_convs on the CPU): conv -> add(., residual) -> relu, either or both, each
// value read only by the next.
#pragma once

#include <functional>
#include <optional>
#include <vector>

#include "passes/program.h"

namespace kiln {

struct ConvEpilogue {
  int32_t last = -1;              // the last absorbed node (-1: nothing to fuse)
  std::vector<int32_t> absorbed;  // the absorbed nodes, last one included
  std::optional<detail::ValueRef> residual;
  bool relu = false;
};

/// The epilogue of conv node `conv` of `p`. `sole_reader(id)` is the one node that reads node id's
/// output 0 (-1: none, several, or an output of the program); `taken` marks nodes another conv's
/// epilogue absorbed already (the add of two convs).
ConvEpilogue conv_epilogue(const Program& p, int32_t conv,
                           const std::function<int32_t(int32_t)>& sole_reader,
                           const std::vector<char>& taken);

}  // namespace kiln
