// Interop with numpy itself: tests/python/test_npy_interop.py writes .npy files with numpy into
// KILN_NPY_DIR and runs this test, which reads each file, saves it back unchanged and saves
// cast(x, f64) * 2 computed by a kiln graph; the Python side checks both with numpy.
// Without KILN_NPY_DIR the test skips.
#include <cstdlib>
#include <filesystem>

#include "support/reference.h"

namespace kiln {
namespace {

TEST(NpyInterop, ReadsAndWritesNumpyFiles) {
  const char* dir = std::getenv("KILN_NPY_DIR");
  if (!dir) GTEST_SKIP() << "run by tests/python/test_npy_interop.py";
  int files = 0;
  for (auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string p = e.path().string();
    if (!p.ends_with(".in.npy")) continue;
    const std::string stem = p.substr(0, p.size() - 7);
    Array a = Array::load_npy(p);
    a.save_npy(stem + ".same.npy");
    Graph g;
    auto x = g.placeholder(a.shape(), a.dtype(), "x");
    test::eval1(g, cast(x, f64) * 2.0, {{x, a}}).save_npy(stem + ".twice.npy");
    ++files;
  }
  EXPECT_GT(files, 0);
}

}  // namespace
}  // namespace kiln
