// Tuning decisions in packages: the blob format (src/core/tuning.h) round trips and rejects
// malformed bytes without reading past them; a package with a tuning section loads on the CPU;
// on a GPU, a conv model saved after a run loads and runs without measuring cuDNN algorithms
// again, bit for bit.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "core/device_backend.h"
#include "core/tuning.h"
#include "io/package/format.h"
#include "io/package/manifest_generated.h"
#include "package/tuned_package.h"
#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;
namespace fb = kiln::package::fb;
using Bytes = std::vector<uint8_t>;

std::vector<TuningRecord> random_records(size_t count) {
  std::uniform_int_distribution<int> kind(0, 65535), nk(0, kMaxTuningKey), nv(0, kMaxTuningValue);
  std::uniform_int_distribution<int64_t> v(INT64_MIN, INT64_MAX);
  std::vector<TuningRecord> r(count);
  for (auto& t : r) {
    t.kind = static_cast<uint16_t>(kind(rng()));
    t.key.resize(nk(rng()));
    t.value.resize(nv(rng()));
    for (auto& e : t.key) e = v(rng());
    for (auto& e : t.value) e = v(rng());
  }
  return r;
}

TEST(TuningBlob, RoundTrip) {
  for (size_t count : {0, 1, 2, 7, 300}) {
    SCOPED_TRACE(count);
    const auto records = random_records(count);
    const Bytes blob = write_tuning(records);
    const TuningParse p = parse_tuning(blob.data(), blob.size());
    EXPECT_EQ(p.error, "");
    EXPECT_EQ(p.version, kTuningVersion);
    EXPECT_TRUE(p.records == records);
  }
  // the layout of format.h's comment: header, then per record 8 bytes and the i64s
  const Bytes blob = write_tuning(sample_conv_records());
  EXPECT_EQ(blob.size(), 16u + 3 * (8 + 27 * 8));
  EXPECT_EQ(std::memcmp(blob.data(), "KTUN", 4), 0);
}

TEST(TuningBlob, WriterRejectsOversizedRecords) {
  TuningRecord t;
  t.key.resize(kMaxTuningKey + 1);
  expect_error<ValueError>([&] { write_tuning({t}); }, {"[tuning]", "65 key"});
  t.key.clear();
  t.value.resize(kMaxTuningValue + 1);
  expect_error<ValueError>([&] { write_tuning({t}); }, {"[tuning]", "17 value"});
}

TuningParse parse(const Bytes& b) { return parse_tuning(b.data(), b.size()); }

template <typename T>
void put(Bytes& b, size_t off, T v) {
  std::memcpy(b.data() + off, &v, sizeof v);
}

TEST(TuningBlob, TruncatedAnywhere) {
  const Bytes full = write_tuning(random_records(5));
  for (size_t n = 0; n < full.size(); ++n) {
    // a copy of exactly n bytes, so that ASan sees a read past them
    const Bytes cut(full.begin(), full.begin() + n);
    const TuningParse p = parse(cut);
    EXPECT_NE(p.error, "") << "cut at " << n;
    EXPECT_TRUE(p.records.empty());
    EXPECT_LE(p.error_offset, n);
  }
  Bytes longer = full;
  longer.push_back(0);
  EXPECT_NE(parse(longer).error.find("1 bytes after the last record"), std::string::npos);
}

TEST(TuningBlob, HugeCountsAndBadFields) {
  const Bytes clean = write_tuning(random_records(3));
  struct Case {
    const char* name;
    size_t at;
    uint64_t value;
    int width;
    std::string expect;
    size_t offset;
  };
  const std::vector<Case> cases = {
      {"huge record count", 8, 0xffffffffu, 4, "do not fit", 8},
      {"count past the bytes", 8, 4, 4, "cut off", 0},  // offset checked below
      {"count above the limit", 8, kMaxTuningRecords + 1, 4, "do not fit", 8},
      {"reserved", 12, 1, 4, "reserved bytes", 12},
      {"huge key count", 18, 0xffff, 2, "key and", 16},
      {"huge value count", 20, 0xffff, 2, "value entries", 16},
      {"record reserved", 22, 3, 2, "reserved bytes", 22},
      {"bad magic", 0, 0x4e555458, 4, "bad magic", 0},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Bytes b = clean;
    if (c.width == 4)
      put<uint32_t>(b, c.at, static_cast<uint32_t>(c.value));
    else
      put<uint16_t>(b, c.at, static_cast<uint16_t>(c.value));
    const TuningParse p = parse(b);
    EXPECT_NE(p.error.find(c.expect), std::string::npos) << p.error;
    if (c.offset) EXPECT_EQ(p.error_offset, c.offset);
    EXPECT_TRUE(p.records.empty());
  }
  // another version: not an error, nothing read
  Bytes newer = clean;
  put<uint32_t>(newer, 4, 9);
  const TuningParse p = parse(newer);
  EXPECT_EQ(p.error, "");
  EXPECT_EQ(p.version, 9u);
  EXPECT_TRUE(p.records.empty());
}

// Any byte flipped: an error or other records, never a read past the bytes (ASan build).
TEST(TuningBlob, FlippedBytes) {
  const auto records = random_records(4);
  const Bytes clean = write_tuning(records);
  for (size_t i = 0; i < clean.size(); ++i)
    for (uint8_t bit : {0x01, 0x80}) {
      Bytes b = clean;
      b[i] ^= bit;
      const TuningParse p = parse(b);
      EXPECT_FALSE(p.error.empty() && p.version == kTuningVersion && p.records == records)
          << "byte " << i;
    }
}

// A package whose tuning section is for CUDA loads on the CPU (the section is checked, not
// used) and runs as the executable it was saved from.
TEST(PackageTuning, TunedPackageLoadsOnCpu) {
  Graph g;
  auto x = g.placeholder({2, 3, 8, 8}, f32, "image");
  auto y = relu(
      conv2d(x, g.constant(random_array({4, 3, 3, 3}, f32)), std::nullopt, {.padding = {1, 1}}));
  auto exe = g.compile(Device::cpu(), {}, {y});
  // a record the CUDA backend would refuse (algorithm 99): the CPU does not read records
  auto records = sample_conv_records();
  records[0].value[0] = 99;
  const Bytes b = save_with_tuning(exe, sample_identity(), records);
  const fb::Manifest* m = fb::GetManifest(
      b.data() + *reinterpret_cast<const uint64_t*>(b.data() + package::header::manifest_offset));
  ASSERT_NE(m->tuning(), nullptr);
  ASSERT_EQ(m->tuning()->size(), 1u);
  const fb::Tuning* t = m->tuning()->Get(0);
  EXPECT_EQ(t->backend(), 1);
  EXPECT_EQ(t->device()->str(), "NVIDIA H200");
  EXPECT_EQ(t->arch()->str(), "sm_90");
  EXPECT_EQ(t->library()->str(), "cudnn 90100");
  EXPECT_EQ(t->offset() % package::kSectionAlign, 0u);
  const TuningParse p = parse_tuning(b.data() + t->offset(), t->size());
  EXPECT_EQ(p.error, "");
  EXPECT_TRUE(p.records == records);
  EXPECT_EQ(*reinterpret_cast<const uint32_t*>(b.data() + package::header::format_version),
            package::kFormatVersion);
  EXPECT_EQ(*reinterpret_cast<const uint32_t*>(b.data() + package::header::min_reader_version), 1u);

  auto loaded = Executable::load_bytes(b.data(), b.size(), Device::cpu(), {.strict = true});
  const Array in = random_array({2, 3, 8, 8}, f32);
  const Array want = exe.run({{"image", in}})[0], got = loaded.run({{"image", in}})[0];
  ASSERT_EQ(got.nbytes(), want.nbytes());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), want.nbytes()), 0);
}

// ---- on a GPU ----

struct ConvModel {
  Graph g;
  std::map<std::string, Array> feeds;
  std::vector<Tensor> outputs;
};

// Forward (direct and through a padded copy), backward-data and backward-filter problems.
std::unique_ptr<ConvModel> conv_model() {
  auto m = std::make_unique<ConvModel>();
  Graph& g = m->g;
  auto x = g.placeholder({4, 3, 16, 16}, f32, "image");
  auto h = relu(conv2d(x, g.constant(random_array({8, 3, 3, 3}, f32, -0.5, 0.5)),
                       g.constant(random_array({8}, f32)), {.padding = {1, 1}}));
  auto a = conv2d(h, g.constant(random_array({8, 8, 3, 3}, f32, -0.5, 0.5)), std::nullopt,
                  {.stride = {2, 2}, .padding = {0, 0, 1, 1}});  // asymmetric: a padded copy
  auto t = conv_transpose2d(a, g.constant(random_array({8, 4, 2, 2}, f32, -0.5, 0.5)), std::nullopt,
                            {.stride = {2, 2}});
  auto dw = conv_grad_weight(x, h, {8, 3, 3, 3}, {.padding = {1, 1}});
  m->outputs = {t, dw};
  m->feeds = {{"image", random_array({4, 3, 16, 16}, f32)}};
  return m;
}

std::string temp_path(const std::string& name) {
  return testing::TempDir() + "kiln_pkg_tuning_" + std::to_string(::getpid()) + "_" + name +
         ".kiln";
}

// Bit for bit where the original executable repeats itself bit for bit (the algorithm a seed
// names is the one measured; an algorithm that accumulates with atomics may differ between any
// two runs), else within f32 tolerance.
void expect_same_as_original(const std::vector<Array>& got, const std::vector<Array>& want,
                             const std::vector<Array>& again, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t k = 0; k < got.size(); ++k) {
    const Array a = got[k].to(Device::cpu()), b = want[k].to(Device::cpu()),
                c = again[k].to(Device::cpu());
    ASSERT_EQ(a.shape(), b.shape()) << what;
    if (std::memcmp(b.data(), c.data(), b.nbytes()) == 0) {
      EXPECT_EQ(std::memcmp(a.data(), b.data(), b.nbytes()), 0) << what << ": output " << k;
      continue;
    }
    std::printf("%s: output %zu differs between two runs of the original; compared within 1e-4\n",
                what.c_str(), k);
    const auto x = a.to_vector<float>(), y = b.to_vector<float>();
    for (size_t i = 0; i < x.size(); ++i)
      ASSERT_NEAR(x[i], y[i], 1e-4 * (1 + std::abs(y[i]))) << what << ": output " << k << " " << i;
  }
}

Bytes read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), {});
}

// The package's tuning section, mutable (the bytes' checksums must be fixed after an edit).
fb::Tuning* tuning_of(Bytes& b) {
  uint64_t off;
  std::memcpy(&off, b.data() + package::header::manifest_offset, 8);
  auto* m = fb::GetMutableManifest(b.data() + off);
  return m->mutable_tuning()->GetMutableObject(0);
}
void fix_checksums(Bytes& b) {
  uint64_t off, size;
  std::memcpy(&off, b.data() + package::header::manifest_offset, 8);
  std::memcpy(&size, b.data() + package::header::manifest_size, 8);
  const uint64_t mx = package::xxh3(b.data() + off, size);
  std::memcpy(b.data() + package::header::manifest_xxh3, &mx, 8);
  const uint64_t hx = package::xxh3(b.data(), package::header::header_xxh3);
  std::memcpy(b.data() + package::header::header_xxh3, &hx, 8);
}

// On a GPU: the kernels kiln generated (fused elementwise chains) travel in the package. A
// process that never compiled them loads the package and runs without compiling any; a flipped
// byte in a kernel section is a FormatError naming it; a binary for another architecture is
// skipped and the kernel compiled from its source; a CPU load checks the sections and runs.
TEST(PackageTuning, CudaGeneratedKernelsTravelInThePackage) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  DeviceBackend& backend = *cuda_backend();
  Graph g;
  auto x = g.placeholder({64, 48}, f32, "x");
  auto w = g.constant(random_array({48, 32}, f32, -0.5, 0.5));
  auto y = tanh(relu(matmul(x, w)) * 0.5 + 1.0) - 0.25;  // one fused chain after the matmul
  auto exe = g.compile(Device::cuda(0), {}, {y});
  ASSERT_NE(exe.dump().find("fused_elementwise"), std::string::npos) << exe.dump();
  const Array in = random_array({64, 48}, f32);
  const Array want = exe.run({{"x", in}})[0].to(Device::cpu());
  const std::string path = temp_path("kernels");
  exe.save(path);
  Bytes bytes = read_file(path);
  uint64_t off;
  std::memcpy(&off, bytes.data() + package::header::manifest_offset, 8);
  const fb::Manifest* m = fb::GetManifest(bytes.data() + off);
  ASSERT_NE(m->kernels(), nullptr);
  ASSERT_EQ(m->kernels()->size(), 1u);
  const fb::Kernel* k = m->kernels()->Get(0);
  EXPECT_EQ(k->arch()->str().rfind("sm_", 0), 0u);
  EXPECT_EQ(k->offset() % package::kSectionAlign, 0u);

  backend.forget_kernels();  // as a new process: nothing compiled or loaded
  int64_t before = backend.kernels_compiled();
  auto loaded = Executable::load(path, Device::cuda(0), {.strict = true});
  expect_close(loaded.run({{"x", in}})[0].to(Device::cpu()), want.shape(), to_f64(want), 0, 0);
  EXPECT_EQ(backend.kernels_compiled(), before) << "the loaded package compiled its kernel again";

  // a binary for another architecture: skipped, the kernel compiled from its source
  Bytes other = bytes;
  auto* mk = fb::GetMutableManifest(other.data() + off)->mutable_kernels()->GetMutableObject(0);
  mk->mutable_arch()->Mutate(3, '0');  // "sm_90" -> "sm_00"
  fix_checksums(other);
  backend.forget_kernels();
  before = backend.kernels_compiled();
  auto recompiled = Executable::load_bytes(other.data(), other.size(), Device::cuda(0));
  expect_close(recompiled.run({{"x", in}})[0].to(Device::cpu()), want.shape(), to_f64(want), 0, 0);
  EXPECT_EQ(backend.kernels_compiled(), before + 1);

  // a flipped byte in the binary: the checksum says so, on every device
  Bytes flipped = bytes;
  flipped[k->offset() + k->size() / 2] ^= 0x40;
  for (Device d : {Device::cuda(0), Device::cpu()})
    expect_error<FormatError>([&] { Executable::load_bytes(flipped.data(), flipped.size(), d); },
                              {"[package]", "kernel section 0", "checksum mismatch"});
  auto on_cpu = Executable::load(path, Device::cpu());
  const auto got = on_cpu.run({{"x", in}})[0].to_vector<float>(), wv = want.to_vector<float>();
  for (size_t i = 0; i < wv.size(); ++i) EXPECT_NEAR(got[i], wv[i], 1e-5) << i;
  std::filesystem::remove(path);
}

TEST(PackageTuning, CudaConvPackageRunsWithoutMeasuring) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  DeviceBackend& backend = *cuda_backend();
  backend.clear_tuning();
  auto m = conv_model();
  auto exe = m->g.compile(Device::cuda(0), {}, m->outputs);
  const auto want = exe.run(m->feeds);
  const TuningStats first = backend.tuning_stats();
  EXPECT_GE(first.measured, 4) << "the first run measures each problem";
  EXPECT_EQ(first.seeded, 0);
  const auto again = exe.run(m->feeds);
  EXPECT_EQ(backend.tuning_stats().measured, first.measured) << "the second run measures nothing";
  const std::string path = temp_path("conv");
  exe.save(path);

  // a fresh process's view: nothing chosen yet
  backend.clear_tuning();
  auto loaded = Executable::load(path, Device::cuda(0), {.strict = true});
  const auto got = loaded.run(m->feeds);
  const TuningStats after = backend.tuning_stats();
  EXPECT_EQ(after.measured, 0) << "the loaded executable's first run measured";
  EXPECT_EQ(after.seeded, first.measured + first.heuristic);
  expect_same_as_original(got, want, again, "loaded from the package");

  // the same package with the tuning of another GPU: measured again (strict: refused)
  Bytes other = read_file(path);
  tuning_of(other)->mutable_arch()->Mutate(3, '0');  // "sm_90" -> "sm_00"
  fix_checksums(other);
  expect_error<UnsupportedError>(
      [&] {
        Executable::load_bytes(other.data(), other.size(), Device::cuda(0), {.strict = true});
      },
      {"[package]", "tuning section 0 (cuda)", "sm_00", "strict"});
  backend.clear_tuning();
  auto remeasured = Executable::load_bytes(other.data(), other.size(), Device::cuda(0));
  remeasured.run(m->feeds);  // (measuring again may pick other algorithms: other roundings)
  EXPECT_EQ(backend.tuning_stats().measured, first.measured);
  EXPECT_EQ(backend.tuning_stats().seeded, 0);

  // a record naming an algorithm cuDNN does not have: a FormatError naming the record
  Bytes bad = read_file(path);
  fb::Tuning* t = tuning_of(bad);
  const uint64_t algo_at = t->offset() + 16 + 8 + 24 * 8;  // record 0's value[0]
  const int64_t algo = 1000;
  std::memcpy(bad.data() + algo_at, &algo, 8);
  t->mutate_xxh3(package::xxh3(bad.data() + t->offset(), t->size()));
  fix_checksums(bad);
  expect_error<FormatError>(
      [&] { Executable::load_bytes(bad.data(), bad.size(), Device::cuda(0)); },
      {"[package]", "tuning section 0 (cuda)", "record 0", "algorithm 1000"});
  std::filesystem::remove(path);
}

// bf16 convolutions run NHWC on CUDA choose, on their first run, between cuDNN's legacy algorithm
// and graph-API plans; a package stores each problem's way (kind-3 records) and a loaded package
// runs them without timing anything again.
TEST(PackageTuning, CudaNhwcChoicesTravelInThePackage) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  DeviceBackend& backend = *cuda_backend();
  backend.clear_tuning();
  Graph g;
  auto x = g.placeholder({4, 16, 14, 14}, bf16, "image");
  auto h = relu(conv2d(x, g.constant(random_array({32, 16, 3, 3}, bf16, -0.3, 0.3)),
                       g.constant(random_array({32}, bf16)), {.padding = {1, 1}}));
  auto y = conv2d(h, g.constant(random_array({32, 32, 1, 1}, bf16, -0.3, 0.3))) + h;
  const std::map<std::string, Array> feeds{{"image", random_array({4, 16, 14, 14}, bf16)}};
  auto exe = g.compile(Device::cuda(0), {}, {y});
  const Array want = exe.run(feeds)[0].to(Device::cpu()).astype(f32);
  const TuningStats first = backend.tuning_stats();
  EXPECT_GE(first.graph_offered, 1) << "cuDNN's graph API offered no plan";
  const std::string path = temp_path("nhwc");
  exe.save(path);
  Bytes b = read_file(path);
  const fb::Tuning* t = tuning_of(b);
  const TuningParse parsed = parse_tuning(b.data() + t->offset(), t->size());
  int nhwc = 0;
  for (const TuningRecord& r : parsed.records) nhwc += r.kind == 3;
  EXPECT_EQ(nhwc, 2) << "a record per NHWC problem";

  backend.clear_tuning();
  auto loaded = Executable::load(path, Device::cuda(0), {.strict = true});
  const Array got = loaded.run(feeds)[0].to(Device::cpu()).astype(f32);
  const TuningStats after = backend.tuning_stats();
  EXPECT_EQ(after.graph_seeded, 2);
  EXPECT_EQ(after.graph_offered, 0) << "the loaded executable timed graph-API plans again";
  const auto gv = got.to_vector<float>(), wv = want.to_vector<float>();
  ASSERT_EQ(gv.size(), wv.size());
  for (size_t i = 0; i < gv.size(); ++i) ASSERT_NEAR(gv[i], wv[i], 2e-2 * (1 + std::abs(wv[i]))) << i;
  std::filesystem::remove(path);
}

// Saved before any run: nothing measured to store; the loaded executable measures, as a compiled
// one does.
TEST(PackageTuning, CudaPackageSavedBeforeRunningMeasuresOnLoad) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  DeviceBackend& backend = *cuda_backend();
  backend.clear_tuning();
  auto m = conv_model();
  auto exe = m->g.compile(Device::cuda(0), {}, m->outputs);
  const std::string path = temp_path("unrun");
  exe.save(path);
  Bytes b = read_file(path);
  const fb::Tuning* t = tuning_of(b);
  const TuningParse p = parse_tuning(b.data() + t->offset(), t->size());
  EXPECT_EQ(p.error, "");
  EXPECT_TRUE(p.records.empty());
  auto loaded = Executable::load(path, Device::cuda(0));
  loaded.run(m->feeds);
  EXPECT_GE(backend.tuning_stats().measured, 4);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace kiln
