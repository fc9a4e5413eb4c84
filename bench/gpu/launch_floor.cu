// The floor of a kernel launched one by one on this machine: the same chain as the tiny-ops
// workload (1000 dependent x = x + 1 on one float) written as bare CUDA runtime launches, with no
// library between the caller and cudaLaunchKernel.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench/gpu/launch_floor.h"

namespace kiln::bench {
namespace {

__global__ void add_one(float* x) { x[0] += 1.f; }

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw std::runtime_error(std::string("[bench] ") + what + ": " + cudaGetErrorString(e));
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

LaunchFloor launch_floor(int launches, int reps) {
  using Clock = std::chrono::steady_clock;
  float* x = nullptr;
  cudaStream_t s = nullptr;
  check(cudaMalloc(&x, sizeof(float)), "cudaMalloc");
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  std::vector<double> enqueue, total;
  for (int r = 0; r < reps + 3; ++r) {
    check(cudaMemsetAsync(x, 0, sizeof(float), s), "cudaMemsetAsync");
    check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    const auto t0 = Clock::now();
    for (int i = 0; i < launches; ++i) add_one<<<1, 1, 0, s>>>(x);
    const auto t1 = Clock::now();
    check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    const auto t2 = Clock::now();
    if (r < 3) continue;  // warm-up
    enqueue.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / launches);
    total.push_back(std::chrono::duration<double, std::micro>(t2 - t0).count() / launches);
  }
  float got = 0;
  check(cudaMemcpy(&got, x, sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy");
  check(cudaStreamDestroy(s), "cudaStreamDestroy");
  check(cudaFree(x), "cudaFree");
  if (got != static_cast<float>(launches))
    throw std::runtime_error("[bench] the bare launch chain gave a wrong sum");
  return {median(enqueue), median(total)};
}

}  // namespace kiln::bench
