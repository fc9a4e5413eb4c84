// Generated CUDA kernels: CUDA C++ compiled by NVRTC to a cubin for a device's architecture,
// loaded with the driver API (its entry points through the runtime, so libkiln does not link
// libcuda, which machines without a GPU driver lack) and launched. Binaries are kept by key
// (XXH3-64 of source and architecture; compiled here or imported from a package), loaded
// functions by (context, key); each source compiles once. The fused elementwise kernels
// (fused_elementwise.cpp) are its users; the entry point of every source is `kiln_fused`.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kiln::cuda::nvrtc {

/// Source -> cubin for sm_<arch>; DeviceError with the compiler's log on a compile error.
std::vector<char> compile_cubin(const std::string& src, int arch);
/// The key of a source for sm_<arch>.
uint64_t kernel_key(const std::string& src, int arch);
/// The binary of `src` for sm_<arch>: imported, compiled before, or compiled now.
std::shared_ptr<const std::vector<char>> binary_for(const std::string& src, int arch, uint64_t key);
/// Whether a binary of that key is at hand.
bool has_binary(uint64_t key);
/// Keeps an imported binary (false where one of that key was there).
bool add_binary(uint64_t key, const std::vector<char>& bytes);
/// The compute capability of a device as 90 for 9.0.
int device_arch(int device);
/// The loaded entry point of `src` in the context of `stream` (the current one when null).
CUfunction get_kernel(const std::string& src, int device, CUstream stream);
/// Launches `fn` on `stream`: `blocks` blocks of `threads` threads, one argument struct.
void launch(CUfunction fn, int64_t blocks, int threads, CUstream stream, void** args);
/// Unloads every module and forgets every binary.
void forget();
/// Sources compiled so far in this process.
int64_t compiled();

}  // namespace kiln::cuda::nvrtc
