// The hoist_casts pass: narrowing casts after reshapes and transposes move before them (and join
// the elementwise group before, or vanish after autocast's widening cast), results bit for bit
// those of the graph as written, and against a float64 reference.
#include <fmt/format.h>

#include <cstring>

#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;

int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}
int casts(const Executable& e) { return count(e.dump(), "= cast("); }
int fused(const Executable& e) { return count(e.dump(), "= fused_elementwise("); }

void expect_same(const Array& got, const Array& want) {
  ASSERT_EQ(got.shape(), want.shape());
  ASSERT_EQ(got.dtype(), want.dtype());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), want.nbytes()), 0)
      << "results differ from the graph as written";
}

const CompileOptions kAsWritten{.optimize = false};

// (x * 2 + 1) -> reshape -> transpose -> bf16: the cast joins the elementwise group, and the
// transpose moves bf16.
TEST(HoistCasts, NarrowingCastJoinsTheGroupBeforeTheChain) {
  for (DType low : {bf16, f16}) {
    SCOPED_TRACE(name(low));
    Graph g;
    auto x = g.placeholder({4, 6, 10}, f32, "x");
    auto y = transpose(reshape(x * 2.0 + 1.0, {24, 10}), {1, 0});
    auto out = cast(y, low);
    Executable opt = g.compile(Device::cpu(), {}, {out});
    Executable plain = g.compile(Device::cpu(), {}, {out}, kAsWritten);
    EXPECT_EQ(casts(opt), 0) << opt.dump();
    EXPECT_EQ(fused(opt), 1) << opt.dump();
    const Array xa = random_array({4, 6, 10}, f32, -3, 3);
    const Array got = opt.run({{x, xa}})[0];
    expect_same(got, plain.run({{x, xa}})[0]);
    const auto xv = to_f64(xa);
    std::vector<double> want(240);
    for (int i = 0; i < 24; ++i)
      for (int j = 0; j < 10; ++j) want[j * 24 + i] = xv[i * 10 + j] * 2 + 1;
    expect_close(got, {10, 24}, want, low == bf16 ? 8e-3 : 1e-3, 1e-3);
  }
}

// Under autocast a bf16 product's f32 copy goes through transpose and reshape into the next
// product, which casts it back: the chain moves the bf16 product and both casts go.
TEST(HoistCasts, AutocastRoundTripVanishes) {
  Graph g;
  auto a = g.placeholder({2, 8, 16}, f32, "a");
  auto w1 = g.placeholder({16, 12}, f32, "w1");
  auto w2 = g.placeholder({8, 5}, f32, "w2");
  auto h = matmul(a, w1);                                   // 2 x 8 x 12
  auto t = reshape(transpose(h, {0, 2, 1}), {24, 8});       // 24 x 8
  auto out = matmul(t, w2);                                 // 24 x 5
  // (elementwise fusion off: small casts independent of each other would share one node)
  CompileOptions with{.autocast = bf16};
  with.fuse_elementwise = false;
  Executable opt = g.compile(Device::cpu(), {}, {out}, with);
  Executable plain = g.compile(Device::cpu(), {}, {out}, {.optimize = false, .autocast = bf16});
  // a, w1 and w2 to bf16, and the result back to f32: nothing between the products
  EXPECT_EQ(casts(opt), 4) << opt.dump();
  EXPECT_GT(casts(plain), 4) << plain.dump();
  const Array aa = random_array({2, 8, 16}, f32), w1a = random_array({16, 12}, f32),
              w2a = random_array({8, 5}, f32);
  const Feeds f{{a, aa}, {w1, w1a}, {w2, w2a}};
  const Array got = opt.run(f)[0];
  expect_same(got, plain.run(f)[0]);
  // float64 products of the bf16-rounded inputs (the first product rounded to bf16 as well)
  auto rb = [](const Array& v) { return to_f64(v.astype(bf16)); };
  const auto av = rb(aa), w1v = rb(w1a), w2v = rb(w2a);
  std::vector<double> hv(2 * 8 * 12);
  for (int b = 0; b < 2; ++b)
    for (int i = 0; i < 8; ++i)
      for (int j = 0; j < 12; ++j) {
        double s = 0;
        for (int k = 0; k < 16; ++k) s += av[(b * 8 + i) * 16 + k] * w1v[k * 12 + j];
        hv[(b * 8 + i) * 12 + j] = s;
      }
  const auto hr = to_f64(Array::from_vector(hv, {2, 8, 12}).astype(bf16));
  std::vector<double> want(24 * 5, 0.0);
  for (int r = 0; r < 24; ++r)  // row r of t: batch r / 12, column r % 12 of h
    for (int c = 0; c < 5; ++c)
      for (int k = 0; k < 8; ++k)
        want[r * 5 + c] += hr[((r / 12) * 8 + k) * 12 + r % 12] * w2v[k * 5 + c];
  expect_close(got, {24, 5}, want, 2e-2, 2e-2);
}

// A transpose whose f32 value has another reader keeps its f32 copy.
TEST(HoistCasts, ChainWithAnotherReaderStays) {
  Graph g;
  auto x = g.placeholder({6, 7}, f32, "x");
  auto t = transpose(x * 3.0, {1, 0});
  auto lo = cast(t, bf16);
  auto also = t + 1.0;
  // (elementwise fusion off: the cast and the add, small and independent, would share one node)
  CompileOptions no_fusion;
  no_fusion.fuse_elementwise = false;
  Executable opt = g.compile(Device::cpu(), {}, {lo, also}, no_fusion);
  EXPECT_EQ(casts(opt), 1) << opt.dump();
  Executable plain = g.compile(Device::cpu(), {}, {lo, also}, kAsWritten);
  const Array xa = random_array({6, 7}, f32);
  const auto got = opt.run({{x, xa}}), want = plain.run({{x, xa}});
  expect_same(got[0], want[0]);
  expect_same(got[1], want[1]);
}

}  // namespace
}  // namespace kiln
