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
  /// With `activations`, another activation than relu: its node (clip, hardswish, sigmoid, silu).
  int32_t activation = -1;
};

/// The epilogue of conv node `conv` of `p`. `sole_reader(id)` is the one node that reads node id's
/// output 0 (-1: none, several, or an output of the program); `taken` marks nodes another conv's
/// epilogue absorbed already (the add of two convs). `activations`: clip, hardswish, sigmoid and
/// silu end an epilogue too (the CPU's post-ops), not relu alone.
ConvEpilogue conv_epilogue(const Program& p, int32_t conv,
                           const std::function<int32_t(int32_t)>& sole_reader,
                           const std::vector<char>& taken, bool activations = false);
/// Sets fused_conv's epilogue attributes of `e` on `a` (relu, has_residual; activation, act_min,
/// act_max).
void set_epilogue_attrs(const Program& p, const ConvEpilogue& e, Attrs& a);

}  // namespace kiln
