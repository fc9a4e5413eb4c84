// Groups of small elementwise values (fuse_elementwise's second phase: several independent small
// values, and chains whose values are also read elsewhere, as one fused_elementwise node of
// several outputs): which nodes join, and results against the unfused graph, bit for bit on the
// CPU, over random graphs of elementwise and other ops.
#include <fmt/format.h>

#include <cstdio>
#include <cstring>
#include <random>

#include "core/graph_impl.h"
#include "ops/fused_elementwise.h"
#include "support/random_graphs.h"
#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;

const CompileOptions kUnfused{.fuse_elementwise = false};

int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

void expect_same(const Array& got, const Array& want, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  ASSERT_EQ(got.dtype(), want.dtype()) << what;
  EXPECT_EQ(std::memcmp(got.data(), want.data(), want.nbytes()), 0)
      << what << ": fused and unfused results differ";
}

// A while_loop's step: the counter's add, the comparison on it, and the carried value's update
// (three nodes, two of them single values) run as one node of three outputs.
TEST(FuseGroups, LoopStepIsOneNode) {
  Graph g;
  const Tensor i = g.placeholder({}, i64, "i"), n = g.placeholder({}, i64, "n");
  const Tensor x = g.placeholder({256}, f32, "x");
  const Tensor next = i + g.constant(Array::scalar(int64_t{1}));
  const Tensor go = less(next, n);
  const Tensor y = x * 0.999 + 0.001;
  auto fused = g.compile(Device::cpu(), {}, {next, go, y});
  EXPECT_EQ(count(fused.dump(), "fused_elementwise("), 1) << fused.dump();
  EXPECT_EQ(fused.num_steps(), 1u) << fused.dump();
  auto plain = g.compile(Device::cpu(), {}, {next, go, y}, kUnfused);
  for (int64_t at : {3, 9}) {
    const Feeds f{
        {i, Array::scalar(at)}, {n, Array::scalar(int64_t{9})}, {x, random_array({256}, f32)}};
    const auto got = fused.run(f), want = plain.run(f);
    for (size_t k = 0; k < got.size(); ++k)
      expect_same(got[k], want[k], fmt::format("output {}", k));
  }
}

// A group travels in a package (its parts in the node's attributes) and runs the same after the
// load; a damaged one is refused when the package loads, naming the part.
TEST(FuseGroups, PackageRoundTrip) {
  Graph g;
  const Tensor i = g.placeholder({}, i64, "i"), x = g.placeholder({64}, f32, "x");
  const Tensor next = i + g.constant(Array::scalar(int64_t{1}));
  const Tensor y = tanh(x) * 0.5;
  auto exe = g.compile(Device::cpu(), {}, {next, y});
  ASSERT_EQ(exe.num_steps(), 1u) << exe.dump();
  const std::string path = ::testing::TempDir() + "fused_groups_round_trip.kiln";
  exe.save(path);
  auto loaded = Executable::load(path, Device::cpu());
  std::remove(path.c_str());
  EXPECT_EQ(loaded.num_steps(), 1u) << loaded.dump();
  const Array xv = random_array({64}, f32);
  const auto got =
      loaded.run(std::map<std::string, Array>{{"i", Array::scalar(int64_t{41})}, {"x", xv}});
  const auto want = exe.run({{i, Array::scalar(int64_t{41})}, {x, xv}});
  for (size_t k = 0; k < want.size(); ++k)
    expect_same(got[k], want[k], fmt::format("output {}", k));
  // parts that claim more instructions than the node holds
  fused::Part p;
  p.inputs = {0};
  p.program.num_inputs = 1;
  p.program.instrs = {{OpId::Neg, f32, 0}};
  Attrs bad = fused::encode_group({p, p});
  bad.set("parts", std::vector<int64_t>{1, 1, 1, 5});
  expect_error<ValueError>(
      [&] {
        detail::make_node1(OpId::FusedElementwise, {x, x}, bad);
      },
      {"[fused_elementwise]", "part 1", "instructions"});
}

// A value read inside the group and outside it is an output and is computed again where the
// group reads it; a node outside that reads a member ends the group (it runs after it).
TEST(FuseGroups, ReadersOutsideEndTheGroup) {
  Graph g;
  const Tensor a = g.placeholder({8, 4}, f32, "a"), b = g.placeholder({8, 4}, f32, "b");
  const Tensor u = exp(a) * b;    // read by v and by the sum
  const Tensor v = tanh(u) + a;   // joins
  const Tensor s = sum(u);        // reads u: the group ends before it
  const Tensor w = v * s;         // after the sum
  const Tensor z = abs(b) - 1.0;  // independent of all
  auto fused = g.compile(Device::cpu(), {}, {w, z, u});
  auto plain = g.compile(Device::cpu(), {}, {w, z, u}, kUnfused);
  const Feeds f{{a, random_array({8, 4}, f32)}, {b, random_array({8, 4}, f32)}};
  const auto got = fused.run(f), want = plain.run(f);
  for (size_t k = 0; k < got.size(); ++k) expect_same(got[k], want[k], fmt::format("output {}", k));
  EXPECT_LT(fused.num_steps(), plain.num_steps()) << fused.dump();
}

// Many small values: more than one node's parts and inputs, so the group is cut into several
// nodes in order, each within the limits.
TEST(FuseGroups, ManyValuesMakeSeveralNodes) {
  Graph g;
  const Tensor x = g.placeholder({8}, f32, "x");
  std::vector<Tensor> outs;
  for (int k = 0; k < 40; ++k) outs.push_back(x * (0.5 + k) + static_cast<double>(k));
  auto fused = g.compile(Device::cpu(), {}, outs);
  auto plain = g.compile(Device::cpu(), {}, outs, kUnfused);
  const int nodes = count(fused.dump(), "fused_elementwise(");
  EXPECT_GE(nodes, 3) << fused.dump();  // (40 parts, at most 16 a node)
  EXPECT_LE(nodes, 10) << fused.dump();
  const Feeds f{{x, random_array({8}, f32)}};
  const auto got = fused.run(f), want = plain.run(f);
  for (size_t k = 0; k < got.size(); ++k) expect_same(got[k], want[k], fmt::format("output {}", k));
}

// Random graphs (support/random_graphs.h: values of a few small shapes and one large,
// elementwise ops between them, reductions, casts and products among them, random outputs), in
// f32, f16, bf16, f64 and i32. Every output of the fused executable equals the unfused one's bit
// for bit.
TEST(FuseGroups, RandomGraphsMatchTheUnfusedGraph) {
  std::mt19937 rng(static_cast<uint32_t>(seed()));
  const std::vector<Shape> shapes{{}, {1}, {7}, {3, 7}, {130, 150}};
  int grouped = 0;
  for (int trial = 0; trial < 60; ++trial) {
    // (f32 with every op kind; the other dtypes, rounded after every op, with the exact ones)
    const DType t = std::vector<DType>{f32, f32, f16, bf16, f64, i32}[trial % 6];
    SCOPED_TRACE(fmt::format("trial {} {} (seed {})", trial, name(t), seed()));
    Graph g;
    const RandomGraph r = random_small_graph(g, rng, t, shapes, t == f32);
    auto fused = g.compile(Device::cpu(), {}, r.outputs);
    auto plain = g.compile(Device::cpu(), {}, r.outputs, kUnfused);
    grouped += count(fused.dump(), "fused_elementwise(") > 0;
    const auto got = fused.run(r.feeds), want = plain.run(r.feeds);
    ASSERT_EQ(got.size(), want.size());
    for (size_t k = 0; k < got.size(); ++k)
      expect_same(got[k], want[k], fmt::format("output {}\n{}", k, fused.dump()));
  }
  EXPECT_GT(grouped, 30);  // (the test exercises fused nodes)
}

}  // namespace
}  // namespace kiln
