// Malformed packages: truncated files, flipped bytes in each section, offsets past the end, huge
// sizes, too-new versions and edited manifests with valid checksums all give FormatError (never
// a crash: these run under ASan+UBSan in the sanitizer build).
#include <fmt/format.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include "core/op_id.h"
#include "io/package/format.h"
#include "io/package/manifest_generated.h"
#include "io/package/validate.h"
#include "package/tuned_package.h"
#include "runtime/executable_impl.h"
#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;
namespace fb = kiln::package::fb;
using Bytes = std::vector<uint8_t>;

template <typename T>
T get(const Bytes& b, size_t off) {
  T v;
  std::memcpy(&v, b.data() + off, sizeof v);
  return v;
}
template <typename T>
void put(Bytes& b, size_t off, T v) {
  std::memcpy(b.data() + off, &v, sizeof v);
}

// A small package (an MLP with a variable) and its feeds.
struct Fixture {
  Bytes bytes;
  std::map<std::string, Array> feeds;
  std::vector<Array> want;
};

Fixture make_fixture(bool tuned) {
  Fixture r;
  Graph g;
  auto x = g.placeholder({2, 4}, f32, "x");
  auto v = g.variable(random_array({3}, f32), "bias");
  auto h =
      relu(linear(x, g.constant(random_array({5, 4}, f32)), g.constant(random_array({5}, f32))));
  auto y = add(linear(h, g.constant(random_array({3, 5}, f32))), v);
  auto exe = g.compile(Device::cpu(), {}, {y, reshape(h, {10})});
  if (tuned) {
    r.bytes = save_with_tuning(exe, sample_identity(), sample_conv_records());
  } else {
    const std::string path =
        testing::TempDir() + "kiln_pkg_malformed_" + std::to_string(::getpid()) + ".kiln";
    exe.save(path);
    std::ifstream in(path, std::ios::binary);
    r.bytes.assign(std::istreambuf_iterator<char>(in), {});
    std::filesystem::remove(path);
  }
  r.feeds = {{"x", random_array({2, 4}, f32)}};
  r.want = exe.run(r.feeds);
  return r;
}

const Fixture& fixture() {
  static const Fixture f = make_fixture(false);
  return f;
}
// The same with a tuning section for CUDA (made without a GPU), which the CPU checks and skips.
const Fixture& tuned_fixture() {
  static const Fixture f = make_fixture(true);
  return f;
}

Executable load(const Bytes& b, const LoadOptions& o = {}) {
  return Executable::load_bytes(b.data(), b.size(), Device::cpu(), o);
}

uint64_t manifest_offset(const Bytes& b) {
  return get<uint64_t>(b, package::header::manifest_offset);
}

fb::Manifest* manifest(Bytes& b) { return fb::GetMutableManifest(b.data() + manifest_offset(b)); }

// Recomputes the manifest's and the header's checksums after an edit.
void fix_checksums(Bytes& b) {
  const uint64_t off = manifest_offset(b), size = get<uint64_t>(b, package::header::manifest_size);
  if (off <= b.size() && size <= b.size() - off)
    put<uint64_t>(b, package::header::manifest_xxh3, package::xxh3(b.data() + off, size));
  put<uint64_t>(b, package::header::header_xxh3,
                package::xxh3(b.data(), package::header::header_xxh3));
}

void expect_format_error(const Bytes& b, const std::vector<std::string>& parts,
                         const LoadOptions& o = {}) {
  expect_error<FormatError>([&] { load(b, o); }, parts);
}

// Packages check the number of inputs of every node before inference reads them: each op of
// op_list.inc needs a rule in src/io/package/validate.cpp.
TEST(PackageMalformed, EveryOpHasAnInputCountRule) {
  for (OpId op : kAllOps) {
    int lo = -1, hi = -1;
    EXPECT_TRUE(package::arity(op, Attrs{}, lo, hi)) << op_name(op) << " has no rule";
    EXPECT_LE(lo, hi) << op_name(op);
  }
}

TEST(PackageMalformed, TheFixtureLoadsAndRuns) {
  const Fixture& f = fixture();
  auto exe = load(f.bytes);
  const auto got = exe.run(f.feeds);
  ASSERT_EQ(got.size(), f.want.size());
  for (size_t k = 0; k < got.size(); ++k)
    EXPECT_EQ(std::memcmp(got[k].data(), f.want[k].data(), got[k].nbytes()), 0);
}

TEST(PackageMalformed, TruncatedAnywhere) {
  for (const Fixture* f : {&fixture(), &tuned_fixture()}) {
    const Bytes& full = f->bytes;
    std::vector<size_t> cuts;
    for (size_t n = 0; n <= package::kHeaderBytes; ++n) cuts.push_back(n);
    for (size_t n = package::kHeaderBytes; n < full.size();
         n += std::max<size_t>(1, full.size() / 300))
      cuts.push_back(n);
    cuts.push_back(full.size() - 1);
    for (size_t n : cuts) {
      SCOPED_TRACE("cut at " + std::to_string(n));
      expect_error<FormatError>([&] { load(Bytes(full.begin(), full.begin() + n)); },
                                {"[package]"});
    }
    // longer than it says
    Bytes longer = full;
    longer.push_back(0);
    expect_format_error(longer, {"header", "truncated or extended"});
  }
}

TEST(PackageMalformed, FlippedByteInHeader) {
  for (size_t i = 0; i < package::kHeaderBytes; ++i) {
    SCOPED_TRACE("header byte " + std::to_string(i));
    Bytes b = fixture().bytes;
    b[i] ^= 0x10;
    expect_format_error(b, {"[package]", "header"});
  }
}

TEST(PackageMalformed, FlippedByteInEachWeightSection) {
  const Fixture& f = fixture();
  Bytes clean = f.bytes;
  const auto* sections = manifest(clean)->sections();
  ASSERT_EQ(sections->size(), 4u);  // three constants and a variable
  for (uint32_t k = 0; k < sections->size(); ++k) {
    SCOPED_TRACE("section " + std::to_string(k));
    const auto* s = sections->Get(k);
    Bytes b = clean;
    b[s->offset() + s->size() / 2] ^= 0x40;
    expect_format_error(b, {fmt::format("section {} (", k), fmt::format("offset {}", s->offset()),
                            "checksum mismatch"});
    // verify_weights = false skips the weights' checksums: the flipped weight is what loads
    auto exe = load(b, {.verify_weights = false});
    const Array& value = exe.impl().program.graph.nodes[s->node()].value;
    ASSERT_EQ(value.nbytes(), s->size());
    const Array host = value.to(Device::cpu());
    EXPECT_EQ(std::memcmp(host.data(), b.data() + s->offset(), s->size()), 0);
    EXPECT_NE(std::memcmp(host.data(), clean.data() + s->offset(), s->size()), 0);
    exe.run(f.feeds);
  }
}

TEST(PackageMalformed, FlippedByteInManifest) {
  const Bytes& full = fixture().bytes;
  const uint64_t off = manifest_offset(full);
  for (uint64_t i = off; i < full.size(); i += 7) {
    Bytes b = full;
    b[i] ^= 0x01;
    expect_format_error(b, {"manifest", fmt::format("offset {}", off), "checksum mismatch"});
  }
}

TEST(PackageMalformed, TooNewVersion) {
  Bytes b = fixture().bytes;
  put<uint32_t>(b, package::header::format_version, 7);
  put<uint32_t>(b, package::header::min_reader_version, 5);
  fix_checksums(b);
  expect_format_error(b, {"format version 7", "reader of version 5", "versions up to 1"});
  // a newer format that older readers may read loads
  Bytes newer = fixture().bytes;
  put<uint32_t>(newer, package::header::format_version, 3);
  fix_checksums(newer);
  EXPECT_EQ(load(newer).package_info()->format_version, 3u);
}

TEST(PackageMalformed, HeaderOffsetsPastTheEndAndHugeSizes) {
  const Bytes& full = fixture().bytes;
  struct Edit {
    size_t field;
    uint64_t value;
    const char* expect;
  };
  const uint64_t size = full.size();
  const std::vector<Edit> edits = {
      {package::header::manifest_offset, size + 64, "outside the file"},
      {package::header::manifest_offset, ~uint64_t{0} - 7, "outside the file"},
      {package::header::manifest_offset, 8, "outside the file"},
      {package::header::manifest_size, ~uint64_t{0}, "outside the file"},
      {package::header::manifest_size, uint64_t{1} << 63, "outside the file"},
      {package::header::manifest_offset, manifest_offset(full) - 4, "multiple of 8"},
      {package::header::file_size, size * 2, "truncated or extended"},
      {package::header::file_size, 0, "truncated or extended"},
  };
  for (auto& e : edits) {
    SCOPED_TRACE(e.expect);
    Bytes b = full;
    put<uint64_t>(b, e.field, e.value);
    fix_checksums(b);
    expect_format_error(b, {"header", e.expect});
  }
}

// Edits of the manifest that keep every checksum valid: the semantic checks must catch them.
TEST(PackageMalformed, ManifestEditsWithValidChecksums) {
  struct Case {
    const char* name;
    std::function<void(fb::Manifest&, const Bytes&)> edit;
    std::vector<std::string> expect;
  };
  // node 0 is the placeholder; find the first linear and the relu
  auto find = [](fb::Manifest& m, uint16_t op) -> fb::Node* {
    for (uint32_t i = 0; i < m.nodes()->size(); ++i)
      if (m.nodes()->Get(i)->op() == op) return m.mutable_nodes()->GetMutableObject(i);
    return nullptr;
  };
  const auto linear_id = static_cast<uint16_t>(OpId::Linear);
  const auto relu_id = static_cast<uint16_t>(OpId::Relu);
  const std::vector<Case> cases = {
      {"unknown op",
       [&](fb::Manifest& m, const Bytes&) { find(m, relu_id)->mutate_op(9999); },
       {"unknown op id 9999"}},
      {"op of another arity",
       [&](fb::Manifest& m, const Bytes&) {
         find(m, relu_id)->mutate_op(static_cast<uint16_t>(OpId::Add));
       },
       {"(add", "has 1 inputs; the op takes 2"}},
      {"op with other outputs",
       [&](fb::Manifest& m, const Bytes&) {
         find(m, relu_id)->mutate_op(static_cast<uint16_t>(OpId::Sigmoid));
         find(m, linear_id)->mutable_outputs()->GetMutableObject(0)->mutable_shape()->Mutate(1, 4);
       },
       {"outputs", "differ"}},
      {"input from a later node",
       [&](fb::Manifest& m, const Bytes&) {
         find(m, relu_id)->mutable_inputs()->GetMutableObject(0)->mutate_node(1000);
       },
       {"not an earlier node"}},
      {"input output index",
       [&](fb::Manifest& m, const Bytes&) {
         find(m, relu_id)->mutable_inputs()->GetMutableObject(0)->mutate_index(3);
       },
       {"has no output 3"}},
      {"negative dim",
       [&](fb::Manifest& m, const Bytes&) {
         m.mutable_nodes()
             ->GetMutableObject(0)
             ->mutable_outputs()
             ->GetMutableObject(0)
             ->mutable_shape()
             ->Mutate(0, -2);
       },
       {"negative dim"}},
      {"huge dims",
       [&](fb::Manifest& m, const Bytes&) {
         auto* s = m.mutable_nodes()
                       ->GetMutableObject(0)
                       ->mutable_outputs()
                       ->GetMutableObject(0)
                       ->mutable_shape();
         s->Mutate(0, int64_t{1} << 40);
         s->Mutate(1, int64_t{1} << 40);
       },
       {"too large"}},
      {"unknown dtype",
       [&](fb::Manifest& m, const Bytes&) {
         m.mutable_nodes()
             ->GetMutableObject(0)
             ->mutable_outputs()
             ->GetMutableObject(0)
             ->mutate_dtype(200);
       },
       {"unknown dtype 200"}},
      {"unknown attribute kind",
       [&](fb::Manifest& m, const Bytes&) {
         find(m, linear_id)
             ->mutable_attrs()
             ->GetMutableObject(0)
             ->mutate_kind(static_cast<fb::AttrKind>(42));
       },
       {"unknown kind 42"}},
      {"section past the end",
       [&](fb::Manifest& m, const Bytes& b) {
         m.mutable_sections()->GetMutableObject(0)->mutate_offset(b.size() + 4096);
       },
       {"section 0 (", "outside the file"}},
      {"section offset overflows",
       [&](fb::Manifest& m, const Bytes&) {
         m.mutable_sections()->GetMutableObject(1)->mutate_offset(~uint64_t{0} - 63);
       },
       {"section 1 (", "outside the file"}},
      {"section of a huge size",
       [&](fb::Manifest& m, const Bytes&) {
         m.mutable_sections()->GetMutableObject(0)->mutate_size(uint64_t{1} << 62);
       },
       {"section 0 (", "bytes;"}},
      {"misaligned section",
       [&](fb::Manifest& m, const Bytes&) {
         auto* s = m.mutable_sections()->GetMutableObject(2);
         s->mutate_offset(s->offset() - 8);
       },
       {"section 2 (", "multiple of 64"}},
      {"section of another node",
       [&](fb::Manifest& m, const Bytes&) {
         m.mutable_sections()->GetMutableObject(0)->mutate_node(0);
       },
       {"section 0 (", "belongs to node %0"}},
      {"node naming a missing section",
       [&](fb::Manifest& m, const Bytes&) {
         for (uint32_t i = 0; i < m.nodes()->size(); ++i)
           if (m.nodes()->Get(i)->section() >= 0) {
             m.mutable_nodes()->GetMutableObject(i)->mutate_section(77);
             break;
           }
       },
       {"data section 77"}},
      {"arena offset past the arena",
       [&](fb::Manifest& m, const Bytes&) {
         for (uint32_t i = 0; i < m.slots()->size(); ++i) {
           auto* r = m.mutable_slots()->GetMutableObject(i)->mutable_slots();
           for (uint32_t o = 0; o < r->size(); ++o)
             if (r->Get(o)->where() == 3)
               return r->GetMutableObject(o)->mutate_offset(~uint64_t{0} - 63), void();
         }
       },
       {"outside the arena"}},
      {"misaligned arena offset",
       [&](fb::Manifest& m, const Bytes&) {
         for (uint32_t i = 0; i < m.slots()->size(); ++i) {
           auto* r = m.mutable_slots()->GetMutableObject(i)->mutable_slots();
           for (uint32_t o = 0; o < r->size(); ++o)
             if (r->Get(o)->where() == 3) return r->GetMutableObject(o)->mutate_offset(4), void();
         }
       },
       {"arena offset 4", "not 64-byte aligned"}},
      {"arena larger than its values",
       [&](fb::Manifest& m, const Bytes&) { m.mutate_arena_bytes(uint64_t{1} << 50); },
       {"more than the", "all values need"}},
      {"arena too small",
       [&](fb::Manifest& m, const Bytes&) { m.mutate_arena_bytes(16); },
       {"outside the arena"}},
      {"unknown slot kind",
       [&](fb::Manifest& m, const Bytes&) {
         m.mutable_slots()->GetMutableObject(0)->mutable_slots()->GetMutableObject(0)->mutate_where(
             9);
       },
       {"unknown kind 9"}},
      {"a step writing into a constant",
       [&](fb::Manifest& m, const Bytes&) {
         for (uint32_t i = 0; i < m.nodes()->size(); ++i)
           if (m.nodes()->Get(i)->op() == relu_id) {
             auto* s = m.mutable_slots()->GetMutableObject(i)->mutable_slots()->GetMutableObject(0);
             s->mutate_where(2);
             for (uint32_t j = 0; j < m.nodes()->size(); ++j)
               if (m.nodes()->Get(j)->section() >= 0) s->mutate_index(static_cast<int32_t>(j));
           }
       },
       {"would write into constant"}},
      {"a feed slot naming a constant",
       [&](fb::Manifest& m, const Bytes&) {
         m.mutable_slots()->GetMutableObject(0)->mutable_slots()->GetMutableObject(0)->mutate_index(
             1000);
       },
       {"does not name the node itself"}},
      {"output slot of another output",
       [&](fb::Manifest& m, const Bytes&) {
         auto v = *m.outputs()->Get(0);
         m.mutable_slots()
             ->GetMutableObject(v.node())
             ->mutable_slots()
             ->GetMutableObject(v.index())
             ->mutate_index(1);
       },
       {"output 1"}},
      {"step of another node",
       [&](fb::Manifest& m, const Bytes&) {
         m.mutable_steps()->GetMutableObject(0)->mutate_node(0);
       },
       {"manifest steps", "should run node"}},
      {"step node out of range",
       [&](fb::Manifest& m, const Bytes&) {
         m.mutable_steps()->GetMutableObject(0)->mutate_node(-5);
       },
       {"manifest steps", "node %-5"}},
      {"step on cuda in a cpu package",
       [&](fb::Manifest& m, const Bytes&) {
         m.mutable_steps()->GetMutableObject(0)->mutate_backend(1);
       },
       {"runs on cuda"}},
      {"unknown backend",
       [&](fb::Manifest& m, const Bytes&) {
         m.mutable_steps()->GetMutableObject(0)->mutate_backend(9);
       },
       {"unknown backend 9"}},
      {"too many returned",
       [&](fb::Manifest& m, const Bytes&) { m.mutate_num_returned(100); },
       {"100 returned"}},
      {"output past the nodes",
       [&](fb::Manifest& m, const Bytes&) {
         m.mutable_outputs()->GetMutableObject(0)->mutate_node(1 << 30);
       },
       {"manifest outputs", "not a value"}},
      {"unknown device kind",
       [&](fb::Manifest& m, const Bytes&) { m.mutable_metadata()->mutate_device_kind(5); },
       {"unknown device kind 5"}},
      {"unknown autocast dtype",
       [&](fb::Manifest& m, const Bytes&) { m.mutable_metadata()->mutate_autocast(77); },
       {"autocast dtype 77"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Bytes b = fixture().bytes;
    c.edit(*manifest(b), b);
    fix_checksums(b);
    std::vector<std::string> parts = c.expect;
    parts.push_back("[package] <memory>: ");
    expect_format_error(b, parts);
  }
}

// Random edits of the manifest with valid checksums: whatever loads must run or throw a
// kiln::Error; nothing may crash (the sanitizer build checks reads and writes).
TEST(PackageMalformed, RandomManifestEditsNeverCrash) {
  const Fixture& f = fixture();
  const uint64_t off = manifest_offset(f.bytes);
  std::uniform_int_distribution<uint64_t> pos(off, f.bytes.size() - 1);
  std::uniform_int_distribution<int> byte(0, 255), count(1, 4);
  int loaded = 0, rejected = 0;
  for (int it = 0; it < 2000; ++it) {
    Bytes b = f.bytes;
    for (int k = count(rng()); k > 0; --k) b[pos(rng())] = static_cast<uint8_t>(byte(rng()));
    fix_checksums(b);
    try {
      auto exe = load(b);
      ++loaded;
      // an edited shape may ask for more memory than there is: an OutOfMemory error, which the
      // sanitizer's allocator reports as a crash instead
      size_t bytes = exe.peak_intermediate_bytes();
      for (const auto& o : exe.outputs()) bytes += numel(o.shape) * size_of(o.dtype);
      if (bytes < (size_t{1} << 26)) exe.run(f.feeds);
    } catch (const Error&) {
      ++rejected;
    }
  }
  EXPECT_GT(rejected, 0);
  std::printf("random manifest edits: %d loaded, %d rejected\n", loaded, rejected);
}

// ---- the tuning section ----

fb::Tuning* tuning(Bytes& b) { return manifest(b)->mutable_tuning()->GetMutableObject(0); }

TEST(PackageMalformed, TheTunedFixtureLoadsAndRuns) {
  const Fixture& f = tuned_fixture();
  Bytes b = f.bytes;
  ASSERT_EQ(manifest(b)->tuning()->size(), 1u);
  auto exe = load(b, {.strict = true});
  const auto got = exe.run(f.feeds);
  ASSERT_EQ(got.size(), f.want.size());
  for (size_t k = 0; k < got.size(); ++k)
    EXPECT_EQ(std::memcmp(got[k].data(), f.want[k].data(), got[k].nbytes()), 0);
  // packages without GPU tuning have none
  Bytes plain = fixture().bytes;
  EXPECT_EQ(manifest(plain)->tuning()->size(), 0u);
}

TEST(PackageMalformed, FlippedByteInTuningSection) {
  Bytes clean = tuned_fixture().bytes;
  const uint64_t off = tuning(clean)->offset(), size = tuning(clean)->size();
  ASSERT_GT(size, 16u);
  for (uint64_t i = off; i < off + size; i += 3) {
    SCOPED_TRACE("byte " + std::to_string(i));
    Bytes b = clean;
    b[i] ^= 0x04;
    // checked whether or not the weights are
    for (bool verify : {true, false})
      expect_format_error(b, {"tuning section 0 (cuda)", fmt::format("offset {}", off),
                              "checksum mismatch"},
                          {.verify_weights = verify});
  }
}

// Edits of the tuning entry or of its blob with every checksum valid.
TEST(PackageMalformed, TuningEditsWithValidChecksums) {
  struct Case {
    const char* name;
    std::function<void(fb::Tuning&, Bytes&)> edit;  // the blob's checksum is fixed after it
    std::vector<std::string> expect;
  };
  auto put_blob = [](Bytes& b, const fb::Tuning& t, uint64_t at, auto v) {
    std::memcpy(b.data() + t.offset() + at, &v, sizeof v);
  };
  Bytes clean = tuned_fixture().bytes;
  const uint64_t off = tuning(clean)->offset(), size = clean.size();
  const std::vector<Case> cases = {
      {"past the end", [&](fb::Tuning& t, Bytes&) { t.mutate_offset(size + 64); },
       {"tuning section 0 (cuda)", "outside the file"}},
      {"offset overflows", [&](fb::Tuning& t, Bytes&) { t.mutate_offset(~uint64_t{0} - 63); },
       {"tuning section 0 (cuda)", "outside the file"}},
      {"inside the header", [&](fb::Tuning& t, Bytes&) { t.mutate_offset(0); },
       {"tuning section 0 (cuda)", "outside the file"}},
      {"huge size", [&](fb::Tuning& t, Bytes&) { t.mutate_size(uint64_t{1} << 62); },
       {"tuning section 0 (cuda)", "at most 16777216"}},
      {"misaligned", [&](fb::Tuning& t, Bytes&) { t.mutate_offset(t.offset() - 8); },
       {"tuning section 0 (cuda)", "multiple of 64"}},
      {"unknown backend", [&](fb::Tuning& t, Bytes&) { t.mutate_backend(7); },
       {"tuning section 0", "unknown backend 7"}},
      {"huge record count",
       [&](fb::Tuning& t, Bytes& b) { put_blob(b, t, 8, uint32_t{0xffffffff}); },
       {"tuning section 0 (cuda)", fmt::format("offset {}", off + 8), "do not fit"}},
      {"huge key count", [&](fb::Tuning& t, Bytes& b) { put_blob(b, t, 18, uint16_t{60000}); },
       {fmt::format("offset {}", off + 16), "record 0 has 60000 key"}},
      {"a record cut off", [&](fb::Tuning& t, Bytes& b) { t.mutate_size(t.size() - 8); },
       {"tuning section 0 (cuda)", "record 2 of 3 is cut off"}},
      {"bytes after the records", [&](fb::Tuning& t, Bytes& b) { put_blob(b, t, 8, uint32_t{2}); },
       {"bytes after the last record"}},
      {"bad magic", [&](fb::Tuning& t, Bytes& b) { put_blob(b, t, 0, uint32_t{0}); },
       {fmt::format("offset {}", off), "bad magic"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Bytes b = clean;
    fb::Tuning& t = *tuning(b);
    c.edit(t, b);
    if (t.offset() == off && t.size() <= b.size() - off)
      t.mutate_xxh3(package::xxh3(b.data() + off, t.size()));
    fix_checksums(b);
    std::vector<std::string> parts = c.expect;
    parts.push_back("[package] <memory>: ");
    expect_format_error(b, parts);
  }
  // a blob of a later version is skipped, not an error
  Bytes newer = clean;
  fb::Tuning& t = *tuning(newer);
  std::memcpy(newer.data() + off + 4, "\x05\0\0\0", 4);
  t.mutate_xxh3(package::xxh3(newer.data() + off, t.size()));
  fix_checksums(newer);
  load(newer, {.strict = true}).run(tuned_fixture().feeds);
}

// Random bytes in the blob with valid checksums: the loader rejects or loads, never crashes.
TEST(PackageMalformed, RandomTuningEditsNeverCrash) {
  const Fixture& f = tuned_fixture();
  Bytes clean = f.bytes;
  const uint64_t off = tuning(clean)->offset(), size = tuning(clean)->size();
  std::uniform_int_distribution<uint64_t> pos(off, off + size - 1);
  std::uniform_int_distribution<int> byte(0, 255), count(1, 4);
  int loaded = 0, rejected = 0;
  for (int it = 0; it < 1000; ++it) {
    Bytes b = clean;
    for (int k = count(rng()); k > 0; --k) b[pos(rng())] = static_cast<uint8_t>(byte(rng()));
    tuning(b)->mutate_xxh3(package::xxh3(b.data() + off, size));
    fix_checksums(b);
    try {
      load(b).run(f.feeds);
      ++loaded;
    } catch (const FormatError&) {
      ++rejected;
    }
  }
  EXPECT_GT(rejected, 0);
  EXPECT_GT(loaded, 0);  // edits of keys and values are records the CPU does not read
}

TEST(PackageMalformed, NotAFile) {
  expect_error<IoError>([] { Executable::load("/nonexistent/dir/x.kiln", Device::cpu()); },
                        {"[package]", "cannot open"});
  expect_error<IoError>([] { Executable::load(testing::TempDir(), Device::cpu()); },
                        {"[package]", "not a regular file"});
  expect_format_error({}, {"header", "has 0 bytes"});
}

// A package compiled for CUDA loads on the CPU by placing and planning its program again.
TEST(PackageMalformed, PackageForAnotherDeviceIsPlannedAgain) {
  const Fixture& f = fixture();
  Bytes b = f.bytes;
  manifest(b)->mutable_metadata()->mutate_device_kind(1);
  fix_checksums(b);
  auto exe = load(b);
  ASSERT_NE(exe.package_info(), nullptr);
  EXPECT_TRUE(exe.package_info()->replanned);
  EXPECT_EQ(exe.package_info()->compiled_for, "cuda:0");
  EXPECT_NE(exe.report().find("planned again"), std::string::npos) << exe.report();
  const auto got = exe.run(f.feeds);
  for (size_t k = 0; k < got.size(); ++k)
    EXPECT_EQ(std::memcmp(got[k].data(), f.want[k].data(), got[k].nbytes()), 0);
  expect_error<UnsupportedError>([&] { load(b, {.strict = true}); },
                                 {"compiled for cuda:0, loaded for cpu", "strict"});
}

}  // namespace
}  // namespace kiln
