// CUDA kernels of the test op library (ops_lib.cpp): enqueued on the executable's stream.
#include <cuda_runtime.h>

#include "kiln/custom_op.h"

namespace {

template <typename T>
__global__ void softshrink_kernel(const T* x, T* y, T l, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) y[i] = x[i] > l ? x[i] - l : x[i] < -l ? x[i] + l : T(0);
}

__global__ void mix_kernel(const float* x, const float* z, float* y0, float* y1, float a, float b,
                           int p, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  y0[i] = a * x[i] + b * z[i];
  float xp = 1;
  for (int k = 0; k < p; ++k) xp *= x[i];
  y1[i] = xp * z[i];
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw kiln::DeviceError(std::string("[test.ops_lib] ") + what + ": " + cudaGetErrorString(e));
}

}  // namespace

void softshrink_cuda(kiln::KernelContext& ctx, kiln::Stream& stream) {
  const int64_t n = ctx.in(0).numel();
  if (n == 0) return;
  auto s = static_cast<cudaStream_t>(stream.native_handle());
  const unsigned blocks = static_cast<unsigned>((n + 255) / 256);
  const double l = ctx.attrs().f("lambda");
  if (ctx.in(0).dtype == kiln::f64)
    softshrink_kernel<<<blocks, 256, 0, s>>>(ctx.in(0).ptr<double>(), ctx.out(0).ptr<double>(), l,
                                             n);
  else
    softshrink_kernel<<<blocks, 256, 0, s>>>(ctx.in(0).ptr<float>(), ctx.out(0).ptr<float>(),
                                             static_cast<float>(l), n);
  check(cudaGetLastError(), "softshrink launch");
}

void mix_cuda(kiln::KernelContext& ctx, kiln::Stream& stream) {
  const int64_t n = ctx.in(0).numel();
  if (n == 0) return;
  auto s = static_cast<cudaStream_t>(stream.native_handle());
  mix_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, s>>>(
      ctx.in(0).ptr<float>(), ctx.in(1).ptr<float>(), ctx.out(0).ptr<float>(),
      ctx.out(1).ptr<float>(), static_cast<float>(ctx.attrs().f("a")),
      static_cast<float>(ctx.attrs().f("b")), static_cast<int>(ctx.attrs().i("power")), n);
  check(cudaGetLastError(), "mix launch");
}
