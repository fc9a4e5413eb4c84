// Every op through a dynamic executable: each harness case built again with placeholders whose
// dims are all dynamic (-1), compiled without feed shapes and run on the CPU with the case's
// data, must give what the case built with static shapes gives. The ops that cannot be built or
// run on dynamic dims yet are listed with the reason; the test fails for an op that fails and is
// not listed, and for a listed op that passes (so the list stays true).
#include <map>

#include "backend_ops/harness.h"
#include "core/op_registry.h"

namespace kiln::harness {
namespace {

// Ops whose builders or inference need static dims, and why.
const std::map<OpId, const char*>& needs_static_dims() {
  static const std::map<OpId, const char*> ops = {
      {OpId::AdaptiveAvgPoolGrad, "the gradient's spatial dims size the pooling windows"},
      // the depth of an index sets the output's rank
      {OpId::GatherNd, "the last dim of the indices must be static"},
      {OpId::ScatterNd, "the last dim of the indices must be static"},
      {OpId::AssignScatterNd, "the last dim of the indices must be static"},
      // weights are variables or constants in models, static; the hidden size shapes the plan
      {OpId::Lstm, "the weights' hidden size must be static"},
      {OpId::Gru, "the weights' hidden size must be static"},
      {OpId::Rnn, "the weights' hidden size must be static"},
      {OpId::RnnGrad, "the weights' hidden size must be static"},
      // a dim that is 1 at run time but dynamic when built is not known to broadcast: the
      // gradient is not summed over it, nor batch dims broadcast before a solve
      {OpId::ScaledDotProductAttentionGrad, "inputs broadcast along dims dynamic when built"},
      {OpId::TriangularSolve, "batch dims broadcast along dims dynamic when built"},
  };
  return ops;
}

// Runs case `i` of `oc` both ways; returns what differs ("" when they agree, "n/a" when the
// case does not apply).
std::string compare_case(const OpCases& oc, DType t, int i) {
  Case fixed;
  if (!oc.build(fixed, t, i)) return "n/a";
  Case dyn;
  dyn.dynamic_inputs = true;
  try {
    if (!oc.build(dyn, t, i)) return "the builder declined the dynamic case";
  } catch (const std::exception& e) {
    return std::string("building on dynamic dims threw: ") + e.what();
  }
  if (dyn.feeds.size() != fixed.feeds.size()) return "the two builds have different inputs";
  Feeds feeds;  // the fixed case's data
  for (size_t k = 0; k < fixed.feeds.size(); ++k)
    feeds.emplace_back(dyn.feeds[k].first, fixed.feeds[k].second);
  const CompileOptions opts{.optimize = false};
  std::vector<Array> want, got;
  try {
    FeedShapes shapes;
    for (auto& [p, a] : fixed.feeds) shapes.emplace_back(p, a.shape());
    want = fixed.g.compile(Device::cpu(), shapes, fixed.outs, opts).run(fixed.feeds);
  } catch (const std::exception& e) {
    return "n/a";  // the static case itself does not run here (covered by the harness)
  }
  try {
    Executable exe = dyn.g.compile(Device::cpu(), {}, dyn.outs, opts);
    bool ranked = false;
    for (auto& [p, a] : fixed.feeds) ranked = ranked || a.shape().size() > 0;
    if (!exe.is_dynamic() && ranked) return "the executable is not dynamic";
    got = exe.run(feeds);
  } catch (const std::exception& e) {
    return std::string("the dynamic executable threw: ") + e.what();
  }
  if (want.size() != got.size()) return "different numbers of outputs";
  for (size_t k = 0; k < want.size(); ++k) {
    if (want[k].shape() != got[k].shape())
      return fmt::format("output {} has shape {} instead of {}", k, to_string(got[k].shape()),
                         to_string(want[k].shape()));
    // the same kernels on the same data: equal, but for ops that draw random numbers or pick
    // kernels by shape (tolerance of the dtype)
    const double tol = is_floating(want[k].dtype()) ? test::tolerance(want[k].dtype()) : 0;
    if (std::string m = compare(want[k], got[k], tol); !m.empty())
      return fmt::format("output {}: {}", k, m);
  }
  return {};
}

TEST(DynamicDims, EveryOpRunsOnDynamicDims) {
  expect_listed_failures(compare_case, needs_static_dims(), "ops fail on dynamic dims", 100);
}

}  // namespace
}  // namespace kiln::harness
