// The generated CUDA kernels of fused_elementwise (fused_elementwise.cpp), exposed for tests:
// code generation and NVRTC compilation need no GPU.
#pragma once

#include <string>
#include <vector>

#include "core/device_backend.h"
#include "core/graph_impl.h"

namespace kiln::cuda {

/// The CUDA C++ source of a fused_elementwise node with these attributes, inputs and output.
std::string fused_elementwise_source(const Attrs& attrs, const std::vector<TensorInfo>& inputs,
                                     const TensorInfo& output);
/// NVRTC: source to a cubin for sm_<arch>; DeviceError carrying the compiler log on failure.
std::vector<char> fused_elementwise_cubin(const std::string& source, int arch);

/// The binaries of the fused_elementwise kernels of `calls` for `device` (compiled when needed).
std::vector<KernelBinary> export_fused_kernels(int device, const std::vector<KernelCall>& calls);
/// Offers binaries for later kernel loads on `device`; returns how many were new and of its
/// architecture.
size_t import_fused_kernels(int device, const std::vector<KernelBinary>& binaries);
/// Unloads every module and forgets every binary (not while a run is in flight).
void forget_fused_kernels();
/// Kernels compiled from source by this process.
int64_t fused_kernels_compiled();

}  // namespace kiln::cuda
