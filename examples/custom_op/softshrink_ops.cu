// The CUDA kernel of my.softshrink (softshrink_ops.cpp): enqueued on the executable's stream,
// never synchronized.
#include <cuda_runtime.h>

#include <string>

#include "kiln/custom_op.h"

namespace {
template <typename T>
__global__ void softshrink(const T* x, T* y, T l, long long n) {
  const long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x;
  if (i < n) y[i] = x[i] > l ? x[i] - l : x[i] < -l ? x[i] + l : T(0);
}
}  // namespace

void softshrink_cuda(kiln::KernelContext& ctx, kiln::Stream& stream) {
  const long long n = ctx.in(0).numel();
  if (n == 0) return;
  auto s = static_cast<cudaStream_t>(stream.native_handle());
  const unsigned blocks = static_cast<unsigned>((n + 255) / 256);
  const double l = ctx.attrs().f("lambda");
  if (ctx.in(0).dtype == kiln::f64)
    softshrink<<<blocks, 256, 0, s>>>(ctx.in(0).ptr<double>(), ctx.out(0).ptr<double>(), l, n);
  else
    softshrink<<<blocks, 256, 0, s>>>(ctx.in(0).ptr<float>(), ctx.out(0).ptr<float>(),
                                      static_cast<float>(l), n);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess)
    throw kiln::DeviceError(std::string("[my.softshrink] launch: ") + cudaGetErrorString(e));
}
