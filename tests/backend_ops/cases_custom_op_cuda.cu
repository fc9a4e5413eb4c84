// The CUDA kernel of the harness's custom op (cases_custom_op.cpp), on the executable's stream.
#include <cuda_runtime.h>

#include <string>

#include "kiln/custom_op.h"

namespace {
template <typename T>
__global__ void softsign(const T* x, T* y, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) y[i] = x[i] / (T(1) + (x[i] < T(0) ? -x[i] : x[i]));
}
}  // namespace

void harness_softsign_cuda(kiln::KernelContext& ctx, kiln::Stream& stream) {
  const int64_t n = ctx.in(0).numel();
  if (n == 0) return;
  auto s = static_cast<cudaStream_t>(stream.native_handle());
  const unsigned blocks = static_cast<unsigned>((n + 255) / 256);
  if (ctx.in(0).dtype == kiln::f64)
    softsign<<<blocks, 256, 0, s>>>(ctx.in(0).ptr<double>(), ctx.out(0).ptr<double>(), n);
  else
    softsign<<<blocks, 256, 0, s>>>(ctx.in(0).ptr<float>(), ctx.out(0).ptr<float>(), n);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess)
    throw kiln::DeviceError(std::string("[harness.softsign] launch: ") + cudaGetErrorString(e));
}
