// Weight checksums verified on several threads (packages of more than a few MB): the loaded
// weights are the saved ones, and with several bad sections the error names the first in node
// order, every time, whatever the threads' timing; a bad place of a later section does not hide
// a checksum mismatch of an earlier one, nor the other way round.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "io/package/format.h"
#include "io/package/manifest_generated.h"
#include "package/package_bytes.h"
#include "runtime/executable_impl.h"
#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;
namespace fb = kiln::package::fb;

// 24 constants of 4 KB to 2 MB (8.4 MB), each added to its own placeholder.
struct BigPackage {
  Bytes bytes;
  std::vector<Array> consts;
};

const BigPackage& big_package() {
  static const BigPackage p = [] {
    BigPackage r;
    Graph g;
    std::vector<Tensor> outs;
    for (int i = 0; i < 24; ++i) {
      const int64_t n = int64_t{1024} << (i % 10);  // 1K .. 512K floats
      r.consts.push_back(random_array({n}, f32));
      outs.push_back(add(g.placeholder({n}, f32, fmt::format("x{}", i)), g.constant(r.consts[i])));
    }
    auto exe = g.compile(Device::cpu(), {}, outs);
    r.bytes = saved_bytes(exe, "checksums");
    return r;
  }();
  return p;
}

Executable load(const Bytes& b) {
  return Executable::load_bytes(b.data(), b.size(), Device::cpu());
}

// The sections (their numbers) in the order of their nodes.
std::vector<uint32_t> sections_in_node_order(Bytes& b) {
  const auto* s = manifest(b)->sections();
  std::vector<uint32_t> k(s->size());
  for (uint32_t i = 0; i < k.size(); ++i) k[i] = i;
  std::sort(k.begin(), k.end(),
            [&](uint32_t a, uint32_t c) { return s->Get(a)->node() < s->Get(c)->node(); });
  return k;
}

TEST(PackageChecksums, LoadsTheSavedWeights) {
  const BigPackage& p = big_package();
  ASSERT_GT(p.bytes.size(), size_t{8} << 20);
  auto exe = load(p.bytes);
  size_t seen = 0;
  for (const auto& n : exe.impl().program.graph.nodes) {
    if (n.op != OpId::Constant) continue;
    for (const Array& c : p.consts)
      if (c.nbytes() == n.value.nbytes() &&
          std::memcmp(c.data(), n.value.data(), c.nbytes()) == 0) {
        ++seen;
        break;
      }
  }
  EXPECT_EQ(seen, p.consts.size());
}

TEST(PackageChecksums, SeveralBadSectionsNameTheFirstInNodeOrder) {
  Bytes clean = big_package().bytes;
  const std::vector<uint32_t> order = sections_in_node_order(clean);
  const auto* sections = manifest(clean)->sections();
  ASSERT_EQ(order.size(), 24u);
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 12; ++trial) {
    // three bad sections, the first in node order anywhere but last
    std::vector<size_t> pick(order.size());
    for (size_t i = 0; i < pick.size(); ++i) pick[i] = i;
    std::shuffle(pick.begin(), pick.end(), rng);
    pick.resize(3);
    const size_t first = *std::min_element(pick.begin(), pick.end());
    Bytes b = clean;
    for (size_t j : pick) {
      const auto* s = sections->Get(order[j]);
      b[s->offset() + s->size() - 1] ^= 0x01;
    }
    const auto* s = sections->Get(order[first]);
    SCOPED_TRACE(fmt::format("trial {}: first bad section {}", trial, order[first]));
    for (int again = 0; again < 4; ++again)
      expect_error<FormatError>([&] { load(b); },
                                {fmt::format("section {} (", order[first]),
                                 fmt::format("offset {}:", s->offset()), "checksum mismatch"});
  }
}

TEST(PackageChecksums, PlaceAndChecksumErrorsInNodeOrder) {
  Bytes clean = big_package().bytes;
  const std::vector<uint32_t> order = sections_in_node_order(clean);
  for (const bool checksum_first : {true, false}) {
    SCOPED_TRACE(checksum_first ? "bad checksum, then a bad place"
                                : "bad place, then a bad checksum");
    Bytes b = clean;
    const uint32_t early = order[5], late = order[17];
    fb::Section* moved =
        manifest(b)->mutable_sections()->GetMutableObject(checksum_first ? late : early);
    const auto* flipped = manifest(b)->sections()->Get(checksum_first ? early : late);
    b[flipped->offset()] ^= 0x80;
    const uint64_t moved_to = moved->offset() + 4;
    moved->mutate_offset(moved_to);
    fix_checksums(b);
    if (checksum_first)
      expect_error<FormatError>(
          [&] { load(b); }, {fmt::format("section {} (", early),
                             fmt::format("offset {}:", flipped->offset()), "checksum mismatch"});
    else
      expect_error<FormatError>([&] { load(b); },
                                {fmt::format("section {} (", early),
                                 fmt::format("offset {}:", moved_to), "not a multiple of 64"});
  }
}

}  // namespace
}  // namespace kiln
