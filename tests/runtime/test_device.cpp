#include <atomic>
#include <vector>

#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;

TEST(DeviceTest, ParseAndPrint) {
  EXPECT_EQ(Device::parse("cpu"), Device::cpu());
  EXPECT_EQ(Device::parse("cuda"), Device::cuda(0));
  EXPECT_EQ(Device::parse("cuda:3").index, 3);
  EXPECT_EQ(Device::cuda(2).str(), "cuda:2");
  expect_error<ValueError>([] { Device::parse("tpu"); }, {"[device]", "tpu"});
  expect_error<ValueError>([] { Device::parse("cuda:x"); }, {"[device]", "cuda:x"});
}

TEST(DeviceTest, DefaultRunsGraphs) {
  Graph g;
  auto x = g.placeholder({4}, f32, "x");
  Array v = random_array({4}, f32);
  auto exe = g.compile(default_device(), {}, {relu(x)});
  auto out = exe.run({{x, v}})[0];
  std::vector<double> ref;
  for (double e : to_f64(v)) ref.push_back(e > 0 ? e : 0);
  expect_close(out, {4}, ref);
}

TEST(QueueTest, RunsWorkInOrder) {
  Queue q;
  std::vector<int> order;
  for (int i = 0; i < 100; ++i) q.submit([&order, i] { order.push_back(i); });
  q.wait();
  ASSERT_EQ(order.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(order[i], i);
}

TEST(CudaDevice, Discovery) {
  const int n = cuda_device_count();
  if (n == 0) GTEST_SKIP() << "no CUDA device";
  EXPECT_GT(n, 0);
}

}  // namespace
}  // namespace kiln
