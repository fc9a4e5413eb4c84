// Gradient rules of the collectives, checked by central differences in a single process (a group
// of one). Over several ranks the rule is the reduced cotangent: AllReduce.GradientIsTheReduced-
// Cotangent in tests/ops/test_dist.cpp checks it on a local group.
#include "kiln/dist.h"
#include "support/gradcheck.h"

namespace kiln {
namespace {
using namespace kiln::test;
using Ts = std::vector<Tensor>;

TEST(AllReduceGrad, FiniteDifferences) {
  for (auto op : {dist::Reduction::sum, dist::Reduction::mean})
    check_gradients([op](const Ts& x) { return tanh(dist::all_reduce(x[0] * x[0], {.op = op})); },
                    {random_array({3, 5}, f64)});
}

TEST(CollectiveWaitGrad, FiniteDifferences) {
  // the wait passes its cotangent through; read twice so it also flows into a sum
  check_gradients(
      [](const Ts& x) {
        Tensor y = dist::all_reduce(x[0]);
        return y * sin(y);
      },
      {random_array({4, 2}, f64)});
}

}  // namespace
}  // namespace kiln
