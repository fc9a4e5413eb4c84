// KILN_STEP_TIMES on the CPU: every step of a run timed, the time and calls per op printed to
// stderr when the executable goes. The variable is read once per process, so this runs as its
// own ctest entry with the variable set (tests/CMakeLists.txt: StepTimes.Cpu) and skips in the
// suite's run.
#include <gtest/gtest.h>

#include <cstdlib>
#include <regex>
#include <string>

#include "kiln/kiln.h"
#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;

TEST(StepTimes, CpuRunsPrintTimeAndCallsPerOp) {
  if (!std::getenv("KILN_STEP_TIMES")) GTEST_SKIP() << "KILN_STEP_TIMES is not set";
  const Array a = random_array({48, 64}, f32), b = random_array({64, 32}, f32);
  testing::internal::CaptureStderr();
  {
    Graph g;
    const Tensor x = g.placeholder({48, 64}, f32, "x"), w = g.placeholder({64, 32}, f32, "w");
    const Executable exe = g.compile(Device::cpu(), {}, {softmax(matmul(x, w), -1)});
    for (int i = 0; i < 3; ++i) {
      const Array y = exe.run({{x, a}, {w, b}})[0];
      ASSERT_EQ(y.shape(), (Shape{48, 32}));
    }
  }
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("KILN_STEP_TIMES on cpu"), std::string::npos) << err;
  // "   <ms> ms        3 calls  matmul", and the same for softmax
  for (const char* op : {"matmul", "softmax"}) {
    std::string pattern = R"(\s[0-9]+\.[0-9]{3} ms\s+3 calls  )";
    pattern += op;
    pattern += '\n';
    const std::regex row(pattern);
    EXPECT_TRUE(std::regex_search(err, row)) << op << " not timed three times in:\n" << err;
  }
}

}  // namespace
}  // namespace kiln
