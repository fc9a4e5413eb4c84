// The CUDA caching allocator and error checks. Skipped without a GPU.
#include <vector>

#include "backends/cuda/allocator.h"
#include "backends/cuda/cuda_check.h"
#include "support/reference.h"
#include "support/gpu.h"

namespace kiln {
namespace {
using namespace kiln::test;

TEST(CudaAllocator, ReusesBlocksOnTheSameStreamOnly) {
  REQUIRE_GPU();
  cuda::CachingAllocator a(0);
  cudaStream_t s1, s2;
  KILN_CUDA_CHECK(cudaStreamCreate(&s1));
  KILN_CUDA_CHECK(cudaStreamCreate(&s2));
  void* p = a.allocate(1000, s1);
  a.release(p);
  void* q = a.allocate(900, s1);  // same 1024-byte class, same stream
  EXPECT_EQ(q, p);
  void* r = a.allocate(1000, s2);  // another stream never takes s1's blocks
  EXPECT_NE(r, p);
  auto st = a.stats();
  EXPECT_EQ(st.allocations, 3u);
  EXPECT_EQ(st.cache_hits, 1u);
  EXPECT_EQ(st.device_mallocs, 2u);
  EXPECT_EQ(st.allocated_bytes, 2048u);
  a.release(q);
  a.release(r);
  a.empty_cache();
  EXPECT_EQ(a.stats().reserved_bytes, 0u);
  expect_error<ValueError>([&] { a.release(reinterpret_cast<void*>(0x1234)); }, {"[cuda]"});
  cudaStreamDestroy(s1);
  cudaStreamDestroy(s2);
}

TEST(CudaAllocator, MemoryHoldsData) {
  REQUIRE_GPU();
  cuda::CachingAllocator a(0);
  const size_t n = 3 << 20;  // a large class
  Array host = random_array({static_cast<int64_t>(n / 4)}, f32);
  void* d = a.allocate(n, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(d) % 256, 0u);
  KILN_CUDA_CHECK(cudaMemcpy(d, host.data(), n, cudaMemcpyHostToDevice));
  Array back = Array::empty(host.shape(), f32);
  KILN_CUDA_CHECK(cudaMemcpy(back.data(), d, n, cudaMemcpyDeviceToHost));
  expect_equal(back, host.shape(), to_f64(host));
  a.release(d);
}

// More than the GPU has: OutOfMemory names the request; the cache was released to retry; the
// allocator and the device keep working afterwards.
TEST(CudaAllocator, OutOfMemoryFreesTheCacheRetriesThenThrows) {
  REQUIRE_GPU();
  cuda::CachingAllocator a(0);
  std::vector<void*> blocks;
  for (int i = 0; i < 4; ++i) blocks.push_back(a.allocate(64 << 20, nullptr));
  for (void* b : blocks) a.release(b);
  EXPECT_GT(a.stats().reserved_bytes, 0u);
  const size_t huge = size_t{1} << 50;
  expect_error<OutOfMemory>([&] { a.allocate(huge, nullptr); },
                            {"[cuda] out of memory", std::to_string(huge), "bytes free"});
  EXPECT_EQ(a.stats().cache_flushes, 1u);
  EXPECT_EQ(a.stats().reserved_bytes, 0u);
  void* p = a.allocate(1 << 20, nullptr);
  KILN_CUDA_CHECK(cudaMemset(p, 0, 1 << 20));
  KILN_CUDA_CHECK(cudaDeviceSynchronize());
  a.release(p);
}

TEST(CudaCheck, NamesTheFailingExpression) {
  REQUIRE_GPU();
  expect_error<DeviceError>([] { KILN_CUDA_CHECK(cudaSetDevice(4096)); },
                            {"[cuda]", "cudaSetDevice(4096)", "cudaErrorInvalidDevice"});
  cudaGetLastError();
}

}  // namespace
}  // namespace kiln
