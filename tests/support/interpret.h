// Test support: a compiled-for-another-target program (a pass's output) run node by node on the
// CPU kernels, without the runtime: placeholders by name from `feeds`.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "passes/program.h"
#include "runtime/executable_impl.h"
#include "runtime/run_kernel.h"

namespace kiln::test {

inline std::vector<Array> interpret(const Program& p, const std::map<std::string, Array>& feeds) {
  std::vector<std::vector<Array>> values(p.graph.nodes.size());
  for (size_t i = 0; i < p.graph.nodes.size(); ++i) {
    const detail::Node& n = p.graph.nodes[i];
    if (n.op == OpId::Placeholder) {
      values[i] = {feeds.at(n.name)};
    } else if (n.op == OpId::Constant) {
      values[i] = {n.value};
    } else {
      std::vector<Array> in;
      for (auto v : n.inputs) in.push_back(values[v.node][v.index]);
      values[i] = evaluate_node_cpu(n, in);
    }
  }
  std::vector<Array> out;
  for (auto v : p.outputs) out.push_back(values[v.node][v.index]);
  return out;
}

}  // namespace kiln::test
