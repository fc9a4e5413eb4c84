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

// Normals use log, sin and cos, which kiln evaluates itself from correctly rounded IEEE
// operations on both devices (ops/philox.h): the same bits as the CPU, in every dtype, for every
// distribution built on them.
TEST(CudaRandom, NormalsSameBitsAsCpu) {
  REQUIRE_GPU();
  const int64_t n = 1 << 20;
  Graph g;
  Tensor s = random_philox_state(g, 5, 6);
  std::vector<Tensor> outs = {random_normal(s, {n}).values,
                              random_truncated_normal(s, {n}).values,
                              random_normal(s, {n}, 0.5, 3, f64).values,
                              random_truncated_normal(s, {n}, 1, 2, -3, 4, f64).values,
                              random_normal(s, {n}, 0, 1, bf16).values,
                              random_normal(s, {n}, -1, 0.5, f16).values,
                              random_truncated_normal(s, {n}).state};
  const auto cpu = run_on(Device::cpu(), g, outs), gpu = run_on(Device::cuda(0), g, outs);
  for (size_t k = 0; k < outs.size(); ++k) {
    const std::vector<uint8_t> a = bytes_of(cpu[k]), b = bytes_of(gpu[k]);
    ASSERT_EQ(a.size(), b.size());
    int64_t diff = 0;
    for (size_t i = 0; i < a.size(); ++i) diff += a[i] != b[i];
    EXPECT_EQ(diff, 0) << "output " << k << ": " << diff << " of " << a.size() << " bytes differ";
  }
}

}  // namespace
}  // namespace kiln
