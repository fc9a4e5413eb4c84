// KernelContext::scratch on the CPU: blocks that are large enough are kept for reuse when their
// context ends (a fresh block costs a page fault per page at every call), never shared between
// contexts alive at once, and always of the size asked for.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <set>

#include "core/op_id.h"
#include "kiln/kernel.h"

namespace kiln {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

bool aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % 256 == 0; }

TEST(HostScratch, ReusedAfterItsContextEndsAndNeverShared) {
  const Attrs attrs;
  std::set<void*> first;
  {
    KernelContext a(OpId::Add, attrs, {}, {}, nullptr), b(OpId::Add, attrs, {}, {}, nullptr);
    void* pa = a.scratch(3 * kMiB + 5);
    void* pb = b.scratch(3 * kMiB + 5);
    void* pa2 = a.scratch(3 * kMiB + 5);
    EXPECT_TRUE(aligned(pa) && aligned(pb) && aligned(pa2));
    EXPECT_EQ((std::set<void*>{pa, pb, pa2}).size(), 3u) << "blocks alive at once are distinct";
    // every byte asked for is writable (a sanitizer build checks the bounds)
    for (void* p : {pa, pb, pa2}) std::memset(p, 0x5a, 3 * kMiB + 5);
    first = {pa, pb, pa2};
  }
  {
    KernelContext c(OpId::Add, attrs, {}, {}, nullptr);
    void* pc = c.scratch(3 * kMiB);
    EXPECT_TRUE(first.count(pc)) << "a kept block of the size is reused";
    std::memset(pc, 0, 3 * kMiB);
    // a request more than twice as small does not take a large kept block, nor a larger one
    // a smaller block
    void* small = c.scratch(kMiB / 2);
    EXPECT_FALSE(first.count(small));
    void* big = c.scratch(8 * kMiB);
    EXPECT_FALSE(first.count(big));
    std::memset(small, 1, kMiB / 2);
    std::memset(big, 2, 8 * kMiB);
    // small requests work as before
    void* tiny = c.scratch(1);
    void* zero = c.scratch(0);
    EXPECT_TRUE(aligned(tiny) && aligned(zero));
    EXPECT_NE(tiny, zero);
  }
}

}  // namespace
}  // namespace kiln
