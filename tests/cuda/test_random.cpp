// The CUDA random kernels give the CPU's bits (ops/philox.h). Skipped without a GPU.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kiln/kiln.h"
#include "support/reference.h"
#include "support/gpu.h"

namespace kiln {
namespace {
using namespace kiln::test;

std::vector<Array> run_on(const Device& d, const Graph& g, const std::vector<Tensor>& outs) {
  CompileOptions o;
  o.optimize = false;  // no constant folding: the device's kernels run
  o.strict_placement = d.kind == Device::Kind::cuda;
  auto r = g.compile(d, {}, outs, o).run(Feeds{});
  for (auto& a : r) a = a.to(Device::cpu());
  return r;
}

std::vector<uint8_t> bytes_of(const Array& a) {
  std::vector<uint8_t> b(static_cast<size_t>(a.numel()) * size_of(a.dtype()));
  std::memcpy(b.data(), a.data(), b.size());
  return b;
}

TEST(CudaRandom, SameBitsAsCpu) {
  REQUIRE_GPU();
  const int64_t n = 100003;
  Graph g;
  Tensor s = random_philox_state(g, 2024, -3);
  std::vector<Tensor> exact = {random_uniform(s, {n}).values,
                               random_uniform(s, {n}, -1, 3, f64).values,
                               random_uniform(s, {n}, 0, 1, f16).values,
                               random_bernoulli(s, {n}, 0.4, i32).values,
                               random_dropout_mask(s, {n}, 0.9).values,
                               random_integer(s, {n}, -100, 12345).values,
                               random_integer(s, {n}, -5, int64_t{1} << 40, i64).values,
                               random_uniform(s, {n}).state,
                               random_truncated_normal(s, {n}).state};
  const auto cpu = run_on(Device::cpu(), g, exact), gpu = run_on(Device::cuda(0), g, exact);
  for (size_t k = 0; k < exact.size(); ++k)
    EXPECT_EQ(bytes_of(gpu[k]), bytes_of(cpu[k])) << "output " << k;
}

// Normals use log, sin and cos: the device rounds double-precision results to float (the
// correctly rounded value), the CPU uses libm's float functions as TensorFlow does; they differ
// only where libm's float result is not correctly rounded, by a few ulp of the result:
// glibc 2.36's logf and sincosf are off in about 1.5% of Box-Muller outputs (15650 of 1048576
// for seed (5, 6), measured on the host with double log/sin/cos rounded to float and on the H200).
TEST(CudaRandom, NormalsMatchCpuWithinFourUlp) {
  REQUIRE_GPU();
  const int64_t n = 1 << 20;
  Graph g;
  Tensor s = random_philox_state(g, 5, 6);
  std::vector<Tensor> outs = {random_normal(s, {n}).values, random_truncated_normal(s, {n}).values,
                              random_normal(s, {n}, 0, 1, f64).values};
  const auto cpu = run_on(Device::cpu(), g, outs), gpu = run_on(Device::cuda(0), g, outs);
  for (size_t k = 0; k < 2; ++k) {
    const float* a = cpu[k].data<float>();
    const float* b = gpu[k].data<float>();
    int64_t diff = 0;
    for (int64_t i = 0; i < n; ++i) {
      if (a[i] == b[i]) continue;
      ++diff;
      // a 1-ulp error of log or sin/cos moves the product sqrt(-2 log u) * sin(2 pi u) by a
      // few ulp of the result (at most 3 in 2M draws on the H200)
      const float m = std::max(std::fabs(a[i]), std::fabs(b[i]));
      EXPECT_LE(std::fabs(a[i] - b[i]), 4 * (std::nextafter(m, INFINITY) - m))
          << "output " << k << " element " << i;
    }
    // (a rejection decision can flip only where a value sits within 1 ulp of the bound)
    EXPECT_LT(diff, n / 25) << "output " << k;
    std::printf("CudaRandom: output %zu: %lld of %lld elements differ from the CPU (<= 4 ulp)\n", k,
                static_cast<long long>(diff), static_cast<long long>(n));
  }
  const double* a = cpu[2].data<double>();
  const double* b = gpu[2].data<double>();
  for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(a[i], b[i], 1e-14 * (1 + std::fabs(a[i]))) << i;
}

}  // namespace
}  // namespace kiln
