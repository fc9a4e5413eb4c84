// Shapes whose element count would overflow: refused with ShapeError where they first appear (a
// placeholder, a constant-free builder, a broadcast), before any planner or kernel sees them.
#include "kiln/kiln.h"
#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;

constexpr int64_t k2to30 = int64_t{1} << 30;

TEST(ElementCount, PlaceholdersPast2To59AreRefused) {
  Graph g;
  expect_error<ShapeError>([&] { g.placeholder({k2to30, k2to30}, f32, "x"); },
                           {"[placeholder]", "2^59", "(1073741824, 1073741824)"});
  // zero dims do not excuse the others: strides are their products
  expect_error<ShapeError>([&] { g.placeholder({0, k2to30, k2to30}, f32, "y"); }, {"2^59"});
  // 2^58 elements: a legal shape (nothing is allocated while building)
  const Tensor ok = g.placeholder({k2to30, int64_t{1} << 28}, f32, "z");
  EXPECT_EQ(ok.shape(), (Shape{k2to30, int64_t{1} << 28}));
}

TEST(ElementCount, BroadcastsAndBuildersPast2To59AreRefused) {
  Graph g;
  const Tensor a = g.placeholder({k2to30, 1}, f32, "a");
  const Tensor b = g.placeholder({1, k2to30}, f32, "b");
  expect_error<ShapeError>([&] { a + b; }, {"[add]", "2^59"});
  expect_error<ShapeError>([&] { full(g, {k2to30, k2to30, 2}, 1.0); }, {"2^59"});
  // the graph is still usable after the refusals
  const Tensor c = a * 2.0;
  EXPECT_EQ(c.shape(), (Shape{k2to30, 1}));
}

TEST(ElementCount, ArraysPast2To59AreRefusedBeforeAllocating) {
  expect_error<ShapeError>([&] { Array::empty({k2to30, k2to30}, f32); },
                           {"[Array]", "2^59", "(1073741824, 1073741824)"});
  expect_error<ShapeError>([&] { Array::empty({0, k2to30, k2to30}, u8); }, {"2^59"});
  // an empty array of a legal shape still allocates nothing and reads as empty
  const Array e = Array::empty({0, k2to30}, f32);
  EXPECT_EQ(e.numel(), 0);
}

}  // namespace
}  // namespace kiln
