// Bare CUDA launches of a dependent chain of tiny kernels (bench/gpu/launch_floor.cu).
#pragma once

namespace kiln::bench {

struct LaunchFloor {
  double enqueue_us;  // host time of one cudaLaunchKernel, median per launch
  double total_us;    // launch to completion of the chain, per launch
};

/// Times `launches` dependent one-thread kernels launched one by one, `reps` times.
LaunchFloor launch_floor(int launches, int reps);

}  // namespace kiln::bench
