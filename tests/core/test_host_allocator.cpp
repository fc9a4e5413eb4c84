#include "core/host_allocator.h"
#include "support/reference.h"

namespace kiln {
namespace {

TEST(HostAllocator, ReusesLargeBlocksAndKeepsDataSeparate) {
  host::trim();
  const Shape big{3 << 20};  // 12 MB of f32
  void* first;
  {
    Array a = Array::empty(big, f32);
    first = a.data();
    a.data<float>()[0] = 1.0f;
  }
  EXPECT_GE(host::cached_bytes(), size_t{12} << 20);
  Array b = Array::empty(big, f32);
  EXPECT_EQ(b.data(), first);  // the released block came back
  Array c = Array::empty(big, f32);
  EXPECT_NE(c.data(), b.data());  // two live arrays never share a block
  Array small = Array::empty({5}, f32);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(small.data()) % 64, 0u);
  host::trim();
  EXPECT_EQ(host::cached_bytes(), 0u);
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

TEST(ArrayTest, TakeRowsCopiesRowsInOrder) {
  Array a = test::random_array({5, 3}, f32);
  Array t = a.take_rows({4, 0, 4});
  auto va = test::to_f64(a);
  std::vector<double> want;
  for (int r : {4, 0, 4})
    for (int c = 0; c < 3; ++c) want.push_back(va[r * 3 + c]);
  test::expect_equal(t, {3, 3}, want);
  test::expect_error<ValueError>([&] { a.take_rows({5}); }, {"[Array]", "5", "(5, 3)"});
  test::expect_error<ShapeError>([&] { Array::scalar(1.0f).take_rows({0}); }, {"[Array]"});
}

}  // namespace
}  // namespace kiln
