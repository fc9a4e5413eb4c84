// Laid-out weights in packages (format.h, LAID OUT): the constant weights a CPU executable's runs
// converted to oneDNN's layouts are saved with it where PackageOptions::laid_out_weights asks, and
// a CPU of the same identity takes them on its first run instead of converting again, with the same
// results bit for bit; another identity or layout converts afresh; damaged sections fail naming the
// section.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "backends/cpu/dnnl_util.h"
#include "package/package_bytes.h"
#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;
namespace du = kiln::cpu::dnnl_util;

// A conv (a fused_conv with its relu, on NHWC) and two products large enough for oneDNN's
// primitives (a linear and a matmul with a GELU after it: a fused_matmul), every weight a
// constant: three laid-out weights where the primitives ask for layouts of their own (AVX-512's
// do; an AVX2 primitive may take a weight as it is, and that weight is not laid out).
struct Net {
  Graph g;
  Tensor x, y;
  Executable exe;
  Net() {
    x = g.placeholder({4, 16, 16, 16}, f32, "x");
    ConvOptions same;
    same.padding = {1, 1};
    Tensor h = relu(conv2d(x, g.constant(random_array({32, 16, 3, 3}, f32)),
                           g.constant(random_array({32}, f32)), same));
    h = reshape(h, {64, 16 * 16 * 2});
    h = linear(h, g.constant(random_array({256, 512}, f32, -0.05, 0.05)),
               g.constant(random_array({256}, f32)));
    y = gelu(matmul(h, g.constant(random_array({256, 384}, f32, -0.1, 0.1))));
    exe = g.compile(Device::cpu(), {}, {y});
  }
};

const PackageOptions kStore{.laid_out_weights = true};

// The first run of n on xv (its result in *y): how many weights it laid out, 1 to 3.
size_t first_run(Net& n, const Array& xv, Array* y = nullptr) {
  const size_t before = du::weights_laid_out();
  const Array out = n.exe.run({{n.x, xv}})[0];
  if (y) *y = out;
  const size_t k = du::weights_laid_out() - before;
  EXPECT_GE(k, 1u);
  EXPECT_LE(k, 3u);
  return k;
}

size_t laid_out_entries(Bytes& b) {
  const auto* l = manifest(b)->laid_out();
  return l ? l->size() : 0;
}

TEST(LaidOutWeights, RunsBeforeSavingAreStoredAndTakenBitForBit) {
  Net n;
  const Array xv = random_array({4, 16, 16, 16}, f32);
  Array want;
  const size_t k = first_run(n, xv, &want);
  Bytes b = saved_bytes(n.exe, "laid_out", kStore);
  ASSERT_EQ(laid_out_entries(b), k);
  for (const auto* w : *manifest(b)->laid_out()) {
    EXPECT_EQ(w->identity()->str(), du::layout_identity());
    EXPECT_NE(w->layout(), 0u);
    EXPECT_EQ(w->offset() % package::kSectionAlign, 0u);
  }
  const size_t before = du::weights_laid_out();
  const Executable loaded = Executable::load_bytes(b.data(), b.size(), Device::cpu());
  const Array got = loaded.run({{"x", xv}})[0];
  EXPECT_EQ(du::weights_laid_out(), before) << "a stored weight was converted again";
  const PackageInfo& info = *loaded.package_info();
  EXPECT_EQ(info.laid_out_weights, k);
  EXPECT_EQ(info.laid_out_taken, k);
  EXPECT_EQ(info.laid_out_for, du::layout_identity());
  expect_equal(got, want.shape(), to_f64(want));
  // saved again, the loaded executable stores the same bytes
  Bytes again = saved_bytes(loaded, "laid_out_again", kStore);
  ASSERT_EQ(laid_out_entries(again), k);
  for (uint32_t i = 0; i < k; ++i) {
    const auto *a = manifest(b)->laid_out()->Get(i), *c = manifest(again)->laid_out()->Get(i);
    EXPECT_EQ(a->layout(), c->layout());
    EXPECT_EQ(a->xxh3(), c->xxh3());
  }
}

// Without PackageOptions::laid_out_weights, or before any run, a package stores none.
TEST(LaidOutWeights, AnExecutableThatNeverRanStoresNone) {
  Net n;
  Bytes b = saved_bytes(n.exe, "laid_out_none", kStore);
  EXPECT_EQ(laid_out_entries(b), 0u);
  size_t k = 0;
  {
    Net ran;
    k = first_run(ran, random_array({4, 16, 16, 16}, f32));
    Bytes by_default = saved_bytes(ran.exe, "laid_out_default");
    EXPECT_EQ(laid_out_entries(by_default), 0u);
  }
  EXPECT_EQ(
      Executable::load_bytes(b.data(), b.size(), Device::cpu()).package_info()->laid_out_weights,
      0u);
  const size_t before = du::weights_laid_out();
  const Array xv = random_array({4, 16, 16, 16}, f32);
  const Executable loaded = Executable::load_bytes(b.data(), b.size(), Device::cpu());
  const Array got = loaded.run({{"x", xv}})[0];
  EXPECT_EQ(du::weights_laid_out(), before + k);
  const Array want = n.exe.run({{n.x, xv}})[0];
  expect_equal(got, want.shape(), to_f64(want));
}

// Another identity (library or instruction set) or another layout key: the section is checked
// and left, the first run converts the weight itself, and the results stay the same.
TEST(LaidOutWeights, OtherIdentitiesAndLayoutsAreConvertedAgain) {
  Net n;
  const Array xv = random_array({4, 16, 16, 16}, f32);
  Array want;
  const size_t k = first_run(n, xv, &want);
  const Bytes saved = saved_bytes(n.exe, "laid_out_other", kStore);
  for (int edit = 0; edit < 2; ++edit) {
    SCOPED_TRACE(edit == 0 ? "identity" : "layout key");
    Bytes b = saved;
    auto* w = manifest(b)->mutable_laid_out()->GetMutableObject(0);
    if (edit == 0) {
      auto* id = w->mutable_identity();
      ASSERT_GT(id->size(), 0u);
      id->Mutate(0, static_cast<char>(id->Get(0) ^ 0x20));  // "Onednn ..."
    } else {
      ASSERT_TRUE(w->mutate_layout(w->layout() ^ 1));
    }
    fix_checksums(b);
    const size_t before = du::weights_laid_out();
    const Executable loaded = Executable::load_bytes(b.data(), b.size(), Device::cpu());
    const Array got = loaded.run({{"x", xv}})[0];
    EXPECT_EQ(du::weights_laid_out(), before + 1);
    expect_equal(got, want.shape(), to_f64(want));
    EXPECT_EQ(loaded.package_info()->laid_out_weights, k);
    // (a key the primitive does not ask for is taken by the load, and left by the run)
    EXPECT_EQ(loaded.package_info()->laid_out_taken, edit == 0 ? k - 1 : k);
  }
}

void expect_format_error(const Bytes& b, const std::vector<std::string>& parts) {
  try {
    Executable::load_bytes(b.data(), b.size(), Device::cpu());
    ADD_FAILURE() << "loaded";
  } catch (const FormatError& e) {
    for (const auto& p : parts)
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

TEST(LaidOutWeights, DamagedSectionsFailNamingThem) {
  Net n;
  n.exe.run({{n.x, random_array({4, 16, 16, 16}, f32)}});
  const Bytes saved = saved_bytes(n.exe, "laid_out_bad", kStore);
  const auto* first = manifest(const_cast<Bytes&>(saved))->laid_out()->Get(1);
  const uint64_t off = first->offset(), size = first->size();
  const int32_t node = first->node();
  {  // a flipped byte of its data
    Bytes b = saved;
    b[off + size / 2] ^= 0x10;
    expect_format_error(b, {"laid-out weight 1", "checksum mismatch"});
  }
  {  // outside the file
    Bytes b = saved;
    manifest(b)->mutable_laid_out()->GetMutableObject(1)->mutate_offset(b.size());
    fix_checksums(b);
    expect_format_error(b, {"laid-out weight 1", "outside the file"});
  }
  {  // a node whose op lays out nothing (the placeholder), and a node out of range
    Bytes b = saved;
    auto* w = manifest(b)->mutable_laid_out()->GetMutableObject(1);
    int32_t placeholder = -1;
    for (uint32_t i = 0; i < manifest(b)->nodes()->size(); ++i)
      if (manifest(b)->nodes()->Get(i)->name()->str() == "x") placeholder = static_cast<int32_t>(i);
    ASSERT_GE(placeholder, 0);
    w->mutate_node(placeholder);
    fix_checksums(b);
    expect_format_error(b, {"laid-out weight 1", "lays out no weight"});
    w->mutate_node(1 << 20);
    fix_checksums(b);
    expect_format_error(b, {"laid-out weight 1", "is not a node"});
  }
  {  // two sections for one node
    Bytes b = saved;
    manifest(b)->mutable_laid_out()->GetMutableObject(0)->mutate_node(node);
    fix_checksums(b);
    expect_format_error(b, {"a second laid-out weight", fmt::format("%{}", node)});
  }
}

}  // namespace
}  // namespace kiln
