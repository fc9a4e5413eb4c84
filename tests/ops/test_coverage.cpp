// Every op of src/ops/op_list.inc has a CPU kernel and a test suite named after it.
#include <set>

#include "core/op_id.h"
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
    // sources read where their data lives: nothing to execute
    if (op == OpId::Placeholder || op == OpId::Constant || op == OpId::Variable) continue;
    EXPECT_NE(find_kernel(op, Backend::cpu), nullptr) << op_name(op) << " has no CPU kernel";
  }
}

TEST(OpCoverage, EveryOpHasTest) {
  auto suites = suite_names();
  for (OpId op : kAllOps)
    EXPECT_TRUE(suites.count(op_pascal_name(op)))
        << op_name(op) << " has no test suite named " << op_pascal_name(op);
}

}  // namespace
}  // namespace kiln
