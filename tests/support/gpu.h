// For tests of the GPU backend: skipping cleanly without a GPU, and forcing an op onto the CPU.
#pragma once

#include <gtest/gtest.h>

#include "core/op_id.h"
#include "kiln/device.h"
#include "kiln/kernel.h"
#include "runtime/env.h"

/// Skips the test when no CUDA device is visible (kiln built without CUDA, or no GPU).
#define REQUIRE_GPU() \
  if (::kiln::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device"
/// The same, and when the environment turns recorded runs off for the process (KILN_VALIDATE,
/// KILN_STEP_TIMES, KILN_CAPTURE=0).
#define REQUIRE_RECORDED_RUNS()                                                                   \
  REQUIRE_GPU();                                                                                  \
  if (::kiln::env::validate_on_cpu() || ::kiln::env::step_times() || ::kiln::env::capture() == 0) \
  GTEST_SKIP() << "runs are not recorded in this environment"
/// The same, and when KILN_CONDITIONAL_NODES=0 (control ops then run from the host).
#define REQUIRE_CONDITIONAL_NODES()      \
  REQUIRE_RECORDED_RUNS();               \
  if (!::kiln::env::conditional_nodes()) \
  GTEST_SKIP() << "KILN_CONDITIONAL_NODES=0: control ops run from the host"

namespace kiln::test {

/// Removes the CUDA kernel of `op` for the scope, so the op must fall back to the CPU.
class WithoutCudaKernel {
 public:
  explicit WithoutCudaKernel(OpId op) : op_(op) {
    if (const KernelEntry* k = find_kernel(op, Backend::cuda)) saved_ = *k;
    register_kernel(op, Backend::cuda, KernelEntry{});
  }
  ~WithoutCudaKernel() { register_kernel(op_, Backend::cuda, saved_); }
  WithoutCudaKernel(const WithoutCudaKernel&) = delete;
  WithoutCudaKernel& operator=(const WithoutCudaKernel&) = delete;

 private:
  OpId op_;
  KernelEntry saved_;
};

}  // namespace kiln::test
