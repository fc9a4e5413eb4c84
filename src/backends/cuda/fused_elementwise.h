// The generated CUDA kernels of fused_elementwise (fused_elementwise.cpp), exposed for tests:
// code generation and NVRTC compilation need no GPU.
#pragma once

#include <string>
#include <vector>

#include "core/graph_impl.h"

namespace kiln::cuda {

/// The CUDA C++ source of a fused_elementwise node with these attributes, inputs and output.
std::string fused_elementwise_source(const Attrs& attrs, const std::vector<TensorInfo>& inputs,
                                     const TensorInfo& output);
/// NVRTC: source to a cubin for sm_<arch>; DeviceError carrying the compiler log on failure.
std::vector<char> fused_elementwise_cubin(const std::string& source, int arch);

}  // namespace kiln::cuda
