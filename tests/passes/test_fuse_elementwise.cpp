// The fuse_elementwise pass: which groups it forms, and fused results against the unfused graph
// (exact on the CPU, whose fused kernel runs each op's own kernel over chunks).
#include <fmt/format.h>

#include <cstdio>
#include <cstring>

#include "kiln/optim.h"
#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;

const CompileOptions kFused{};
const CompileOptions kUnfused{.fuse_elementwise = false};

int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}
int fused_nodes(const Executable& e) { return count(e.dump(), "= fused_elementwise("); }

// Bitwise equality (NaNs included), which the CPU's fused kernel promises for every dtype.
void expect_same(const Array& got, const Array& want) {
  ASSERT_EQ(got.shape(), want.shape());
  ASSERT_EQ(got.dtype(), want.dtype());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), want.nbytes()), 0)
      << "fused and unfused results differ (" << name(got.dtype()) << to_string(got.shape()) << ")";
}

TEST(FuseElementwise, ChainBecomesOneNode) {
  for (DType t : {f32, f64}) {
    SCOPED_TRACE(name(t));
    Graph g;
    auto x = g.placeholder({333, 77}, t, "x");
    auto y = g.placeholder({333, 77}, t, "y");
    // eight elementwise ops, two scalar constants
    auto z = sigmoid(tanh(exp(x * 0.5) - y) * y + 1.0);
    auto out = leaky_relu(gelu(z, GeluApprox::tanh), 0.1);
    auto fused = g.compile(Device::cpu(), {}, {out}, kFused);
    auto plain = g.compile(Device::cpu(), {}, {out}, kUnfused);
    EXPECT_EQ(fused_nodes(fused), 1) << fused.dump();
    EXPECT_EQ(fused_nodes(plain), 0);
    EXPECT_EQ(fused.num_steps(), 1u) << fused.dump();
    const Array xa = random_array({333, 77}, t, -2, 2), ya = random_array({333, 77}, t, -2, 2);
    const Feeds f{{x, xa}, {y, ya}};
    expect_same(fused.run(f)[0], plain.run(f)[0]);
    // and against a float64 reference
    const auto xv = to_f64(xa), yv = to_f64(ya);
    std::vector<double> want(xv.size());
    for (size_t i = 0; i < xv.size(); ++i) {
      const double zz = 1 / (1 + std::exp(-(std::tanh(std::exp(xv[i] * 0.5) - yv[i]) * yv[i] + 1)));
      const double gl =
          0.5 * zz * (1 + std::tanh(0.7978845608028654 * (zz + 0.044715 * zz * zz * zz)));
      want[i] = gl > 0 ? gl : 0.1 * gl;
    }
    expect_close(fused.run(f)[0], {333, 77}, want, tolerance(t) * 10, tolerance(t) * 10);
  }
}

TEST(FuseElementwise, EscapingIntermediatesStayOutside) {
  Graph g;  // (values above the size of small groups: FuseGroups)
  auto x = g.placeholder({200, 100}, f32, "x");
  auto a = x + 1.0;       // read by the sum below and returned: stays a node
  auto b = exp(a) * 3.0;  // exp and mul fuse
  auto c = sum(a);        // a reduction is no elementwise op
  auto fused = g.compile(Device::cpu(), {}, {b, a, c}, kFused);
  EXPECT_EQ(fused_nodes(fused), 1) << fused.dump();
  EXPECT_EQ(count(fused.dump(), "= add("), 1) << fused.dump();
  auto plain = g.compile(Device::cpu(), {}, {b, a, c}, kUnfused);
  const Feeds f{{x, random_array({200, 100}, f32)}};
  const auto got = fused.run(f), want = plain.run(f);
  for (size_t i = 0; i < got.size(); ++i) expect_same(got[i], want[i]);

  // an intermediate read twice inside the group is fine; one read outside stops it (values above
  // the size of small groups, which compute such an intermediate again: SmallValuesRunAsOneNode)
  Graph h;
  auto u = h.placeholder({64, 512}, f32, "u");
  auto v = u * u;
  auto w = sqrt(v + v);
  auto exe = h.compile(Device::cpu(), {}, {w}, kFused);
  EXPECT_EQ(fused_nodes(exe), 1);
  EXPECT_EQ(exe.num_steps(), 1u) << exe.dump();
  auto v2 = relu(v);
  auto exe2 = h.compile(Device::cpu(), {}, {w, v2}, kFused);  // v now escapes to relu
  EXPECT_EQ(count(exe2.dump(), "= mul("), 1) << exe2.dump();
}

TEST(FuseElementwise, BroadcastInputsStayInputs) {
  Graph g;
  auto x = g.placeholder({16, 9, 31}, f32, "x");
  auto bias = g.placeholder({31}, f32, "bias");
  auto scale = g.placeholder({9, 1}, f32, "scale");
  auto s = g.placeholder({}, f32, "s");
  auto small = bias * 2.0;  // of shape (31): stays outside, an input of the fused node
  auto out = clip(relu(x + small) * scale - s, -0.5, 0.75);
  auto fused = g.compile(Device::cpu(), {}, {out}, kFused);
  auto plain = g.compile(Device::cpu(), {}, {out}, kUnfused);
  EXPECT_EQ(fused_nodes(fused), 1) << fused.dump();
  EXPECT_EQ(count(fused.dump(), "= mul("), 1) << fused.dump();  // bias * 2
  const Feeds f{{x, random_array({16, 9, 31}, f32)},
                {bias, random_array({31}, f32)},
                {scale, random_array({9, 1}, f32)},
                {s, random_array({}, f32)}};
  expect_same(fused.run(f)[0], plain.run(f)[0]);
}

TEST(FuseElementwise, MixedDtypesThroughCasts) {
  Graph g;
  auto x = g.placeholder({1000}, f16, "x");
  auto k = g.placeholder({1000}, i32, "k");
  auto y = cast(x, f32) * cast(k, f32);
  auto m = greater(y, g.scalar(0.25));
  auto out = cast(where(m, tanh(y), -y), bf16);
  auto fused = g.compile(Device::cpu(), {}, {out}, kFused);
  auto plain = g.compile(Device::cpu(), {}, {out}, kUnfused);
  EXPECT_EQ(fused_nodes(fused), 1) << fused.dump();
  const Feeds f{{x, random_array({1000}, f16, -2, 2)}, {k, random_ints({1000}, -3, 3, i32)}};
  expect_same(fused.run(f)[0], plain.run(f)[0]);
}

// One chain per dtype on fresh random data, sizes around the 4096-element chunk.
TEST(FuseElementwise, MatchesUnfusedForEveryDtype) {
  for (DType t : {f32, f64, f16, bf16, i32, i64, i8, u8})
    for (int64_t n : {1, 4095, 4096, 4097, 50000}) {
      SCOPED_TRACE(fmt::format("{} n={}", name(t), n));
      Graph g;
      auto a = g.placeholder({n}, t, "a");
      auto b = g.placeholder({n}, t, "b");
      Tensor out;
      if (is_floating(t))
        out = softplus(abs(a * b - a) + 0.5, 1.0, 20.0) / (hardsigmoid(b, 0.2, 0.5) + 1.0);
      else
        out = maximum(clip(a * b + a, -20, 100), mod(b, a)) - floor(a);
      auto fused = g.compile(Device::cpu(), {}, {out}, kFused);
      auto plain = g.compile(Device::cpu(), {}, {out}, kUnfused);
      EXPECT_EQ(fused_nodes(fused), 1) << fused.dump();
      const Array av = is_floating(t) ? random_array({n}, t, -3, 3) : random_nonzero({n}, t, 1, 9);
      const Array bv = is_floating(t) ? random_array({n}, t, -3, 3) : random_nonzero({n}, t, 1, 9);
      const Feeds f{{a, av}, {b, bv}};
      expect_same(fused.run(f)[0], plain.run(f)[0]);
    }
}

TEST(FuseElementwise, SwitchedOffByTheOption) {
  Graph g;
  auto x = g.placeholder({10}, f32, "x");
  auto out = exp(x) + x;
  EXPECT_EQ(fused_nodes(g.compile(Device::cpu(), {}, {out}, kUnfused)), 0);
  EXPECT_EQ(fused_nodes(g.compile(Device::cpu(), {}, {out}, {.optimize = false})), 0);
  const char* env = std::getenv("KILN_FUSION");
  EXPECT_EQ(fused_nodes(g.compile(Device::cpu(), {}, {out}, kFused)),
            env && std::string(env) == "0" ? 0 : 1);
}

// A small MLP's training step gives the same weights with fusion on and off.
TEST(FuseElementwise, TrainingStepIsUnchanged) {
  std::vector<std::vector<Array>> results;
  const Array xv = random_array({32, 20}, f32), yv = random_array({32, 4}, f32);
  const Array w1v = random_array({20, 16}, f32, -0.5, 0.5),
              w2v = random_array({16, 4}, f32, -0.5, 0.5);
  for (const CompileOptions& opts : {kFused, kUnfused}) {
    Graph g;
    auto x = g.placeholder({32, 20}, f32, "x");
    auto y = g.placeholder({32, 4}, f32, "y");
    auto w1 = g.variable(w1v.copy(), "w1");
    auto w2 = g.variable(w2v.copy(), "w2");
    auto h = gelu(matmul(x, w1), GeluApprox::none);
    auto p = tanh(matmul(h, w2));
    auto loss = mean((p - y) * (p - y));
    auto grads = gradients(loss, {w1, w2});
    auto exe = g.compile(
        Device::cpu(), {}, {loss, grads[0], grads[1]},
        Updates{{assign(w1, w1 - grads[0] * 0.1), assign(w2, w2 - grads[1] * 0.1)}}, opts);
    if (&opts == &kFused) EXPECT_GE(fused_nodes(exe), 1) << exe.dump();
    std::vector<Array> r = exe.run({{x, xv}, {y, yv}});
    r.push_back(exe.read_variable("w1"));
    r.push_back(exe.read_variable("w2"));
    results.push_back(r);
  }
  for (size_t i = 0; i < results[0].size(); ++i) expect_same(results[0][i], results[1][i]);
}

// Reads of a variable before its assignment never join nodes that run after it.
TEST(FuseElementwise, ReadsBeforeAnAssignmentStayBeforeIt) {
  Graph g;
  auto x = g.placeholder({300}, f32, "x");
  const Array v0 = random_array({300}, f32);
  auto v = g.variable(v0.copy(), "v");
  auto before = exp(v * 2.0);               // the value at the start of the run
  auto updated = assign(v, v + x);          // runs last
  auto out = tanh(updated * 3.0) + before;  // mixes both
  auto exe = g.compile(Device::cpu(), {}, {out}, kFused);
  const Array xv = random_array({300}, f32);
  const Array got = exe.run({{x, xv}})[0];
  const auto V = to_f64(v0), X = to_f64(xv);
  std::vector<double> want(V.size());
  for (size_t i = 0; i < V.size(); ++i)
    want[i] = std::tanh((V[i] + X[i]) * 3.0) + std::exp(V[i] * 2.0);
  expect_close(got, {300}, want, 1e-5, 1e-5);
  EXPECT_GE(fused_nodes(exe), 1) << exe.dump();
}

TEST(FuseElementwise, PackageRoundTrip) {
  Graph g;
  auto x = g.placeholder({7, 300}, f32, "x");
  auto b = g.placeholder({300}, f32, "b");
  auto out = silu(x * b + 1.0) - cast(greater(x, b), f32);
  auto exe = g.compile(Device::cpu(), {}, {out}, kFused);
  ASSERT_EQ(fused_nodes(exe), 1) << exe.dump();
  const std::string path = ::testing::TempDir() + "fused_round_trip.kiln";
  exe.save(path);
  auto loaded = Executable::load(path, Device::cpu());
  std::remove(path.c_str());
  EXPECT_EQ(fused_nodes(loaded), 1) << loaded.dump();
  const Array xv = random_array({7, 300}, f32), bv = random_array({300}, f32);
  expect_same(loaded.run(std::map<std::string, Array>{{"x", xv}, {"b", bv}})[0],
              exe.run({{x, xv}, {b, bv}})[0]);
}

}  // namespace
}  // namespace kiln
