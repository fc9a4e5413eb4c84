// CUDA kernels of hashgrid_encode and hashgrid_encode_grad (hashgrid_ops.cpp), enqueued on the
// executable's stream: one thread per (point, level).
#include <cuda_runtime.h>

#include <cmath>
#include <string>

#include "kiln/custom_op.h"

namespace {

constexpr unsigned long long kPrime = 2654435761ull;  // hashgrid.h

struct Levels {
  long long res[32];
};

struct Args {
  const float* x;
  const float* table;  // forward: the table; backward: unused
  const float* dy;     // backward only
  float* out;
  long long n, levels, t, f;
};

Levels levels_of(const kiln::KernelContext& c, long long levels) {
  Levels lv{};
  const double base = static_cast<double>(c.attrs().i("base_resolution"));
  const double scale = c.attrs().f("per_level_scale");
  for (long long l = 0; l < levels; ++l)
    lv.res[l] = static_cast<long long>(std::floor(base * std::pow(scale, static_cast<double>(l))));
  return lv;
}

__device__ void corners(const float* x, long long i, long long res, long long t,
                        unsigned long long rows[4], float w[4]) {
  const float px = x[2 * i] * static_cast<float>(res), py = x[2 * i + 1] * static_cast<float>(res);
  const float fx = floorf(px), fy = floorf(py);
  const float wx = px - fx, wy = py - fy;
  const auto cx = static_cast<unsigned long long>(static_cast<long long>(fx));
  const auto cy = static_cast<unsigned long long>(static_cast<long long>(fy));
  for (int k = 0; k < 4; ++k) {
    const int dx = k & 1, dy = k >> 1;
    rows[k] = ((cx + dx) ^ ((cy + dy) * kPrime)) % static_cast<unsigned long long>(t);
    w[k] = (dx ? wx : 1 - wx) * (dy ? wy : 1 - wy);
  }
}

__global__ void encode(Args a, Levels lv) {
  const long long id = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x;
  if (id >= a.n * a.levels) return;
  const long long l = id % a.levels, i = id / a.levels;
  unsigned long long rows[4];
  float w[4];
  corners(a.x, i, lv.res[l], a.t, rows, w);
  const float* tl = a.table + l * a.t * a.f;
  float* out = a.out + i * a.levels * a.f + l * a.f;
  for (long long k = 0; k < a.f; ++k) {
    float acc = 0;
    for (int q = 0; q < 4; ++q) acc += tl[rows[q] * a.f + k] * w[q];
    out[k] = acc;
  }
}

__global__ void encode_grad(Args a, Levels lv) {
  const long long id = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x;
  if (id >= a.n * a.levels) return;
  const long long l = id % a.levels, i = id / a.levels;
  unsigned long long rows[4];
  float w[4];
  corners(a.x, i, lv.res[l], a.t, rows, w);
  float* tl = a.out + l * a.t * a.f;
  const float* g = a.dy + i * a.levels * a.f + l * a.f;
  for (int q = 0; q < 4; ++q)
    for (long long k = 0; k < a.f; ++k) atomicAdd(&tl[rows[q] * a.f + k], w[q] * g[k]);
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw kiln::DeviceError(std::string("[hashgrid_encode] ") + what + ": " +
                            cudaGetErrorString(e));
}

Args args_of(kiln::KernelContext& c) {
  const auto& ts = c.in(1).shape;
  return {c.in(0).ptr<float>(),
          c.in(1).ptr<float>(),
          nullptr,
          c.out(0).ptr<float>(),
          c.in(0).shape[0],
          ts[0],
          ts[1],
          ts[2]};
}

}  // namespace

void hashgrid_encode_cuda(kiln::KernelContext& c, kiln::Stream& s) {
  Args a = args_of(c);
  const long long threads = a.n * a.levels;
  if (threads == 0) return;
  encode<<<static_cast<unsigned>((threads + 255) / 256), 256, 0,
           static_cast<cudaStream_t>(s.native_handle())>>>(a, levels_of(c, a.levels));
  check(cudaGetLastError(), "forward launch");
}

void hashgrid_encode_grad_cuda(kiln::KernelContext& c, kiln::Stream& s) {
  Args a = args_of(c);
  a.dy = c.in(2).ptr<float>();
  auto stream = static_cast<cudaStream_t>(s.native_handle());
  check(cudaMemsetAsync(a.out, 0, sizeof(float) * a.levels * a.t * a.f, stream), "memset");
  const long long threads = a.n * a.levels;
  if (threads == 0) return;
  encode_grad<<<static_cast<unsigned>((threads + 255) / 256), 256, 0, stream>>>(
      a, levels_of(c, a.levels));
  check(cudaGetLastError(), "backward launch");
}
