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
