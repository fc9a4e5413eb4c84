// CUDA executables: arrays on the device, placement and CPU fallback, strict placement,
// KILN_VALIDATE, out-of-memory recovery, training against the CPU, concurrent runs.
// Skipped without a GPU.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "backends/cuda/cuda_check.h"
#include "core/op_id.h"
#include "kiln/kernel.h"
#include "kiln/kiln.h"
#include "runtime/env.h"
#include "support/reference.h"
#include "support/gpu.h"

namespace kiln {
namespace {
using namespace kiln::test;

const Device kGpu = Device::cuda(0);

TEST(CudaRuntime, ArraysRoundTripEveryDtype) {
  REQUIRE_GPU();
  for (DType t : {f32, f16, bf16, f64, i8, u8, i16, i32, i64, boolean}) {
    SCOPED_TRACE(name(t));
    Array h = t == boolean ? random_ints({3, 257}, 0, 1, boolean) : random_array({3, 257}, t, -50, 50);
    Array d = h.to(kGpu);
    EXPECT_EQ(d.device(), kGpu);
    EXPECT_EQ(d.shape(), h.shape());
    Array d2 = d.copy();
    EXPECT_EQ(d2.device(), kGpu);
    EXPECT_NE(d2.data(), d.data());
    Array back = d2.to(Device::cpu());
    ASSERT_EQ(back.nbytes(), h.nbytes());
    EXPECT_EQ(std::memcmp(back.data(), h.data(), h.nbytes()), 0);
    EXPECT_EQ(d.to_vector<double>(), h.to_vector<double>());
  }
  // larger than one pinned staging buffer
  Array big = random_array({5 << 20}, f32);
  Array back = big.to(kGpu).to(Device::cpu());
  EXPECT_EQ(std::memcmp(back.data(), big.data(), big.nbytes()), 0);
  expect_error<UnsupportedError>([&] { big.to(kGpu).data<float>(); }, {"[Array]", "cuda:0", "to("});
  expect_error<UnsupportedError>([&] { big.to(Device::cuda(99)); }, {"cuda:99"});
}

// `host` copied to the GPU one element past an allocation's start, as an Array over that
// address (what from_dlpack makes of a sliced CUDA tensor): too misaligned for 16-byte loads, so
// kernels that pick their vector width by alignment take their one-element path.
Array misaligned_on_gpu(const Array& host) {
  const size_t es = size_of(host.dtype());
  Array buf = Array::empty({host.numel() + 1}, host.dtype(), kGpu);
  char* at = static_cast<char*>(buf.data()) + es;
  KILN_CUDA_CHECK(cudaMemcpy(at, host.data(), host.nbytes(), cudaMemcpyHostToDevice));
  auto st = std::make_shared<Storage>();
  st->data = at;
  st->bytes = host.nbytes();
  st->device = kGpu;
  st->deleter = [buf](void*) {};  // buf keeps the allocation
  return Array::adopt(st, host.shape(), host.dtype());
}

TEST(CudaRuntime, MisalignedDeviceFeedsMatchTheCpu) {
  REQUIRE_GPU();
  for (DType t : {f32, f64, f16, bf16}) {
    SCOPED_TRACE(name(t));
    Graph g;
    auto x = g.placeholder({2, 3, 5, 7}, t, "x");
    auto mean = g.placeholder({3}, t, "mean"), var = g.placeholder({3}, t, "var");
    const std::vector<Tensor> outs{batch_norm(x, mean, var, std::nullopt, std::nullopt),
                                   dropout(x, 0.3, true, 7)};
    const Array xv = random_array({2, 3, 5, 7}, t, -2, 2), mv = random_array({3}, t),
                vv = random_array({3}, t, 0.5, 2);
    const Array xd = misaligned_on_gpu(xv);
    ASSERT_NE(reinterpret_cast<uintptr_t>(xd.data()) % 16, 0u);
    // the first run reads the feed where it lies (a replay would copy it into its recording)
    auto got = g.compile(kGpu, {}, outs, CompileOptions{.optimize = false, .strict_placement = true})
                   .run({{x, xd}, {mean, mv}, {var, vv}});
    auto want = g.compile(Device::cpu(), {}, outs).run({{x, xv}, {mean, mv}, {var, vv}});
    for (size_t k = 0; k < outs.size(); ++k)
      expect_close(got[k].to(Device::cpu()), {2, 3, 5, 7}, to_f64(want[k]), tolerance(t),
                   tolerance(t));
  }
}

TEST(CudaRuntime, RunsOnTheDeviceAndMatchesTheCpu) {
  REQUIRE_GPU();
  Graph g;
  auto x = g.placeholder({64, 33}, f32, "x");
  auto y = g.placeholder({33}, f32, "y");
  auto out = exp(relu(x) * y) - x;
  Array xv = random_array({64, 33}, f32), yv = random_array({33}, f32);
  auto gpu = g.compile(kGpu, {}, {out}, CompileOptions{.strict_placement = true});
  EXPECT_EQ(gpu.device(), kGpu);
  for (auto& s : gpu.placement()) EXPECT_EQ(s.backend, "cuda") << s.op;
  auto r = gpu.run({{x, xv}, {y, yv.to(kGpu)}});  // host and device feeds
  ASSERT_EQ(r[0].device(), kGpu);
  auto want = g.compile(Device::cpu(), {}, {out}).run({{x, xv}, {y, yv}});
  expect_close(r[0].to(Device::cpu()), {64, 33}, to_f64(want[0]), 1e-5);
  // a feed on the device of the executable is used as it is; a GPU feed to a CPU executable is not
  auto cpu = g.compile(Device::cpu(), {}, {out});
  expect_error<UnsupportedError>([&] { cpu.run({{x, xv.to(kGpu)}, {y, yv}}); }, {"[run]", "'x'", "cuda:0"});
}

TEST(CudaRuntime, FallbackIsMarkedCopiedAndCorrect) {
  REQUIRE_GPU();
  Graph g;
  auto x = g.placeholder({1000}, f32, "x");
  auto out = relu(x) + x;
  Array xv = random_array({1000}, f32);
  WithoutCudaKernel no_relu(OpId::Relu);
  auto exe = g.compile(kGpu, {}, {out});
  bool marked = false;
  for (auto& s : exe.placement())
    if (s.op == "relu") {
      EXPECT_EQ(s.backend, "cpu");
      EXPECT_NE(s.fallback_reason.find("no cuda kernel"), std::string::npos) << s.fallback_reason;
      marked = true;
    }
  EXPECT_TRUE(marked);
  EXPECT_NE(exe.report().find("cpu fallback: "), std::string::npos) << exe.report();
  EXPECT_NE(exe.dump().find("[cpu fallback"), std::string::npos);
  auto r = exe.run({{x, xv}})[0].to(Device::cpu());
  std::vector<double> want;
  for (double v : to_f64(xv)) want.push_back((v > 0 ? v : 0) + v);
  expect_close(r, {1000}, want, 1e-6);
  expect_error<UnsupportedError>(
      [&] { g.compile(kGpu, {}, {out}, CompileOptions{.strict_placement = true}); },
      {"[compile]", "relu", "strict_placement"});
}

TEST(CudaRuntime, ValidateFindsAWrongKernel) {
  REQUIRE_GPU();
  if (!env::validate_on_cpu()) GTEST_SKIP() << "runs under KILN_VALIDATE=cpu (ctest entry CudaRuntimeValidate)";
  const KernelEntry* real = find_kernel(OpId::Relu, Backend::cuda);
  ASSERT_NE(real, nullptr);
  const KernelEntry saved = *real;
  // a kernel that writes zeros: wrong wherever x > 0
  KernelEntry wrong = saved;
  wrong.fn = [](KernelContext& ctx) {
    const TensorView& o = ctx.out(0);
    cudaMemsetAsync(o.data, 0, static_cast<size_t>(o.numel()) * size_of(o.dtype),
                    static_cast<cudaStream_t>(ctx.stream()));
  };
  register_kernel(OpId::Relu, Backend::cuda, wrong);
  Graph g;
  auto x = g.placeholder({100}, f32, "x");
  auto out = exp(x) - relu(x);
  // unfused, so the relu kernel runs (a fused node would not call it)
  auto exe = g.compile(kGpu, {}, {out}, {.fuse_elementwise = false});
  Array xv = random_array({100}, f32, 0.5, 1.0);
  expect_error<DeviceError>([&] { exe.run({{x, xv}}); }, {"[validate]", "relu", "element 0"});
  register_kernel(OpId::Relu, Backend::cuda, saved);
  auto r = exe.run({{x, xv}})[0];
  std::vector<double> want;
  for (double v : to_f64(xv)) want.push_back(std::exp(v) - v);
  expect_close(r.to(Device::cpu()), {100}, want, 1e-5);
}

TEST(CudaRuntime, OutOfMemoryThenRunsNormally) {
  REQUIRE_GPU();
  size_t free = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free, &total), cudaSuccess);
  const int64_t too_many = static_cast<int64_t>(total / 4) * 2;  // f32: twice the memory
  expect_error<OutOfMemory>([&] { Array::empty({too_many}, f32, kGpu); },
                            {"[cuda]", "out of memory", "asked for"});
  Graph g;
  auto x = g.placeholder({256}, f32, "x");
  Array xv = random_array({256}, f32);
  auto r = g.compile(kGpu, {}, {x * x}).run({{x, xv}})[0];
  std::vector<double> want;
  for (double v : to_f64(xv)) want.push_back(v * v);
  expect_close(r.to(Device::cpu()), {256}, want, 1e-6);
}

// A small classifier trained with Adam on the CPU and on the GPU from the same start.
std::vector<double> train_losses(Device device, int steps, Graph& g, Tensor* w1_out) {
  auto x = g.placeholder({32, 20}, f32, "x");
  auto y = g.placeholder({32}, i64, "y");
  auto w1 = g.variable(random_array({20, 64}, f32, -0.3, 0.3), "w1");
  auto b1 = g.variable(Array::zeros({64}, f32), "b1");
  auto w2 = g.variable(random_array({64, 5}, f32, -0.3, 0.3), "w2");
  auto loss = softmax_cross_entropy(matmul(relu(matmul(x, w1) + b1), w2), y);
  std::vector<Tensor> vars{w1, b1, w2};
  auto step = optim::adam(g, vars, gradients(loss, vars), {.lr = 1e-2});
  auto exe = g.compile(device, {}, {loss}, Updates(step));
  std::mt19937_64 data(9);
  std::vector<double> losses;
  for (int s = 0; s < steps; ++s) {
    std::vector<float> xs(32 * 20);
    std::vector<int64_t> ys(32);
    std::uniform_real_distribution<float> u(-1, 1);
    for (auto& v : xs) v = u(data);
    // learnable labels: the largest of the first five features
    for (int i = 0; i < 32; ++i)
      ys[i] = std::max_element(xs.begin() + i * 20, xs.begin() + i * 20 + 5) - (xs.begin() + i * 20);
    auto r = exe.run({{x, Array::from_vector(xs, {32, 20})}, {y, Array::from_vector(ys, {32})}});
    losses.push_back(r[0].to_vector<double>()[0]);
  }
  *w1_out = w1;
  return losses;
}

TEST(CudaRuntime, TrainingMatchesTheCpuTrajectory) {
  REQUIRE_GPU();
  const uint64_t s = seed();
  Graph gc, gg;
  Tensor wc, wg;
  rng().seed(s);
  auto cpu = train_losses(Device::cpu(), 40, gc, &wc);
  rng().seed(s);
  auto gpu = train_losses(kGpu, 40, gg, &wg);
  ASSERT_EQ(cpu.size(), gpu.size());
  for (size_t i = 0; i < cpu.size(); ++i)
    EXPECT_NEAR(gpu[i], cpu[i], 1e-3 * (1 + std::abs(cpu[i]))) << "step " << i;
  EXPECT_LT(gpu.back(), 0.6 * gpu.front());  // it learns
  // variables come back to the host on request and match the CPU's: within 1e-3 relative, and
  // within lr / 10 absolute (Adam moves a weight whose gradient is near zero by about lr times
  // the gradient's sign, so f32 rounding that differs between the devices moves such weights
  // apart by fractions of lr: 2e-4 after 40 steps was seen on an H100)
  Array a = gc.read_variable(wc), b = gg.read_variable(wg);
  EXPECT_EQ(b.device(), Device::cpu());
  expect_close(b, a.shape(), to_f64(a), 1e-3, 1e-3);
  // a checkpoint of GPU-trained variables round-trips, and a CPU executable of the same graph
  // runs after the GPU one
  const std::string path = ::testing::TempDir() + "cuda_runtime.ckpt";
  gg.save_variables(path);
  gg.write_variable(wg, Array::zeros(a.shape(), f32));
  gg.load_variables(path);
  expect_close(gg.read_variable(wg), a.shape(), to_f64(b), 0, 0);
  auto doubled = gg.compile(Device::cpu(), {}, {wg * 2.0}).run(Feeds{})[0];
  std::vector<double> want;
  for (double v : to_f64(b)) want.push_back(2 * v);
  expect_close(doubled, a.shape(), want, 1e-6);
}

TEST(CudaRuntime, ConcurrentRunsKeepTheirBuffersApart) {
  REQUIRE_GPU();
  Graph g;
  auto x = g.placeholder({4096}, f32, "x");
  auto out = sqrt(abs(x) + 1.0) * x;
  auto exe = g.compile(kGpu, {}, {out});
  std::vector<std::thread> threads;
  std::vector<int> failures(4, 0);
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int it = 0; it < 30; ++it) {
        std::vector<float> xs(4096);
        for (size_t i = 0; i < xs.size(); ++i) xs[i] = static_cast<float>(t * 1000 + it) + 0.001f * i;
        auto r = exe.run({{x, Array::from_vector(xs, {4096})}})[0].to_vector<float>();
        for (size_t i = 0; i < xs.size(); ++i) {
          const double want = std::sqrt(std::abs(xs[i]) + 1.0) * xs[i];
          if (std::abs(r[i] - want) > 1e-5 * (1 + std::abs(want))) ++failures[t];
        }
      }
    });
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(failures[t], 0) << "thread " << t;
  // each concurrent run has its own stream, buffers and CUDA graph (recorded on its second run)
  if (!env::validate_on_cpu()) EXPECT_GT(exe.replayed_runs(), 0);  // KILN_VALIDATE: not recorded
}

}  // namespace
}  // namespace kiln
