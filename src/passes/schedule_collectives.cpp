// Collective scheduling: each all_reduce start runs as soon as its input is computed and each
// wait as late as its readers allow, so communication overlaps the computation in between (the
// backward pass of a data-parallel step, typically).
//
// A list schedule over the program's dependencies, picking among ready nodes by priority:
// first the nodes a start needs, start by start in program order (so the first bucket's
// gradients, then its start, come before the work only later buckets need), then every other
// node in program order, and the waits only when nothing else is ready.
#include <limits>
#include <queue>
#include <tuple>

#include "core/op_registry.h"
#include "passes/program.h"

namespace kiln {

Program schedule_collectives(const Program& p) {
  const auto& nodes = p.graph.nodes;
  const size_t n = nodes.size();
  bool any = false;
  for (const auto& node : nodes) any = any || node.op == OpId::AllReduce;
  if (!any) return p;

  // group[i]: ordinal of the first start (in program order) that node i feeds
  constexpr int64_t kNone = std::numeric_limits<int64_t>::max() / 4;
  std::vector<int64_t> group(n, kNone);
  std::vector<std::vector<int32_t>> readers(n);
  std::vector<int32_t> missing(n, 0);
  int64_t ordinal = 0;
  std::vector<int64_t> start_ordinal(n, kNone);
  for (size_t i = 0; i < n; ++i) {
    if (nodes[i].op == OpId::AllReduce) start_ordinal[i] = ordinal++;
    for (auto v : nodes[i].inputs) {
      readers[v.node].push_back(static_cast<int32_t>(i));
      ++missing[i];
    }
  }
  for (size_t j = n; j-- > 0;) {
    int64_t g = start_ordinal[j];
    for (int32_t r : readers[j]) g = std::min(g, group[r]);
    // a wait does not pull what it waits for forward; only starts do
    group[j] = nodes[j].op == OpId::CollectiveWait ? kNone : g;
  }
  for (size_t j = 0; j < n; ++j)
    if (start_ordinal[j] != kNone) group[j] = start_ordinal[j];

  using Key = std::tuple<int64_t, int64_t>;  // (class, program index)
  auto key = [&](int32_t i) -> Key {
    if (nodes[i].op == OpId::CollectiveWait) return {kNone + 1, i};
    return {group[i], i};
  };
  std::priority_queue<Key, std::vector<Key>, std::greater<>> ready;
  for (size_t i = 0; i < n; ++i)
    if (missing[i] == 0) ready.push(key(static_cast<int32_t>(i)));
  ProgramBuilder b(p);
  while (!ready.empty()) {
    const auto i = static_cast<int32_t>(std::get<1>(ready.top()));
    ready.pop();
    b.copy(i);
    for (int32_t r : readers[i])
      if (--missing[r] == 0) ready.push(key(r));
  }
  return b.finish();
}

}  // namespace kiln
