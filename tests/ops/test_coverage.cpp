// Every op of src/ops/op_list.inc has a CPU kernel and a test suite named after it, and a kernel
// for each layout its record declares (and none for a layout it does not).
#include <set>

#include "core/op_id.h"
#include "core/op_registry.h"
#include "kiln/kernel.h"
#include "support/reference.h"

namespace kiln {
namespace {

std::set<std::string> suite_names() {
  std::set<std::string> s;
  auto* u = ::testing::UnitTest::GetInstance();
  for (int i = 0; i < u->total_test_suite_count(); ++i) s.insert(u->GetTestSuite(i)->name());
  return s;
}

TEST(OpCoverage, EveryOpHasCpuKernel) {
  for (OpId op : kAllOps) {
    // sources read where their data lives, and shape_of becomes a constant when shapes are
    // specialized: nothing to execute
    if (op == OpId::Placeholder || op == OpId::Constant || op == OpId::Variable ||
        op == OpId::ShapeOf)
      continue;
    EXPECT_NE(find_kernel(op, Backend::cpu), nullptr) << op_name(op) << " has no CPU kernel";
  }
}

// The CPU runs every node a package may hold (a package made for a GPU, with channels_last
// nodes, runs there too), so it has a kernel for every declared layout; no backend has one for an
// undeclared layout, which no node could reach.
TEST(OpCoverage, LayoutKernelsFollowTheRecords) {
  int declared = 0;
  for (OpId op : kAllOps) {
    const bool cl = op_def(op).nhwc_input != nullptr;
    declared += cl;
    if (cl)
      EXPECT_NE(find_kernel(op, Backend::cpu, Layout::channels_last), nullptr)
          << op_name(op) << " declares layout channels_last but has no CPU kernel for it";
    for (Backend b : {Backend::cpu, Backend::cuda})
      if (!cl)
        EXPECT_EQ(find_kernel(op, b, Layout::channels_last), nullptr)
            << op_name(op) << " has a " << backend_name(b)
            << " kernel for layout channels_last, which its record does not declare";
  }
  // the conv family, pooling and batch norm between NHWC convolutions, int8 convolution
  EXPECT_GE(declared, 8);
}

TEST(OpCoverage, EveryOpHasTest) {
  auto suites = suite_names();
  for (OpId op : kAllOps)
    EXPECT_TRUE(suites.count(op_pascal_name(op)))
        << op_name(op) << " has no test suite named " << op_pascal_name(op);
}

}  // namespace
}  // namespace kiln
