// Dead-code elimination: keep only the nodes the outputs need.
#include <algorithm>

#include "passes/program.h"

namespace kiln {

Program eliminate_dead_code(const Program& p) {
  const auto& nodes = p.graph.nodes;
  std::vector<char> live(nodes.size(), 0);
  for (auto v : p.outputs) live[v.node] = 1;
  for (int i = static_cast<int>(nodes.size()) - 1; i >= 0; --i)
    if (live[i])
      for (auto v : nodes[i].inputs) live[v.node] = 1;
  if (std::find(live.begin(), live.end(), 0) == live.end()) return p;  // nothing is dead
  ProgramBuilder b(p);
  for (size_t i = 0; i < nodes.size(); ++i)
    if (live[i]) b.copy(static_cast<int32_t>(i));
  return b.finish();
}

}  // namespace kiln
