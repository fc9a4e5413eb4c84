// CUDA kernels of cholesky and triangular_solve: simple own kernels accumulating in double.
// cholesky: one block per matrix, column by column (Crout) in the output; a matrix that is not
// positive definite becomes all-NaN, as on the CPU. triangular_solve: one thread per
// right-hand side, substituting through the output.
#include <cmath>
#include <limits>

#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/kernels.h"
#include "ops/factorization_params.h"

namespace kiln::cuda {

namespace {

constexpr int kCholThreads = 256;

template <typename T> __global__ void cholesky_kernel(const T* __restrict__ a, T* __restrict__ out,
                                                      int64_t n, bool upper) {
  __shared__ double part[kCholThreads];
  __shared__ double diag;
  const int64_t b = blockIdx.x;
  const T* m = a + b * n * n;
  T* l = out + b * n * n;
  // the read triangle as a lower matrix, zeros above
  for (int64_t t = threadIdx.x; t < n * n; t += blockDim.x) {
    const int64_t i = t / n, j = t % n;
    l[t] = j <= i ? (upper ? m[j * n + i] : m[i * n + j]) : T(0);
  }
  __syncthreads();
  bool ok = true;
  for (int64_t j = 0; j < n && ok; ++j) {
    double s = 0;
    for (int64_t k = threadIdx.x; k < j; k += blockDim.x) {
      const double v = l[j * n + k];
      s += v * v;
    }
    part[threadIdx.x] = s;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w >>= 1) {
      if (threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
      __syncthreads();
    }
    if (threadIdx.x == 0) diag = static_cast<double>(l[j * n + j]) - part[0];
    __syncthreads();
    const double d = diag;
    if (!(d > 0)) {
      ok = false;  // uniform over the block
      break;
    }
    const double ljj = sqrt(d);
    for (int64_t i = j + 1 + threadIdx.x; i < n; i += blockDim.x) {
      double v = l[i * n + j];
      for (int64_t k = 0; k < j; ++k)
        v -= static_cast<double>(l[i * n + k]) * static_cast<double>(l[j * n + k]);
      l[i * n + j] = static_cast<T>(v / ljj);
    }
    __syncthreads();
    if (threadIdx.x == 0) l[j * n + j] = static_cast<T>(ljj);
    __syncthreads();
  }
  if (!ok) {
    for (int64_t t = threadIdx.x; t < n * n; t += blockDim.x)
      l[t] = std::numeric_limits<T>::quiet_NaN();
    return;
  }
  if (upper) {
    __syncthreads();
    for (int64_t t = threadIdx.x; t < n * n; t += blockDim.x) {
      const int64_t i = t / n, j = t % n;
      if (j < i) {
        l[j * n + i] = l[t];
        l[t] = T(0);
      }
    }
  }
}

void cholesky(KernelContext& ctx) {
  const TensorView& a = ctx.in(0);
  const int64_t n = a.shape.back();
  const int64_t batch = n > 0 ? a.numel() / (n * n) : 0;
  if (batch == 0 || n == 0) return;
  const bool upper = params_of<FactorizationParams>(ctx).upper;
  dispatch_float(a.dtype, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      cholesky_kernel<T><<<static_cast<unsigned>(batch), kCholThreads, 0, stream_of(ctx)>>>(
          a.ptr<T>(), ctx.out(0).ptr<T>(), n, upper);
      check_launch(ctx.op_name());
    } else {
      fail<UnsupportedError>("[{}] cuda kernel got dtype {}", ctx.op_name(), name(a.dtype));
    }
  });
}

// M y = c for each right-hand side, with M = a or aᵀ (see the CPU kernel).
template <typename T>
__global__ void triangular_solve_kernel(const T* __restrict__ a, const T* __restrict__ bm,
                                        T* __restrict__ out, int64_t batch, int64_t n, int64_t r,
                                        int64_t c, bool left, bool trans, bool lower, bool unit) {
  const int64_t rhs = left ? c : r, step = left ? c : 1;
  for (int64_t w = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; w < batch * rhs;
       w += int64_t{gridDim.x} * blockDim.x) {
    const int64_t b = w / rhs, s = w % rhs;
    const T* m = a + b * n * n;
    const int64_t base = b * r * c + (left ? s : s * n);
    for (int64_t t = 0; t < n; ++t) {
      const int64_t i = lower ? t : n - 1 - t;
      double v = bm[base + i * step];
      const int64_t k0 = lower ? 0 : i + 1, k1 = lower ? i : n;
      for (int64_t k = k0; k < k1; ++k)
        v -= static_cast<double>(trans ? m[k * n + i] : m[i * n + k]) *
             static_cast<double>(out[base + k * step]);
      out[base + i * step] = static_cast<T>(unit ? v : v / static_cast<double>(m[i * n + i]));
    }
  }
}

void triangular_solve(KernelContext& ctx) {
  const TensorView &a = ctx.in(0), &b = ctx.in(1);
  const FactorizationParams p = params_of<FactorizationParams>(ctx);
  const bool upper = p.upper, left = p.left, unit = p.unit_diagonal;
  const bool trans = p.transpose != !left;
  const bool lower = trans ? upper : !upper;
  const int64_t n = a.shape.back();
  const int64_t r = b.shape[b.shape.size() - 2], c = b.shape.back();
  const int64_t batch = numel(Shape(a.shape.begin(), a.shape.end() - 2));
  const int64_t work = batch * (left ? c : r);
  if (work == 0 || n == 0) return;
  dispatch_float(a.dtype, ctx.op_name(), [&](auto t) {
    using T = decltype(t);
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      triangular_solve_kernel<T><<<blocks_for(work, 128), 128, 0, stream_of(ctx)>>>(
          a.ptr<T>(), b.ptr<T>(), ctx.out(0).ptr<T>(), batch, n, r, c, left, trans, lower, unit);
      check_launch(ctx.op_name());
    } else {
      fail<UnsupportedError>("[{}] cuda kernel got dtype {}", ctx.op_name(), name(a.dtype));
    }
  });
}

}  // namespace

void register_factorization_kernels() {
  const DTypeSet types{f32, f64};
  register_kernel(OpId::Cholesky, Backend::cuda, {cholesky, types, 0, false});
  register_kernel(OpId::TriangularSolve, Backend::cuda, {triangular_solve, types, 0, false});
}

}  // namespace kiln::cuda
