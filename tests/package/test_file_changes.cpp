// Packages whose file changes under a loaded executable: truncated, rewritten or deleted after
// load, the executable keeps giving the right outputs; truncated while it loads, the load gives
// an IoError or a FormatError, or succeeds and runs right. Never a signal (format.h, FILES: the
// reader reads the file, it does not map it).
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "kiln/kiln.h"
#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;
namespace fs = std::filesystem;

std::string temp_path(const std::string& name) {
  return testing::TempDir() + "kiln_changes_" + std::to_string(::getpid()) + "_" + name + ".kiln";
}

// y = relu(x W + b): W a constant of k x n (k * n * 4 bytes in the file), b a variable.
struct Fixture {
  Array x, w, b;
  std::vector<double> want;  // float64 reference
  std::string path;
};

Fixture save_fixture(const std::string& name, int64_t k, int64_t n) {
  Fixture f{random_array({2, k}, f32),
            random_array({k, n}, f32),
            random_array({n}, f32),
            {},
            temp_path(name)};
  Graph g;
  auto x = g.placeholder({2, k}, f32, "x");
  auto y = relu(matmul(x, g.constant(f.w, "w")) + g.variable(f.b, "b"));
  g.compile(Device::cpu(), {{x, {2, k}}}, {y}).save(f.path);
  const auto xv = to_f64(f.x), wv = to_f64(f.w), bv = to_f64(f.b);
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = bv[j];
      for (int64_t t = 0; t < k; ++t) s += xv[i * k + t] * wv[t * n + j];
      f.want.push_back(std::max(s, 0.0));
    }
  return f;
}

void expect_right(const Executable& exe, const Fixture& f, const std::string& what) {
  SCOPED_TRACE(what);
  const auto out = exe.run(std::map<std::string, Array>{{"x", f.x}});
  ASSERT_EQ(out.size(), 1u);
  expect_close(out[0], {2, static_cast<int64_t>(f.want.size() / 2)}, f.want, 1e-4, 1e-4);
}

void truncate_file(const std::string& path, uintmax_t size) {
  std::error_code ec;
  fs::resize_file(path, size, ec);
  ASSERT_FALSE(ec) << ec.message();
}

// 4 MiB of constant: many pages, so a mapping would fault on every one of them.
constexpr int64_t kK = 1024, kN = 1024;

TEST(PackageFileChanges, TruncatedAfterLoadStillRunsRight) {
  const Fixture f = save_fixture("truncated", kK, kN);
  const Executable exe = Executable::load(f.path, Device::cpu());
  expect_right(exe, f, "before");
  for (uintmax_t size : {uintmax_t{64}, uintmax_t{0}}) {
    truncate_file(f.path, size);
    expect_right(exe, f, "truncated to " + std::to_string(size) + " bytes");
  }
  // the same, loaded without checking the weights' checksums (nothing read them at load)
  const Fixture g = save_fixture("truncated_unverified", kK, kN);
  const Executable fast = Executable::load(g.path, Device::cpu(), {.verify_weights = false});
  truncate_file(g.path, 4096);
  expect_right(fast, g, "loaded without weight checksums, truncated to 4096 bytes");
  fs::remove(f.path);
  fs::remove(g.path);
}

TEST(PackageFileChanges, RewrittenOrDeletedAfterLoadStillRunsRight) {
  const Fixture f = save_fixture("rewritten", kK, kN);
  const Executable exe = Executable::load(f.path, Device::cpu());
  {  // same size, other bytes, written in place (not a new file renamed over it)
    const auto size = fs::file_size(f.path);
    std::fstream out(f.path, std::ios::in | std::ios::out | std::ios::binary);
    const std::string junk(size, '\x5a');
    out.write(junk.data(), static_cast<std::streamsize>(junk.size()));
  }
  expect_right(exe, f, "rewritten in place");
  fs::remove(f.path);
  expect_right(exe, f, "deleted");
  EXPECT_THROW(Executable::load(f.path, Device::cpu()), IoError);
}

TEST(PackageFileChanges, TruncatedBeforeLoadIsAnError) {
  const Fixture f = save_fixture("cut", 64, 64);
  const auto size = fs::file_size(f.path);
  for (uintmax_t cut :
       {uintmax_t{0}, uintmax_t{8}, uintmax_t{63}, uintmax_t{64}, size / 2, size - 1}) {
    truncate_file(f.path, cut);
    try {
      Executable::load(f.path, Device::cpu());
      ADD_FAILURE() << "a package cut to " << cut << " of " << size << " bytes loaded";
    } catch (const FormatError&) {
    } catch (const IoError&) {
    }
  }
  fs::remove(f.path);
}

// Another thread truncates the file at a random moment of a load: every load fails with a kiln
// error or succeeds and then runs right, whatever the file became.
TEST(PackageFileChanges, TruncatedWhileLoading) {
  const Fixture f = save_fixture("racing", kK, kN);
  std::ifstream in(f.path, std::ios::binary);
  const std::string full((std::istreambuf_iterator<char>(in)), {});
  in.close();
  std::mt19937 rng(std::random_device{}());
  int loaded = 0, refused = 0;
  for (int round = 0; round < 12; ++round) {
    {
      std::ofstream out(f.path, std::ios::binary | std::ios::trunc);
      out.write(full.data(), static_cast<std::streamsize>(full.size()));
    }
    const auto delay = std::chrono::microseconds(std::uniform_int_distribution<int>(0, 3000)(rng));
    const uintmax_t cut = std::uniform_int_distribution<uintmax_t>(0, full.size() - 1)(rng);
    std::thread cutter([&] {
      std::this_thread::sleep_for(delay);
      std::error_code ec;
      fs::resize_file(f.path, cut, ec);
    });
    try {
      const Executable exe = Executable::load(f.path, Device::cpu());
      cutter.join();
      ++loaded;
      expect_right(exe, f, "loaded while it was cut to " + std::to_string(cut) + " bytes");
    } catch (const IoError&) {
      cutter.join();
      ++refused;
    } catch (const FormatError&) {
      cutter.join();
      ++refused;
    }
  }
  EXPECT_EQ(loaded + refused, 12);
  fs::remove(f.path);
}

}  // namespace
}  // namespace kiln
