// Groups of small elementwise values on CUDA (fuse_elementwise's second phase: one
// fused_elementwise node of several outputs, one generated kernel launch): their source compiles
// for every dtype (NVRTC, no GPU needed), and on a GPU their results match the CPU's, a loop
// step's three values in one launch.
#include <fmt/format.h>

#include <random>

#include "backends/cuda/fused_elementwise.h"
#include "kiln/kiln.h"
#include "ops/fused_elementwise.h"
#include "support/gpu.h"
#include "support/random_graphs.h"
#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;

const Device kGpu = Device::cuda(0);

int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

// A group whose parts give every dtype, each from a dense input of its size and a single value:
// its kernel's source compiles.
TEST(CudaFusedElementwiseCodegen, GroupsCompile) {
  std::vector<fused::Part> parts;
  std::vector<TensorInfo> ins;
  for (DType t : {f32, f16, bf16, f64, i8, u8, i16, i32, i64, boolean}) {
    const auto base = static_cast<int32_t>(ins.size());
    ins.push_back({{5 + base}, t});
    ins.push_back({{}, t});
    fused::Part part;
    part.inputs = {base, base + 1};
    part.program.num_inputs = 2;
    if (t == boolean) {
      part.program.instrs = {{OpId::LogicalXor, boolean, 0, 1}};
    } else {
      part.program.instrs = {
          {OpId::Maximum, t, 0, 1}, {OpId::Less, boolean, 2, 0}, {OpId::Where, t, 3, 2, 1}};
    }
    parts.push_back(std::move(part));
  }
  ASSERT_LE(parts.size(), static_cast<size_t>(fused::kMaxParts));
  std::vector<DType> types;
  for (const TensorInfo& t : ins) types.push_back(t.dtype);
  const Attrs attrs = fused::encode_group(parts);
  ASSERT_EQ(fused::decode_parts(attrs, types).size(), parts.size());
  const std::string src = cuda::fused_elementwise_source(attrs, ins, ins[0]);
  EXPECT_NE(src.find("elem9"), std::string::npos) << src;
  try {
    EXPECT_FALSE(cuda::fused_elementwise_cubin(src, 90).empty());
  } catch (const Error& e) {
    ADD_FAILURE() << e.what() << "\nsource:\n" << src;
  }
}

// A while_loop step's values (the counter's add, the comparison on it, the carried update) as
// one node on CUDA, equal to the CPU's.
TEST(CudaFusedGroups, LoopStepIsOneLaunch) {
  REQUIRE_GPU();
  Graph g;
  const Tensor i = g.placeholder({}, i64, "i"), n = g.placeholder({}, i64, "n");
  const Tensor x = g.placeholder({256}, f32, "x");
  const Tensor next = i + g.constant(Array::scalar(int64_t{1}));
  const Tensor go = less(next, n);
  const Tensor y = x * 0.999 + 0.001;
  auto gpu = g.compile(kGpu, {}, {next, go, y}, {.strict_placement = true});
  EXPECT_EQ(gpu.num_steps(), 1u) << gpu.dump();
  auto cpu = g.compile(Device::cpu(), {}, {next, go, y});
  for (int64_t at : {4, 9}) {
    const Feeds f{
        {i, Array::scalar(at)}, {n, Array::scalar(int64_t{9})}, {x, random_array({256}, f32)}};
    const auto got = gpu.run(f), want = cpu.run(f);
    EXPECT_EQ(got[0].to(Device::cpu()).to_vector<int64_t>(), want[0].to_vector<int64_t>());
    EXPECT_EQ(got[1].to(Device::cpu()).to_vector<int64_t>(), want[1].to_vector<int64_t>());
    expect_close(got[2].to(Device::cpu()), {256}, to_f64(want[2]), 1e-6, 1e-7);
  }
}

// Negated integers feeding chained minima and maxima, which ptxas for sm_90 folds into one
// three-way instruction (and once dropped the negation: min(min(-x, x), x + c) came out as
// min(x, x, x + c), wrong wherever x > 0); small values (groups) and a large one (a program), for
// each integer width that has the instruction.
TEST(CudaFusedGroups, NegationsInChainedMinimaAndMaxima) {
  REQUIRE_GPU();
  for (DType t : {i32, i16, i8, i64}) {
    SCOPED_TRACE(name(t));
    Graph g;
    const Tensor x = g.placeholder({3, 7}, t, "x"), c = g.placeholder({}, t, "c");
    const Tensor big = g.placeholder({33, 65}, t, "big");
    const std::vector<Tensor> outs{minimum(minimum(-x, x), x + c), maximum(maximum(-x, c), x),
                                   minimum(abs(x), c) - x, minimum(minimum(-big, big), big + c),
                                   maximum(maximum(-big, c), big)};
    auto gpu = g.compile(kGpu, {}, outs, {.strict_placement = true});
    auto cpu = g.compile(Device::cpu(), {}, outs);
    for (int64_t cv : {-2, 0, 3}) {
      const Feeds f{{x, random_array({3, 7}, t, -9, 9)},
                    {c, Array::scalar(cv).astype(t)},
                    {big, random_array({33, 65}, t, -9, 9)}};
      const auto got = gpu.run(f), want = cpu.run(f);
      for (size_t k = 0; k < outs.size(); ++k) {
        SCOPED_TRACE(fmt::format("output {}, c = {}", k, cv));
        expect_equal(got[k].to(Device::cpu()), want[k].shape(), to_f64(want[k]));
      }
    }
  }
}

// Random graphs of small values of several dtypes (support/random_graphs.h: elementwise ops among
// them, and reductions that end groups): the CUDA executable's outputs equal the CPU's (floats
// within a few units in the last place: a product and a sum may contract into one FMA on the GPU).
TEST(CudaFusedGroups, RandomGraphsMatchTheCpu) {
  REQUIRE_GPU();
  std::mt19937 rng(static_cast<uint32_t>(seed()));
  const std::vector<Shape> shapes{{}, {1}, {7}, {3, 7}, {33, 65}};
  int grouped = 0;
  for (int trial = 0; trial < 40; ++trial) {
    const DType t = std::vector<DType>{f32, f16, bf16, f64, i32}[trial % 5];
    SCOPED_TRACE(fmt::format("trial {} {} (seed {})", trial, name(t), seed()));
    Graph g;
    const RandomGraph r = random_small_graph(g, rng, t, shapes, false);
    auto gpu = g.compile(kGpu, {}, r.outputs, {.strict_placement = true});
    auto cpu = g.compile(Device::cpu(), {}, r.outputs);
    grouped += count(gpu.dump(), "fused_elementwise(") > 0;
    const auto got = gpu.run(r.feeds), want = cpu.run(r.feeds);
    ASSERT_EQ(got.size(), want.size());
    const double tol = t == f16 ? 4e-3 : t == bf16 ? 3e-2 : t == f32 ? 1e-5 : 1e-12;
    for (size_t k = 0; k < got.size(); ++k) {
      SCOPED_TRACE(fmt::format("output {}\n{}", k, gpu.dump()));
      const Array a = got[k].to(Device::cpu());
      if (is_floating(t)) expect_close(a, want[k].shape(), to_f64(want[k]), tol, tol);
      else expect_equal(a, want[k].shape(), to_f64(want[k]));
    }
  }
  EXPECT_GT(grouped, 20);
}

}  // namespace
}  // namespace kiln
