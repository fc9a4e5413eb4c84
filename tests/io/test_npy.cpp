#include <cstdio>
#include <fstream>

#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;

std::string tmp(const std::string& name) {
  return ::testing::TempDir() + "kiln_" + std::to_string(seed()) + "_" + name;
}

TEST(Npy, RoundTripsEveryDtype) {
  for (DType t : {f32, f64, f16, bf16, i8, u8, i16, i32, i64, boolean}) {
    for (Shape s : {Shape{}, Shape{0}, Shape{7}, Shape{2, 3, 4}}) {
      Array a = random_array(s, t, -100, 100);
      const std::string p = tmp(std::string(name(t)) + ".npy");
      a.save_npy(p);
      Array b = Array::load_npy(p);
      EXPECT_EQ(b.dtype(), t);
      expect_equal(b, s, to_f64(a));
      std::remove(p.c_str());
    }
  }
}

TEST(Npy, RejectsMalformedFiles) {
  const std::string p = tmp("bad.npy");
  {
    std::ofstream f(p, std::ios::binary);
    f << "not numpy at all";
  }
  expect_error<FormatError>([&] { Array::load_npy(p); }, {"[npy]", "magic"});
  {
    Array a = random_array({100}, f32);
    a.save_npy(p);
    std::ifstream in(p, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), {});
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size() - 50));  // truncated data
  }
  expect_error<FormatError>([&] { Array::load_npy(p); }, {"[npy]", "(100,)", "400"});
  expect_error<IoError>([&] { Array::load_npy(p + ".missing"); }, {"[npy]", "cannot open"});
  std::remove(p.c_str());
}

}  // namespace
}  // namespace kiln
