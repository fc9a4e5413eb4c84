// Every op decides about gradients: a rule checked by finite differences in a test suite named
// <PascalName>Grad, or explicitly "not differentiable".
#include <set>

#include "core/op_registry.h"
#include "support/reference.h"

namespace kiln {
namespace {

TEST(GradCoverage, EveryOpDecides) {
  for (OpId op : kAllOps)
    EXPECT_NE(op_def(op).grad_kind, GradKind::undecided)
        << op_name(op) << " has neither a gradient rule nor not_differentiable()";
}

TEST(GradCoverage, EveryRuleIsChecked) {
  std::set<std::string> suites;
  auto* u = ::testing::UnitTest::GetInstance();
  for (int i = 0; i < u->total_test_suite_count(); ++i) suites.insert(u->GetTestSuite(i)->name());
  for (OpId op : kAllOps)
    if (op_def(op).grad_kind == GradKind::rule)
      EXPECT_TRUE(suites.count(std::string(op_pascal_name(op)) + "Grad"))
          << op_name(op) << " has a gradient rule but no test suite " << op_pascal_name(op) << "Grad";
}

}  // namespace
}  // namespace kiln
