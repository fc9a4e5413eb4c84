// Fused elementwise kernels on CUDA (generated, compiled by NVRTC): against the unfused CUDA
// kernels (same math, so exact for f32/f64/integers and, rounding per op, for f16/bf16) and
// against the CPU. Skipped without a GPU.
#include <fmt/format.h>

#include <cstring>
#include <sstream>
#include <thread>

#include "backends/cuda/fused_elementwise.h"
#include "kiln/kiln.h"
#include "ops/fused_elementwise.h"
#include "support/reference.h"
#include "support/gpu.h"

namespace kiln {
namespace {
using namespace kiln::test;

const Device kGpu = Device::cuda(0);
const CompileOptions kFused{.strict_placement = true};
const CompileOptions kUnfused{.strict_placement = true, .fuse_elementwise = false};

int fused_nodes(const Executable& e) {
  const std::string d = e.dump();
  int n = 0;
  for (size_t p = d.find("= fused_elementwise("); p != std::string::npos;
       p = d.find("= fused_elementwise(", p + 1))
    ++n;
  return n;
}

struct Model {
  Graph g;
  Tensor a, b, s, out;
};
// Eight elementwise ops over a dense input, a broadcast input (a row, or a column) and a scalar.
void build(Model& m, DType t, const Shape& shape, const Shape& b_shape) {
  m.a = m.g.placeholder(shape, t, "a");
  m.b = m.g.placeholder(b_shape, t, "b");
  m.s = m.g.placeholder({}, t, "s");
  if (is_floating(t)) {
    auto z = tanh(m.a * m.b + m.s) - sigmoid(m.a);
    m.out = clip(gelu(z, GeluApprox::none) * 1.5, -0.75, 2.0);
  } else {
    m.out = maximum(abs(m.a * m.b + m.s) - m.a, mod(m.a, m.b)) * m.s;
  }
}

TEST(CudaFusedElementwise, MatchesUnfusedCudaAndCpu) {
  REQUIRE_GPU();
  for (DType t : {f32, f64, f16, bf16, i32})
    // (rows of 2048 take the vector path's one offset computation a chunk, rows of 1031 one an
    // element; the column broadcast too)
    for (const Shape& shape :
         {Shape{1}, Shape{4097}, Shape{64, 1031}, Shape{8, 16, 2048}, Shape{48, 1024}}) {
      const bool column = shape == Shape{48, 1024};
      const Shape b_shape = column ? Shape{48, 1} : Shape{shape.back()};
      SCOPED_TRACE(fmt::format("{} {}", name(t), to_string(shape)));
      Model m;
      build(m, t, shape, b_shape);
      auto fused = m.g.compile(kGpu, {}, {m.out}, kFused);
      auto plain = m.g.compile(kGpu, {}, {m.out}, kUnfused);
      auto cpu = m.g.compile(Device::cpu(), {}, {m.out}, kUnfused);
      EXPECT_EQ(fused_nodes(fused), 1) << fused.dump();
      const bool fl = is_floating(t);
      const Feeds f{{m.a, fl ? random_array(shape, t, -2, 2) : random_nonzero(shape, t, 1, 9)},
                    {m.b, fl ? random_array(b_shape, t, -2, 2) : random_nonzero(b_shape, t, 1, 9)},
                    {m.s, fl ? random_array({}, t, -1, 1) : random_nonzero({}, t, 1, 3)}};
      const Array got = fused.run(f)[0].to(Device::cpu());
      const Array want = plain.run(f)[0].to(Device::cpu());
      ASSERT_EQ(got.nbytes(), want.nbytes());
      EXPECT_EQ(std::memcmp(got.data(), want.data(), got.nbytes()), 0)
          << "fused and unfused CUDA results differ";
      const Array ref = cpu.run(f)[0];
      const double tol = t == f16 ? 2e-2 : t == bf16 ? 1e-1 : fl ? tolerance(t) * 20 : 0;
      if (fl)
        expect_close(got, shape, to_f64(ref), tol, tol);
      else
        expect_equal(got, shape, to_f64(ref));
    }
}

// The gradients of the demo's convnet (conv + bias + relu, max-pool, linear, cross entropy):
// fused and unfused CUDA give the same bits for the loss and every gradient the elementwise
// kernels and reductions make. The convolution weight gradients get a tolerance: cuDNN's
// backward-filter algorithm is chosen by timing (src/backends/cuda/conv_algo.cu) and may be one
// that adds with atomics, so it can differ between two executables (and two runs) in the last bits.
TEST(CudaFusedElementwise, ConvnetGradientsMatchUnfused) {
  REQUIRE_GPU();
  const Array x0 = random_array({32, 1, 8, 8}, f32, 0, 1);
  const Array y0 = random_ints({32}, 0, 9);
  const Array w1 = random_array({16, 1, 3, 3}, f32, -0.5, 0.5);
  const Array w2 = random_array({32, 16, 3, 3}, f32, -0.1, 0.1);
  const Array wf = random_array({10, 128}, f32, -0.1, 0.1);
  std::vector<std::vector<Array>> got;
  for (const CompileOptions& o : {kFused, kUnfused}) {
    Graph g;
    auto x = g.placeholder({32, 1, 8, 8}, f32, "x");
    auto y = g.placeholder({32}, i64, "y");
    std::vector<Tensor> vars{g.variable(w1), g.variable(Array::zeros({16}, f32)),
                             g.variable(w2), g.variable(Array::zeros({32}, f32)),
                             g.variable(wf), g.variable(Array::zeros({10}, f32))};
    ConvOptions same;
    same.padding = {1, 1};
    PoolOptions pool2;
    pool2.kernel = {2, 2};
    Tensor h = max_pool(relu(conv2d(x, vars[0], vars[1], same)), pool2);
    h = max_pool(relu(conv2d(h, vars[2], vars[3], same)), pool2);
    auto loss = softmax_cross_entropy(linear(reshape(h, {-1, 128}), vars[4], vars[5]), y);
    std::vector<Tensor> fetch{loss};
    for (const Tensor& d : gradients(loss, vars)) fetch.push_back(d);
    std::vector<Array> vals;
    for (const Array& a : g.compile(kGpu, {}, fetch, o).run({{x, x0}, {y, y0}}))
      vals.push_back(a.to(Device::cpu()));
    got.push_back(std::move(vals));
  }
  const char* names[] = {"loss", "d conv1.w", "d conv1.b", "d conv2.w", "d conv2.b", "d fc.w",
                         "d fc.b"};
  for (size_t i = 0; i < got[0].size(); ++i) {
    SCOPED_TRACE(names[i]);
    if (i == 1 || i == 3) {
      expect_close(got[0][i], got[1][i].shape(), to_f64(got[1][i]), 1e-5, 1e-7);
      continue;
    }
    ASSERT_EQ(got[0][i].nbytes(), got[1][i].nbytes());
    EXPECT_EQ(std::memcmp(got[0][i].data(), got[1][i].data(), got[0][i].nbytes()), 0)
        << "fused and unfused CUDA results differ";
  }
}

TEST(CudaFusedElementwise, CompilesOncePerProgramAcrossThreads) {
  REQUIRE_GPU();
  Model m;
  build(m, f32, {256, 257}, {257});
  std::vector<std::thread> threads;
  std::vector<int> ok(4, 0);
  for (int k = 0; k < 4; ++k)
    threads.emplace_back([&, k] {
      auto e = m.g.compile(kGpu, {}, {m.out}, kFused);
      ok[k] = fused_nodes(e);
    });
  for (auto& th : threads) th.join();
  for (int k = 0; k < 4; ++k) EXPECT_EQ(ok[k], 1);
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// Every fusable op in every dtype its inference takes, and every cast, generated and compiled
// by NVRTC for sm_90 (no GPU needed): one program per dtype.
TEST(CudaFusedElementwiseCodegen, EveryOpCompiles) {
  for (DType t : {f32, f16, bf16, f64, i8, u8, i16, i32, i64, boolean}) {
    SCOPED_TRACE(name(t));
    fused::Program p;
    p.num_inputs = 3;
    const std::vector<DType> ins{t, t, boolean};
    int count = 0;
    for (OpId op : kAllOps) {
      const int ar = fused::arity(op);
      if (ar == 0 || op == OpId::Cast) continue;
      fused::Instr in;
      in.op = op;
      in.a = op == OpId::Where ? 2 : 0;
      in.b = ar >= 2 ? (op == OpId::Where ? 0 : 1) : -1;
      in.c = ar == 3 ? 1 : -1;
      if (op == OpId::LeakyRelu || op == OpId::Elu) in.p0 = 0.25;
      if (op == OpId::Softplus) in.p0 = 1, in.p1 = 20;
      if (op == OpId::Softshrink || op == OpId::Hardshrink) in.p0 = 0.5;
      if (op == OpId::Hardsigmoid) in.p0 = 0.2, in.p1 = 0.5;
      if (op == OpId::Clip) in.p0 = -1.5, in.p1 = 2.5;
      // the dtype its inference gives, or skip when it rejects t
      bool ok = false;
      for (DType r : {t, boolean}) {
        in.dtype = r;
        fused::Program one;
        one.num_inputs = 3;
        one.instrs = {in};
        try {
          fused::decode(fused::encode(one), ins);
          ok = true;
          break;
        } catch (const ValueError&) {
        }
      }
      if (!ok) continue;
      p.instrs.push_back(in);
      ++count;
    }
    // (to every dtype a fused program holds: the narrow types never fuse)
    for (int d = 0; d < kNumDTypes; ++d)
      if (!is_narrow(static_cast<DType>(d)))
        p.instrs.push_back({OpId::Cast, static_cast<DType>(d), 0});
    // the last value combines two others, so the output depends on the chain
    p.instrs.push_back({OpId::Cast, t, 3 + count - 1});
    EXPECT_GT(count, 3);
    const std::string src = cuda::fused_elementwise_source(
        fused::encode(p), {{{64, 33}, t}, {{33}, t}, {{}, boolean}}, {{64, 33}, t});
    try {
      EXPECT_FALSE(cuda::fused_elementwise_cubin(src, 90).empty());
    } catch (const Error& e) {
      ADD_FAILURE() << e.what() << "\nsource:\n" << src;
    }
  }
}

TEST(CudaFusedElementwiseCodegen, CompilerErrorsCarryTheLog) {
  expect_error<DeviceError>([] { cuda::fused_elementwise_cubin("this is not C++", 90); },
                            {"[fused_elementwise]", "nvrtcCompileProgram", "compiler log"});
}

}  // namespace
}  // namespace kiln
